"""Load generator: N concurrent IVR calls against a gateway, and what they measured.

    python -m tests.bench.loadgen --sessions 50 200 --duration 30
    python -m tests.bench.loadgen --server baseline --sessions 50
    python -m tests.bench.loadgen --target ws://10.0.0.5:8080/v1/stream --token "$TOKEN" \\
        --server-pid 4242 --sessions 100

Without ``--target`` it starts the server itself (``--server gateway``: our gateway with
its espeak engine, ``LOG_LEVEL=WARNING``; ``--server baseline``: the naive server of
:mod:`tests.bench.baseline_server`), a fresh one for every level. Every call opens a
realtime mu-law session (voice ``zh`` or ``en-us``, alternating), then speaks
15-character prompts in its language with think time, until the window ends.

A level runs in phases: connect every call (ramp), let them sit idle (idle memory),
then the measurement window of ``--duration`` seconds; utterances begun inside the
window may finish during the drain. CPU shares count the window only.

Calls run in ``--workers`` processes (default: one per 150 calls, at most one per
core), each one event loop on uvloop with a minimal WebSocket client
(:mod:`tests.bench.wsclient`); the load generator's own CPU is measured and reported,
so a run where the instrument itself was the bottleneck can be recognised. Output:
``result.json`` and PNG plots in ``--out`` (default ``bench-results/<timestamp>/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench import plots, promscrape, stats
from tests.bench.calls import DRIVERS, CallFailed, CallSpec
from tests.bench.procstat import machine_info, source_revision, wait_for_quiet
from tests.bench.prompts import VOICES, pick_prompt
from tests.bench.recorder import Recorder
from tests.bench.script import Behaviour
from tests.bench.targets import BaselineTarget, ExternalTarget, GatewayTarget, Target
from tests.bench.watch import ProcessWatch, Snapshot, cpu_pct, total_kib
from tests.bench.worker import WorkerPlan, worker_main

ROOT = Path(__file__).resolve().parents[2]
CALLS_PER_WORKER = 150
Log = Callable[[str], None]


def stop_on_signals() -> None:
    """SIGINT and SIGTERM end a run cleanly (servers stopped, workers joined), also when
    the run was started in the background, where a shell leaves SIGINT ignored (and the
    servers it starts would inherit that)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def say(line: str) -> None:
    """The default log: stdout, flushed (progress must show when piped to a file)."""
    print(line, flush=True)


@dataclass(frozen=True)
class LoadOptions:
    """Everything that shapes a level, recorded in the result."""

    duration_s: float = 30.0
    protocol: str = "native"
    fmt: str = "mulaw_8000"
    pacing: str = "realtime"
    think_min_s: float = 0.5
    think_max_s: float = 2.0
    max_prompts: int | None = None
    caller_audio: bool = False
    workers: int | None = None
    ramp_per_s: float = 200.0
    jitter_ms: float = 20.0
    drain_s: float = 10.0
    utterance_timeout_s: float = 30.0
    settle_s: float = 1.5
    quiet_wait_s: float = 0.0  # before a level: wait up to this long for an idle machine
    max_other_pct: float | None = None  # rerun a level when other processes took more
    retries: int = 0  # … at most this many times, keeping the least disturbed attempt
    sample_s: float = 2.0
    progress_s: float = 2.0
    seed: int = 1
    voices: tuple[str, ...] = VOICES  # call g speaks with voices[g % len(voices)]
    burst: bool = False  # every call's first prompt at once (script.Behaviour.burst)
    prompts: str = ""  # "module:function" picking prompts (script.Behaviour.prompts)

    def worker_count(self, sessions: int) -> int:
        if self.workers:
            return max(1, min(self.workers, sessions))
        return max(1, min(os.cpu_count() or 1, math.ceil(sessions / CALLS_PER_WORKER)))


