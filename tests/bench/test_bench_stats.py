"""Statistics of the benchmark: nearest-rank percentiles, censoring, Prometheus buckets."""

from __future__ import annotations

import math

import numpy as np

from tests.bench import promscrape, report, stats


def test_nearest_rank_percentiles_in_ms() -> None:
    values = np.arange(1, 101, dtype=float) / 1000  # 1..100 ms
    q = stats.quantiles_ms(values, (50, 99))
    assert q["p50"] == 50.0 and q["p99"] == 99.0 and q["max"] == 100.0


def test_censored_values_count_as_infinitely_late() -> None:
    values = np.full(98, 0.010)
    q = stats.quantiles_ms(values, (50, 99), censored=2)
    assert q["p50"] == 10.0
    assert q["p99"] is None and q["max"] is None  # 2 % never got audio: p99 is unbounded


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.001, 10.0), (0.002, 90.0), (0.005, 100.0), (math.inf, 100.0)]
    est, bound = promscrape.histogram_quantile(0.99, buckets) or (0, 0)
    assert bound == 0.005 and 0.002 < est < 0.005
    assert promscrape.histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert promscrape.histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 10.0)]) == (0.1, math.inf)


def test_scrape_delta_of_counters_and_buckets() -> None:
    text = """# HELP gateway_underruns_total x
# TYPE gateway_underruns_total counter
gateway_underruns_total {n}
# HELP gateway_errors_total x
# TYPE gateway_errors_total counter
gateway_errors_total{{code="queue_full"}} {n}
# HELP gateway_added_latency_seconds x
# TYPE gateway_added_latency_seconds histogram
gateway_added_latency_seconds_bucket{{le="0.001"}} {n}
gateway_added_latency_seconds_bucket{{le="+Inf"}} {n}
gateway_added_latency_seconds_count {n}
gateway_added_latency_seconds_sum 0.0
"""
    before = promscrape.Scrape.parse(text.format(n=1.0))
    after = promscrape.Scrape.parse(text.format(n=4.0))
    summary = promscrape.summarize(before, after)
    assert summary is not None
    assert summary["underruns"] == 3 and summary["errors"] == {"queue_full": 3}
    assert summary["added_latency_ms"]["count"] == 3
    assert summary["added_latency_ms"]["p99"]["at_most"] == 1.0


def test_replace_section_keeps_the_rest_of_the_document() -> None:
    doc = "# B\n\nintro\n"
    once = report.replace_section(doc, report.MATRIX_MARKERS, "table 1")
    twice = report.replace_section(once + "\noutro\n", report.MATRIX_MARKERS, "table 2")
    assert "table 1" not in twice and "table 2" in twice
    assert twice.startswith("# B\n\nintro\n") and twice.endswith("outro\n")
