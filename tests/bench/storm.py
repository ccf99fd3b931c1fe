"""Reconnect storm: a surge of new sessions while established calls speak (``make bench``).

    python -m tests.bench.storm --established 100 200 --storm 1000 --over 1.0   # standard
    python -m tests.bench.storm --established 50 --storm 200 --no-docs      # a smoke run

When an instance fails, every IVR media server it served reconnects at once to the
others. Each run (a fresh gateway each time, espeak, realtime mu-law): ``--established``
native calls (each count given) speak the standard prompts for ``--duration`` seconds
(the load generator of :mod:`tests.bench.loadgen`); once they are all up, and
``--delay`` seconds into their window, ``--storm`` new sessions connect within
``--over`` seconds (evenly spread), each sending ``start`` and waiting for ``ready``;
they stay connected ``--hold`` seconds, then close. Reported:

- the storm: sessions ready, and their time from connecting to ``ready`` (p50, p99, max);
  refusals by code; the gateway's CPU during the storm above its rate just before, per
  session (the cost of accepting and starting one: the upgrade, the token check, the
  engine slot, the tenant lease);
- the established calls, the same load with and without the storm: first audio p50/p99,
  frame gap p99, late frames (beyond 20 ms), underruns, errors.

Goals (issue 15): all sessions ready within 2 s; the established calls keep first audio
p99 at most 100 ms and no underrun. Writes ``bench-results/<time>/storm.json`` and the
"Reconnect storm" section of docs/benchmarks.md (``--no-docs`` to leave it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from tests.bench import promscrape, report
from tests.bench.loadgen import (
    LoadOptions,
    default_out_dir,
    is_gateway_role,
    run_level,
    stop_on_signals,
)
from tests.bench.procstat import cpu_seconds
from tests.bench.targets import GatewayTarget, HostTarget, Target

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MARKERS = ("<!-- storm:begin -->", "<!-- storm:end -->")
STANDARD = {"established": 200, "storm": 1000, "over": 1.0}
START = json.dumps({"type": "start", "voice": "en-us", "format": "mulaw_8000"})


def gateway_cpu(target: Target) -> float:
    return sum(
        cpu_seconds(pid) or 0.0 for role, pid in target.processes().items() if is_gateway_role(role)
    )


def active_sessions(metrics_url: str) -> float:
    scrape = promscrape.fetch(metrics_url)
    values = scrape.values if scrape is not None else {}
    return sum(v for k, v in values.items() if k.startswith("gateway_sessions_active{"))


@dataclass
class StormResult:
    ready_ms: list[float] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    span_s: float = 0.0
    gateway_cpu_s: float = 0.0
    gateway_cpu_rate_before: float = 0.0  # cores, in the seconds before the storm

    def count(self, refusal: str) -> None:
        self.refused[refusal] = self.refused.get(refusal, 0) + 1


async def _one(
    http: aiohttp.ClientSession, url: str, token: str, at: float, hold_until: asyncio.Event,
    out: StormResult,
) -> None:  # fmt: skip
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    t0 = time.monotonic()
    try:
        async with http.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send_str(START)
            while True:
                msg = await ws.receive(timeout=30)
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    out.count(f"closed {ws.close_code}")
                    return
                event = json.loads(msg.data)
                if event.get("type") == "ready":
                    out.ready_ms.append((time.monotonic() - t0) * 1000)
                    break
                if event.get("type") == "error":
                    out.count(str(event.get("code")))
                    return
            await hold_until.wait()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        out.count(type(exc).__name__)


async def _storm(target: Target, count: int, over_s: float, hold_s: float) -> StormResult:
    out = StormResult()
    token = target.token(max_streams=count + 1000)
    assert token is not None
    before_t, before_cpu = time.monotonic(), gateway_cpu(target)
    await asyncio.sleep(2.0)
    now, cpu_now = time.monotonic(), gateway_cpu(target)
    out.gateway_cpu_rate_before = (cpu_now - before_cpu) / (now - before_t)
    hold = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        start = time.monotonic() + 0.05
        out.started_at = time.time()
        cpu0 = gateway_cpu(target)
        tasks = [
            asyncio.create_task(
                _one(http, target.ws_url, token, start + over_s * i / count, hold, out)
            )
            for i in range(count)
        ]
        deadline = start + over_s + 30.0
        while len(out.ready_ms) + sum(out.refused.values()) < count:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        out.span_s = time.monotonic() - start
        out.gateway_cpu_s = gateway_cpu(target) - cpu0
        await asyncio.sleep(hold_s)
        hold.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


def _storm_thread(
    target: Target, args: argparse.Namespace, established: int, box: dict[str, Any]
) -> None:
    """Wait for the established calls, then ``--delay`` seconds, then storm."""
    try:
        assert target.metrics_url is not None
        deadline = time.monotonic() + 120
        while active_sessions(target.metrics_url) < established:
            if time.monotonic() > deadline:
                raise TimeoutError("the established calls did not come up")
            time.sleep(0.2)
        time.sleep(args.delay)
        box["storm"] = asyncio.run(_storm(target, args.storm, args.over, args.hold))
    except Exception as exc:
        box["error"] = repr(exc)


def make_target(args: argparse.Namespace, established: int, work: Path, name: str) -> Target:
    sessions = established + args.storm
    env = {
        "GATEWAY_TENANT_MAX_STREAMS": str(sessions + 16),
        "ENGINE_VAD": "0",
    }
    slots = max(512, sessions + 16)
    if args.workers > 1:
        return HostTarget(work / name, workers=args.workers, slots=slots, env=env)
    return GatewayTarget(work / name, slots=slots, env=env)


def established_row(level: dict[str, Any]) -> dict[str, Any]:
    client = level["client"]
    server = level.get("server") or {}
    return {
        "ready": client["sessions_ready"],
        "first_audio_p50_ms": client["first_audio_ms"]["p50"],
        "first_audio_p99_ms": client["first_audio_ms"]["p99"],
        "gap_p99_ms": client["gap_ms"]["p99"],
        "late_frames": client["late_frames"],
        "underruns": server.get("underruns"),
        "errors": dict(client["errors"]),
        "pacer_tick_lag_p99_ms": ((server.get("pacer_tick_lag_ms") or {}).get("p99") or {}).get(
            "estimate"
        ),
        "cpu_pct": level["cpu_pct"],
    }


def run(args: argparse.Namespace, established: int, work: Path, with_storm: bool) -> dict[str, Any]:
    name = f"{established}-{'storm' if with_storm else 'calm'}"
    target = make_target(args, established, work, name)
    print(
        f"== {established} calls, {'with' if with_storm else 'without'} a storm of "
        f"{args.storm} sessions in {args.over:g} s ({args.workers} worker(s))",
        flush=True,
    )
    target.start()
    box: dict[str, Any] = {}
    try:
        thread = None
        if with_storm:
            thread = threading.Thread(target=_storm_thread, args=(target, args, established, box))
            thread.start()
        opts = LoadOptions(duration_s=args.duration, ramp_per_s=established / 2)
        level = run_level(target, established, opts)
        if thread is not None:
            thread.join(120)
    finally:
        target.stop()
    row: dict[str, Any] = {
        "calls": established,
        "storm": with_storm,
        "established": established_row(level),
    }
    if "error" in box:
        row["storm_failed"] = box["error"]
    storm: StormResult | None = box.get("storm")
    if storm is not None:
        ready = np.array(storm.ready_ms) if storm.ready_ms else np.array([np.inf])
        extra_cpu = storm.gateway_cpu_s - storm.gateway_cpu_rate_before * storm.span_s
        row["sessions"] = {
            "count": args.storm,
            "ready": len(storm.ready_ms),
            "ready_within_2s": int(np.sum(ready <= 2000)),
            "ready_p50_ms": round(float(np.percentile(ready, 50)), 1),
            "ready_p99_ms": round(float(np.percentile(ready, 99)), 1),
            "ready_max_ms": round(float(np.max(ready)), 1),
            "refused": storm.refused,
            "span_s": round(storm.span_s, 2),
            "gateway_cpu_ms_per_session": round(1000 * extra_cpu / max(1, args.storm), 3),
        }
    e = row["established"]
    print(
        f"  => established: first audio p50/p99 {e['first_audio_p50_ms']}/"
        f"{e['first_audio_p99_ms']} ms; gap p99 {e['gap_p99_ms']} ms; late {e['late_frames']};"
        f" underruns {e['underruns']}; errors {e['errors']}; pacer lag p99 "
        f"{e['pacer_tick_lag_p99_ms']} ms; CPU {e['cpu_pct']}",
        flush=True,
    )
    if "sessions" in row:
        s = row["sessions"]
        print(
            f"  => storm: {s['ready']}/{s['count']} ready ({s['ready_within_2s']} within 2 s);"
            f" ready p50/p99/max {s['ready_p50_ms']}/{s['ready_p99_ms']}/{s['ready_max_ms']} "
            f"ms; refused {s['refused']}; gateway CPU {s['gateway_cpu_ms_per_session']} ms per "
            "session",
            flush=True,
        )
    return row


def render(body: dict[str, Any]) -> str:
    lines = [
        report.generated_line(body),
        "",
    ]
    if max(body["established"]) < STANDARD["established"] or body["storm"] < STANDARD["storm"]:
        lines += [
            "**Smoke run**: it shows the benchmark works, it is not the measurement "
            "(`python -m tests.bench.storm --established 100 200 --storm 1000 --over 1`).",
            "",
        ]
    lines += [
        *report.provenance_lines(body),
        "",
        f"Established native calls speak for {body['duration_s']:g} s "
        f"({body['workers']} gateway worker(s), espeak, realtime mu-law); in one run, "
        f"{body['storm']} new sessions connect within {body['over']:g} s, each sending "
        "`start` and waiting for `ready`.",
        "",
        "| calls | run | established: first audio p50 / p99 (ms) | gap p99 (ms) | late frames | "
        "underruns | errors | pacer lag p99 (ms) | machine CPU % | storm: ready (within 2 s) "
        "| ready p50 / p99 / max (ms) | refused | gateway CPU per new session (ms) |",
        "|---:|---|---|---:|---:|---:|---|---:|---:|---|---|---|---:|",
    ]
    for r in body["rows"]:
        e = r["established"]
        s = r.get("sessions")
        storm_cells = (
            f"{s['ready']}/{s['count']} ({s['ready_within_2s']}) | {s['ready_p50_ms']} / "
            f"{s['ready_p99_ms']} / {s['ready_max_ms']} | {s['refused'] or 0} | "
            f"{s['gateway_cpu_ms_per_session']}"
            if s
            else (
                f"failed: `{r['storm_failed'][:80]}` | | |"
                if "storm_failed" in r
                else "- | - | - | -"
            )
        )
        lines.append(
            f"| {r['calls']} | {'storm' if r['storm'] else 'no storm'} | "
            f"{e['first_audio_p50_ms']} / "
            f"{e['first_audio_p99_ms']} | {e['gap_p99_ms']} | {e['late_frames']} | "
            f"{e['underruns']} | {sum(e['errors'].values())} | {e['pacer_tick_lag_p99_ms']} "
            f"| {e['cpu_pct'].get('machine')} | {storm_cells} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--established", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--storm", type=int, default=STANDARD["storm"])
    parser.add_argument("--over", type=float, default=STANDARD["over"], help="seconds")
    parser.add_argument("--duration", type=float, default=30.0, help="the calls' window, s")
    parser.add_argument("--delay", type=float, default=12.0, help="storm after, s")
    parser.add_argument("--hold", type=float, default=3.0, help="storm sessions stay, s")
    parser.add_argument("--workers", type=int, default=1, help="GATEWAY_WORKERS")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_signals()
    out = args.out or default_out_dir()
    body: dict[str, Any] = report.provenance("tests.bench.storm", argv)
    body.update(
        established=args.established, storm=args.storm, over=args.over,
        duration_s=args.duration, workers=args.workers, rows=[],
    )  # fmt: skip
    for established in args.established:
        for with_storm in (False, True):
            try:
                body["rows"].append(run(args, established, out / "work", with_storm))
            except Exception as exc:
                print(f"  FAILED: {exc!r}", flush=True)
                body.setdefault("failed", []).append(repr(exc))
    report.publish(
        out,
        "storm.json",
        body,
        render(body),
        docs=DOCS,
        markers=MARKERS,
        update_docs=not args.no_docs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
