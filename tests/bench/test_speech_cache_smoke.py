"""The speech-cache benchmark runs end to end at a tiny size (two calls and a burst of
three, cache off and on, Piper): the instrument, not the figures. Every field the report
reads is there, the cache-on levels warmed their 8 prompts, and a cache-off level has no
hits."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.bench import speech_cache

pytestmark = pytest.mark.timeout(600)


def test_the_mix_repeats_its_fixed_prompts_at_the_stated_ratio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(speech_cache.REPEAT_ENV, "0.8")
    rng = random.Random(7)
    prompts = [speech_cache.pick("en-us-joe", rng) for _ in range(2000)]
    fixed = sum(p in speech_cache.FIXED["en"] for p in prompts) / len(prompts)
    assert 0.77 < fixed < 0.83
    dynamic = [p for p in prompts if p not in speech_cache.FIXED["en"]]
    assert len(set(dynamic)) > 0.95 * len(dynamic)  # amounts and dates hardly repeat
    assert all(speech_cache.pick("zh-xiaoyi", rng) for _ in range(10))
    assert speech_cache.greeting("zh-xiaoyi", rng) == speech_cache.FIXED["zh"][0]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from engine.backends.piper import installed

    if not installed():
        pytest.skip("Piper is not installed")
    out: Path = tmp_path_factory.mktemp("speech-cache")
    argv = ["--langs", "en", "--calls", "2", "--burst", "3", "--duration", "4", "--out", str(out)]
    assert speech_cache.main(argv) == 0
    body: dict[str, Any] = json.loads((out / "speech_cache.json").read_text())
    assert (out / "speech_cache.md").read_text().startswith("Speech cache")
    return body


def test_every_level_reports_its_figures(result: dict[str, Any]) -> None:
    levels = result["levels"]
    assert [(r["cache"], r["burst"], r["calls"]) for r in levels] == [
        ("off", False, 2), ("off", True, 3), ("on", False, 2), ("on", True, 3)
    ]  # fmt: skip
    for row in levels:
        assert row["errors"] == 0, row
        assert row["first_audio_p50_ms"] is not None
        assert row["underruns"] is not None and row["late_frames"] >= 0
        for label in ("hit", "miss"):
            assert set(row[f"first_audio_{label}"]) == {"count", "p50", "p95", "p99"}


def test_the_cache_on_levels_are_warm_and_hit_the_off_levels_never(
    result: dict[str, Any],
) -> None:
    for row in result["levels"]:
        if row["cache"] == "off":
            assert row["warm_up"] is None
            assert row["first_audio_hit"]["count"] == 0 and row["segment_lookups"] == 0
        else:
            assert row["warm_up"]["warm"] == len(speech_cache.FIXED["en"]), row["warm_up"]
            assert row["segment_hits"] > 0 and row["hit_ratio"] is not None
    burst_on = next(r for r in result["levels"] if r["cache"] == "on" and r["burst"])
    assert burst_on["first_audio_hit"]["count"] == 3  # every caller's greeting hit