@dataclass
class _Fleet:
    """The worker processes of one level and what they reported."""

    conns: list[Connection]
    procs: list[SpawnProcess]
    ready: dict[int, dict[str, int]] = field(default_factory=dict)
    progress: dict[int, dict[str, Any]] = field(default_factory=dict)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    recent_first_audio: list[float] = field(default_factory=list)

    def poll(self, timeout: float) -> None:
        live = [c for i, c in enumerate(self.conns) if i not in self.results]
        for conn in wait(live, timeout):
            assert isinstance(conn, Connection)
            i = self.conns.index(conn)
            try:
                kind, body = conn.recv()
            except EOFError:
                self.results.setdefault(i, {})
                continue
            if kind == "ready":
                self.ready[i] = body
            elif kind == "progress":
                self.recent_first_audio.extend(body.pop("first_audio_new"))
                del self.recent_first_audio[:-5000]
                self.progress[i] = body
            elif kind == "result":
                self.results[i] = body

    def send(self, message: tuple[Any, ...]) -> None:
        """To every worker still running (one that died already reported EOF)."""
        for i, conn in enumerate(self.conns):
            if i not in self.results:
                with contextlib.suppress(OSError):
                    conn.send(message)

    def total(self, key: str) -> int:
        return sum(int(p.get(key, 0)) for p in self.progress.values())

    def join(self) -> None:
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


def _plans(target: Target, sessions: int, opts: LoadOptions) -> list[WorkerPlan]:
    token = target.token(max_streams=sessions + len(opts.voices))
    k = opts.worker_count(sessions)
    calls: list[list[CallSpec]] = [[] for _ in range(k)]
    delays: list[list[float]] = [[] for _ in range(k)]
    for g in range(sessions):
        spec = CallSpec(
            url=target.ws_url,
            token=token,
            voice=opts.voices[g % len(opts.voices)],
            fmt=opts.fmt,
            pacing=opts.pacing,
            caller_audio=opts.caller_audio,
            utterance_timeout_s=opts.utterance_timeout_s,
            sip_target=target.sip_target,
            audiosocket_target=target.audiosocket_target,
        )
        calls[g % k].append(spec)
        delays[g % k].append(g / opts.ramp_per_s)
    behaviour = Behaviour(
        opts.think_min_s, opts.think_max_s, opts.max_prompts, opts.burst, opts.prompts
    )
    return [
        WorkerPlan(
            protocol=opts.protocol,
            calls=calls[i],
            connect_delays_s=delays[i],
            behaviour=behaviour,
            jitter_ms=opts.jitter_ms,
            drain_s=opts.drain_s,
            progress_s=min(1.0, opts.progress_s),
            seed=opts.seed * 1000 + i,
        )
        for i in range(k)
    ]


def _spawn(plans: list[WorkerPlan]) -> _Fleet:
    ctx = multiprocessing.get_context("spawn")
    conns, procs = [], []
    for plan in plans:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker_main, args=(plan, child), daemon=True, name="loadgen")
        proc.start()
        child.close()
        conns.append(parent)
        procs.append(proc)
    return _Fleet(conns, procs)


def _progress_line(fleet: _Fleet, elapsed: float, opts: LoadOptions, point: dict[str, Any]) -> str:
    recent = np.array(fleet.recent_first_audio[-2000:]) * 1000
    fa = (
        f"{np.percentile(recent, 50):.0f}/{np.percentile(recent, 99):.0f} ms"
        if recent.size
        else "-"
    )
    cpu = dict(point.get("cpu_pct", {}))
    workers = [pct for role, pct in cpu.items() if role.startswith("loadgen")]
    cpu = {role: pct for role, pct in cpu.items() if not role.startswith("loadgen")}
    if workers:
        cpu["loadgen"] = sum(workers)
    cpu_text = " ".join(f"{role} {pct:.0f}%" for role, pct in cpu.items())
    return (
        f"{elapsed:5.1f}/{opts.duration_s:.0f}s  speaks {fleet.total('speaks')}"
        f"  done {fleet.total('completed')}  frames {fleet.total('frames')}"
        f"  errors {fleet.total('errors')}  first audio p50/p99 {fa}"
        f"  cpu {cpu_text or '-'} machine {point.get('machine_cpu_pct') or 0:.0f}%"
    )


