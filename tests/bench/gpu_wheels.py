"""The wheels the GPU run carries to the lent machine, and the check that they fit it.

The lent GPU machines (``nvidia-h100-x1``, ``nvidia-h200``) run CPython 3.12 with their own
PyTorch stack and no network; what one device call takes along (the working tree and the
carried paths) is at most 64 MiB. So the wheel set holds **only what the image lacks**
(``tests/bench/gpu_image.txt``: the image's package list, with its date) at versions that
work with the image's own (torch 2.11, transformers 5.17, huggingface-hub 1.33, numpy
2.5), pinned in ``tests/bench/cosyvoice2_gpu_wheels.txt``.

:func:`check` (``python -m tests.bench.gpu_wheels check``) fails when a wheel's tags do not
fit the target interpreter (CPython 3.12, manylinux x86-64 up to glibc 2.28: the image's
torch 2.11 is itself a manylinux_2_28 wheel, so its glibc is at least that; newer glibc
tags are not assumed), when a wheel is a distribution the image already has, when the
directory and the pin list disagree (a pin without its wheel, a wheel not pinned, two
versions of one name, anything that is not a wheel), or when the set is over its size
budget (60 MiB by default, so that the tree and the wheels travel in one call).

``download`` empties the folder of wheels, runs ``pip download`` for any CPython version
(``--python 3.11`` makes the same list for this 3.11 development machine, to rehearse the
install here) and checks the result; ``--no-check`` downloads another list as it is (the
rehearsal's image versions). The check also prints what one device call would carry: the
working tree (``git ls-files``: tracked and untracked-not-ignored files) and the wheels,
a problem above 64 MiB::

    python -m tests.bench.gpu_wheels download --python 3.12 --dest artifacts/gpu-wheels
    python -m tests.bench.gpu_wheels check --python 3.12 --dest artifacts/gpu-wheels
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)

HERE: Final = Path(__file__).resolve().parent
IMAGE_LIST: Final = HERE / "gpu_image.txt"
WHEEL_LIST: Final = HERE / "cosyvoice2_gpu_wheels.txt"
TARGET_PYTHON: Final = (3, 12)
# The newest glibc the image is known to have: its torch 2.11.0+cu130 is a manylinux_2_28
# wheel. manylinux_2_5 .. 2_28, and the legacy names for 2_5, 2_12 and 2_17.
GLIBC_MAX: Final = (2, 28)
BUDGET_MIB: Final = 60.0
CALL_LIMIT_MIB: Final = 64.0  # what one device call carries: the tree and carried paths
MIB: Final = 2**20
REPO: Final = HERE.parents[1]


@dataclass(frozen=True)
class Image:
    """The GPU image's Python: its interpreter, when the list was read, and its
    distributions (canonical name -> the version the notes give, or None)."""

    python: str
    read: str
    packages: dict[NormalizedName, str | None]

    def has(self, name: str) -> bool:
        return canonicalize_name(name) in self.packages


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: NormalizedName
    version: str
    tags: frozenset[Tag]
    size: int


@dataclass
class Report:
    """What :func:`check` found: the wheels, their total size, and every problem (none
    means the set fits)."""

    wheels: list[Wheel] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(w.size for w in self.wheels)


def _lines(path: Path) -> Iterable[str]:
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            yield line


def _header(path: Path, key: str) -> str:
    prefix = f"# {key}:"
    for line in path.read_text().splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise ValueError(f"{path}: no '{prefix}' line")


def load_image(path: Path = IMAGE_LIST) -> Image:
    """Read the image's list: ``name`` or ``name==version`` a line, and the ``# python:``
    and ``# read:`` header lines."""
    packages: dict[NormalizedName, str | None] = {}
    for line in _lines(path):
        name, _, version = line.partition("==")
        packages[canonicalize_name(name.strip())] = version.strip() or None
    return Image(_header(path, "python"), _header(path, "read"), packages)


def read_pins(path: Path = WHEEL_LIST) -> list[tuple[str, str]]:
    """The pinned ``(name, version)`` pairs, in the file's order; every line must be
    ``name==version``."""
    pins = []
    for line in _lines(path):
        name, sep, version = line.partition("==")
        if not sep or not version.strip():
            raise ValueError(f"{path}: not pinned: {line!r}")
        pins.append((name.strip(), version.strip()))
    return pins


