"""SIP calls against Twilio legs, side by side (``make bench``).

    python -m tests.bench.sip_calls                      # 100 and 200 calls, ~6 minutes
    python -m tests.bench.sip_calls --levels 50 --duration 20 --no-docs

For each level N, on a fresh gateway each time (espeak, VAD on): N SIP calls
(:class:`tests.bench.calls.SipCall`: INVITE to route ``app``, caller audio as RTP, an
attached application speaking the standard English prompts), then the same N calls as
Twilio Media Streams legs (:class:`tests.bench.calls.TwilioCall`). Measured at the
receiving end of each call: the packet interval p99 (the load generator's inter-frame
gaps), RFC 3550 interarrival jitter (per call, p99 over calls), packets lost (sequence
numbers), SIP set-up time (INVITE to 200 OK; for Twilio, the WebSocket upgrade), and the
gateway's CPU per call, whose ratio is what a SIP leg costs against a Twilio leg.

Goal on this machine: 200 SIP calls with interval p99 <= 30 ms, jitter p99 <= 20 ms and
no packet lost. Writes ``bench-results/<time>/sip.json`` and the SIP section of
docs/benchmarks.md (``--no-docs`` to leave it).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.bench import report
from tests.bench.loadgen import LoadOptions, default_out_dir, run_level, stop_on_signals
from tests.bench.targets import GatewayTarget

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MARKERS = ("<!-- sip:begin -->", "<!-- sip:end -->")
INTERVAL_P99_MS, JITTER_P99_MS = 30.0, 20.0


def run(protocol: str, sessions: int, opts: LoadOptions, work: Path) -> dict[str, Any]:
    # A SIP call has no token to carry a max_streams claim: its tenant (the trusted
    # network's, "loadgen") is held to GATEWAY_TENANT_MAX_STREAMS, provisioned here.
    target = GatewayTarget(
        work / f"{protocol}-{sessions}",
        slots=max(512, sessions + 8),
        env={"GATEWAY_TENANT_MAX_STREAMS": str(max(100, sessions + 8))},
    )
    target.start()
    try:
        level = run_level(target, sessions, replace(opts, protocol=protocol))
    finally:
        target.stop()
    return summary(protocol, level)


def summary(protocol: str, level: dict[str, Any]) -> dict[str, Any]:
    client = level["client"]
    rtp = client.get("rtp", {})
    server_cpu = float(level["cpu_pct"].get("server") or 0.0)
    ready = int(client["sessions_ready"])
    row = {
        "protocol": protocol,
        "sessions": level["sessions"],
        "ready": ready,
        "interval_p99_ms": client["gap_ms"]["p99"],
        "interval_p999_ms": client["gap_ms"]["p99.9"],
        "jitter_p99_ms": (rtp.get("jitter_ms") or {}).get("p99"),
        "lost": rtp.get("lost"),
        "packets": rtp.get("packets"),
        "late_frames": client["late_frames"],
        "setup_p50_ms": client["setup_ms"]["p50"],
        "setup_p99_ms": client["setup_ms"]["p99"],
        "first_audio_p99_ms": client["first_audio_ms"]["p99"],
        "errors": sum(client["errors"].values()),
        "cpu_pct": level["cpu_pct"],
        "server_cpu_per_call_pct": round(server_cpu / max(ready, 1), 3),
    }
    row["meets"] = bool(
        protocol == "sip"
        and ready == level["sessions"]
        and row["interval_p99_ms"] is not None
        and row["interval_p99_ms"] <= INTERVAL_P99_MS
        and row["jitter_p99_ms"] is not None
        and row["jitter_p99_ms"] <= JITTER_P99_MS
        and row["lost"] == 0
        and row["errors"] == 0
    )
    print(
        f"  => {protocol} x{level['sessions']}: ready {ready}; interval p99 "
        f"{row['interval_p99_ms']} ms; jitter p99 {row['jitter_p99_ms']} ms; lost "
        f"{row['lost']}; setup p50/p99 {row['setup_p50_ms']}/{row['setup_p99_ms']} ms; "
        f"gateway CPU {server_cpu}% ({row['server_cpu_per_call_pct']}% per call); errors "
        f"{row['errors']}",
        flush=True,
    )
    return row


def render(body: dict[str, Any]) -> str:
    lines = [
        report.generated_line(body),
        "",
        *report.provenance_lines(body),
        "",
        "Each call: the standard English prompts spoken by an attached application, caller "
        "audio (silence) streaming back, VAD on. SIP: INVITE to route `app`, RTP; Twilio: a "
        "`/v1/twilio` leg. Goal for SIP: interval p99 <= 30 ms, jitter p99 <= 20 ms, nothing "
        "lost.",
        "",
        "| leg | calls | ready | interval p99 / p99.9 (ms) | jitter p99 (ms) | lost / packets "
        "| set-up p50 / p99 (ms) | gateway CPU % (per call) | errors | meets |",
        "|---|---:|---:|---|---:|---|---|---|---:|---|",
    ]
    for r in body["rows"]:
        lost = "-" if not r["packets"] else f"{r['lost']} / {r['packets']}"  # RTP legs only
        jitter = "-" if r["jitter_p99_ms"] is None else r["jitter_p99_ms"]
        lines.append(
            f"| {r['protocol']} | {r['sessions']} | {r['ready']} | {r['interval_p99_ms']} / "
            f"{r['interval_p999_ms']} | {jitter} | {lost} | "
            f"{r['setup_p50_ms']} / {r['setup_p99_ms']} | "
            f"{r['cpu_pct'].get('server')} ({r['server_cpu_per_call_pct']}) | {r['errors']} | "
            f"{'yes' if r['meets'] else ('-' if r['protocol'] != 'sip' else 'no')} |"
        )
    for ratio in body.get("ratios", []):
        lines += [
            "",
            f"At {ratio['sessions']} calls a SIP leg costs the gateway {ratio['sip_over_twilio']}"
            " times the CPU of a Twilio leg.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--no-twilio", action="store_true", help="SIP only")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_signals()
    out = args.out or default_out_dir()
    work = out / "work"
    body: dict[str, Any] = report.provenance("tests.bench.sip_calls", argv)
    body["rows"], body["ratios"] = [], []
    opts = LoadOptions(duration_s=args.duration, voices=("en-us",), caller_audio=True)
    for sessions in args.levels:
        sip = run("sip", sessions, opts, work)
        body["rows"].append(sip)
        if not args.no_twilio:
            twilio = run("twilio", sessions, opts, work)
            body["rows"].append(twilio)
            if twilio["server_cpu_per_call_pct"]:
                body["ratios"].append(
                    {
                        "sessions": sessions,
                        "sip_over_twilio": round(
                            sip["server_cpu_per_call_pct"] / twilio["server_cpu_per_call_pct"], 2
                        ),
                    }
                )
    report.publish(
        out,
        "sip.json",
        body,
        render(body),
        docs=DOCS,
        markers=MARKERS,
        update_docs=not args.no_docs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
