"""The check of the GPU run's wheel set (tests/bench/gpu_wheels.py): it fails on a tag the
lent machine's CPython 3.12 cannot install, on a distribution its image already has, on a
set over budget, and on a folder that does not match the pins; the committed lists pass."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from packaging.tags import Tag
from packaging.utils import canonicalize_name

from engine.backends.cosyvoice2 import upstream
from tests.bench import gpu_wheels
from tests.bench.gpu_wheels import Image, check

VERSIONS = {"numpy": "2.5.2", "torch": "2.11.0", "pyyaml": None}
IMAGE = Image("3.12.3", "2026-11-17", {canonicalize_name(k): v for k, v in VERSIONS.items()})


def wheel(directory: Path, name: str, size: int = 1024) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with path.open("wb") as f:
        f.truncate(size)  # sparse: the size is what counts
    return path


def problems(
    directory: Path,
    pins: list[tuple[str, str]],
    python: tuple[int, int] = (3, 12),
    budget_mib: float = 60,
) -> list[str]:
    return check(directory, image=IMAGE, pins=pins, python=python, budget_mib=budget_mib).problems


@pytest.mark.parametrize(
    "name",
    [
        "demo-1.0-py3-none-any.whl",
        "demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "demo-1.0-cp312-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "demo-1.0-cp38-abi3-manylinux2014_x86_64.whl",
        "demo-1.0-cp312-cp312-manylinux_2_5_x86_64.manylinux1_x86_64.whl",
        "demo-1.0-cp312-cp312-manylinux_2_34_x86_64.manylinux_2_28_x86_64.whl",
    ],
)
def test_a_wheel_cpython_312_on_manylinux_x86_64_installs_fits(tmp_path: Path, name: str) -> None:
    wheel(tmp_path, name)
    assert problems(tmp_path, [("demo", "1.0")]) == []


@pytest.mark.parametrize(
    "name",
    [
        "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",  # another CPython's ABI
        "demo-1.0-cp313-abi3-manylinux_2_28_x86_64.whl",  # abi3 from a newer CPython on
        "demo-1.0-cp312-cp312-manylinux_2_34_x86_64.whl",  # glibc newer than 2.28 only
        "demo-1.0-cp312-cp312-linux_x86_64.whl",  # not manylinux
        "demo-1.0-cp312-cp312-manylinux_2_28_aarch64.whl",  # another processor
        "demo-1.0-cp312-cp312-macosx_11_0_x86_64.whl",
        "demo-1.0-pp310-pypy310_pp73-manylinux_2_28_x86_64.whl",
    ],
)
def test_a_wheel_whose_tags_do_not_fit_fails(tmp_path: Path, name: str) -> None:
    wheel(tmp_path, name)
    (problem,) = problems(tmp_path, [("demo", "1.0")])
    assert "do not fit CPython 3.12 manylinux x86_64" in problem and name in problem


def test_the_same_wheel_fits_the_python_it_was_downloaded_for(tmp_path: Path) -> None:
    wheel(tmp_path, "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert problems(tmp_path, [("demo", "1.0")], python=(3, 11)) == []
    assert problems(tmp_path, [("demo", "1.0")], python=(3, 12))


def test_a_wheel_of_a_distribution_the_image_has_fails(tmp_path: Path) -> None:
    wheel(tmp_path, "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl")
    wheel(tmp_path, "PyYAML-6.0.4-cp312-cp312-manylinux_2_17_x86_64.whl")
    found = problems(tmp_path, [("numpy", "2.4.6"), ("PyYAML", "6.0.4")])
    assert any("the image already has numpy 2.5.2 (list read 2026-11-17)" in p for p in found)
    assert any("the image already has pyyaml (list read" in p for p in found)
    assert "numpy: pinned, but the image has it" in found


def test_a_set_over_the_budget_fails(tmp_path: Path) -> None:
    wheel(tmp_path, "big-1.0-py3-none-any.whl", size=45 * gpu_wheels.MIB)
    wheel(tmp_path, "bigger-1.0-py3-none-any.whl", size=16 * gpu_wheels.MIB)
    pins = [("big", "1.0"), ("bigger", "1.0")]
    assert problems(tmp_path, pins) == ["61.0 MiB of wheels: over the 60 MiB budget"]
    assert problems(tmp_path, pins, budget_mib=62) == []


def test_the_folder_must_hold_the_pins_and_nothing_else(tmp_path: Path) -> None:
    wheel(tmp_path, "demo-1.0-py3-none-any.whl")
    wheel(tmp_path, "demo-1.1-py3-none-any.whl")
    wheel(tmp_path, "extra-2.0-py3-none-any.whl")
    wheel(tmp_path, "other-1.0.tar.gz")
    found = problems(tmp_path, [("demo", "1.1"), ("absent", "3.0")])
    assert "other-1.0.tar.gz: not a wheel" in found
    assert "demo-1.1-py3-none-any.whl: a second version of demo (1.0)" in found
    assert "absent==3.0: pinned, no wheel" in found
    assert "extra: a wheel that is not pinned" in found
    assert problems(tmp_path / "nowhere", []) == [f"{tmp_path / 'nowhere'}: no such directory"]


def test_the_supported_tags_stop_at_glibc_2_28() -> None:
    tags = gpu_wheels.supported_tags()
    assert Tag("cp312", "cp312", "manylinux_2_28_x86_64") in tags
    assert Tag("cp312", "cp312", "manylinux2014_x86_64") in tags
    assert Tag("py3", "none", "any") in tags
    assert Tag("cp312", "cp312", "manylinux_2_29_x86_64") not in tags
    assert Tag("cp311", "cp311", "manylinux_2_28_x86_64") not in tags


def test_the_committed_lists_are_consistent() -> None:
    image = gpu_wheels.load_image()
    assert image.python.startswith("3.12.3") and image.read == "2026-11-17"
    versions = {str(name): version for name, version in image.packages.items()}
    assert versions["torch"] == "2.11.0" and versions["transformers"] == "5.17.0"
    assert versions["numpy"] == "2.5.2" and image.has("PyYAML") and image.has("pip")
    pins = gpu_wheels.read_pins()
    assert len(pins) == len({n for n, _ in pins})
    assert [n for n, _ in pins if image.has(n)] == []
    assert {"cosyvoice-minicpmo", "diffusers", "HyperPyYAML", "msgspec"} <= {n for n, _ in pins}


@pytest.mark.skipif(
    bool(upstream.missing_packages()), reason="the cosyvoice2 extra is not installed"
)
def test_every_pin_is_the_version_installed_here() -> None:
    """The rehearsal without wheels links these from this virtual environment."""
    import importlib.metadata

    for name, version in gpu_wheels.read_pins():
        assert importlib.metadata.version(name) == version, name


def test_the_download_command_names_the_python_and_the_platforms(tmp_path: Path) -> None:
    command = gpu_wheels.download_command((3, 11), tmp_path)
    joined = " ".join(command)
    assert "--python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none" in joined
    assert "--platform manylinux_2_28_x86_64" in joined and "--platform any" in joined
    assert "--no-deps --only-binary=:all:" in joined
    assert command[-2:] == ["-r", str(gpu_wheels.WHEEL_LIST)]
    assert "--abi cp312" in " ".join(gpu_wheels.download_command((3, 12), tmp_path))


def test_the_cli_exits_1_on_a_problem_and_0_on_a_set_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = tmp_path / "pins.txt"
    pins.write_text("# a comment\ndemo==1.0  # why\n")
    folder = tmp_path / "wheels"
    wheel(folder, "demo-1.0-cp312-abi3-manylinux_2_17_x86_64.whl")
    args = ["check", "--dest", str(folder), "--requirements", str(pins)]
    assert gpu_wheels.main(args) == 0
    assert "fits: CPython 3.12 manylinux x86_64" in capsys.readouterr().out
    os.rename(
        folder / "demo-1.0-cp312-abi3-manylinux_2_17_x86_64.whl",
        folder / "demo-1.0-cp312-cp312-win_amd64.whl",
    )
    assert gpu_wheels.main(args) == 1
    assert "PROBLEM: demo-1.0-cp312-cp312-win_amd64.whl: tags" in capsys.readouterr().err
