"""The CosyVoice2 capacity benchmark runs end to end at tiny dimensions on the CPU (its
instrument, not the model's speed): both paths speak every stream, and the report's
figures are there and consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.backends.cosyvoice2 import upstream
from tests.bench import cosyvoice2_capacity
from tests.bench.cosyvoice2_capacity import StreamRecord
from tests.integration.harness import running_redis

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        bool(upstream.missing_packages()), reason="the cosyvoice2 extra is not installed"
    ),
]


def test_both_paths_speak_every_stream_and_the_report_adds_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with running_redis(tmp_path) as redis:
        argv = ["--levels", "1", "2", "--cache-lookups", "20", "--redis-url", redis.url]
        cosyvoice2_capacity.main([*argv, "--no-docs", "--out", str(out)])
    body = json.loads((out / "cosyvoice2_capacity.json").read_text())
    cache = body["feature_cache"]
    assert 100 < cache["blob_kib"] < 250  # 10 s: 500 mel frames of 80 floats, and more
    assert 0 < cache["l1_p50_us"] <= cache["l1_p99_us"]
    assert 0 < cache["l2_p50_us"] <= cache["l2_p99_us"]
    assert cache["l1_p50_us"] < cache["l2_p50_us"]  # memory before a Redis round trip
    assert body["dims"] == "tiny" and body["device"] == "cpu"
    levels = {(lv["path"], lv["streams"]): lv for lv in body["levels"]}
    assert set(levels) == {("engine", 1), ("official", 1), ("engine", 2), ("official", 2)}
    for level in levels.values():
        assert level["errors"] == 0
        assert level["audio_s"] > 1.0 * level["streams"]
        assert 0 < level["first_chunk_p50_ms"] <= level["first_chunk_p95_ms"]
        assert level["meets"] == (
            level["first_chunk_p95_ms"] <= 500 and level["streams_with_gaps"] == 0
        )


def test_a_chunk_that_arrives_after_the_audio_before_it_played_is_a_gap() -> None:
    on_time = StreamRecord(0.0, [(0.2, 24000), (1.1, 24000), (2.0, 24000)])
    assert on_time.first_chunk_s() == 0.2 and on_time.gaps() == 0
    late = StreamRecord(0.0, [(0.2, 24000), (1.5, 24000), (2.4, 24000)])
    assert late.gaps() == 1  # the second chunk was due at 1.2 s; playback resumes at 1.5
    assert late.audio_s() == 3.0