async def _warm_up(target: Target, opts: LoadOptions) -> list[str]:
    """One call per voice speaks one prompt, so that one-off costs (voice data loaded on
    first use, caches) are neither charged to the sessions' memory nor to the first
    utterances' latency. Returns the error codes it met."""
    recorder = Recorder()
    driver_cls = DRIVERS[opts.protocol]
    for voice in dict.fromkeys(opts.voices):
        spec = CallSpec(  # burst: the warm-up need not take the prompt's duration
            url=target.ws_url,
            token=target.token(max_streams=len(opts.voices)),
            voice=voice,
            fmt=opts.fmt,
            pacing="burst",
            sip_target=target.sip_target,
            audiosocket_target=target.audiosocket_target,
        )
        driver = driver_cls(spec, recorder)
        try:
            await driver.open()
            await driver.speak(pick_prompt(voice, random.Random(0)), "warm-up")
        except CallFailed as exc:
            recorder.error(exc.code)
        finally:
            await driver.close()
    return sorted(recorder.errors)


def run_level(target: Target, sessions: int, opts: LoadOptions, log: Log = say) -> dict[str, Any]:
    """Drive ``sessions`` calls against a started ``target``; the level's result."""
    if opts.protocol not in DRIVERS:
        raise ValueError(f"unknown protocol {opts.protocol!r} (known: {', '.join(DRIVERS)})")
    label = f"{target.name} x{sessions}"
    background = None
    if opts.quiet_wait_s > 0:
        background = round(wait_for_quiet(opts.quiet_wait_s), 1)
        log(f"  [{label}] machine CPU before the run: {background}% of one core")
    warm_errors = asyncio.run(_warm_up(target, opts))
    if warm_errors:
        log(f"  [{label}] warm-up call failed: {', '.join(warm_errors)}")
    time.sleep(0.5)
    watch = ProcessWatch(target.processes())
    base = watch.snapshot()
    plans = _plans(target, sessions, opts)
    log(f"  [{label}] connecting {sessions} calls from {len(plans)} worker process(es) ...")
    t_ramp = time.monotonic()
    fleet = _spawn(plans)
    watch.cpu_pids = {f"loadgen{i}": p.pid for i, p in enumerate(fleet.procs) if p.pid}
    try:
        _wait_ready(fleet, deadline=t_ramp + sessions / opts.ramp_per_s + 60.0)
        ready = sum(r["ready"] for r in fleet.ready.values())
        failed = sum(r["failed"] for r in fleet.ready.values())
        ramp_s = time.monotonic() - t_ramp
        log(f"  [{label}] {ready} ready, {failed} failed after {ramp_s:.1f} s; idle")
        time.sleep(opts.settle_s)
        idle = watch.snapshot()

        scrape0 = promscrape.fetch(target.metrics_url) if target.metrics_url else None
        t_go = time.monotonic() + 0.2
        t_end = t_go + opts.duration_s
        fleet.send(("go", t_go, t_end))
        time.sleep(max(0.0, t_go - time.monotonic()))
        go = watch.snapshot()
        _watch_window(fleet, watch, opts, t_go, t_end, lambda line: log(f"  [{label}] {line}"))
        end = watch.snapshot()
        scrape1 = promscrape.fetch(target.metrics_url) if target.metrics_url else None
        log(f"  [{label}] window over; draining (at most {opts.drain_s:.0f} s) ...")
        collect_deadline = t_end + opts.drain_s + 30.0
        while len(fleet.results) < len(fleet.procs) and time.monotonic() < collect_deadline:
            fleet.poll(0.5)
    except BaseException:
        fleet.send(("stop",))
        raise
    finally:
        fleet.join()
    result = _level_result(
        target, sessions, opts, fleet, (base, idle, go, end), watch, (scrape0, scrape1), ramp_s
    )
    result["machine_cpu_pct_before"] = background
    return result


