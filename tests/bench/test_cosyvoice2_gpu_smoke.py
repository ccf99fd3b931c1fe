"""The one-call GPU run (and the KV benchmark beside it) runs end to end at tiny
dimensions on the CPU: its instrument, not the GPU's figures.

The run goes through the device call's own script (tests/bench/cosyvoice2_gpu.sh) as the
rehearsal makes it (tests/bench/gpu_rehearsal.py): this interpreter without site-packages,
only the image's distributions (linked from this virtual environment) and the pinned ones
importable, so an import the lent machine could not satisfy fails here. Installing the
carried wheels needs them downloaded for this Python first (``make gpu-rehearsal``: pip
download from PyPI); without them that one test is skipped and the run uses the pinned
distributions linked from here instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.cosyvoice2 import upstream
from tests.bench import cosyvoice2_kv, gpu_rehearsal, gpu_wheels

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        bool(upstream.missing_packages()), reason="the cosyvoice2 extra is not installed"
    ),
]
WHEELS_311 = gpu_rehearsal.REPO / "artifacts" / "gpu-wheels-cp311"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> gpu_rehearsal.StandIn:
    return gpu_rehearsal.build_image(tmp_path_factory.mktemp("gpu-image"))


def test_the_device_script_runs_the_gpu_run_with_only_the_image_and_the_pins(
    tmp_path: Path, image: gpu_rehearsal.StandIn
) -> None:
    out = tmp_path / "out"
    site = gpu_rehearsal.link_pins(tmp_path)
    env = gpu_rehearsal.environment(image, site)
    done = gpu_rehearsal.run_script(env, None, out, [*gpu_rehearsal.TINY_ARGS, *image.args()])
    assert done.returncode == 0
    body = json.loads((out / "cosyvoice2_gpu.json").read_text())
    assert body["stage"] == "done"
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
    # Every import came from the image's list or the pins (the pins from their folder).
    imports = body["imports"]
    assert imports["problems"] == []
    wheels = {name for name, d in imports["distributions"].items() if d["from"] == "wheels"}
    assert {"cosyvoice-minicpmo", "diffusers", "hyperpyyaml", "msgspec", "soxr"} <= wheels
    assert imports["distributions"]["torch"]["from"] == "image"
    # The stages said how far they got, with their times, in the log that comes back.
    log = (out / "log.txt").read_text()
    # the script's stage lines carry their elapsed seconds (1 s under load, not 0)
    assert re.search(r"\[sh \d+ s\] Python 3\.11", log)
    assert "s] conformance: all equal True" in log
    assert "s] done" in log


def test_the_device_script_installs_the_wheels_into_a_fresh_target(
    tmp_path: Path, image: gpu_rehearsal.StandIn
) -> None:
    if not WHEELS_311.is_dir():
        pytest.skip(
            f"no {WHEELS_311.relative_to(gpu_rehearsal.REPO)}: the wheels for this Python "
            "come from PyPI (make gpu-rehearsal); the run itself is tested without them"
        )
    report = gpu_wheels.check(
        WHEELS_311, image=gpu_wheels.load_image(), pins=gpu_wheels.read_pins(), python=(3, 11)
    )
    assert report.problems == []
    site = tmp_path / "site"
    env = gpu_rehearsal.environment(image, site)
    done = gpu_rehearsal.run_script(env, WHEELS_311, tmp_path / "out", ["--help"])
    assert done.returncode == 0
    assert f"installing {len(report.wheels)} wheels" in (tmp_path / "out" / "log.txt").read_text()
    probe = (
        "from engine.backends.cosyvoice2 import upstream; upstream.install_stand_ins(); "
        "import cosyvoice.cli.model, matcha, diffusers, hyperpyyaml, msgspec, soxr; "
        "print(cosyvoice.__file__)"
    )
    found = subprocess.run(
        [*env["GPU_PYTHON"].split(), "-c", probe],
        cwd=gpu_rehearsal.REPO,
        env={"PYTHONPATH": f"{site}:{env['PYTHONPATH']}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.startswith(str(site))


def test_the_kv_benchmark_steps_every_level_and_frees_the_pool(tmp_path: Path) -> None:
    out = tmp_path / "out"
    small = ["--dims", "tiny", "--streams", "2", "5", "--steps", "2", "--positions", "40"]
    cosyvoice2_kv.main([*small, "--model-dir", str(tmp_path / "model"), "--out", str(out)])
    rows = json.loads((out / "cosyvoice2_kv.json").read_text())["rows"]
    assert [r["streams"] for r in rows] == [2, 5]
    assert all(len(r["step_ms"]) == 2 and r["pool_mib"] > 0 for r in rows)


def test_a_linked_module_reads_its_original_s_byte_code(tmp_path: Path) -> None:
    """The image's links carry their originals' byte code: a process with the same cache
    imports a linked module without compiling it again (the link to the byte code is still
    there afterwards), and one whose original changed compiles it again, replacing the
    link and never the original's byte code."""
    original, image = tmp_path / "venv" / "probe_mod.py", tmp_path / "image" / "probe_mod.py"
    original.parent.mkdir()
    original.write_text("VALUE = 1\n")
    cache = tmp_path / "pycache"
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run(folder: Path) -> str:
        probe = "import probe_mod; print(probe_mod.VALUE)"
        return subprocess.run(
            [sys.executable, "-c", probe], cwd=folder, env=env, capture_output=True,
            text=True, check=True,
        ).stdout.strip()  # fmt: skip

    assert run(original.parent) == "1"  # compiled once, for the original
    [pyc] = cache.rglob("probe_mod.*.pyc")
    image.parent.mkdir()
    image.symlink_to(original)
    script = (
        "import sys; from pathlib import Path; from tests.bench import gpu_rehearsal; "
        "gpu_rehearsal.link_byte_code(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(original), str(image)],
        cwd=gpu_rehearsal.REPO, env=env, check=True,
    )  # fmt: skip
    [linked] = (p for p in cache.rglob(pyc.name) if p != pyc)
    assert linked.is_symlink() and linked.resolve() == pyc
    assert run(image.parent) == "1"
    assert linked.is_symlink()  # read, not compiled again
    before = pyc.read_bytes()
    original.write_text("VALUE = 22\n")  # another size: the byte code is stale
    assert run(image.parent) == "22"
    assert not linked.is_symlink() and pyc.read_bytes() == before
