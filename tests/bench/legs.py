"""Telephony legs side by side: the same calls over every leg, one after another
(``make bench``).

    python -m tests.bench.legs --calls 100 --duration 30     # the standard run, ~8 minutes
    python -m tests.bench.legs --calls 20 --duration 20 --no-docs
    python -m tests.bench.legs --legs twilio jambonz freeswitch

For each leg in ``--legs`` (default: every one, Twilio first, the reference), on a fresh
gateway each time (this build, espeak, VAD on, ``LOG_LEVEL=WARNING``): ``--calls``
concurrent calls, each a leg of that protocol whose far end (the simulated vendor of
:mod:`tests.bench.calls`) streams caller audio (silence) every 20 ms for the whole call,
and an IVR application attached over the native protocol (``start`` with ``call``)
speaking the standard English prompts with think time until the window ends:

- ``twilio``: Twilio Media Streams (``/v1/twilio``, mu-law in JSON ``media`` events);
- ``asterisk``: Asterisk chan_websocket (``/v1/asterisk``, mu-law binary frames);
- ``jambonz``: jambonz ``listen`` (``/v1/jambonz``, L16 binary frames);
- ``freeswitch``: FreeSWITCH mod_audio_stream (``/v1/freeswitch``, ``streamAudio`` JSON
  messages of 100 ms of base64 L16: its interval figures are per 100 ms message);
- ``audiosocket``: Asterisk AudioSocket (TCP, ``GATEWAY_AUDIOSOCKET_LISTEN``, slin);
- ``sip``: SIP and RTP (INVITE to route ``app``, PCMU), as in :mod:`tests.bench.sip_calls`.

Per leg: calls set up and completed (still up, no prompt failed, at the end), the audio
interval p50/p99 at the far end (the load generator's inter-arrival of audio messages),
underruns (the gateway's counter, and late frames at the far end), first audio p50/p99
(the application's ``speak`` to the leg's first audio), the gateway process's CPU % in
the window and per call, and that per-call CPU over the Twilio leg's. Writes
``bench-results/<time>/legs.json`` and the "Telephony legs side by side" section of
docs/benchmarks.md (``--no-docs`` to leave it).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.bench import report
from tests.bench.calls import DRIVERS
from tests.bench.loadgen import LoadOptions, default_out_dir, run_level, stop_on_signals
from tests.bench.targets import GatewayTarget

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MARKERS = ("<!-- legs:begin -->", "<!-- legs:end -->")
LEGS = ("twilio", "asterisk", "jambonz", "freeswitch", "audiosocket", "sip")
REFERENCE = "twilio"
#: Below these, the docs block says it is a smoke run, not the measurement.
STANDARD_CALLS, STANDARD_DURATION_S = 100, 30.0
VOICE = "en-us"


def run_leg(protocol: str, calls: int, opts: LoadOptions, work: Path) -> dict[str, Any]:
    """``calls`` calls over ``protocol`` on a fresh gateway; the leg's row."""
    # Calls without a token (AudioSocket, SIP) are the trusted network's tenant
    # ("loadgen"), held to GATEWAY_TENANT_MAX_STREAMS, provisioned here; the others carry
    # a max_streams claim. AudioSocket calls speak the listener's voice.
    target = GatewayTarget(
        work / protocol,
        slots=max(512, calls + 8),
        env={
            "GATEWAY_TENANT_MAX_STREAMS": str(max(100, calls + 8)),
            "GATEWAY_AUDIOSOCKET_VOICE": opts.voices[0],
        },
    )
    print(f"== {protocol}: {calls} concurrent calls, {opts.duration_s:g} s window", flush=True)
    target.start()
    try:
        level = run_level(target, calls, replace(opts, protocol=protocol))
    finally:
        target.stop()
    return summary(protocol, level)


