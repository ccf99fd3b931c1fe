"""The standard benchmark matrix (``make bench``), and the memory soak.

    python -m tests.bench.matrix                      # 1, 50, 200, 500 calls, 30 s each
    python -m tests.bench.matrix --duration 20 --levels 1 50
    python -m tests.bench.matrix --soak 600 --soak-sessions 200

Matrix: for every concurrency level, our gateway (engine ``espeak``) and then the naive
baseline (:mod:`tests.bench.baseline_server`), each freshly started, each driven by the
same realtime mu-law calls (:mod:`tests.bench.loadgen`). Running them back to back, level
by level, keeps the ratios ours/baseline meaningful on a shared machine where absolute
times drift. Writes ``bench-results/<timestamp>/result.json`` and PNG plots there, and
rewrites the generated tables of ``docs/benchmarks.md`` (``--no-docs`` to leave it).

Soak: our gateway only, ``--soak-sessions`` calls talking for ``--soak`` seconds,
memory sampled every 5 s; reports the growth (see :mod:`tests.bench.soak`) and memory
per idle and per speaking call, into the soak section of the same document.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.bench import plots, report, soak
from tests.bench.loadgen import (
    ROOT,
    LoadOptions,
    add_load_options,
    completed,
    default_out_dir,
    options_from,
    print_plots,
    run_level,
    run_levels,
    stop_on_signals,
    target_factory,
    write_result,
)
from tests.bench.procstat import machine_info, source_revision
from tests.bench.targets import GatewayTarget

DEFAULT_LEVELS = [1, 50, 200, 500]
DOCS = ROOT / "docs" / "benchmarks.md"


def _command(argv: list[str]) -> str:
    return " ".join(["python -m tests.bench.matrix", *map(shlex.quote, argv)])


def _relative(path: Path, docs: Path) -> str:
    """``path`` as the document's readers find it: relative to the document's checkout."""
    for root in (docs.resolve().parents[1], ROOT):
        try:
            return str(path.resolve().relative_to(root))
        except ValueError:
            continue
    return str(path)


def run_matrix(args: argparse.Namespace, argv: list[str], opts: LoadOptions) -> dict[str, Any]:
    started = datetime.now(UTC)
    revision = source_revision(str(ROOT))  # what the servers will load, not what is there later
    make = target_factory(args.engine, max(args.levels))
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        levels = run_levels(make, args.servers, args.levels, opts, Path(tmp))
    return {
        "command": _command(argv),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "revision": revision,
        "options": dataclasses.asdict(opts),
        "levels": levels,
    }


def run_soak(args: argparse.Namespace, argv: list[str], opts: LoadOptions) -> dict[str, Any]:
    started = datetime.now(UTC)
    revision = source_revision(str(ROOT))
    soak_opts = dataclasses.replace(opts, duration_s=args.soak, sample_s=5.0, progress_s=30.0)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        target = GatewayTarget(Path(tmp), backend=args.engine, slots=max(512, args.soak_sessions))
        print(f"== soak: {args.soak_sessions} calls for {args.soak:.0f} s")
        target.start()
        try:
            level = run_level(target, args.soak_sessions, soak_opts)
        finally:
            target.stop()
    return {
        "command": _command(argv),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "revision": revision,
        "options": dataclasses.asdict(soak_opts),
        "levels": [level],
        "soak": soak.analyze(level),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows when piped to a file
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--levels", type=int, nargs="+", default=DEFAULT_LEVELS)
    parser.add_argument(
        "--servers", nargs="+", choices=["gateway", "baseline"], default=["gateway", "baseline"]
    )
    parser.add_argument("--docs", type=Path, default=DOCS, help="document to update")
    parser.add_argument("--no-docs", action="store_true", help="do not touch the document")
    parser.add_argument("--soak", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--soak-sessions", type=int, default=200)
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="RESULT_JSON",
        help="rewrite the document from a saved result instead of running anything",
    )
    add_load_options(parser)
    parser.set_defaults(quiet_wait=60.0)  # returns at once on an idle machine
    args = parser.parse_args(argv)
    stop_on_signals()
    opts = options_from(args)
    if args.render:
        body = json.loads(args.render.read_text())
        body["result_path"] = _relative(args.render, args.docs)
        _document(body, args)
        return 0
    out: Path = args.out or default_out_dir()

    body = run_soak(args, argv, opts) if args.soak else run_matrix(args, argv, opts)
    path = write_result(out, body)
    body["result_path"] = _relative(path, args.docs)
    print(f"result: {path}")
    if not args.no_plots:
        pngs = plots.plot_all(completed(body["levels"]), out)
        if args.soak and plots.available():
            pngs.append(plots.soak_memory(body["levels"][0], out / "soak_memory.png"))
        print_plots(pngs)
    _document(body, args)
    return 0


def _document(body: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the generated section and write it into the document (unless --no-docs)."""
    if "soak" in body:
        section, markers = report.soak_section(body), report.SOAK_MARKERS
        print(f"soak: {body['soak']}")
    else:
        section, markers = report.matrix_section(body), report.MATRIX_MARKERS
    print(section)
    if not args.no_docs:
        report.update_doc(args.docs, markers, section)
        print(f"updated {args.docs}")


if __name__ == "__main__":
    sys.exit(main())
