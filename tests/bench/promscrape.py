"""The gateway's own view of a run: ``/metrics`` scraped before and after the window.

Counters and histogram buckets are cumulative, so the window's figures are the
difference of two scrapes. Histogram quantiles are estimated like Prometheus'
``histogram_quantile``: linear interpolation inside the bucket that holds the rank;
the bucket's upper bound is reported too, as the honest "at most".
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Scrape:
    """One scrape: plain counters/gauges by ``name{label=value}``, histogram buckets."""

    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        scrape = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_bucket") and "le" in sample.labels:
                    le = float(sample.labels["le"])
                    scrape.buckets.setdefault(sample.name[: -len("_bucket")], []).append(
                        (le, sample.value)
                    )
                    continue
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                key = f"{sample.name}{{{labels}}}" if labels else sample.name
                scrape.values[key] = sample.value
        for series in scrape.buckets.values():
            series.sort()
        return scrape


def fetch(url: str, timeout: float = 5.0) -> Scrape | None:
    """Scrape ``url``; None when the server has no metrics (the baseline)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return Scrape.parse(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def bucket_delta(before: Scrape, after: Scrape, name: str) -> list[tuple[float, float]]:
    old = dict(before.buckets.get(name, []))
    return [(le, count - old.get(le, 0.0)) for le, count in after.buckets.get(name, [])]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(estimate, bucket upper bound) of quantile ``q`` (0..1) of cumulative ``buckets``.

    None without observations; an estimate in the ``+Inf`` bucket is reported as the
    highest finite bound (the value is above it) with an infinite upper bound.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le, math.inf
            if count == prev_count:
                return le, le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count), le
        prev_le, prev_count = le, count
    return prev_le, math.inf


def _counter_delta(before: Scrape, after: Scrape, prefix: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in after.values.items():
        if key == prefix or key.startswith(prefix + "{"):
            delta = value - before.values.get(key, 0.0)
            if delta:
                out[key] = delta
    return out


def _ms(pair: tuple[float, float] | None) -> dict[str, float | None]:
    if pair is None:
        return {"estimate": None, "at_most": None}
    est, bound = pair
    return {
        "estimate": round(est * 1000, 3),
        "at_most": None if math.isinf(bound) else round(bound * 1000, 3),
    }


def summarize(before: Scrape | None, after: Scrape | None) -> dict[str, Any] | None:
    """The server-side section of a level's result (None without metrics)."""
    if before is None or after is None:
        return None
    errors = {
        key.split("code=", 1)[1].rstrip("}"): int(v)
        for key, v in _counter_delta(before, after, "gateway_errors_total").items()
        if "code=" in key
    }
    added = bucket_delta(before, after, "gateway_added_latency_seconds")
    first = bucket_delta(before, after, "gateway_first_audio_seconds")
    lag = bucket_delta(before, after, "gateway_pacer_tick_lag_seconds")
    return {
        "underruns": int(sum(_counter_delta(before, after, "gateway_underruns_total").values())),
        "frames_sent": int(
            sum(_counter_delta(before, after, "gateway_frames_sent_total").values())
        ),
        "errors": errors,
        "added_latency_ms": {
            "count": int(added[-1][1]) if added else 0,
            "p50": _ms(histogram_quantile(0.50, added)),
            "p99": _ms(histogram_quantile(0.99, added)),
        },
        "first_audio_ms": {
            "p50": _ms(histogram_quantile(0.50, first)),
            "p99": _ms(histogram_quantile(0.99, first)),
        },
        "pacer_tick_lag_ms": {"p99": _ms(histogram_quantile(0.99, lag))},
        "sessions_active_at_end": after.values.get("gateway_sessions_active{protocol=native}"),
    }
