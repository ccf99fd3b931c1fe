"""The one-command GPU run (and the conformance and KV benchmarks it builds on) runs end
to end at tiny dimensions on the CPU: its instrument, not the GPU's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.backends.cosyvoice2 import upstream
from tests.bench import cosyvoice2_gpu, cosyvoice2_kv

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        bool(upstream.missing_packages()), reason="the cosyvoice2 extra is not installed"
    ),
]


def test_the_gpu_run_checks_conformance_and_measures_every_level(tmp_path: Path) -> None:
    out = tmp_path / "out"
    dry_run = ["--dims", "tiny", "--device", "cpu", "--levels", "1", "2", "--official-levels", "1"]
    cosyvoice2_gpu.main(
        [*dry_run, "--wheels", "none", "--model-dir", str(tmp_path / "model"), "--out", str(out)]
    )
    body = json.loads((out / "cosyvoice2_gpu.json").read_text())
    conformance = body["conformance"]
    assert conformance["all_equal"]
    assert len(conformance["tokens"]) == 8 and all(r["equal"] for r in conformance["tokens"])
    assert conformance["waveform"]["max_abs_difference_int16"] <= 2
    rows = {(r["llm"], r["path"], r["streams"]) for r in body["capacity"]}
    assert rows == {
        ("float32", "engine", 1),
        ("float32", "engine", 2),
        ("float32", "official", 1),
        ("bfloat16", "engine", 1),
        ("bfloat16", "engine", 2),
    }
    assert all(r["errors"] == 0 for r in body["capacity"])
    assert "| bfloat16 | engine | 2 |" in (out / "cosyvoice2_gpu.md").read_text()


def test_the_kv_benchmark_steps_every_level_and_frees_the_pool(tmp_path: Path) -> None:
    out = tmp_path / "out"
    small = ["--dims", "tiny", "--streams", "2", "5", "--steps", "2", "--positions", "40"]
    cosyvoice2_kv.main([*small, "--model-dir", str(tmp_path / "model"), "--out", str(out)])
    rows = json.loads((out / "cosyvoice2_kv.json").read_text())["rows"]
    assert [r["streams"] for r in rows] == [2, 5]
    assert all(len(r["step_ms"]) == 2 and r["pool_mib"] > 0 for r in rows)
