"""The import graph of the three packages, read from their source (no import runs):

- the floors: ``telephony`` imports neither ``engine`` nor ``gateway``, ``engine`` imports
  no ``gateway``, and ``engine/ipc`` (imported by both processes) nothing outside itself;
- no gateway folder imports upward: an import from a module of a folder (``gateway/sip``)
  to a module at the root of ``gateway`` is a **back arrow** when that root module itself
  leads, import by import, back into the folder (a circle through the root). The back
  arrows that exist today are listed in :data:`ALLOWED_BACK_ARROWS`; the test fails on a
  new one, and on a listed one that is gone (so the list only shrinks). Folders import
  each other without circles;
- a backend is created through its table (engine/backends/table.py): no module outside a
  backend's own folder imports it, and nothing runs in a circle through
  ``engine/backends/base.py``;
- the scheduler's parts (engine/scheduler/) import each other without circles and never
  the coordinator, which ties them together and stays under 600 lines: the speech cache's
  path, the flights and the warm-ups are parts of their own.

Imports under ``if TYPE_CHECKING:`` are left out (they do not run). Run with
``pytest tests/test_import_graph.py``; ``python -m tests.test_import_graph`` prints the
back arrows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from engine.backends.table import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "engine", "telephony")

#: (gateway folder, root module it imports although that module leads back into it).
#: Before the legs move there were five (audiosocket -> call_leg, state; sip -> call_leg,
#: state; voices -> state); gateway/legs/ and gateway/context.py removed four, and the
#: voices API's own context (gateway/voices/api.py VoicesContext) the last.
ALLOWED_BACK_ARROWS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module
    target: str  # the imported module
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module ``name`` designates (``from a.b import c``: ``a.b.c`` or ``a.b``)."""
    modules = _modules()
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imported_names(path: Path) -> Iterator[tuple[str, int]]:
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]

    def visit(node: ast.AST) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    yield from visit_one(stmt)
                continue
            yield from visit_one(child)

    def visit_one(node: ast.AST) -> Iterator[tuple[str, int]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno
        else:
            yield from visit(node)

    yield from visit(ast.parse(path.read_text(), str(path)))


@cache
def edges() -> tuple[Edge, ...]:
    found: set[Edge] = set()
    for module, path in _modules().items():
        for name, line in _imported_names(path):
            target = _resolve(name)
            if target is not None and target != module:
                found.add(Edge(module, target, line))
    return tuple(sorted(found, key=lambda e: (e.source, e.target, e.line)))


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges():
        graph.setdefault(edge.source, set()).add(edge.target)
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _gateway_folder(module: str) -> str | None:
    """``gateway.sip`` for a module of gateway/sip/, ``gateway`` for one at the root."""
    parts = module.split(".")
    if parts[0] != "gateway":
        return None
    if len(parts) > 2 or (len(parts) == 2 and (ROOT / "gateway" / parts[1]).is_dir()):
        return f"gateway.{parts[1]}"
    return "gateway"


def back_arrows() -> dict[tuple[str, str], list[Edge]]:
    """(folder, root module) -> the imports that make it a back arrow."""
    graph = _graph()
    arrows: dict[tuple[str, str], list[Edge]] = {}
    for edge in edges():
        folder = _gateway_folder(edge.source)
        if folder in (None, "gateway") or _gateway_folder(edge.target) != "gateway":
            continue
        if any(_gateway_folder(m) == folder for m in _reachable(graph, edge.target)):
            assert folder is not None
            arrows.setdefault((folder, edge.target), []).append(edge)
    return arrows


def test_the_floors_run_one_way() -> None:
    wrong = [
        e
        for e in edges()
        if (e.source.startswith("telephony") and not e.target.startswith("telephony"))
        or (e.source.startswith("engine") and e.target.startswith("gateway"))
        or (e.source.startswith("engine.ipc") and not e.target.startswith("engine.ipc"))
    ]
    assert wrong == []


def test_no_gateway_folder_imports_upward_beyond_the_listed_back_arrows() -> None:
    arrows = back_arrows()
    new = {pair: found for pair, found in arrows.items() if pair not in ALLOWED_BACK_ARROWS}
    assert new == {}, "new back arrows (an import from a gateway folder into a root module "
    "that leads back into the folder)"
    gone = ALLOWED_BACK_ARROWS - set(arrows)
    assert gone == set(), "back arrows removed: take them off ALLOWED_BACK_ARROWS"


def test_gateway_folders_import_each_other_without_circles() -> None:
    folders: dict[str, set[str]] = {}
    for edge in edges():
        source, target = _gateway_folder(edge.source), _gateway_folder(edge.target)
        if source not in (None, "gateway") and target not in (None, "gateway", source):
            assert source is not None and target is not None
            folders.setdefault(source, set()).add(target)
    circles = [f for f in folders if f in _reachable(folders, f)]
    assert circles == []


def _backend_home(module: str) -> str | None:
    """The backend (a table name) whose module or folder ``module`` is part of."""
    for name, target in BACKENDS.items():
        home = target.partition(":")[0]
        if module == home or module.startswith(f"{home}."):
            return name
    return None


def test_backends_are_reached_only_through_the_table() -> None:
    bypass = [
        e
        for e in edges()
        if _backend_home(e.target) is not None
        and _backend_home(e.source) != _backend_home(e.target)
    ]
    assert bypass == []
    base = "engine.backends.base"
    graph = _graph()
    assert base not in _reachable(graph, base), "an import circle runs through base.py"


SCHEDULER = "engine.scheduler"
COORDINATOR = "engine.scheduler.coordinator"
MAX_COORDINATOR_LINES = 600


def test_the_scheduler_s_parts_never_import_the_coordinator_and_run_no_circle() -> None:
    parts: dict[str, set[str]] = {}
    for edge in edges():
        if edge.source.startswith(f"{SCHEDULER}.") and edge.target.startswith(f"{SCHEDULER}."):
            parts.setdefault(edge.source, set()).add(edge.target)
    assert [s for s, targets in parts.items() if COORDINATOR in targets] == []
    assert [p for p in parts if p in _reachable(parts, p)] == []
    for part in ("cache_path", "flights", "warming", "utterances", "commands"):
        assert (COORDINATOR, f"{SCHEDULER}.{part}") in {(e.source, e.target) for e in edges()}
    lines = len((ROOT / "engine" / "scheduler" / "coordinator.py").read_text().splitlines())
    assert lines <= MAX_COORDINATOR_LINES, f"the coordinator grew to {lines} lines"


def test_the_graph_is_read() -> None:
    # The checks above mean something only if the reading finds the imports it should.
    found = {(e.source, e.target) for e in edges()}
    assert ("gateway.legs.sip.leg", "gateway.legs.base") in found
    assert ("gateway.voices.api", "gateway.errors") in found
    assert ("gateway.voices.api", "gateway.state") not in found  # its context instead
    assert ("engine.server", "engine.scheduler") in found
    assert ("engine.backends.base", "engine.backends.table") in found
    assert ("engine.backends.table", "engine.backends.base") not in found  # TYPE_CHECKING


if __name__ == "__main__":
    for (folder, module), found in sorted(back_arrows().items()):
        where = ", ".join(f"{e.source}:{e.line}" for e in found)
        print(f"{folder} -> {module}  ({where})")