def _wait_ready(fleet: _Fleet, deadline: float) -> None:
    """Until every worker reported its calls set up (or died, or ``deadline``)."""
    workers = len(fleet.procs)
    while len(fleet.ready) < workers and time.monotonic() < deadline:
        fleet.poll(0.5)
        if len(fleet.results) == workers:
            break
    if not fleet.ready:
        raise RuntimeError("no load-generator worker got its calls ready (see stderr)")


def _watch_window(
    fleet: _Fleet, watch: ProcessWatch, opts: LoadOptions, t_go: float, t_end: float, log: Log
) -> None:
    """The measurement window: sample the processes, show progress, until ``t_end`` (or
    until every worker is done, when calls speak a fixed number of prompts)."""
    watch.sample(t_go)
    next_sample = t_go + opts.sample_s
    next_print = t_go + opts.progress_s
    while (now := time.monotonic()) < t_end and len(fleet.results) < len(fleet.procs):
        fleet.poll(max(0.0, min(next_sample, t_end) - now))
        now = time.monotonic()
        if now >= next_sample:
            point = watch.sample(t_go)
            next_sample += opts.sample_s
            if now >= next_print:
                log(_progress_line(fleet, now - t_go, opts, point))
                next_print += opts.progress_s


def _level_result(
    target: Target,
    sessions: int,
    opts: LoadOptions,
    fleet: _Fleet,
    snaps: tuple[Snapshot, Snapshot, Snapshot, Snapshot],
    watch: ProcessWatch,
    scrapes: tuple[promscrape.Scrape | None, promscrape.Scrape | None],
    ramp_s: float,
) -> dict[str, Any]:
    base, idle, go, end = snaps
    exports = [r["recorder"] for r in fleet.results.values() if "recorder" in r]
    missing_workers = len(fleet.procs) - len(exports)
    client = stats.summarize_client(stats.merge_exports(exports))
    window = end.t - go.t
    worker_cpu = [r["cpu"].get("window_s", 0.0) for r in fleet.results.values() if r.get("cpu")]
    parent_cpu = end.self_cpu_s - go.self_cpu_s
    cpu = {role: pct for role, pct in cpu_pct(go, end).items() if is_server_role(role)}
    cpu["loadgen"] = round(100.0 * (sum(worker_cpu) + parent_cpu) / window, 1)
    cpu["loadgen_parent"] = round(100.0 * parent_cpu / window, 1)
    machine = end.machine.busy_pct_since(go.machine)
    cpu["machine"] = round(machine, 1) if machine is not None else 0.0
    irq = end.machine.irq_pct_since(go.machine)
    cpu["kernel_irq"] = round(irq, 1) if irq is not None else 0.0
    steal = end.machine.steal_pct_since(go.machine)
    cpu["steal"] = round(steal, 1) if steal is not None else 0.0
    ours = sum(pct for role, pct in cpu.items() if is_server_role(role))
    ours += cpu["loadgen"] + cpu["kernel_irq"]
    cpu["other"] = round(max(0.0, cpu["machine"] - ours), 1)  # processes not in this run
    peak = max(watch.timeline, key=lambda p: int(p["total_kib"]), default=None)
    peak_memory = peak["memory_kib"] if peak else end.memory
    ready = client["sessions_ready"] or 1
    memory = {  # "total": anon of every process + the shared rings once (tests.bench.watch)
        "base_kib": {**base.memory, "total": base.total_kib()},
        "idle_kib": {**idle.memory, "total": idle.total_kib()},
        "speaking_peak_kib": {**peak_memory, "total": total_kib(peak_memory)},
        "per_idle_session_kib": round((idle.total_kib() - base.total_kib()) / ready, 1),
        "per_speaking_session_kib": round((total_kib(peak_memory) - base.total_kib()) / ready, 1),
    }
    return {
        "target": target.describe(),
        "sessions": sessions,
        "workers": len(fleet.procs),
        "missing_workers": missing_workers,
        "options": asdict(opts),
        "ramp_s": round(ramp_s, 2),
        "window_s": round(window, 2),
        "client": client,
        "server": promscrape.summarize(*scrapes),
        "cpu_pct": cpu,
        "loadgen_cpu_s": {
            "workers": [r["cpu"] for r in fleet.results.values() if r.get("cpu")],
            "parent": round(parent_cpu, 3),
        },
        "memory": memory,
        "timeline": watch.timeline,
    }


