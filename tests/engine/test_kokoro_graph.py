"""Kokoro's graphs: the float graph rebuilt from the int8 model (deterministic, pinned,
checked), the setting that chooses the graph, and the split into front and decoder."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from engine.backends.kokoro import assets, graph
from engine.backends.kokoro.backend import KokoroBackend, chosen_graph, cpu_has_vnni, installed
from engine.backends.kokoro.model import SplitModel, tokenize
from engine.backends.onnx_conv2d import rewritten_count

pytestmark = pytest.mark.skipif(
    not installed(), reason="kokoro assets not installed (make kokoro-voices)"
)

VNNI = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
NO_VNNI = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n"


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An asset directory with the int8 model, its float graph built there."""
    directory = tmp_path_factory.mktemp("kokoro")
    shutil.copy(assets.asset_dir() / assets.MODEL_FILE, directory / assets.MODEL_FILE)
    assets.build_float(directory)
    return directory


def test_the_float_graph_is_rebuilt_to_its_pinned_bytes(float_dir: Path) -> None:
    data = (float_dir / assets.FLOAT_FILE).read_bytes()
    assert hashlib.sha256(data).hexdigest() == assets.FLOAT_SHA256
    model = onnx.load_from_string(data)
    ops = {node.op_type for node in model.graph.node}
    assert not ops & {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
                      "DynamicQuantizeLSTM", "DequantizeLinear"}  # fmt: skip
    assert rewritten_count(model) >= 80  # the 1-D convolutions run as 2-D ones
    assert assets.float_bytes(float_dir) == data


def test_a_damaged_float_graph_is_rebuilt(float_dir: Path) -> None:
    path = float_dir / assets.FLOAT_FILE
    good = path.read_bytes()
    path.write_bytes(good[:-10] + b"\0" * 10)
    assert assets.float_bytes(float_dir) == good
    assert path.read_bytes() == good


def test_a_rebuild_that_misses_its_pin_is_refused(
    float_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shutil.copy(float_dir / assets.MODEL_FILE, tmp_path / assets.MODEL_FILE)
    monkeypatch.setattr(assets, "FLOAT_SHA256", "0" * 64)
    with pytest.raises(assets.KokoroAssetError, match="ENGINE_KOKORO_GRAPH=int8"):
        assets.float_bytes(tmp_path)
    assert not (tmp_path / assets.FLOAT_FILE).exists()


def test_the_graph_setting_chooses_float_or_int8() -> None:
    assert chosen_graph({"ENGINE_KOKORO_GRAPH": "int8"}, VNNI) == "int8"
    assert chosen_graph({"ENGINE_KOKORO_GRAPH": "float"}, VNNI) == "float"
    assert chosen_graph({}, VNNI) == chosen_graph({"ENGINE_KOKORO_GRAPH": "auto"}, VNNI) == "int8"
    assert chosen_graph({}, NO_VNNI) == "float"
    assert cpu_has_vnni("flags : avx_vnni") and not cpu_has_vnni("")
    with pytest.raises(ValueError, match="ENGINE_KOKORO_GRAPH"):
        chosen_graph({"ENGINE_KOKORO_GRAPH": "fp16"})


def test_each_graph_splits_into_front_and_decoder(float_dir: Path) -> None:
    for data in (assets.model_bytes(float_dir), assets.float_bytes(float_dir)):
        parts = graph.split(onnx.load_from_string(data))
        assert len(parts.norms) == 54
        front_out = {o.name for o in parts.front.graph.output}
        assert {graph.ALIGNED, graph.F0, graph.ENERGY, graph.PHASE} <= front_out
        decoder_in = {i.name for i in parts.decoder.graph.input}
        assert {graph.ALIGNED, graph.F0, graph.ENERGY, graph.PHASE, "style"} <= decoder_in
        assert not any(n.op_type == "CumSum" for n in parts.decoder.graph.node)


def test_the_float_graph_speaks_like_the_int8_one(float_dir: Path) -> None:
    """Same weights: the same durations within a frame or two, the same level."""
    from engine.backends.kokoro.g2p import english

    ids = tokenize(english("Thank you for calling the billing department today."))[0].ids
    style = assets.load_pack("af_heart")[len(ids) - 1]
    out = {}
    for name, data in (
        ("int8", assets.model_bytes(float_dir)),
        ("float", assets.float_bytes(float_dir)),
    ):
        model = SplitModel(onnx.load_from_string(data))
        frames, features = model.front(ids, style, 1.0)
        audio, _ = model.decode(features, 0, features.frames, None)
        out[name] = (int(frames.sum()), float(np.sqrt(np.mean(audio**2))))
    assert abs(out["float"][0] - out["int8"][0]) <= 2
    assert abs(20 * np.log10(out["float"][1] / out["int8"][1])) < 1.5


def test_the_backend_runs_the_graph_it_is_told(float_dir: Path) -> None:
    (float_dir / "voices").mkdir(exist_ok=True)
    shutil.copy(assets.voices_dir() / "af_heart.bin", float_dir / "voices" / "af_heart.bin")
    from engine.backends.kokoro.backend import VOICES

    heart = [v for v in VOICES if v.pack == "af_heart"]
    backend = KokoroBackend(
        voices=heart, directory=float_dir, graph="int8", idle_threads=1, pieces="off"
    )
    assert backend.digest == assets.MODEL_SHA256 and backend.graph == "int8"
    assert backend.version.startswith(f"kokoro/{assets.MODEL_SHA256[:12]}/whole/")
