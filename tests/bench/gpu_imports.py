"""Which distributions a run imported, and from where: the import list of the GPU run.

:func:`audit` walks ``sys.modules`` at the time of the call, maps each module's top-level
name to the distributions that provide it (``importlib.metadata.packages_distributions``)
and sorts each by the folder its file came from:

- ``wheels``: the carried wheels' target folder (``site``);
- ``project``: this repository's sources (imported from the working tree);
- ``image``: any other folder on ``sys.path`` (on the lent machine, its image's
  site-packages; in the rehearsal, the folder that stands for it);
- the standard library is left out.

A module counts by the top-level folder or file its file lies in on ``sys.path`` (so a
namespace package's distributions count through their submodules). A **problem** is a
distribution that came from the wheels but is not pinned, one that came from anywhere
else but is not in the image's list, or a module outside the standard library and the
project that no distribution provides. The GPU run writes the audit into
its JSON (the versions it really ran with: torch, transformers, numpy...), and the
rehearsal fails on any problem.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from packaging.utils import canonicalize_name

REPO: Final = Path(__file__).resolve().parents[2]


def _under(path: str, folder: str) -> bool:
    folder = os.path.abspath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _stdlib() -> list[str]:
    # Inside a virtual environment "platstdlib" would name the environment's own lib folder
    # (its site-packages below it): ask for the base interpreter's.
    bases = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    return [sysconfig.get_path(key, vars=bases) for key in ("stdlib", "platstdlib")]


def _entry(path: str) -> str | None:
    """The longest ``sys.path`` entry that holds ``path``."""
    entries = sorted({os.path.abspath(e or os.curdir) for e in sys.path}, key=len, reverse=True)
    return next((e for e in entries if _under(path, e) and path != e), None)


def origin(file: str, site: Path | None) -> str:
    """``wheels``, ``project``, ``stdlib`` or ``image`` for a module file (not resolved:
    the rehearsal's image folder holds links into another tree). ``project``: found through
    the repository's own ``sys.path`` entry (a folder inside it that is an entry of its
    own, such as a virtual environment or the rehearsal's image, is not the project)."""
    path = os.path.abspath(file)
    if site is not None and _under(path, str(site)):
        return "wheels"
    if any(_under(path, folder) for folder in _stdlib()):
        return "stdlib"
    entry = _entry(path)
    if entry is not None and os.path.realpath(entry) == str(REPO):
        return "project"
    return "image"


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    # Installed distributions do not change during a run; reading them all takes a while.
    return importlib.metadata.packages_distributions()


def top_level(name: str, file: str) -> str:
    """The top-level name a module's file lies under on ``sys.path`` (a compiled module
    that registers itself at the top level, such as scipy's ``_cyutility``, lies inside its
    package), or the module's own name when no entry holds it."""
    path = os.path.abspath(file)
    entry = _entry(path)
    if entry is not None:
        return Path(os.path.relpath(path, entry)).parts[0].split(".", 1)[0]
    return name


def audit(image: Iterable[str], pins: Iterable[str], site: Path | None) -> dict[str, Any]:
    """The distributions imported so far: ``{"distributions": {name: {"version", "from"}},
    "problems": [...]}`` (names canonical, sorted)."""
    image_names = {canonicalize_name(n) for n in image}
    pinned = {canonicalize_name(n) for n in pins}
    providers = _providers()
    found: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    tops: dict[str, tuple[str, str]] = {}
    for name, module in sorted(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str):
            continue  # built-ins, namespace packages (their submodules count), stand-ins
        where = origin(file, site)
        if where not in ("stdlib", "project"):
            tops.setdefault(top_level(name.split(".", 1)[0], file), (where, file))
    for top, (where, file) in sorted(tops.items()):
        dists = providers.get(top)
        if not dists:
            problems.append(f"module {top} ({file}): no distribution provides it")
            continue
        for dist in dists:
            canonical = canonicalize_name(dist)
            try:
                version = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                version = "?"
            found[canonical] = {"version": version, "from": where}
            if where == "wheels" and canonical not in pinned:
                problems.append(f"{canonical}: from the wheels' folder, not pinned")
            if where == "image" and canonical not in image_names:
                problems.append(f"{canonical} {version}: not in the image's list ({file})")
    return {
        "python": sys.version.split()[0],
        "distributions": dict(sorted(found.items())),
        "problems": sorted(set(problems)),
    }