def _manylinux_x86_64(glibc_max: tuple[int, int]) -> list[str]:
    major, newest = glibc_max
    platforms = [f"manylinux_{major}_{minor}_x86_64" for minor in range(newest, 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    return platforms + [name for minor, name in legacy.items() if minor <= newest]


def supported_tags(
    python: tuple[int, int] = TARGET_PYTHON, glibc_max: tuple[int, int] = GLIBC_MAX
) -> frozenset[Tag]:
    """Every tag CPython ``python`` on manylinux x86-64 (glibc up to ``glibc_max``)
    installs: its own ABI, abi3, none, and pure-Python wheels."""
    platforms = _manylinux_x86_64(glibc_max)
    interpreter = f"cp{python[0]}{python[1]}"
    return frozenset(cpython_tags(python, [interpreter], platforms)) | frozenset(
        compatible_tags(python, interpreter, platforms)
    )


def check(
    directory: Path,
    *,
    image: Image,
    pins: list[tuple[str, str]],
    python: tuple[int, int] = TARGET_PYTHON,
    budget_mib: float = BUDGET_MIB,
) -> Report:
    """Check the wheel directory against the target interpreter, the image and the pins."""
    report = Report()
    fits = supported_tags(python)
    seen: dict[NormalizedName, str] = {}
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        try:
            name, version, _build, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            report.problems.append(f"{path.name}: not a wheel")
            continue
        wheel = Wheel(path, name, str(version), frozenset(tags), path.stat().st_size)
        report.wheels.append(wheel)
        if not wheel.tags & fits:
            report.problems.append(
                f"{path.name}: tags {sorted(map(str, wheel.tags))} do not fit "
                f"CPython {python[0]}.{python[1]} manylinux x86_64"
            )
        if image.has(name):
            known = image.packages[name]
            report.problems.append(
                f"{path.name}: the image already has {name}"
                + (f" {known}" if known else "")
                + f" (list read {image.read}): carry only what it lacks"
            )
        if name in seen:
            report.problems.append(f"{path.name}: a second version of {name} ({seen[name]})")
        seen[name] = str(version)
    if not directory.is_dir():
        report.problems.append(f"{directory}: no such directory")
    wanted = {canonicalize_name(name): pinned for name, pinned in pins}
    for name, pinned in sorted(wanted.items()):
        if name not in seen:
            report.problems.append(f"{name}=={pinned}: pinned, no wheel")
        elif seen[name] != pinned:
            report.problems.append(f"{name}: wheel {seen[name]}, pinned {pinned}")
    for name in sorted(seen.keys() - wanted.keys()):
        report.problems.append(f"{name}: a wheel that is not pinned")
    for name in sorted(wanted):
        if image.has(name):
            report.problems.append(f"{name}: pinned, but the image has it")
    if report.total_bytes > budget_mib * MIB:
        report.problems.append(
            f"{report.total_bytes / MIB:.1f} MiB of wheels: over the {budget_mib:g} MiB budget"
        )
    return report


def download_command(
    python: tuple[int, int], dest: Path, requirements: Path = WHEEL_LIST
) -> list[str]:
    """``pip download`` of the pinned list, without dependencies (the list is the whole
    set), binary wheels only, for CPython ``python`` on manylinux x86-64."""
    version = f"{python[0]}.{python[1]}"
    abi = f"cp{python[0]}{python[1]}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", version, "--implementation", "cp"]
    command += ["--abi", abi, "--abi", "abi3", "--abi", "none"]
    for platform in [*_manylinux_x86_64(GLIBC_MAX), "any"]:
        command += ["--platform", platform]
    return [*command, "-d", str(dest), "-r", str(requirements)]


def tree_bytes(repo: Path = REPO) -> int:
    """The size of the working tree a device call sends: tracked files and untracked files
    git does not ignore (ignored folders such as ``artifacts/`` travel only when carried)."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    files = (repo / name.decode() for name in listed if name)
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def download(python: tuple[int, int], dest: Path, requirements: Path = WHEEL_LIST) -> None:
    """Empty ``dest`` of wheels (a wheel left from another list would travel too) and
    download ``requirements`` into it."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    subprocess.run(download_command(python, dest, requirements), check=True)


def describe(report: Report) -> list[str]:
    lines = [f"{w.size / MIB:7.2f} MiB  {w.path.name}" for w in report.wheels]
    lines.append(f"{report.total_bytes / MIB:7.2f} MiB  in {len(report.wheels)} wheels")
    return lines


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("download", "check"))
    parser.add_argument("--python", type=_version, default=TARGET_PYTHON, help="e.g. 3.12")
    parser.add_argument("--dest", type=Path, default=Path("artifacts/gpu-wheels"))
    parser.add_argument("--requirements", type=Path, default=WHEEL_LIST)
    parser.add_argument("--image", type=Path, default=IMAGE_LIST)
    parser.add_argument("--budget-mib", type=float, default=BUDGET_MIB)
    parser.add_argument("--no-check", action="store_true", help="download only")
    args = parser.parse_args(argv)
    if args.action == "download":
        download(args.python, args.dest, args.requirements)
        if args.no_check:
            return 0
    report = check(
        args.dest,
        image=load_image(args.image),
        pins=read_pins(args.requirements),
        python=args.python,
        budget_mib=args.budget_mib,
    )
    print("\n".join(describe(report)))
    tree = tree_bytes()
    carried = (tree + report.total_bytes) / MIB
    print(f"{tree / MIB:7.2f} MiB  working tree; {carried:.2f} MiB in one device call")
    if carried > CALL_LIMIT_MIB:
        report.problems.append(f"{carried:.1f} MiB to carry: over {CALL_LIMIT_MIB:g} MiB a call")
    for problem in report.problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if report.problems:
        return 1
    print(
        f"fits: CPython {args.python[0]}.{args.python[1]} manylinux x86_64, none of the image's "
        f"{len(load_image(args.image).packages)} packages, {args.budget_mib:g} MiB budget"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
