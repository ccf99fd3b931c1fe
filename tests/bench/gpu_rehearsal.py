"""Rehearse the GPU run on this CPU machine, as the lent machine would run it.

The lent machine's Python has the image's distributions (``tests/bench/gpu_image.txt``) and
what the device call installs from the carried wheels into a target folder on
``PYTHONPATH``; nothing else. This machine has no Python 3.12 and no GPU, so the rehearsal
builds the nearest thing:

- **the image**: a folder of symbolic links to the files (from each distribution's
  ``RECORD``) of this virtual environment's distributions that the image also has, and
  nothing else; with ``--image-wheels`` the image's own versions first (pip ``--target``),
  where this machine's Python has them (transformers 5.17, huggingface-hub 1.33,
  tokenizers 0.23.2, onnxruntime 1.30: tests/bench/gpu_rehearsal_image.txt), in place of
  the virtual environment's. What this environment's versions of them require that the
  image lacks (huggingface-hub 2.x's httpx2, without the image's versions) is linked too,
  named in the audit's image list as the rehearsal's own, and is a failure of the
  rehearsal when the image's versions stood in;
- **the run**: ``tests/bench/cosyvoice2_gpu.sh`` (the device call's script) with this
  interpreter started with ``-S`` (no site-packages) and ``PYTHONPATH`` set to the image
  folder, so an import of anything neither the image nor the carried wheels provide fails
  here as it would there. Without a wheel folder for this Python (``--wheels`` absent: it
  is downloaded, ``make gpu-rehearsal``), the pinned distributions are linked from the
  virtual environment into a separate folder instead of installed from wheels. The run's
  import audit (tests/bench/gpu_imports.py) must find nothing outside the image and the
  pins.

What it cannot show: CPython 3.12, numpy 2.5 (no 3.11 wheels), torch 2.11 and torchaudio
(this machine's torch is a CPU build of another version; without torchaudio the engine's
stand-in serves its imports), and every GPU figure.

    python -m tests.bench.gpu_rehearsal --work /tmp/gpu-rehearsal \\
        --wheels artifacts/gpu-wheels-cp311 --image-wheels artifacts/gpu-image-cp311
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from tests.bench import gpu_wheels

REPO: Final = Path(__file__).resolve().parents[2]
SCRIPT: Final = REPO / "tests" / "bench" / "cosyvoice2_gpu.sh"
TINY_ARGS: Final = (
    "--dims",
    "tiny",
    "--device",
    "cpu",
    "--levels",
    "1",
    "2",
    "--official-levels",
    "1",
)


def installed() -> dict[NormalizedName, importlib.metadata.Distribution]:
    """This interpreter's distributions by canonical name (the first on ``sys.path``)."""
    found: dict[NormalizedName, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        found.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    return found


def link_distributions(dest: Path, names: Iterable[str]) -> list[NormalizedName]:
    """Link every file of the named distributions installed here into ``dest`` (created),
    at the same relative paths; files outside the site folder (scripts) are left out.
    Returns the names linked, in canonical form; names not installed here are skipped."""
    here = installed()
    linked = []
    for name in sorted({canonicalize_name(n) for n in names}):
        dist = here.get(name)
        if dist is None or not dist.files:
            continue
        for file in dist.files:
            if file.parts[0] == "..":
                continue
            source = Path(str(dist.locate_file(file)))
            target = dest / file
            if not source.exists() or target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
            if target.suffix == ".py":
                link_byte_code(source, target)
        linked.append(name)
    return linked


def link_byte_code(source: Path, target: Path) -> None:
    """The byte code this interpreter cached for ``source`` (if any), linked where it
    would cache it for ``target``, a link to ``source``: a process with the same cache
    (``PYTHONPYCACHEPREFIX``, passed on to the run) reads it instead of compiling the
    module again (the linked torch and transformers cost the run about 15 s of compiling
    per rehearsal). It is valid there: a link's source has its original's time and size,
    and a module compiled again replaces the link, never what it points to."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.is_file():
        return
    own = Path(importlib.util.cache_from_source(str(target)))
    own.parent.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(own):
        own.symlink_to(cached)


def pip_target(wheels: Path, target: Path) -> None:
    """Install every wheel of ``wheels`` into ``target``: no index, no dependencies."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    command += ["--no-compile", "--target", str(target)]
    subprocess.run([*command, *map(str, sorted(wheels.glob("*.whl")))], check=True)


@dataclass(frozen=True)
class StandIn:
    """The folders that stand for the image, in ``PYTHONPATH`` order; the list of names
    the run's import audit takes as the image's (``--image-list``); the distributions this
    virtual environment's versions of image distributions need that the image lacks."""

    paths: list[Path]
    image_list: Path
    extras: list[str]

    def args(self) -> list[str]:
        return ["--image-list", str(self.image_list)]


def requirement_closure(names: Iterable[str], known: Iterable[str]) -> list[str]:
    """The distributions installed here that ``names`` require (their markers, no extras),
    directly or through each other, and that are not ``known``."""
    here = installed()
    skip = {canonicalize_name(n) for n in known}
    todo = [canonicalize_name(n) for n in names]
    seen = set(todo)
    extras = []
    while todo:
        dist = here.get(todo.pop())
        for line in (dist.requires or []) if dist else []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(requirement.name)
            if name in seen:
                continue
            seen.add(name)
            if name not in skip:
                extras.append(name)
            todo.append(name)
    return sorted(extras)


def build_image(work: Path, image_wheels: Path | None = None) -> StandIn:
    """Stand in for the image under ``work``: ``work/image-versions`` (the image's versions
    installed from ``image_wheels``, if given) and ``work/image`` (links to the rest of the
    image's distributions installed here, and to what this virtual environment's versions
    of them require that the image lacks: ``extras``, added to the audit's image list)."""
    image = gpu_wheels.load_image()
    overrides = work / "image-versions"
    replaced: set[NormalizedName] = set()
    if image_wheels is not None:
        pip_target(image_wheels, overrides)
        replaced = {
            canonicalize_name(d.metadata["Name"])
            for d in importlib.metadata.distributions(path=[str(overrides)])
        }
    linked = link_distributions(work / "image", set(image.packages) - replaced)
    extras = requirement_closure(linked, [*image.packages, *replaced])
    link_distributions(work / "image", extras)
    image_list = work / "image.txt"
    text = gpu_wheels.IMAGE_LIST.read_text()
    image_list.write_text(
        text
        + "# The rehearsal's: required here by this machine's versions of the above\n"
        + "".join(f"{name}\n" for name in extras)
    )
    print(
        f"image: {len(linked)} of its {len(image.packages)} distributions linked from here, "
        f"{len(replaced)} at the image's versions; {len(extras)} more that this machine's "
        f"versions require: {', '.join(extras) or 'none'}",
        flush=True,
    )
    paths = [overrides, work / "image"] if replaced else [work / "image"]
    return StandIn(paths, image_list, extras)


def link_pins(work: Path) -> Path:
    """Without wheels for this Python: the pinned distributions installed here, linked
    into ``work/pinned`` (the folder the device script would install them into)."""
    pins = [name for name, _ in gpu_wheels.read_pins()]
    linked = link_distributions(work / "pinned", pins)
    missing = {canonicalize_name(n) for n in pins} - set(linked)
    if missing:
        raise RuntimeError(f"pinned but not installed here: {sorted(missing)}")
    print(f"no wheels for this Python: {len(linked)} pinned distributions linked", flush=True)
    return work / "pinned"


def environment(image: StandIn, site: Path) -> dict[str, str]:
    """What the device script runs with here: this interpreter without site-packages,
    the image's folders on ``PYTHONPATH``, the wheels' target folder."""
    return {
        "GPU_PYTHON": f"{shlex.quote(sys.executable)} -S",
        "GPU_SITE": str(site),
        "PYTHONPATH": os.pathsep.join(map(str, image.paths)),
    }


def run_script(
    env: dict[str, str], wheels: Path | None, out: Path, args: Iterable[str]
) -> subprocess.CompletedProcess[str]:
    """The device script (``tests/bench/cosyvoice2_gpu.sh``) with ``env``; ``wheels``
    None: nothing to install (the site folder is already filled)."""
    command = ["bash", str(SCRIPT), str(wheels) if wheels else "-", str(out), *args]
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    return subprocess.run(command, cwd=REPO, env={**full, **env}, text=True, check=False)


def verdict(out: Path, stand_in: StandIn, exact_image: bool) -> list[str]:
    """What the run's import audit says against the rehearsal: its problems, and (when the
    image's own versions stood in, ``exact_image``) any of the stand-in's extras imported."""
    body = json.loads((out / "cosyvoice2_gpu.json").read_text())
    imports = body["imports"]
    found: dict[str, dict[str, str]] = imports["distributions"]
    for where in ("wheels", "image"):
        names = [f"{n} {d['version']}" for n, d in found.items() if d["from"] == where]
        print(f"imported from the {where}: {', '.join(names)}")
    problems = list(imports["problems"])
    extras = sorted(set(stand_in.extras) & set(found))
    if extras and exact_image:
        problems.append(f"imported what the image lacks (this machine's extras): {extras}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="a new, empty folder")
    parser.add_argument("--out", type=Path, help="default: WORK/out")
    parser.add_argument("--wheels", type=Path, help="the pinned list's wheels for this Python")
    parser.add_argument("--image-wheels", type=Path, help="the image's versions, this Python")
    args, rest = parser.parse_known_args(argv)
    started = time.monotonic()
    out = args.out or args.work / "out"
    stand_in = build_image(args.work, args.image_wheels)
    site = args.work / "site" if args.wheels else link_pins(args.work)
    env = environment(stand_in, site)
    done = run_script(env, args.wheels, out, [*(rest or TINY_ARGS), *stand_in.args()])
    problems = verdict(out, stand_in, args.image_wheels is not None) if done.returncode == 0 else []
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    print(f"rehearsal: exit {done.returncode} after {time.monotonic() - started:.1f} s")
    return done.returncode or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