def is_gateway_role(role: str) -> bool:
    """A gateway process: a single gateway, or one of a host's workers (``worker0``, ...)."""
    return role == "server" or role.startswith("worker")


def is_server_role(role: str) -> bool:
    """The processes of the server under test: the gateway process(es), its engine, and a
    host's supervisor."""
    return is_gateway_role(role) or role in ("engine", "supervisor")


def run_levels(
    make_target: Callable[[str, Path], Target],
    names: list[str],
    levels: list[int],
    opts: LoadOptions,
    work_dir: Path,
    log: Log = say,
) -> list[dict[str, Any]]:
    """For every level, every target in ``names`` (side by side), each on a fresh server."""
    results = []
    for n in levels:
        for name in names:
            results.append(_run_with_retries(make_target, name, n, opts, work_dir, log))
    return results


def _run_with_retries(
    make_target: Callable[[str, Path], Target],
    name: str,
    n: int,
    opts: LoadOptions,
    work_dir: Path,
    log: Log,
) -> dict[str, Any]:
    """One (server, level) run; on a shared machine, rerun it while other processes took
    more than ``opts.max_other_pct`` of the CPU, and keep the least disturbed attempt
    (every attempt's figure is recorded in ``attempts_other_cpu_pct``)."""
    attempts: list[dict[str, Any]] = []
    for attempt in range(1 + max(0, opts.retries)):
        target = make_target(name, work_dir / f"{name}-{n}-{attempt}")
        log(f"== {name}: {n} concurrent calls, {opts.duration_s:.0f} s window")
        try:
            target.start()
            level = run_level(target, n, opts, log)
            log(summary_line(level))
        except Exception as exc:  # one broken run must not lose the others
            log(f"  [{name} x{n}] FAILED: {exc!r}")
            return {"target": {"name": name}, "sessions": n, "failed": repr(exc)[:500]}
        finally:
            target.stop()
        attempts.append(level)
        other = level["cpu_pct"].get("other", 0.0)
        if opts.max_other_pct is None or other <= opts.max_other_pct:
            break
        log(f"  [{name} x{n}] other processes took {other:.0f}% of a core: disturbed")
    best = min(attempts, key=lambda lv: lv["cpu_pct"].get("other", 0.0))
    best["attempts_other_cpu_pct"] = [lv["cpu_pct"].get("other") for lv in attempts]
    return best


