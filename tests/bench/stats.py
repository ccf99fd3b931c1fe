"""Turning what the workers recorded into the numbers a deployment is sized by.

Percentiles use the nearest-rank definition (``inverted_cdf``): a reported p99 is a
latency some utterance really had, never an interpolation. Utterances that never got
audio are *censored*: they count as infinitely late, so when more than 1 % of utterances
had no audio the p99 is reported as ``None`` (shown as "∞") instead of silently dropping
the worst cases.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
GAP_BIN_MS = 1.0
GAP_MAX_MS = 200.0


def merge_exports(exports: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate the arrays and add up the counters of every worker's export."""
    merged: dict[str, Any] = {}
    for key, dtype in (
        ("first_audio", np.float64),
        ("gaps", np.float64),
        ("utt_frames", np.int64),
        ("utt_max_ahead", np.float64),
        ("utt_min_ahead", np.float64),
        ("utt_late", np.int64),
        ("server_first_audio_ms", np.float64),
        ("setup", np.float64),
        ("rtp_jitter_ms", np.float64),
    ):
        parts = [np.frombuffer(e[key], dtype=dtype) for e in exports]
        merged[key] = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    errors: Counter[str] = Counter()
    for e in exports:
        errors.update(e["errors"])
    merged["errors"] = dict(sorted(errors.items()))
    for key in (
        "speaks",
        "completed",
        "unfinished",
        "no_audio",
        "bad_size_frames",
        "stray_frames",
        "tail_frames",
        "sessions_ready",
        "sessions_failed",
        "calls_completed",
        "frames",
        "rtp_packets",
        "rtp_lost",
    ):
        merged[key] = int(sum(e.get(key, 0) for e in exports))
    return merged


def quantiles_ms(
    seconds: Floats, qs: tuple[float, ...] = (50, 95, 99), censored: int = 0
) -> dict[str, float | None]:
    """``p50``… and ``max`` in milliseconds; ``censored`` values count as +infinity."""
    out: dict[str, float | None] = {}
    n = seconds.size + censored
    if n == 0:
        return dict.fromkeys([*(f"p{q:g}" for q in qs), "max", "mean"])
    values = np.sort(seconds) * 1000.0
    for q in qs:
        rank = int(np.ceil(q / 100.0 * n))  # nearest rank, 1-based
        out[f"p{q:g}"] = round(float(values[rank - 1]), 2) if rank <= values.size else None
    out["max"] = None if censored or not values.size else round(float(values[-1]), 2)
    out["mean"] = round(float(values.mean()), 2) if values.size else None
    return out


def gap_histogram(gaps_s: Floats) -> dict[str, Any]:
    """Inter-frame gaps in 1 ms bins from 0 to 200 ms, plus the count above."""
    ms = gaps_s * 1000.0
    edges = np.arange(0.0, GAP_MAX_MS + GAP_BIN_MS, GAP_BIN_MS)
    counts, _ = np.histogram(ms, bins=edges)
    return {
        "bin_ms": GAP_BIN_MS,
        "counts": counts.astype(int).tolist(),
        "over": int((ms >= GAP_MAX_MS).sum()),
    }


def summarize_client(merged: dict[str, Any], frame_ms: float = 20.0) -> dict[str, Any]:
    """The client-side section of a level's result."""
    first = merged["first_audio"]
    gaps = merged["gaps"]
    max_ahead = merged["utt_max_ahead"]
    min_ahead = merged["utt_min_ahead"]
    late = merged["utt_late"]
    return {
        "sessions_ready": merged["sessions_ready"],
        "sessions_failed": merged["sessions_failed"],
        "calls_completed": merged["calls_completed"],
        "utterances": {
            "speaks": merged["speaks"],
            "completed": merged["completed"],
            "unfinished": merged["unfinished"],
            "no_audio": merged["no_audio"],
        },
        "frames": merged["frames"],
        "first_audio_ms": quantiles_ms(first, (50, 95, 99), censored=merged["no_audio"]),
        "server_first_audio_ms": _plain_quantiles(merged["server_first_audio_ms"]),
        "gap_ms": quantiles_ms(gaps, (50, 99, 99.9)),
        "setup_ms": quantiles_ms(merged["setup"], (50, 95, 99)),
        "rtp": {
            "packets": merged["rtp_packets"],
            "lost": merged["rtp_lost"],
            "jitter_ms": _plain_quantiles(merged["rtp_jitter_ms"]),
        },
        "run_ahead_ms": {
            "max": round(float(max_ahead.max()) * 1000, 2) if max_ahead.size else None,
            "p99_of_utterance_max": _p(max_ahead * 1000, 99),
            "min": round(float(min_ahead.min()) * 1000, 2) if min_ahead.size else None,
        },
        "late_frames": int(late.sum()),
        "utterances_with_late_frames": int((late > 0).sum()),
        "bad_size_frames": merged["bad_size_frames"],
        "stray_frames": merged["stray_frames"],
        "tail_frames": merged["tail_frames"],
        "errors": merged["errors"],
        "frame_ms": frame_ms,
        "gap_histogram": gap_histogram(gaps),
        "first_audio_sorted_ms": np.round(np.sort(first) * 1000, 2).tolist(),
    }


def _p(values: Floats, q: float) -> float | None:
    if not values.size:
        return None
    return round(float(np.percentile(values, q, method="inverted_cdf")), 2)


def _plain_quantiles(ms: Floats) -> dict[str, float | None]:
    return {"p50": _p(ms, 50), "p99": _p(ms, 99), "max": _p(ms, 100)}


def ratio(ours: float | None, baseline: float | None) -> float | None:
    """``ours / baseline``; None when either is unknown or the baseline is 0."""
    if ours is None or baseline is None or baseline == 0:
        return None
    return round(ours / baseline, 3)


def linear_slope(xs: Floats, ys: Floats) -> float | None:
    """Least-squares slope of ``ys`` over ``xs`` (None with fewer than 3 points)."""
    if xs.size < 3:
        return None
    slope, _ = np.polyfit(xs, ys, 1)
    return float(slope)
