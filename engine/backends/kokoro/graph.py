"""Kokoro's graphs: the float graph rebuilt from the int8 one, and its split in two.

Sans-I/O: ``onnx.ModelProto`` in, a new one out (the asset module reads and writes files).

The float graph (:func:`float_graph`): the shipped model is a dynamically quantized export
(every activation re-quantized at run time: ``DynamicQuantizeLinear`` before 148
``MatMulInteger``, 87 ``ConvInteger``, 6 ``DynamicQuantizeLSTM``, 4 embedding tables read
through ``DequantizeLinear``), which this CPU runs no faster than float. Each quantized
operator is replaced by its float one over the dequantized weight, ``(q - zero_point) *
scale`` (per tensor, or per output column for the matrix products; the LSTM's weights
transposed back to ONNX's ``[directions, 4 * hidden, input]`` layout), with the float bias
the quantized one was made from; a weight read by several operators (ALBERT's 12 layers
share theirs) becomes one float initializer. The same weights, so it sounds the same (the
int8 path rounds each activation; the float one does not). Then the 1-D convolutions run
as 2-D ones (:mod:`engine.backends.onnx_conv2d`). The result is a function of the int8
model alone, built in a fixed order: the same bytes every time, so its sha256 can be
pinned (:data:`engine.backends.kokoro.assets.FLOAT_SHA256`).

The split (:func:`split`): a front graph (``tokens``, ``style``, ``speed`` to the frames of
each id, the aligned features, the F0 and energy curves and the harmonic source's phase)
and a decoder graph (those, over a range of frames, and ``style`` to audio), so that the
decoder can run over frame ranges (:mod:`engine.backends.kokoro.pieces`). Both graphs take
the tensor names of the whole model; the decoder's phase input replaces the in-graph
cumulative sum of the harmonic source (:data:`PHASE`, computed by the front over the whole
segment), and each of its instance normalizations can take its statistics from inputs
(:data:`STATS_GIVEN_FLAG`); it returns its own either way.
Either graph, int8 or float, splits the same way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from engine.backends.onnx_conv2d import conv1d_as_conv2d

# The tensors where the model's front hands over to its decoder (names of the export).
ALIGNED: Final = "/encoder/MatMul_1_output_0"  # [1, 512, frames]: features per frame
F0: Final = "/encoder/Reshape_output_0"  # [1, 2 * frames]: pitch (Hz), two per frame
ENERGY: Final = "/encoder/Reshape_1_output_0"  # [1, 2 * frames]
# The harmonic source's phase in radians, [1, harmonics, 2 * frames] (before its upsampling
# to the sample rate): 2 pi * 300 * the cumulative sum of frac(f0 * h / 24000).
PHASE: Final = "/decoder/decoder/generator/m_source/l_sin_gen/Mul_4_output_0"
PHASE_SUM: Final = "/decoder/decoder/generator/m_source/l_sin_gen/CumSum"
NORM_PREFIX: Final = "/decoder/"


class GraphError(RuntimeError):
    """The model is not the export this module knows (a tensor or pattern is missing)."""


# ----------------------------------------------------------------------------- float graph


def float_graph(model: Any) -> Any:
    """The float32 graph of the int8 ``model`` (dequantized, then its 1-D convolutions as
    2-D ones). Deterministic: equal inputs give byte-equal serializations."""
    return conv1d_as_conv2d(dequantize(model))


def dequantize(model: Any) -> Any:
    """A copy of ``model`` with its dynamically quantized operators run in float."""
    import onnx

    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    rebuild = _Dequantizer(graph)
    nodes: list[Any] = []
    for node in graph.node:
        replaced = rebuild.replace(node)
        nodes += [node] if replaced is None else replaced
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rebuild.new_initializers)
    _prune(graph)
    return result


class _Dequantizer:
    """Finds each quantized operator's float pattern and makes its float replacement."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.weights = {init.name: init for init in graph.initializer}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for node in graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers[name].append(node)
        self.new_initializers: list[Any] = []
        self._made: dict[tuple[str, ...], str] = {}
        self._skip: set[int] = set()  # ids of nodes folded into a replacement

    def replace(self, node: Any) -> list[Any] | None:
        """The float nodes that replace ``node`` ([] to drop it), or None to keep it."""
        if id(node) in self._skip:
            return []
        if node.op_type in ("MatMulInteger", "ConvInteger"):
            return self._integer_product(node)
        if node.op_type == "DynamicQuantizeLSTM":
            return [self._lstm(node)]
        if node.op_type == "DequantizeLinear":
            return self._dequantized_gather(node)
        return None

    def array(self, name: str) -> npt.NDArray[Any]:
        from onnx import numpy_helper

        if name not in self.weights:
            raise GraphError(f"{name} is not an initializer")
        return np.asarray(numpy_helper.to_array(self.weights[name]))

    def _float_weight(self, key: tuple[str, ...], make: Any) -> str:
        """The float initializer for ``key`` (the quantized weight and its parameters),
        made once (shared weights stay shared)."""
        from onnx import numpy_helper

        name = self._made.get(key)
        if name is None:
            name = f"{key[0]}__float"
            array = np.ascontiguousarray(make(), dtype=np.float32)
            self.new_initializers.append(numpy_helper.from_array(array, name))
            self._made[key] = name
        return name

    def _only_consumer(self, name: str) -> Any:
        users = self.consumers.get(name, [])
        if len(users) != 1:
            raise GraphError(f"{name} has {len(users)} readers, expected one")
        return users[0]

    def _integer_product(self, node: Any) -> list[Any]:
        """``DynamicQuantizeLinear`` -> ``ConvInteger``/``MatMulInteger`` [-> ``Add`` of the
        quantized bias] -> ``Cast`` -> ``Mul`` by the scales: one float ``Conv``/``MatMul``."""
        from onnx import helper

        quantized, weight, _zero, weight_zero = node.input[:4]
        quantize = self.producer.get(quantized)
        if quantize is None or quantize.op_type != "DynamicQuantizeLinear":
            raise GraphError(f"{node.name}: its input is not dynamically quantized")
        source = quantize.input[0]
        chain = [self._only_consumer(node.output[0])]
        bias: str | None = None
        if chain[-1].op_type == "Add":
            bias = self._float_bias(chain[-1], node.output[0])
            chain.append(self._only_consumer(chain[-1].output[0]))
        if chain[-1].op_type != "Cast":
            raise GraphError(f"{node.name}: no Cast after it")
        chain.append(self._only_consumer(chain[-1].output[0]))
        scale_mul = chain[-1]
        if scale_mul.op_type != "Mul":
            raise GraphError(f"{node.name}: no scale after it")
        scales = self.producer.get(scale_mul.input[1])
        if scales is None or scales.op_type != "Mul" or scales.input[0] != quantize.output[1]:
            raise GraphError(f"{node.name}: its scale is not the input's times the weight's")
        weight_scale = scales.input[1]
        self._skip.update(id(n) for n in chain)
        output = scale_mul.output[0]

        if node.op_type == "MatMulInteger":

            def make_matmul() -> npt.NDArray[np.float32]:
                q = self.array(weight).astype(np.float32)
                zero = self.array(weight_zero).astype(np.float32)
                return (q - zero) * self.array(weight_scale).astype(np.float32)

            float_weight = self._float_weight((weight, weight_zero, weight_scale), make_matmul)
            return [helper.make_node("MatMul", [source, float_weight], [output], name=node.name)]

        def make_conv() -> npt.NDArray[np.float32]:
            q = self.array(weight).astype(np.float32)
            zero = self.array(weight_zero).astype(np.float32)
            scale = self.array(weight_scale).astype(np.float32)
            if scale.ndim:  # per output channel
                scale = scale.reshape(-1, *([1] * (q.ndim - 1)))
                zero = zero.reshape(-1, *([1] * (q.ndim - 1))) if zero.ndim else zero
            return (q - zero) * scale

        float_weight = self._float_weight((weight, weight_zero, weight_scale), make_conv)
        inputs = [source, float_weight] + ([bias] if bias is not None else [])
        conv = helper.make_node("Conv", inputs, [output], name=node.name)
        conv.attribute.extend(node.attribute)
        return [conv]

    def _float_bias(self, add: Any, product: str) -> str:
        """The float bias whose quantized copy ``add`` adds: ``Div`` (bias / scale) ->
        ``Floor`` -> ``Cast`` -> ``Reshape`` -> this ``Add``."""
        other = add.input[1] if add.input[0] == product else add.input[0]
        node = self.producer.get(other)
        for op in ("Reshape", "Cast", "Floor", "Div"):
            if node is None or node.op_type != op:
                raise GraphError(f"{add.name}: not a quantized bias ({op} missing)")
            if op == "Div":
                break
            node = self.producer.get(node.input[0])
        assert node is not None
        bias = str(node.input[0])
        self.array(bias)  # raises when it is not an initializer
        return bias

    def _lstm(self, node: Any) -> Any:
        """``DynamicQuantizeLSTM`` (weights ``[directions, input, 4 * hidden]``, int8, a
        scale and zero point per direction) as ``LSTM`` over float weights."""
        from onnx import helper

        inputs = list(node.input) + [""] * (12 - len(node.input))
        x, w, r, b, lengths, h0, c0, peep, w_scale, w_zero, r_scale, r_zero = inputs[:12]

        def make(q: str, scale: str, zero: str) -> Any:
            def build() -> npt.NDArray[np.float32]:
                values = self.array(q).astype(np.float32)
                s = self.array(scale).astype(np.float32).reshape(values.shape[0], 1, -1)
                z = self.array(zero).astype(np.float32).reshape(values.shape[0], 1, -1)
                return np.transpose((values - z) * s, (0, 2, 1))

            return build

        float_w = self._float_weight((w, w_scale, w_zero), make(w, w_scale, w_zero))
        float_r = self._float_weight((r, r_scale, r_zero), make(r, r_scale, r_zero))
        lstm = helper.make_node(
            "LSTM", [x, float_w, float_r, b, lengths, h0, c0, peep], list(node.output),
            name=node.name,
        )  # fmt: skip
        lstm.attribute.extend(node.attribute)
        while lstm.input and not lstm.input[-1]:
            lstm.input.pop()
        return lstm

    def _dequantized_gather(self, node: Any) -> list[Any] | None:
        """``Gather`` from an int8 table -> ``DequantizeLinear``: a ``Gather`` from the float
        table. Any other ``DequantizeLinear`` is left as it is."""
        from onnx import helper

        gather = self.producer.get(node.input[0])
        if gather is None or gather.op_type != "Gather" or gather.input[0] not in self.weights:
            return None
        table, scale = gather.input[0], node.input[1]
        zero = node.input[2] if len(node.input) > 2 else ""

        def build() -> npt.NDArray[np.float32]:
            values = self.array(table).astype(np.float32)
            offset = self.array(zero).astype(np.float32) if zero else np.float32(0)
            return (values - offset) * self.array(scale).astype(np.float32)

        float_table = self._float_weight((table, scale, zero), build)
        self._skip.add(id(gather))  # made before this node: dropped by _prune
        replacement = helper.make_node(
            "Gather", [float_table, gather.input[1]], [node.output[0]], name=gather.name
        )
        replacement.attribute.extend(gather.attribute)
        return [replacement]


