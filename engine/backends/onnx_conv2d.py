"""One-dimensional convolutions of an ONNX graph rewritten as two-dimensional ones.

ONNX Runtime's CPU provider runs a 1-D ``Conv`` as im2col and a matrix product, but a 2-D
``Conv`` with its blocked-layout kernels (NCHWc, on x86 with AVX2 or AVX-512). A 1-D
convolution over ``[batch, channels, time]`` is the 2-D one over
``[batch, channels, 1, time]`` with a kernel of height 1, so the rewrite is exact (the
same sums, in a different order: results agree to float rounding). For a Piper voice
(nearly all of its work is 1-D convolutions) it makes synthesis about 11 % cheaper
(docs/benchmarks.md).

Rewritten: every ``Conv`` and ``ConvTranspose`` whose weight is a 3-D initializer read by
nothing else (no node of another kind, no subgraph, not a graph input or output). Each
gets ``Unsqueeze`` (axis 2) before and ``Squeeze`` after, named after the tensors they
make; its weight gains the unit axis (and loses any stale ``value_info``) and its
attributes the unit height (``kernel_shape``, ``strides``, ``dilations``; ``output_shape``
a 1 before its last entry; ``output_padding`` a zero height; ``pads`` become
``[0, begin, 0, end]``). Everything else is left as it is, so tensor names and the graph's
inputs and outputs do not change. Sans-I/O: a ``ModelProto`` in, a new one out.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

CONV_OPS: Final = frozenset({"Conv", "ConvTranspose"})
AXIS_NAME: Final = "conv2d_rewrite_axis2"
_UNIT_PREFIXED: Final = ("kernel_shape", "strides", "dilations")
UNSQUEEZE_SUFFIX: Final = "__conv2d_unsqueeze"
_AXES_AS_INPUT_OPSET: Final = 13  # Unsqueeze/Squeeze take axes as an input from here on
_GRAPHS: Final = frozenset({5, 10})  # onnx.AttributeProto.GRAPH and GRAPHS: a node's bodies


def conv1d_as_conv2d(model: Any) -> Any:
    """A copy of ``model`` (an ``onnx.ModelProto``) with its 1-D convolutions run as
    2-D ones. The count rewritten is :func:`rewritten_count` of the result."""
    import onnx
    from onnx import helper, numpy_helper

    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    weights = {init.name: init for init in graph.initializer}
    eligible = _convertible_weights(graph, weights)
    if not eligible:
        return result
    axes_as_input = _default_opset(result) >= _AXES_AS_INPUT_OPSET
    if axes_as_input:
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), AXIS_NAME))
    for name in eligible:
        init = weights[name]
        array = numpy_helper.to_array(init)
        init.CopyFrom(numpy_helper.from_array(array[:, :, np.newaxis, :], name))
    stale = [info for info in graph.value_info if info.name in eligible]
    for info in stale:
        graph.value_info.remove(info)

    nodes: list[Any] = []
    for node in graph.node:
        if node.op_type not in CONV_OPS or len(node.input) < 2 or node.input[1] not in eligible:
            nodes.append(node)
            continue
        source, target = node.input[0], node.output[0]
        wide_in, wide_out = f"{target}__conv2d_in", f"{target}__conv2d_out"
        unsqueeze = _axis_node(
            "Unsqueeze", source, wide_in, f"{target}{UNSQUEEZE_SUFFIX}", axes_as_input
        )
        nodes.append(unsqueeze)
        _widen_attributes(node, helper)
        node.input[0] = wide_in
        node.output[0] = wide_out
        nodes.append(node)
        squeeze = _axis_node(
            "Squeeze", wide_out, target, f"{target}__conv2d_squeeze", axes_as_input
        )
        nodes.append(squeeze)
    del graph.node[:]
    graph.node.extend(nodes)
    return result


def rewritten_count(model: Any) -> int:
    """How many convolutions of ``model`` run as rewritten 2-D ones."""
    return sum(1 for node in model.graph.node if node.name.endswith(UNSQUEEZE_SUFFIX))


def _convertible_weights(graph: Any, weights: dict[str, Any]) -> set[str]:
    """Names of 3-D weight initializers read only as the weight of convolutions."""
    conv_weights: set[str] = set()
    other_uses: set[str] = set()
    for node in graph.node:
        for position, name in enumerate(node.input):
            if node.op_type in CONV_OPS and position == 1:
                conv_weights.add(name)
            else:
                other_uses.add(name)
        for body in _bodies(node):  # If, Loop, Scan: what their bodies read
            other_uses |= _names_read(body)
    interface = {value.name for value in [*graph.input, *graph.output]}
    return {
        name
        for name in conv_weights - other_uses - interface
        if name in weights and len(weights[name].dims) == 3
    }


def _names_read(graph: Any) -> set[str]:
    """Every tensor name a graph's nodes read, its subgraphs' included."""
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for body in _bodies(node):
            names |= _names_read(body)
    return names


def _bodies(node: Any) -> list[Any]:
    """The graphs a node carries as attributes (an If's branches, a Loop's body)."""
    bodies: list[Any] = []
    for attribute in node.attribute:
        if attribute.type in _GRAPHS:
            bodies += [attribute.g, *attribute.graphs]
    return bodies


def _widen_attributes(node: Any, helper: Any) -> None:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    del node.attribute[:]
    for name, value in attributes.items():
        if name in _UNIT_PREFIXED:
            value = [1, *value]
        elif name == "output_shape":  # the spatial size, or N, C and it
            value = [*value[:-1], 1, value[-1]]
        elif name == "output_padding":
            value = [0, *value]
        elif name == "pads":
            value = [0, value[0], 0, value[1]]
        node.attribute.append(helper.make_attribute(name, value))


def _axis_node(op: str, source: str, target: str, name: str, axes_as_input: bool) -> Any:
    from onnx import helper

    if axes_as_input:
        return helper.make_node(op, [source, AXIS_NAME], [target], name=name)
    return helper.make_node(op, [source], [target], name=name, axes=[2])


def _default_opset(model: Any) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1
