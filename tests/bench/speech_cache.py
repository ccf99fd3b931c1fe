"""The speech cache under a bank IVR's call mix (issue 27), cache off and on side by side.

    python -m tests.bench.speech_cache                          # en, 20/100/200 calls, burst 30
    python -m tests.bench.speech_cache --langs en zh --calls 20 100 --duration 30
    python -m tests.bench.speech_cache --langs en --calls 2 --burst 3 --duration 4   # smoke

The mix (written down here, reported with the results): each prompt is one of a bank
IVR's 8 fixed prompts (3-6 s of speech: greeting, menu, hold, transfer, goodbye;
:data:`FIXED`) with probability ``--repeat`` (0.8), else a dynamic one (an amount, a
date, the last digits of a card: :func:`dynamic`, never the same twice in practice).
Callers think 0.5-2 s between prompts, mu-law 8 kHz, realtime pacing, the standard
load generator (:mod:`tests.bench.loadgen`, its worker processes, one voice per
language: Piper ``en-us-joe``; Kokoro ``zh-xiaoyi``, the Mandarin voice of issue 26,
when installed).

Each level runs on a fresh gateway and engine: ``off`` is ``ENGINE_SPEECH_CACHE=0``;
``on`` is the cache with its host directory (a fresh one per level) and the 8 fixed
prompts in ``GATEWAY_SPEECH_CACHE_PROMPTS``, warmed before the window opens (what an
operator does); ``cold`` is the cache on and empty, nothing declared (a fresh deployment,
a restart, a new prompt set: the yardstick declares nothing). ``--burst N``: N callers
hear the greeting at the same instant (one prompt each): on a ``cold`` level, a prompt
nobody has heard yet (a new announcement going live at peak). Reported per level: first
audio p50/p95/p99 at the client (exact), split hit/join/miss at the gateway
(``gateway_speech_cache_first_audio_seconds``, interpolated in its buckets like
``histogram_quantile``), underruns, errors, the engine's hit ratio
(``engine_speech_cache_*``: all hits over memory-level lookups), and whether the level
meets first audio p95 <= 300 ms / p99 <= 500 ms with no underrun and no error. Also,
from the engine's counters (``engine_speech_cache_played_audio_seconds_total``, ``_cached_``,
``_joined_``): the audio seconds synthesized per audio second played (1.0: every
second played was synthesized for its caller), where the engine reports them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from tests.bench import promscrape
from tests.bench.loadgen import LoadOptions, default_out_dir, run_level, stop_on_signals
from tests.bench.targets import GatewayTarget

P95_MS: Final = 300.0
P99_MS: Final = 500.0
REPEAT_ENV: Final = "SPEECH_CACHE_BENCH_REPEAT"  # read by the load generator's workers
DEFAULT_REPEAT: Final = 0.8
HISTOGRAM: Final = "gateway_speech_cache_first_audio_seconds"
WARM_TIMEOUT_S: Final = 600.0

#: A bank IVR's fixed prompts, 3-6 s each (the first is the greeting).
FIXED: Final[dict[str, tuple[str, ...]]] = {
    "en": (
        "Thank you for calling Acme Bank. Your call may be recorded for quality purposes.",
        "For your account balance and recent transactions, press one.",
        "To report a lost or stolen card, press two, or stay on the line.",
        "Please enter your sixteen digit card number, followed by the pound key.",
        "All of our agents are currently busy. Your call is important to us.",
        "Please hold while we transfer you to the next available representative.",
        "To hear these options again, press nine. To return to the main menu, press star.",
        "Thank you for banking with Acme. Goodbye, and have a nice day.",
    ),
    "zh": (
        "您好，欢迎致电安信银行，本次通话可能会被录音。",
        "查询账户余额和最近交易，请按一。",
        "挂失银行卡，请按二，或者请不要挂机。",
        "请输入您的十六位卡号，并以井号键结束。",
        "所有客服人员正忙，您的来电对我们非常重要。",
        "请稍候，我们正在为您转接下一位客服代表。",
        "重听以上选项请按九，返回主菜单请按星号键。",
        "感谢您致电安信银行，祝您生活愉快，再见。",
    ),
}
VOICES: Final = {"en": "en-us-joe", "zh": "zh-xiaoyi"}
BACKENDS: Final = {"en": "piper,espeak", "zh": "kokoro,espeak"}
_MONTHS: Final = ("January", "February", "March", "April", "May", "June", "July",
                  "August", "September", "October", "November", "December")  # fmt: skip


def language_of(voice: str) -> str:
    return "zh" if voice.startswith("zh") else "en"


def dynamic(lang: str, rng: random.Random) -> str:
    """A prompt with an amount, a date or card digits: a new text almost every time."""
    dollars, cents = rng.randint(1, 9999), rng.randint(0, 99)
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    if lang == "zh":
        return rng.choice((
            f"您的账户余额为{dollars}元{cents}分。",
            f"您上一笔{dollars}元的还款已于{month}月{day}日到账。",
            f"您尾号{rng.randint(1000, 9999)}的银行卡将于{month}月{day}日到期。",
        ))  # fmt: skip
    return rng.choice((
        f"Your available balance is {dollars} dollars and {cents} cents.",
        f"Your last payment of {dollars} dollars was received on {_MONTHS[month - 1]} {day}.",
        f"Your card ending in {rng.randint(1000, 9999)} is due on {_MONTHS[month - 1]} {day}.",
    ))  # fmt: skip


def pick(voice: str, rng: random.Random) -> str:
    """The mix's next prompt (the load generator's ``prompts`` hook)."""
    lang = language_of(voice)
    repeat = float(os.environ.get(REPEAT_ENV) or DEFAULT_REPEAT)
    return rng.choice(FIXED[lang]) if rng.random() < repeat else dynamic(lang, rng)


def greeting(voice: str, rng: random.Random) -> str:
    """The greeting (``--burst``: every caller hears it at once)."""
    return FIXED[language_of(voice)][0]


def _prompts_file(path: Path, lang: str) -> Path:
    lines = [json.dumps({"text": t, "voice": VOICES[lang]}) for t in FIXED[lang]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _get_json(url: str, token: str | None) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def wait_warm(base: str, token: str | None, expected: int) -> dict[str, Any]:
    """Until every start-up prompt is warm (or failed): the ``expected`` of the prompts
    file and any other the gateway keeps warm (the SIP bridge's default flow's); the
    states of the file's prompts, and how many others there were."""
    deadline = time.monotonic() + WARM_TIMEOUT_S
    started = time.monotonic()
    while True:
        prompts = _get_json(base + "/v1/speech-cache/prompts", token)["prompts"]
        from_file = [p["state"] for p in prompts if p["source"].startswith("file:")]
        done = all(p["state"] in ("warm", "failed") for p in prompts)
        if (done and len(from_file) >= expected) or time.monotonic() > deadline:
            return {
                "warm": from_file.count("warm"),
                "failed": from_file.count("failed"),
                "others": len(prompts) - len(from_file),
                "seconds": round(time.monotonic() - started, 1),
            }
        time.sleep(0.5)


