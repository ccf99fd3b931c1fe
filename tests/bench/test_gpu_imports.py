"""The GPU run's import audit (tests/bench/gpu_imports.py) sorts each imported
distribution by where it came from and names what neither the image nor the pins cover."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import packaging
import pytest

from tests.bench import gpu_imports

SITE = Path(packaging.__file__).parents[1]  # this virtual environment's site-packages


def test_a_file_is_from_the_wheels_the_stdlib_the_project_or_the_image() -> None:
    assert gpu_imports.origin(packaging.__file__, SITE) == "wheels"
    assert gpu_imports.origin(packaging.__file__, None) == "image"
    assert gpu_imports.origin(json.__file__, None) == "stdlib"
    assert gpu_imports.origin(gpu_imports.__file__, None) == "project"


def test_a_compiled_module_registered_at_the_top_counts_for_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pkg").mkdir()
    inner = tmp_path / "pkg" / "_speedup.cpython-311-x86_64-linux-gnu.so"
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert gpu_imports.top_level("_speedup", str(inner)) == "pkg"
    assert gpu_imports.top_level("mod", str(tmp_path / "mod.py")) == "mod"
    assert gpu_imports.top_level("gone", os.sep + "nowhere.py") in ("gone", "nowhere")


def test_the_audit_names_distributions_outside_the_image_and_the_pins() -> None:
    image = gpu_imports.audit(["packaging"], [], None)
    assert image["distributions"]["packaging"] == {
        "version": packaging.__version__,
        "from": "image",
    }
    assert not any(p.startswith("packaging") for p in image["problems"])
    outside = gpu_imports.audit([], [], None)
    assert any(
        p.startswith(f"packaging {packaging.__version__}: not in") for p in outside["problems"]
    )
    carried = gpu_imports.audit([], [], SITE)
    assert carried["distributions"]["packaging"]["from"] == "wheels"
    assert "packaging: from the wheels' folder, not pinned" in carried["problems"]
    assert (
        gpu_imports.audit([], ["packaging"], SITE)["problems"].count(
            "packaging: from the wheels' folder, not pinned"
        )
        == 0
    )
