"""The voice-cache benchmark runs end to end with tiny parameters (a few seconds).

This tests the instrument, not the registry's speed: every field the report reads is
there and plausible, and the counters add up.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.bench import voice_cache

pytestmark = pytest.mark.timeout(120)


def redis_reachable(url: str) -> bool:
    async def probe() -> bool:
        client = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            return bool(await client.ping())
        except (OSError, aioredis.RedisError):
            return False
        finally:
            await client.aclose()

    return asyncio.run(probe())


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not redis_reachable(voice_cache.DEFAULT_REDIS_URL):
        pytest.skip(f"no Redis at {voice_cache.DEFAULT_REDIS_URL}")
    out: Path = tmp_path_factory.mktemp("voice-cache") / "result.json"
    argv = ["--voices", "3", "--lookups", "50", "--calls", "200", "--l1-size", "2"]
    argv += ["--gateway-calls", "50", "--quiet", "--out", str(out)]
    assert voice_cache.main(argv) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_the_result_has_every_section(result: dict[str, Any]) -> None:
    assert result["benchmark"] == "voice_cache"
    assert result["options"]["voices"] == 3 and result["options"]["l1_size"] == 2
    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["python"]
    assert set(result["lookup"]) == {"features_l1", "features_l2", "profile_l1", "profile_l2"}
    for figures in result["lookup"].values():
        assert figures["n"] == 50 and 0 < figures["median_ms"] <= figures["p99_ms"]
    reg = result["registration"]
    assert len(reg["voices"]) == 3 and reg["extraction"]["n"] == 3
    assert all(v["extraction_ms"] > 0 and v["duration_ms"] >= 3000 for v in reg["voices"])
    assert result["redis"]["keys_deleted"] > 0
    assert sum(result["mix"]["draws_per_voice_rank"]) == 200


def test_l1_hits_are_faster_than_l2_hits(result: dict[str, Any]) -> None:
    look = result["lookup"]
    assert look["features_l1"]["median_ms"] < look["features_l2"]["median_ms"]
    assert look["profile_l1"]["median_ms"] < look["profile_l2"]["median_ms"]


@pytest.mark.parametrize("where,starts", [("in_process", 200), ("gateway", 50)])
def test_the_mix_counters_add_up(result: dict[str, Any], where: str, starts: int) -> None:
    mix = result["mix"][where]
    assert mix["session_starts"] == starts and mix["lookups"] == starts
    assert mix["l1_hits"] + mix["l2_hits"] + mix["misses"] == starts
    assert mix["misses"] == mix["extractions"] == 0  # every feature is in Redis
    assert 0.0 <= mix["l1_hit_ratio"] <= mix["hit_ratio"] <= 1.0
    assert 0.0 <= mix["cosy2_cache_hit_ratio_gauge"] <= 1.0
    assert 0 < mix["l1_hits"] < starts  # 3 voices through an L1 of 2: both levels serve