def _cache_figures(before: promscrape.Scrape, after: promscrape.Scrape) -> dict[str, Any]:
    def delta(prefix: str, **labels: str) -> float:
        total = 0.0
        for key, value in after.values.items():
            if (key == prefix or key.startswith(prefix + "{")) and all(
                f"{k}={v}" in key for k, v in labels.items()
            ):
                total += value - before.values.get(key, 0.0)
        return total

    hits = delta("engine_speech_cache_hits_total")
    lookups = delta("engine_speech_cache_hits_total", level="memory") + delta(
        "engine_speech_cache_misses_total", level="memory"
    )
    figures: dict[str, Any] = {
        "segment_lookups": int(lookups),
        "segment_hits": int(hits),
        "hit_ratio": round(hits / lookups, 3) if lookups else None,
        "shared_errors": int(delta("engine_speech_cache_errors_total", level="shared")),
    }
    played = delta("engine_speech_cache_played_audio_seconds_total")
    spared = delta("engine_speech_cache_cached_audio_seconds_total") + delta(
        "engine_speech_cache_joined_audio_seconds_total"
    )
    figures["played_audio_s"] = round(played, 1)
    figures["synthesized_per_played"] = round((played - spared) / played, 3) if played else None
    figures["joins"] = int(delta("engine_speech_cache_joins_total"))
    figures["prefix_hits"] = int(delta("engine_speech_cache_prefix_hits_total"))
    for label in ("hit", "join", "miss"):
        buckets = [
            (le, after_v - before_v)
            for (le, after_v), (_, before_v) in zip(
                _series(after, label), _series(before, label), strict=False
            )
        ]
        count = buckets[-1][1] if buckets else 0.0
        figures[f"first_audio_{label}"] = {
            "count": int(count),
            **{
                f"p{int(q * 100)}": _ms(promscrape.histogram_quantile(q, buckets))
                for q in (0.5, 0.95, 0.99)
            },
        }
    return figures


