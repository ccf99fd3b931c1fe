#!/usr/bin/env bash
# The GPU run in one device call (docs/cosyvoice2.md, "One command on a GPU"):
#
#   bash tests/bench/cosyvoice2_gpu.sh WHEELS OUT [tests.bench.cosyvoice2_gpu options]
#
# Installs the carried wheels (WHEELS, made by `make gpu-wheels`; "-": none) into a fresh
# target folder with the machine's own pip (no index, no dependencies: the list is the
# whole set, and nothing the image has is replaced), puts that folder first on PYTHONPATH,
# and runs tests.bench.cosyvoice2_gpu from the repository root (its sources are imported
# from the tree), writing its JSON, Markdown and this run's log (log.txt) to OUT.
# Every stage prints its elapsed time, unbuffered, so a run cut off says how far it got.
#
# GPU_PYTHON: the interpreter (default python3: on the lent machine, the image's 3.12);
# GPU_SITE: the target folder (default /tmp/cosyvoice2-gpu-site). The rehearsal on a
# development machine (tests/bench/gpu_rehearsal.py) sets both, and PYTHONPATH.
set -uo pipefail
wheels=${1:?usage: cosyvoice2_gpu.sh WHEELS|- OUT [options]}
out=${2:?usage: cosyvoice2_gpu.sh WHEELS|- OUT [options]}
shift 2
python=${GPU_PYTHON:-python3}
site=$(realpath -m "${GPU_SITE:-/tmp/cosyvoice2-gpu-site}")
export PYTHONUNBUFFERED=1
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
[ "$wheels" = - ] || wheels=$(cd "$wheels" && pwd) || exit 2
cd "$(dirname "$0")/../.." || exit 2
log=$out/log.txt
: >"$log"
stage() { echo "[sh $SECONDS s] $*" | tee -a "$log"; }

stage "$($python -c 'import sys; print("Python", sys.version.split()[0], sys.executable)')"
if [ "$wheels" != - ]; then
  shopt -s nullglob
  found=("$wheels"/*.whl)
  [ ${#found[@]} -gt 0 ] || { stage "no wheels in $wheels (make gpu-wheels; carry it)"; exit 2; }
  stage "installing ${#found[@]} wheels ($(du -sh "$wheels" | cut -f1)) into $site"
  rm -rf "$site"
  if ! $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --root-user-action=ignore --target "$site" "${found[@]}" 2>&1 | tee -a "$log"; then
    stage "pip install failed"
    exit 3
  fi
  stage "installed"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
stage "running tests.bench.cosyvoice2_gpu $*"
$python -m tests.bench.cosyvoice2_gpu --site "$site" --out "$out" "$@" 2>&1 | tee -a "$log"
status=$?
stage "exit $status"
exit $status