def summary(protocol: str, level: dict[str, Any]) -> dict[str, Any]:
    client = level["client"]
    server = level.get("server") or {}
    cpu = level["cpu_pct"]
    server_cpu = float(cpu.get("server") or 0.0)
    ready = int(client["sessions_ready"])
    row: dict[str, Any] = {
        "protocol": protocol,
        "calls": level["sessions"],
        "ready": ready,
        "completed": client["calls_completed"],
        "frame_ms": round(DRIVERS[protocol].frame_s * 1000),
        "interval_p50_ms": client["gap_ms"]["p50"],
        "interval_p99_ms": client["gap_ms"]["p99"],
        "interval_max_ms": client["gap_ms"]["max"],
        "run_ahead_max_ms": client["run_ahead_ms"]["max"],
        "underruns": server.get("underruns"),
        "late_frames": client["late_frames"],
        "first_audio_p50_ms": client["first_audio_ms"]["p50"],
        "first_audio_p99_ms": client["first_audio_ms"]["p99"],
        "utterances": client["utterances"],
        "server_cpu_pct": server_cpu,
        "engine_cpu_pct": cpu.get("engine"),
        "loadgen_cpu_pct": cpu.get("loadgen"),
        "machine_cpu_pct": cpu.get("machine"),
        "server_cpu_per_call_pct": round(server_cpu / max(ready, 1), 3),
        "errors": client["errors"],
        "bad_size_frames": client["bad_size_frames"],
        "stray_frames": client["stray_frames"],
        "tail_frames": client["tail_frames"],
    }
    print(
        f"  => {protocol} x{row['calls']}: ready {ready}, completed {row['completed']}; "
        f"interval p50/p99 {row['interval_p50_ms']}/{row['interval_p99_ms']} ms per "
        f"{row['frame_ms']} ms message; underruns {row['underruns']}, late frames "
        f"{row['late_frames']}; first audio p50/p99 {row['first_audio_p50_ms']}/"
        f"{row['first_audio_p99_ms']} ms; gateway CPU {server_cpu}% "
        f"({row['server_cpu_per_call_pct']}% per call); errors {sum(row['errors'].values())}",
        flush=True,
    )
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's CPU per call over the reference leg's (None without it)."""
    ref = next((r for r in rows if r["protocol"] == REFERENCE and "failed" not in r), None)
    base = ref["server_cpu_per_call_pct"] if ref else None
    for r in rows:
        per_call = r.get("server_cpu_per_call_pct")
        r["cpu_per_call_vs_twilio"] = (
            round(per_call / base, 2) if base and per_call is not None else None
        )


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _errors(errors: dict[str, int]) -> str:
    total = sum(errors.values())
    if not total:
        return "0"
    top = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    return f"{total} ({', '.join(f'{code} {n}' for code, n in top)})"


def render(body: dict[str, Any]) -> str:
    lines = [
        report.generated_line(body),
        "",
    ]
    if body["calls"] < STANDARD_CALLS or body["duration_s"] < STANDARD_DURATION_S:
        lines += [
            f"**Smoke run** ({body['calls']} calls per leg, {body['duration_s']:g} s "
            "windows): it shows the benchmark works, it is not the measurement (figures at "
            "this size, the CPU ratios above all, vary from run to run). The measurement is "
            f"`python -m tests.bench.legs --calls {STANDARD_CALLS} "
            f"--duration {STANDARD_DURATION_S:g}`.",
            "",
        ]
    lines += [
        *report.provenance_lines(body),
        "",
        f"{body['calls']} concurrent calls per leg, one leg after another, each on a fresh "
        "gateway of the same build (espeak, VAD on). Each call: the leg's far end streams "
        "caller audio (silence) every 20 ms; an IVR application attached over the native "
        "protocol speaks the standard English prompts with 0.5-2 s think time. Interval: "
        "inter-arrival of audio messages at the far end, per 20 ms message except "
        "**FreeSWITCH, whose figures are per 100 ms `streamAudio` message**. Underruns: the "
        "gateway's counter / frames late at the far end (beyond a 20 ms jitter buffer). "
        "Gateway CPU: the gateway process in the window (the engine's is the same work on "
        "every leg and is left out); per call: over the calls set up.",
        "",
        "| leg | calls | set up / completed | interval p50 / p99 (ms) | underruns / late "
        "| first audio p50 / p99 (ms) | gateway CPU % | CPU % per call | per call vs Twilio "
        "| errors |",
        "|---|---:|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in body["rows"]:
        if "failed" in r:
            lines.append(
                f"| {r['protocol']} | {r['calls']} | failed: `{r['failed'][:120]}` | | | | | | | |"
            )
            continue
        leg = r["protocol"] + (" (per 100 ms)" if r["frame_ms"] != 20 else "")
        lines.append(
            f"| {leg} | {r['calls']} | {r['ready']} / {r['completed']} "
            f"| {_cell(r['interval_p50_ms'])} / {_cell(r['interval_p99_ms'])} "
            f"| {_cell(r['underruns'])} / {r['late_frames']} "
            f"| {_cell(r['first_audio_p50_ms'])} / {_cell(r['first_audio_p99_ms'])} "
            f"| {r['server_cpu_pct']} | {r['server_cpu_per_call_pct']} "
            f"| {_cell(r['cpu_per_call_vs_twilio'])} | {_errors(r['errors'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--calls", type=int, default=STANDARD_CALLS, help="per leg")
    parser.add_argument("--duration", type=float, default=STANDARD_DURATION_S, help="s")
    parser.add_argument("--legs", nargs="+", choices=LEGS, default=list(LEGS))
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        metavar="S",
        help="before each leg wait up to S seconds for the machine to be idle",
    )
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_signals()
    out = args.out or default_out_dir()
    work = out / "work"
    body: dict[str, Any] = report.provenance("tests.bench.legs", argv)
    body.update(calls=args.calls, duration_s=args.duration, rows=[])
    opts = LoadOptions(
        duration_s=args.duration,
        voices=(VOICE,),
        caller_audio=True,
        quiet_wait_s=args.quiet_wait,
    )
    for protocol in dict.fromkeys(args.legs):
        try:
            body["rows"].append(run_leg(protocol, args.calls, opts, work))
        except Exception as exc:  # one broken leg must not lose the others
            print(f"  [{protocol}] FAILED: {exc!r}", flush=True)
            body["rows"].append({"protocol": protocol, "calls": args.calls, "failed": repr(exc)})
    add_ratios(body["rows"])
    report.publish(
        out,
        "legs.json",
        body,
        render(body),
        docs=DOCS,
        markers=MARKERS,
        update_docs=not args.no_docs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