def _prune(graph: Any) -> None:
    """Drop nodes no graph output depends on, then initializers and value_info of tensors
    nothing reads or makes any more."""
    needed = {o.name for o in graph.output}
    kept: list[Any] = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    inits = [init for init in graph.initializer if init.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    made = {name for node in kept for name in node.output}
    infos = [info for info in graph.value_info if info.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)


# ----------------------------------------------------------------------------- the split


@dataclass(frozen=True)
class Norm:
    """One instance normalization of the decoder: the tensors of its own mean and
    variance (over time, per channel: ``[1, channels, 1]``), the inputs that can replace
    them, and the graph output that returns them."""

    mean: str
    var: str

    @property
    def mean_input(self) -> str:
        return f"{self.mean}__given"

    @property
    def var_input(self) -> str:
        return f"{self.var}__given"


# bool [normalizations]: which normalizations take given statistics rather than their own
STATS_GIVEN_FLAG: Final = "norm_stats_given"


@dataclass(frozen=True)
class Split:
    """The front and decoder graphs of one model, and the decoder's normalizations."""

    front: Any
    decoder: Any
    durations: str
    norms: tuple[Norm, ...]


def split(model: Any) -> Split:
    """Cut ``model`` (int8 or float) into a front graph and a decoder graph.

    Front: ``tokens``, ``style``, ``speed`` -> the frames of each id (the input of the
    encoder's ``CumSum``, int64), :data:`ALIGNED`, :data:`F0`, :data:`ENERGY` and
    :data:`PHASE` (the export's own nodes: the harmonic source's cumulative phase over the
    whole segment).
    Decoder: :data:`ALIGNED`, :data:`F0`, :data:`ENERGY`, :data:`PHASE` (a range of frames),
    ``style``, :data:`STATS_GIVEN_FLAG` (bool, one per normalization) and each
    normalization's given mean and variance (``[1, channels, 1]``; any shape that
    broadcasts, ``[1, 1, 1]``, where its flag is False) -> ``audio`` and each
    normalization's own mean and variance (:attr:`Split.norms` order). A normalization
    whose flag is False runs as exported; one whose flag is True normalizes with the given
    statistics (selected, not blended: an overflow of its own cannot reach them)."""
    from onnx import TensorProto, helper

    graph = model.graph
    durations = _durations_tensor(graph)
    if durations is None:
        raise GraphError("the model has no encoder CumSum (durations)")
    for name in (ALIGNED, F0, ENERGY, PHASE):
        if not any(name in node.output for node in graph.node):
            raise GraphError(f"the model has no tensor {name}")
    inputs = {i.name: i for i in graph.input}
    front = _extract(
        model,
        [inputs["tokens"], inputs["style"], inputs["speed"]],
        [
            helper.make_tensor_value_info(durations, TensorProto.INT64, None),
            helper.make_tensor_value_info(ALIGNED, TensorProto.FLOAT, [1, 512, "frames"]),
            helper.make_tensor_value_info(F0, TensorProto.FLOAT, [1, "halves"]),
            helper.make_tensor_value_info(ENERGY, TensorProto.FLOAT, [1, "halves"]),
            helper.make_tensor_value_info(PHASE, TensorProto.FLOAT, [1, "harmonics", "halves"]),
        ],
    )
    feature_inputs = [
        helper.make_tensor_value_info(ALIGNED, TensorProto.FLOAT, [1, 512, "frames"]),
        helper.make_tensor_value_info(F0, TensorProto.FLOAT, [1, "halves"]),
        helper.make_tensor_value_info(ENERGY, TensorProto.FLOAT, [1, "halves"]),
        inputs["style"],
        helper.make_tensor_value_info(PHASE, TensorProto.FLOAT, [1, "harmonics", "halves"]),
    ]
    decoder = _extract(model, feature_inputs, list(graph.output))
    norms = _given_statistics(decoder.graph)
    return Split(front, decoder, durations, norms)


def _durations_tensor(graph: Any) -> str | None:
    sums = [n for n in graph.node if n.op_type == "CumSum" and n.name.startswith("/encoder/")]
    return str(sums[0].input[0]) if len(sums) == 1 else None


def _extract(model: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> Any:
    """A model of the nodes ``outputs`` need from ``inputs`` (and initializers)."""
    import onnx
    from onnx import helper

    source = model.graph
    stops = {i.name for i in inputs}
    producer = {name: node for node in source.node for name in node.output}
    weights = {init.name: init for init in source.initializer}
    needed: set[str] = set()
    chosen: set[int] = set()
    stack = [o.name for o in outputs]
    while stack:
        name = stack.pop()
        if name in needed or name in stops or not name:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is None:
            if name not in weights:
                raise GraphError(f"{name} is neither made, given nor an initializer")
            continue
        if id(node) not in chosen:
            chosen.add(id(node))
            stack.extend(node.input)
    nodes = [node for node in source.node if id(node) in chosen]
    inits = [weights[name] for name in sorted(needed) if name in weights]
    made = {name for node in nodes for name in node.output}
    infos = [info for info in source.value_info if info.name in made]
    graph = helper.make_graph(
        nodes, source.name, list(inputs), list(outputs), inits, value_info=infos
    )
    result: onnx.ModelProto = helper.make_model(graph, opset_imports=list(model.opset_import))
    result.ir_version = model.ir_version
    return result


def _given_statistics(graph: Any) -> tuple[Norm, ...]:
    """Give every instance normalization of the decoder the statistics blend of
    :func:`split` (in place); its normalizations, in graph order."""
    from onnx import TensorProto, helper

    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    norms: list[Norm] = []
    blends: dict[int, list[Any]] = {}
    for node in graph.node:
        if node.op_type != "ReduceMean" or not node.name.startswith(NORM_PREFIX):
            continue
        subs = [c for c in consumers[node.output[0]] if c.op_type == "Sub"]
        if (
            len(subs) != 1
            or subs[0].input[1] != node.output[0]
            or len(consumers[node.output[0]]) != 1
        ):
            continue  # a variance, or not a normalization
        squares = [c for c in consumers[subs[0].output[0]] if c.op_type in ("Mul", "Pow")]
        variances = list(
            {
                id(v): v
                for s in squares
                for v in consumers[s.output[0]]
                if v.op_type == "ReduceMean" and v.input[1:] == node.input[1:]
            }.values()
        )
        if len(variances) != 1:
            raise GraphError(f"{node.name}: a mean without one variance")
        norm = Norm(node.output[0], variances[0].output[0])
        norms.append(norm)
        for reduce, own, given in (
            (node, norm.mean, norm.mean_input),
            (variances[0], norm.var, norm.var_input),
        ):
            used = f"{own}__used"
            for reader in consumers[own]:
                for k, name in enumerate(reader.input):
                    if name == own:
                        reader.input[k] = used
            index = len(norms) - 1
            flag = f"{STATS_GIVEN_FLAG}__{index}"
            blends[id(reduce)] = [
                helper.make_node(
                    "Slice",
                    [STATS_GIVEN_FLAG, f"{flag}__at", f"{flag}__to"],
                    [f"{used}__flag"],
                    name=f"{used}__flag",
                ),
                helper.make_node("Where", [f"{used}__flag", given, own], [used], name=used),
            ]
            for bound, value in (("at", index), ("to", index + 1)):
                name = f"{flag}__{bound}"
                if not any(init.name == name for init in graph.initializer):
                    graph.initializer.append(
                        helper.make_tensor(name, TensorProto.INT64, [1], [value])
                    )
    if len(norms) < 1:
        raise GraphError("the decoder has no instance normalization")
    nodes: list[Any] = []
    for node in graph.node:
        nodes.append(node)
        nodes += blends.get(id(node), [])
    del graph.node[:]
    graph.node.extend(nodes)
    graph.input.append(
        helper.make_tensor_value_info(STATS_GIVEN_FLAG, TensorProto.BOOL, [len(norms)])
    )
    for norm in norms:
        for given, own in ((norm.mean_input, norm.mean), (norm.var_input, norm.var)):
            graph.input.append(helper.make_tensor_value_info(given, TensorProto.FLOAT, None))
            graph.output.append(helper.make_tensor_value_info(own, TensorProto.FLOAT, None))
    return tuple(norms)
