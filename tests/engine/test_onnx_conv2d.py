"""The 1-D to 2-D convolution rewrite: the same outputs as the original graph, on small
graphs built here (every attribute the rewrite touches) run with ONNX Runtime."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.backends.onnx_conv2d import conv1d_as_conv2d, rewritten_count
from engine.backends.onnx_cpu import cpu_session

RNG = np.random.default_rng(7)


def _model(nodes: list[Any], weights: dict[str, np.ndarray], channels: int, opset: int = 15) -> Any:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, channels, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, None])],
        [
            numpy_helper.from_array(value.astype(np.float32), name)
            for name, value in weights.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _run(model: Any, x: np.ndarray) -> np.ndarray:
    session = cpu_session(model.SerializeToString())
    return np.asarray(session.run(None, {"x": x})[0])


def _same_outputs(model: Any, channels: int, frames: int = 37) -> Any:
    rewritten = conv1d_as_conv2d(model)
    onnx.checker.check_model(rewritten)
    for batch in (1, 3):
        x = RNG.standard_normal((batch, channels, frames)).astype(np.float32)
        expected, got = _run(model, x), _run(rewritten, x)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    return rewritten


CONV_CASES = {
    "plain": {"kernel_shape": [3], "pads": [1, 1]},
    "dilated": {"kernel_shape": [5], "dilations": [3], "pads": [6, 6]},
    "strided, uneven pads": {"kernel_shape": [4], "strides": [2], "pads": [1, 2]},
    "grouped": {"kernel_shape": [3], "group": 2, "pads": [1, 1]},
    "no pads attribute": {"kernel_shape": [3]},
    "auto pad": {"kernel_shape": [3], "auto_pad": "SAME_UPPER"},
    "auto pad, lower": {"kernel_shape": [4], "auto_pad": "SAME_LOWER"},
    "auto pad, valid": {"kernel_shape": [3], "auto_pad": "VALID", "strides": [2]},
    "no kernel_shape": {"pads": [1, 1]},
}


@pytest.mark.parametrize("attributes", CONV_CASES.values(), ids=CONV_CASES.keys())
def test_conv_gives_the_same_output(attributes: dict[str, Any]) -> None:
    group = attributes.get("group", 1)
    kernel = attributes.get("kernel_shape", [3])[0]
    weights = {"w": RNG.standard_normal((6, 4 // group, kernel)), "b": RNG.standard_normal(6)}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", **attributes)
    rewritten = _same_outputs(_model([node], weights, channels=4), channels=4)
    assert rewritten_count(rewritten) == 1


TRANSPOSE_CASES = {
    "upsample by 8 (HiFi-GAN)": {"kernel_shape": [16], "strides": [8], "pads": [4, 4]},
    "output padding": {"kernel_shape": [8], "strides": [4], "pads": [2, 2], "output_padding": [1]},
    "dilated": {"kernel_shape": [3], "strides": [2], "dilations": [2]},
    "grouped": {"kernel_shape": [4], "strides": [2], "pads": [1, 1], "group": 2},
    "output shape": {"kernel_shape": [4], "strides": [2], "output_shape": [74]},
}


@pytest.mark.parametrize("attributes", TRANSPOSE_CASES.values(), ids=TRANSPOSE_CASES.keys())
def test_conv_transpose_gives_the_same_output(attributes: dict[str, Any]) -> None:
    kernel, group = attributes["kernel_shape"][0], attributes.get("group", 1)
    weights = {"w": RNG.standard_normal((4, 6 // group, kernel)), "b": RNG.standard_normal(6)}
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", **attributes)
    rewritten = _same_outputs(_model([node], weights, channels=4), channels=4)
    assert rewritten_count(rewritten) == 1


def test_a_residual_block_keeps_its_names_and_output() -> None:
    """Conv, LeakyRelu, Add as in a HiFi-GAN resblock; a weight shared by two convs is
    widened once; tensor names that other nodes read are kept."""
    weights = {"w": RNG.standard_normal((4, 4, 3)), "b": RNG.standard_normal(4)}
    nodes = [
        helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
        helper.make_node("Conv", ["a", "w", "b"], ["c1"], name="c1", kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Add", ["c1", "x"], ["r"]),
        helper.make_node(
            "Conv", ["r", "w", "b"], ["c2"], name="c2", kernel_shape=[3], pads=[3, 3], dilations=[3]
        ),
        helper.make_node("Add", ["c2", "r"], ["y"]),
    ]
    rewritten = _same_outputs(_model(nodes, weights, channels=4), channels=4)
    assert rewritten_count(rewritten) == 2
    outputs = {out for node in rewritten.graph.node for out in node.output}
    assert {"c1", "c2", "r", "y"} <= outputs


def test_older_opsets_take_axes_as_an_attribute() -> None:
    weights = {"w": RNG.standard_normal((2, 4, 3))}
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3], pads=[1, 1])
    rewritten = _same_outputs(_model([node], weights, channels=4, opset=11), channels=4)
    squeeze = [n for n in rewritten.graph.node if n.op_type == "Squeeze"]
    assert len(squeeze) == 1 and len(squeeze[0].input) == 1


def test_weights_read_elsewhere_and_2d_convs_are_left_alone() -> None:
    """A weight that another node also reads keeps its shape (and its conv stays 1-D); a
    2-D convolution is not touched; the input model is not modified."""
    shared = {"w": RNG.standard_normal((4, 4, 1)), "b": RNG.standard_normal(4)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[1]),
        helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0),
        helper.make_node("Add", ["c", "s"], ["y"]),
    ]
    model = _model(nodes, shared, channels=4)
    before = model.SerializeToString()
    rewritten = _same_outputs(model, channels=4)
    assert rewritten_count(rewritten) == 0
    assert model.SerializeToString() == before

    image = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        "g2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, None, None])],
        [numpy_helper.from_array(RNG.standard_normal((2, 2, 3, 3)).astype(np.float32), "w")],
    )
    model_2d = helper.make_model(image, opset_imports=[helper.make_opsetid("", 15)])
    assert rewritten_count(conv1d_as_conv2d(model_2d)) == 0


def test_unnamed_convolutions_get_unique_node_names() -> None:
    weights = {"w": RNG.standard_normal((4, 4, 3))}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("Conv", ["a", "w"], ["y"], kernel_shape=[3], pads=[1, 1]),
    ]
    rewritten = _same_outputs(_model(nodes, weights, channels=4), channels=4)
    added = [node.name for node in rewritten.graph.node if node.op_type != "Conv"]
    assert rewritten_count(rewritten) == 2 and len(set(added)) == len(added) == 4


def test_a_weight_that_is_also_a_graph_input_or_read_in_a_subgraph_is_left_alone() -> None:
    """A weight fed as a graph input (initializers kept as inputs) could be replaced by
    the caller with a 3-D one; one read inside an If's branch would change under it."""
    weights = {"w": RNG.standard_normal((4, 4, 3))}
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3], pads=[1, 1])
    model = _model([conv], weights, channels=4)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4, 3]))
    assert rewritten_count(conv1d_as_conv2d(model)) == 0

    branch = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["wb"])],
        "branch",
        [],
        [helper.make_tensor_value_info("wb", TensorProto.FLOAT, [4, 4, 3])],
    )
    model = _model([conv], weights, channels=4)
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "flag"))
    model.graph.node.append(
        helper.make_node("If", ["flag"], ["unused"], then_branch=branch, else_branch=branch)
    )
    assert rewritten_count(conv1d_as_conv2d(model)) == 0