def completed(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The levels that ran to the end (failed runs only carry ``failed``)."""
    return [level for level in levels if "failed" not in level]


def summary_line(level: dict[str, Any]) -> str:
    c = level["client"]
    fa = c["first_audio_ms"]
    server = level["server"] or {}
    return (
        f"  => {level['target']['name']} x{level['sessions']}: first audio p50 {_fmt(fa['p50'])}"
        f" p99 {_fmt(fa['p99'])} ms; gap p99 {_fmt(c['gap_ms']['p99'])} ms; "
        f"run-ahead max {_fmt(c['run_ahead_ms']['max'])} ms; late frames {c['late_frames']};"
        f" underruns {server.get('underruns', 'n/a')}; errors {sum(c['errors'].values())};"
        f" cpu {level['cpu_pct']}"
    )


def _fmt(value: float | None) -> str:
    return "∞" if value is None else f"{value:.1f}"


def default_out_dir() -> Path:
    return ROOT / "bench-results" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def write_result(out: Path, body: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    path.write_text(json.dumps(body, indent=1, ensure_ascii=False))
    return path


def print_plots(paths: list[Path]) -> None:
    if not plots.available():
        print("no plots: matplotlib is not installed (.venv/bin/pip install matplotlib)")
    for png in paths:
        print(f"plot: {png}")


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark CLI shares."""
    parser.add_argument("--duration", type=float, default=30.0, help="window per level, s")
    parser.add_argument("--protocol", choices=sorted(DRIVERS), default="native")
    parser.add_argument("--think", type=float, nargs=2, default=(0.5, 2.0), metavar=("MIN", "MAX"))
    parser.add_argument(
        "--caller-audio",
        action="store_true",
        help="stream mu-law silence from every call (start has input_format mulaw_8000)",
    )
    parser.add_argument("--workers", type=int, default=None, help="load-generator processes")
    parser.add_argument("--ramp", type=float, default=200.0, help="new calls per second")
    parser.add_argument("--jitter-ms", type=float, default=20.0, help="late-frame threshold")
    parser.add_argument("--drain", type=float, default=10.0, help="max wait after the window")
    parser.add_argument("--engine", default="espeak", help="engine backend of our gateway")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="S",
        help="before each level wait up to S seconds for the machine to be idle",
    )
    parser.add_argument(
        "--max-other",
        type=float,
        default=None,
        metavar="PCT",
        help="rerun a level when other processes took more than PCT %% of a core",
    )
    parser.add_argument("--retries", type=int, default=2, help="reruns allowed by --max-other")
    parser.add_argument("--out", type=Path, default=None, help="result directory")
    parser.add_argument("--no-plots", action="store_true")


def options_from(args: argparse.Namespace) -> LoadOptions:
    return LoadOptions(
        duration_s=args.duration,
        protocol=args.protocol,
        think_min_s=args.think[0],
        think_max_s=args.think[1],
        caller_audio=args.caller_audio,
        workers=args.workers,
        ramp_per_s=args.ramp,
        jitter_ms=args.jitter_ms,
        drain_s=args.drain,
        quiet_wait_s=args.quiet_wait,
        max_other_pct=args.max_other,
        retries=args.retries if args.max_other is not None else 0,
    )


def target_factory(engine: str, slots_for: int) -> Callable[[str, Path], Target]:
    def make(name: str, log_dir: Path) -> Target:
        if name == "gateway":
            return GatewayTarget(log_dir, backend=engine, slots=max(512, slots_for))
        if name == "baseline":
            return BaselineTarget(log_dir)
        raise ValueError(f"unknown server {name!r}")

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sessions", type=int, nargs="+", default=[50])
    parser.add_argument("--server", choices=["gateway", "baseline"], default="gateway")
    parser.add_argument("--target", default=None, help="ws:// URL of a running gateway")
    parser.add_argument("--token", default=os.environ.get("LOADGEN_TOKEN"), help="bearer JWT")
    parser.add_argument("--server-pid", type=int, default=None, help="pid of --target's worker")
    add_load_options(parser)
    args = parser.parse_args(argv)
    stop_on_signals()
    opts = options_from(args)
    out = args.out or default_out_dir()
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="loadgen-") as tmp:
        if args.target:
            external = ExternalTarget(args.target, args.token, args.server_pid)
            levels = [run_level(external, n, opts) for n in args.sessions]
            for level in levels:
                print(summary_line(level))
        else:
            make = target_factory(args.engine, max(args.sessions))
            levels = run_levels(make, [args.server], args.sessions, opts, Path(tmp))
    body = {
        "command": " ".join(["python -m tests.bench.loadgen", *(argv or sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "revision": source_revision(str(ROOT)),
        "options": asdict(opts),
        "levels": levels,
    }
    path = write_result(out, body)
    print(f"result: {path}")
    if not args.no_plots:
        print_plots(plots.plot_all(completed(levels), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
