"""Scale-out: one gateway worker against several, and the cost of a relayed attach
(``make bench``).

    python -m tests.bench.scale_out --sessions 200 500 --duration 30   # the standard run
    python -m tests.bench.scale_out --sessions 50 --duration 10 --relay-samples 100 --no-docs

1. **Workers.** The same native load (each of ``--sessions`` calls, the standard mix of
   :mod:`tests.bench.loadgen`: English prompts, 0.5-2 s think time, mu-law, realtime
   pacing) against one gateway process (``GATEWAY_WORKERS`` unset) and against the host
   supervisor with ``--workers`` workers, each on a fresh host with its espeak engine.
   Per run: first audio p50/p99, frame interval p99, underruns (the gateway's counter),
   late frames and errors at the client, the CPU of each gateway process in the window,
   and calls per gateway core (calls over the gateway processes' CPU, in cores): the
   figure that carries to a host with more cores, since on this one the load generator
   and the engine share the same cores.
2. **Relayed attach.** One Twilio leg on a host of two workers, and two IVR applications
   attached to its call: one on the leg's worker, one on the other (relayed). Each sends
   ``--relay-samples`` marks on the idle call, alternately; a mark on an idle call comes
   back at once, so its round trip is the path's own cost. Reported: round-trip p50/p99
   of each, and the relayed one's added latency.

Writes ``bench-results/<time>/scale_out.json`` and the "Scale-out" section of
docs/benchmarks.md (``--no-docs`` to leave it).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench import report
from tests.bench.loadgen import (
    LoadOptions,
    default_out_dir,
    is_gateway_role,
    run_level,
    stop_on_signals,
)
from tests.bench.storm import gateway_cpu
from tests.bench.targets import GatewayTarget, HostTarget
from tests.integration.harness import NativeClient
from tests.integration.telephony_peers import attached_app, leg_on

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MARKERS = ("<!-- scale-out:begin -->", "<!-- scale-out:end -->")
STANDARD_SESSIONS, STANDARD_DURATION_S, STANDARD_SAMPLES = 500, 30.0, 1000
SCRAPES = 200


def run_workers(workers: int, sessions: int, opts: LoadOptions, work: Path) -> dict[str, Any]:
    """``sessions`` native calls against a fresh host of ``workers`` worker(s)."""
    env = {"GATEWAY_TENANT_MAX_STREAMS": str(sessions + 8)}
    slots = max(512, sessions + 8)
    target = (
        GatewayTarget(work / "1w", slots=slots, env=env)
        if workers == 1
        else HostTarget(work / f"{workers}w", workers=workers, slots=slots, env=env)
    )
    print(f"== {workers} worker(s): {sessions} native calls, {opts.duration_s:g} s", flush=True)
    target.start()
    try:
        level = run_level(target, sessions, opts)
        scrape = scrape_cost(target)
    finally:
        target.stop()
    return {**row(workers, level), "scrape": scrape}


def scrape_cost(target: GatewayTarget, scrapes: int = SCRAPES) -> dict[str, Any]:
    """``scrapes`` scrapes of ``/metrics`` one after another, after the load (every series
    it created is there): the time each took and the gateway CPU each cost (with several
    workers, whichever answered reads every worker's files)."""
    url = target.metrics_url
    assert url is not None
    cpu0 = gateway_cpu(target)
    times, size = [], 0
    for _ in range(scrapes):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as resp:
            size = len(resp.read())
        times.append((time.perf_counter() - started) * 1000)
    cpu = gateway_cpu(target) - cpu0
    arr = np.array(times)
    out = {
        "scrapes": scrapes,
        "p50_ms": round(float(np.percentile(arr, 50)), 2),
        "p99_ms": round(float(np.percentile(arr, 99)), 2),
        "gateway_cpu_ms_per_scrape": round(1000 * cpu / scrapes, 2),
        "bytes": size,
    }
    print(f"  => /metrics: {out}", flush=True)
    return out


def row(workers: int, level: dict[str, Any]) -> dict[str, Any]:
    client, cpu = level["client"], level["cpu_pct"]
    server = level.get("server") or {}
    gateway_cpu = {role: pct for role, pct in cpu.items() if is_gateway_role(role)}
    total = sum(gateway_cpu.values())
    ready = int(client["sessions_ready"])
    out = {
        "workers": workers,
        "machine_cpu_pct": cpu.get("machine"),
        "sessions": level["sessions"],
        "ready": ready,
        "first_audio_p50_ms": client["first_audio_ms"]["p50"],
        "first_audio_p99_ms": client["first_audio_ms"]["p99"],
        "gap_p99_ms": client["gap_ms"]["p99"],
        "underruns": server.get("underruns"),
        "late_frames": client["late_frames"],
        "errors": sum(client["errors"].values()),
        "error_codes": dict(client["errors"]),
        "gateway_cpu_pct": gateway_cpu,
        "gateway_cpu_total_pct": round(total, 1),
        "engine_cpu_pct": cpu.get("engine"),
        "supervisor_cpu_pct": cpu.get("supervisor"),
        "loadgen_cpu_pct": cpu.get("loadgen"),
        "calls_per_gateway_core": round(ready / (total / 100), 1) if total > 0 else None,
    }
    print(
        f"  => {workers} worker(s): first audio p50/p99 {out['first_audio_p50_ms']}/"
        f"{out['first_audio_p99_ms']} ms; gap p99 {out['gap_p99_ms']} ms; underruns "
        f"{out['underruns']}; late {out['late_frames']}; errors {out['error_codes']}; gateway CPU "
        f"{gateway_cpu}; calls per gateway core {out['calls_per_gateway_core']}",
        flush=True,
    )
    return out


async def _mark_rtt(app: NativeClient, name: str) -> float:
    sent = await app.send(type="mark", name=name)
    await app.wait_event("mark", name=name)
    arrived = next(t for t, e in app.got.events if e.get("type") == "mark" and e["name"] == name)
    return (arrived - sent) * 1000


async def _relay_latency(target: HostTarget, samples: int) -> dict[str, Any]:
    token = target.token()
    assert token is not None
    base = target.ws_url.removesuffix("/v1/stream")
    leg = await leg_on(f"{base}/v1/twilio", token, worker="0")
    local = await attached_app(target.ws_url, token, leg.call_sid, worker="0")
    relayed = await attached_app(target.ws_url, token, leg.call_sid, worker="1")
    times: dict[str, list[float]] = {"local": [], "relayed": []}
    try:
        for i in range(samples):
            for kind, app in (("local", local), ("relayed", relayed)):
                times[kind].append(await _mark_rtt(app, f"{kind}-{i}"))
    finally:
        for thing in (local, relayed, leg):
            await thing.aclose()
    out: dict[str, Any] = {"samples": samples}
    for kind, values in times.items():
        arr = np.array(values[min(20, samples // 10) :])  # the first few warm the path
        out[kind] = {
            "p50_ms": round(float(np.percentile(arr, 50)), 3),
            "p99_ms": round(float(np.percentile(arr, 99)), 3),
        }
    out["added_p50_ms"] = round(out["relayed"]["p50_ms"] - out["local"]["p50_ms"], 3)
    out["added_p99_ms"] = round(out["relayed"]["p99_ms"] - out["local"]["p99_ms"], 3)
    return out


def run_relay(samples: int, work: Path) -> dict[str, Any]:
    target = HostTarget(work / "relay", workers=2, env={"ENGINE_VAD": "0"})
    print(f"== relayed attach: {samples} marks each way", flush=True)
    target.start()
    try:
        result = asyncio.run(_relay_latency(target, samples))
    finally:
        target.stop()
    print(
        f"  => mark round trip local p50/p99 {result['local']['p50_ms']}/"
        f"{result['local']['p99_ms']} ms, relayed {result['relayed']['p50_ms']}/"
        f"{result['relayed']['p99_ms']} ms: added p99 {result['added_p99_ms']} ms",
        flush=True,
    )
    return result


def render(body: dict[str, Any]) -> str:
    lines = [
        report.generated_line(body),
        "",
    ]
    if max(body["sessions"]) < STANDARD_SESSIONS or body["duration_s"] < STANDARD_DURATION_S:
        lines += [
            f"**Smoke run** ({body['sessions']} calls, {body['duration_s']:g} s): it shows the "
            "benchmark works, it is not the measurement (`python -m tests.bench.scale_out "
            f"--sessions 200 {STANDARD_SESSIONS} --duration {STANDARD_DURATION_S:g}`).",
            "",
        ]
    lines += [
        *report.provenance_lines(body),
        "",
        "Native calls (standard mix, espeak, realtime mu-law), each run on a fresh host: one "
        "gateway process, then the host supervisor with its workers on one port. Gateway CPU: "
        "each gateway process in the window, % of one core; machine: both cores together (the "
        "engine and the load generator share them). Calls per gateway core: calls set up over "
        "the gateway processes' CPU in cores. Late: frames later than 20 ms at the client.",
        "",
        "| calls | workers | set up | first audio p50 / p99 (ms) | gap p99 (ms) | underruns "
        "/ late | errors | gateway CPU % per worker | engine CPU % | machine CPU % "
        "| calls per gateway core |",
        "|---:|---:|---:|---|---:|---|---:|---|---:|---:|---:|",
    ]
    for r in body["rows"]:
        if "failed" in r:
            lines.append(
                f"| {r['sessions']} | {r['workers']} | failed: `{r['failed'][:120]}` "
                "| | | | | | | | |"
            )
            continue
        per_worker = ", ".join(f"{v:g}" for v in r["gateway_cpu_pct"].values())
        lines.append(
            f"| {r['sessions']} | {r['workers']} | {r['ready']} | {r['first_audio_p50_ms']} / "
            f"{r['first_audio_p99_ms']} | {r['gap_p99_ms']} | {r['underruns']} / "
            f"{r['late_frames']} | {r['errors']} | {per_worker} | {r['engine_cpu_pct']} "
            f"| {r['machine_cpu_pct']} | {r['calls_per_gateway_core']} |"
        )
    scraped = [r for r in body["rows"] if "scrape" in r]
    if scraped:
        lines += [
            "",
            f"`/metrics` after each run ({scraped[0]['scrape']['scrapes']} scrapes in a row):",
        ]
        for r in scraped:
            sc = r["scrape"]
            lines.append(
                f"- {r['sessions']} calls, {r['workers']} worker(s): p50 {sc['p50_ms']} ms, "
                f"p99 {sc['p99_ms']} ms, {sc['gateway_cpu_ms_per_scrape']} ms of gateway CPU "
                f"per scrape, {sc['bytes']} bytes"
            )
    relay = body.get("relay")
    if relay and "failed" not in relay:
        lines += [
            "",
            f"Relayed attach ({relay['samples']} marks each way on an idle call, host of two "
            "workers; a mark on an idle call is echoed at once): round trip from the leg's "
            f"own worker p50 {relay['local']['p50_ms']} ms, p99 {relay['local']['p99_ms']} ms;"
            f" from the other worker p50 {relay['relayed']['p50_ms']} ms, p99 "
            f"{relay['relayed']['p99_ms']} ms: the relay adds {relay['added_p50_ms']} ms at "
            f"p50 and {relay['added_p99_ms']} ms at p99.",
        ]
    elif relay:
        lines += ["", f"Relayed attach: failed: `{relay['failed'][:200]}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[200, STANDARD_SESSIONS])
    parser.add_argument("--duration", type=float, default=STANDARD_DURATION_S)
    parser.add_argument("--workers", type=int, default=2, help="workers of the host run")
    parser.add_argument("--relay-samples", type=int, default=STANDARD_SAMPLES)
    parser.add_argument("--quiet-wait", type=float, default=0.0, metavar="S")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_signals()
    out = args.out or default_out_dir()
    work = out / "work"
    body: dict[str, Any] = report.provenance("tests.bench.scale_out", argv)
    body.update(sessions=args.sessions, duration_s=args.duration, rows=[])
    opts = LoadOptions(duration_s=args.duration, quiet_wait_s=args.quiet_wait)
    for sessions in args.sessions:
        for workers in (1, args.workers):
            try:
                body["rows"].append(run_workers(workers, sessions, opts, work / str(sessions)))
            except Exception as exc:  # one failed run must not lose the others
                print(f"  [{sessions} x {workers} workers] FAILED: {exc!r}", flush=True)
                body["rows"].append({"sessions": sessions, "workers": workers, "failed": repr(exc)})
    started = time.monotonic()
    try:
        body["relay"] = run_relay(args.relay_samples, work)
    except Exception as exc:
        print(f"  [relay] FAILED: {exc!r}", flush=True)
        body["relay"] = {"failed": repr(exc)}
    body["relay_s"] = round(time.monotonic() - started, 1)
    report.publish(
        out,
        "scale_out.json",
        body,
        render(body),
        docs=DOCS,
        markers=MARKERS,
        update_docs=not args.no_docs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