def _series(scrape: promscrape.Scrape, label: str) -> list[tuple[float, float]]:
    """The buckets of ``HISTOGRAM{cache=label}`` (Scrape keeps buckets by name only, so
    read them from its values, where labelled buckets are kept by key)."""
    found = []
    for key, value in scrape.values.items():
        if key.startswith(HISTOGRAM + "_bucket{") and f"cache={label}" in key:
            le = key.split("le=", 1)[1].split(",")[0].rstrip("}")
            found.append((float(le), value))
    return sorted(found)


def _ms(pair: tuple[float, float] | None) -> float | None:
    return None if pair is None else round(pair[0] * 1000, 1)


def _scrape_labelled(url: str) -> promscrape.Scrape:
    """A scrape whose histogram buckets keep their labels (``cache``) in ``values``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    scrape = promscrape.Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            scrape.values[key] = sample.value
    return scrape


def run_one(
    lang: str, mode: str, calls: int, opts: LoadOptions, work: Path, *, burst: bool = False
) -> dict[str, Any]:
    """One level on a fresh gateway: ``calls`` callers, the cache ``off``, ``on`` (its
    fixed prompts warmed first) or ``cold`` (on and empty)."""
    cache = mode != "off"
    name = f"{lang}-{mode}-{'burst' if burst else 'calls'}-{calls}"
    env = {
        "ENGINE_VAD": "0",
        "ENGINE_SPEECH_CACHE": "1" if cache else "0",
        "ENGINE_SPEECH_CACHE_SHARED": "directory",
        "ENGINE_SPEECH_CACHE_DIR": str(work / name / "cache"),
        "GATEWAY_TENANT_MAX_STREAMS": str(max(100, calls * 2)),
    }
    if mode == "on":
        (work / name).mkdir(parents=True, exist_ok=True)
        env["GATEWAY_SPEECH_CACHE_PROMPTS"] = str(_prompts_file(work / name / "p.jsonl", lang))
    target = GatewayTarget(work / name, backend=BACKENDS[lang], env=env)
    target.start()
    try:
        assert target.metrics_url is not None
        base = target.metrics_url.removesuffix("/metrics")
        warm = wait_warm(base, target.token(), len(FIXED[lang])) if mode == "on" else None
        before = _scrape_labelled(target.metrics_url)
        level = run_level(target, calls, opts)
        after = _scrape_labelled(target.metrics_url)
    finally:
        target.stop()
    fa = level["client"]["first_audio_ms"]
    underruns = (level["server"] or {}).get("underruns")
    errors = int(sum(level["client"]["errors"].values()))
    row = {
        "lang": lang,
        "voice": VOICES[lang],
        "cache": mode,
        "burst": burst,
        "calls": calls,
        "utterances": fa.get("count"),
        "first_audio_p50_ms": fa["p50"],
        "first_audio_p95_ms": fa["p95"],
        "first_audio_p99_ms": fa["p99"],
        "underruns": underruns,
        # stalls at the caller: frames that came over the jitter bound late (the client's
        # count, beside the gateway's underruns)
        "late_frames": level["client"]["late_frames"],
        "errors": errors,
        "error_codes": dict(level["client"]["errors"]),
        "warm_up": warm,
        **_cache_figures(before, after),
    }
    row["meets"] = bool(
        fa["p95"] is not None
        and fa["p95"] <= P95_MS
        and fa["p99"] is not None
        and fa["p99"] <= P99_MS
        and not underruns
        and not errors
    )
    print(
        f"  => {name}: first audio p50 {fa['p50']} p95 {fa['p95']} p99 {fa['p99']} ms; "
        f"hit p99 {row['first_audio_hit']['p99']} ms, miss p99 {row['first_audio_miss']['p99']}"
        f" ms; hit ratio {row['hit_ratio']}; joins {row['joins']}; synthesized per played "
        f"{row['synthesized_per_played']}; underruns {underruns}; late frames "
        f"{row['late_frames']}; errors {errors} "
        f"{row['error_codes'] or ''}; "
        f"meets {row['meets']}",
        flush=True,
    )
    return row


def render(body: dict[str, Any]) -> str:
    lines = [
        f"Speech cache, bank IVR mix (repeat {body['repeat']}: that fraction of prompts "
        f"from {len(FIXED['en'])} fixed 3-6 s prompts, the rest amounts/dates), "
        f"{body['duration_s']:.0f} s per level, mu-law realtime; bounds p95 <= {P95_MS:.0f} "
        f"/ p99 <= {P99_MS:.0f} ms:",
        "",
        "| lang | cache | calls | first audio p50 / p95 / p99 (ms) | hit p50 / p99 | "
        "miss p50 / p99 | hit ratio | joins | synthesized / played | underruns | late frames "
        "| errors | meets |",
        "|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in body["levels"]:
        hit, miss = r["first_audio_hit"], r["first_audio_miss"]
        calls = f"burst {r['calls']}" if r["burst"] else str(r["calls"])
        lines.append(
            f"| {r['lang']} | {r['cache']} | {calls} | {r['first_audio_p50_ms']} / "
            f"{r['first_audio_p95_ms']} / {r['first_audio_p99_ms']} | {hit['p50']} / "
            f"{hit['p99']} ({hit['count']}) | {miss['p50']} / {miss['p99']} ({miss['count']}) | "
            f"{r['hit_ratio']} | {r.get('joins')} | {r.get('synthesized_per_played')} | "
            f"{r['underruns']} | {r.get('late_frames')} | {r['errors']} | "
            f"{'yes' if r['meets'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--langs", nargs="+", default=["en"], choices=sorted(FIXED))
    parser.add_argument("--calls", nargs="+", type=int, default=[20, 100, 200])
    parser.add_argument("--burst", type=int, default=30, help="callers at once; 0: none")
    parser.add_argument("--modes", nargs="+", default=["off", "on"],
                        choices=["off", "on", "cold"])  # fmt: skip
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--repeat", type=float, default=DEFAULT_REPEAT)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_signals()
    os.environ[REPEAT_ENV] = str(args.repeat)  # the load generator's workers inherit it
    out_dir: Path = args.out or default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / f"speech-cache-{int(time.time())}"
    rows = []
    for lang in args.langs:
        if lang == "zh":
            from engine.backends.kokoro import installed

            if not installed():
                print("  Kokoro is not installed: no Mandarin levels", flush=True)
                continue
        for mode in args.modes:
            for calls in args.calls:
                opts = LoadOptions(
                    duration_s=args.duration, voices=(VOICES[lang],),
                    prompts="tests.bench.speech_cache:pick", utterance_timeout_s=60.0,
                )  # fmt: skip
                rows.append(run_one(lang, mode, calls, opts, work))
            if args.burst:
                opts = LoadOptions(
                    duration_s=max(args.duration, 15.0), voices=(VOICES[lang],), burst=True,
                    max_prompts=1, prompts="tests.bench.speech_cache:greeting",
                    utterance_timeout_s=60.0,
                )  # fmt: skip
                rows.append(run_one(lang, mode, args.burst, opts, work, burst=True))
    body = {
        "benchmark": "speech_cache",
        "repeat": args.repeat,
        "duration_s": args.duration,
        "mix": {
            "fixed": FIXED,
            "dynamic": "amounts, dates, card digits (tests.bench.speech_cache.dynamic)",
        },
        "levels": rows,
    }
    (out_dir / "speech_cache.json").write_text(json.dumps(body, indent=2, ensure_ascii=False))
    table = render(body)
    (out_dir / "speech_cache.md").write_text(table)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
