"""triodnn.onnx: ONNX models built here with onnx.helper, imported, compiled on the default engine
and compared with the float64 numpy computation of the same model (and, for what folds, with
ONNX's reference evaluator); the ops each import makes are counted exactly."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto, helper, numpy_helper

import triodnn
import triodnn.onnx
from triodnn._values._errors import InvalidArgumentError
from triodnn.graph import MissingHandlerError, compile_graph


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _value(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _kinds(onnx_graph):
    return collections.Counter(op.kind for op in onnx_graph.graph.ops)


async def _run(engine, onnx_graph, feeds, **kwargs):
    runner = await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants, **kwargs)
    stream = await engine.stream()
    results = await runner.run(stream, {onnx_graph.inputs[name]: a for name, a in feeds.items()})
    return [results[i] for i in onnx_graph.outputs.values()]


def _conv_ref(x, w, b, pad):
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i:i + out.shape[2], j:j + out.shape[3]], w[:, :, i, j])
    return out + b.reshape(1, -1, 1, 1)


async def test_a_small_cnn_matches_numpy(engine, rng):
    """Conv (bias, padding) -> Relu -> MaxPool -> Flatten -> Gemm (transB, bias) -> Softmax."""
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(4).astype(np.float32)
    fc = rng.standard_normal((5, 64)).astype(np.float32) * 0.2
    fc_b = rng.standard_normal(5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fc_b"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"]),
    ]
    model = _model(nodes, [_value("x", [2, 3, 8, 8])], [_value("y", [2, 5])],
                   [("w", w), ("b", b), ("fc", fc), ("fc_b", fc_b)])
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"Convolution": 1, "ReLU": 1, "MaxPool": 1, "StaticReshape": 1, "MatMul": 1,
                                  "SoftMax": 1}
    assert set(onnx_graph.inputs) == {"x"} and len(onnx_graph.constants) == 4 and not onnx_graph.wildcard_nodes
    (y,) = await _run(engine, onnx_graph, {"x": x})
    c = np.maximum(_conv_ref(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1), 0)
    p = c.reshape(2, 4, 4, 2, 4, 2).max(axis=(3, 5)).reshape(2, -1)
    g = p @ fc.T.astype(np.float64) + fc_b
    want = np.exp(g - g.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6)


async def test_constants_fold_and_gemm_scales(engine, rng):
    """ConstantOfShape, Shape arithmetic and a Reshape of known shape fold away; Gemm's alpha
    and beta with a 2-D C become a Multiply and an Add."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    c = rng.standard_normal((3, 6)).astype(np.float32)
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Add", ["ones", "w"], ["w1"]),  # folds: both known
        helper.make_node("Shape", ["x"], ["xs"]),  # folds: x's shape is static
        helper.make_node("Reshape", ["x", "xs"], ["x2"]),
        helper.make_node("Gemm", ["x2", "w1", "c"], ["y"], alpha=0.5, beta=2.0),
    ]
    model = _model(nodes, [_value("x", [3, 4])], [_value("y", [3, 6])],
                   [("shape", np.array([4, 6], np.int64)), ("w", w), ("c", c)])
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"StaticReshape": 1, "MatMul": 1, "Multiply": 2, "Add": 1}
    (y,) = await _run(engine, onnx_graph, {"x": x})
    want = 0.5 * (x.astype(np.float64) @ (w.astype(np.float64) + 1)) + 2.0 * c
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


async def test_a_node_without_converter_runs_through_its_handler(engine, rng):
    """Hardmax has no oneDNN Graph op: a Wildcard that ``handlers()`` runs through ONNX's
    reference evaluator (the results are the evaluator's for the whole model); without handlers,
    compile_graph names it."""
    x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Hardmax", ["x"], ["l"], axis=1), helper.make_node("Relu", ["l"], ["y"])]
    model = _model(nodes, [_value("x", [1, 4, 3, 3])], [_value("y", [1, 4, 3, 3])])
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"Wildcard": 1, "ReLU": 1}
    assert [n.op_type for n in onnx_graph.wildcard_nodes.values()] == ["Hardmax"]
    with pytest.raises(MissingHandlerError, match="Wildcard"):
        await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants)
    (y,) = await _run(engine, onnx_graph, {"x": x}, handlers=onnx_graph.handlers())
    (want,) = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


async def test_batch_norm_pooling_and_elementwise(engine, rng):
    """BatchNormalization, AveragePool (count_include_pad), GlobalAveragePool, Clip (inputs),
    LeakyRelu and a broadcast Mul, opset 13."""
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    scale, bias = rng.uniform(0.5, 1.5, 3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    mean, var = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    k = rng.standard_normal((1, 3, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["n"], epsilon=1e-3),
        helper.make_node("Clip", ["n", "lo", "hi"], ["c"]),
        helper.make_node("LeakyRelu", ["c"], ["l"], alpha=0.1),
        helper.make_node("Mul", ["l", "k"], ["mk"]),
        helper.make_node("AveragePool", ["mk"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("GlobalAveragePool", ["a"], ["y"]),
    ]
    model = _model(nodes, [_value("x", [2, 3, 6, 6])], [_value("y", [2, 3, 1, 1])],
                   [("s", scale), ("bb", bias), ("m", mean), ("v", var), ("k", k),
                    ("lo", np.array(-1.0, np.float32)), ("hi", np.array(1.5, np.float32))], opset=13)
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"BatchNormInference": 1, "Clamp": 1, "LeakyReLU": 1, "Multiply": 1, "AvgPool": 1,
                                  "ReduceMean": 1}
    (y,) = await _run(engine, onnx_graph, {"x": x})
    c = lambda a: a.reshape(1, -1, 1, 1).astype(np.float64)  # noqa: E731
    n = (x - c(mean)) / np.sqrt(c(var) + 1e-3) * c(scale) + c(bias)
    l = np.clip(n, -1.0, 1.5)
    l = np.where(l > 0, l, 0.1 * l) * k
    padded = np.pad(l, ((0, 0), (0, 0), (1, 1), (1, 1)))
    a = sum(padded[:, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3)) / 9
    np.testing.assert_allclose(y, a.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


async def test_batch_norm_after_a_convolution_rides_on_it(engine, rng):
    """Conv -> BatchNormalization -> Relu with known statistics: the BN becomes a per-channel
    Multiply and Add of constants, which fuse with the ReLU into the convolution's post-ops:
    one partition, one primitive."""
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    scale, shift = rng.uniform(0.5, 1.5, 4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    mean, var = rng.standard_normal(4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "sh", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    model = _model(nodes, [_value("x", [2, 3, 6, 6])], [_value("y", [2, 4, 6, 6])],
                   [("w", w), ("s", scale), ("sh", shift), ("m", mean), ("v", var)])
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"Convolution": 1, "Multiply": 1, "Add": 1, "ReLU": 1}
    runner = await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants)
    (partition,) = runner.compiled_partitions
    assert [p.kind for p in partition.primitives] == ["convolution"]
    (y,) = await _run(engine, onnx_graph, {"x": x})
    c = lambda a: a.reshape(1, -1, 1, 1).astype(np.float64)  # noqa: E731
    conv = _conv_ref(x.astype(np.float64), w.astype(np.float64), np.zeros(4), 1)
    want = np.maximum((conv - c(mean)) / np.sqrt(c(var) + 1e-3) * c(scale) + c(shift), 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


async def test_softmax_before_opset_13_flattens_from_its_axis(engine, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [_value("x", [2, 3, 4])],
                   [_value("y", [2, 3, 4])], opset=11)
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"StaticReshape": 2, "SoftMax": 1}
    (y,) = await _run(engine, onnx_graph, {"x": x})
    flat = x.reshape(2, 12).astype(np.float64)
    want = np.exp(flat - flat.max(1, keepdims=True))
    np.testing.assert_allclose(y, (want / want.sum(1, keepdims=True)).reshape(2, 3, 4), rtol=1e-5, atol=1e-7)


async def test_softmin_selu_and_instance_norm_convert_without_a_wildcard(engine, rng):
    """torch's Softmin exports as Neg then Softmax, SELU as Selu, InstanceNorm2d as
    InstanceNormalization: Multiply by -1, Elu then Multiply, and GroupNorm of one group a channel."""
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    scale, bias = rng.uniform(0.5, 2, 3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    model = _model([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Softmax", ["n"], ["soft"], axis=1),
                    helper.make_node("Selu", ["x"], ["selu"]),
                    helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["inorm"], epsilon=1e-3)],
                   [_value("x", [2, 3, 4, 5])], [_value(n, [2, 3, 4, 5]) for n in ("soft", "selu", "inorm")],
                   initializers=[("scale", scale), ("bias", bias)])
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert not onnx_graph.wildcard_nodes
    assert _kinds(onnx_graph) == {"Multiply": 2, "SoftMax": 1, "Elu": 1, "GroupNorm": 1}
    got = await _run(engine, onnx_graph, {"x": x})
    x64 = x.astype(np.float64)
    e = np.exp(-x64 - (-x64).max(1, keepdims=True))
    selu = 1.0507009873554805 * np.where(x64 > 0, x64, 1.6732632423543772 * np.expm1(x64))
    mean, var = x64.mean((2, 3), keepdims=True), x64.var((2, 3), keepdims=True)
    inorm = (x64 - mean) / np.sqrt(var + 1e-3) * scale[:, None, None] + bias[:, None, None]
    for y, want in zip(got, (e / e.sum(1, keepdims=True), selu, inorm)):
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


async def test_an_output_another_node_reads_is_still_returned(engine, rng):
    """ONNX lets a graph output feed other nodes (logits beside their softmax); an End op keeps
    it a graph output."""
    x = rng.standard_normal((2, 5)).astype(np.float32)
    model = _model([helper.make_node("Relu", ["x"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"])],
                   [_value("x", [2, 5])], [_value("p", [2, 5]), _value("logits", [2, 5])])
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"ReLU": 1, "SoftMax": 1, "End": 1}
    p, logits = await _run(engine, onnx_graph, {"x": x})
    np.testing.assert_array_equal(logits, np.maximum(x, 0))
    e = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


async def test_lrn_runs_on_the_host_as_its_specification_says(engine):
    """ONNX's reference evaluator (onnx 1.23) loops LRN's channel window over the batch dim; with
    one image and 4 channels it leaves channels 1-3 undivided. triodnn's LRN (a Wildcard run on
    the host) follows the specification, as ONNX Runtime does."""
    model = _model([helper.make_node("LRN", ["x"], ["y"], size=3, alpha=0.5, beta=1.0, bias=1.0)],
                   [_value("x", [1, 4, 1, 1])], [_value("y", [1, 4, 1, 1])])
    onnx_graph = triodnn.onnx.from_onnx(model)
    x = np.arange(1, 5, dtype=np.float32).reshape(1, 4, 1, 1)
    (y,) = await _run(engine, onnx_graph, {"x": x}, handlers=onnx_graph.handlers())
    squares = x.reshape(4).astype(np.float64) ** 2
    windows = [squares[max(0, c - 1):c + 2].sum() for c in range(4)]
    np.testing.assert_allclose(y.reshape(4), x.reshape(4) / (1 + 0.5 / 3 * np.array(windows)), rtol=1e-6)


def test_bad_models_and_inputs_are_named():
    with pytest.raises(triodnn.onnx.OnnxImportError, match="no ONNX model at 'missing.onnx'"):
        triodnn.onnx.from_onnx("missing.onnx")
    with pytest.raises(triodnn.onnx.OnnxImportError, match="expected a path, bytes or onnx.ModelProto"):
        triodnn.onnx.from_onnx(42)
    broken = _model([helper.make_node("Relu", ["nowhere"], ["y"])], [_value("x", [2])], [_value("y", [2])])
    with pytest.raises(triodnn.onnx.OnnxImportError, match="the ONNX checker refuses the model"):
        triodnn.onnx.from_onnx(broken)
    assert issubclass(triodnn.onnx.OnnxImportError, InvalidArgumentError)
    good = _model([helper.make_node("Relu", ["x"], ["y"])], [_value("x", [2])], [_value("y", [2])])
    assert triodnn.onnx.from_onnx(good.SerializeToString()).inputs == {"x": 0}
    with pytest.raises(triodnn.onnx.OnnxImportError, match=r"input_shapes names 'z'; the model's inputs are \['x'\]"):
        triodnn.onnx.from_onnx(good, input_shapes={"z": (2,)})
    with pytest.raises(triodnn.onnx.OnnxImportError, match="input_shapes gives 'x' 2 dims; the model declares 1"):
        triodnn.onnx.from_onnx(good, input_shapes={"x": (2, 2)})
    strings = _model([helper.make_node("Identity", ["x"], ["y"])], [_value("x", [2], TensorProto.STRING)],
                     [_value("y", [2], TensorProto.STRING)])
    with pytest.raises(triodnn.UnsupportedError, match="input 'x' has ONNX element type 8"):
        triodnn.onnx.from_onnx(strings)


async def test_a_qdq_convolution_fuses_into_one_int8_partition(engine, rng):
    """QuantizeLinear/DequantizeLinear around a Conv with per-channel int8 weights: the weights'
    DequantizeLinear is not folded, so the graph is oneDNN's int8 pattern and compiles to one
    partition; results within one output quantum of the reference evaluator's."""
    w = rng.integers(-20, 20, (8, 4, 3, 3)).astype(np.int8)
    initializers = [("xs", np.array(0.05, np.float32)), ("xz", np.array(128, np.uint8)), ("w", w),
                    ("ws", np.full(8, 0.01, np.float32)), ("wz", np.zeros(8, np.int8)),
                    ("ys", np.array(0.1, np.float32)), ("yz", np.array(128, np.uint8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    model = _model(nodes, [_value("x", [1, 4, 8, 8])], [_value("y", [1, 8, 8, 8])], initializers, opset=19)
    onnx_graph = triodnn.onnx.from_onnx(model)
    assert _kinds(onnx_graph) == {"Quantize": 2, "Dequantize": 3, "Convolution": 1, "ReLU": 1}
    runner = await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants)
    assert len(runner.compiled_partitions) == 1
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    y = (await runner.run(await engine.stream(), {onnx_graph.inputs["x"]: x}))[onnx_graph.outputs["y"]]
    (want,) = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
    assert np.abs(y - want).max() <= 0.1 + 1e-6  # a rounding tie lands on either neighbour
    assert np.mean(y == want) > 0.95


async def test_an_exported_attention_block_runs_as_one_sdpa_kernel(engine, rng):
    """Transpose(K) -> MatMul -> Div by sqrt(D) -> Add mask -> Softmax -> MatMul, as torch exports
    attention: one partition, one SDPA primitive, against float64 numpy."""
    b, h, s, d = 1, 4, 32, 16
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Div", ["scores", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"])]
    shapes = {"q": [b, h, s, d], "k": [b, h, s, d], "v": [b, h, s, d], "mask": [b, 1, s, s]}
    model = _model(nodes, [_value(n, shape) for n, shape in shapes.items()], [_value("o", [b, h, s, d])],
                   [("scale", np.array(np.sqrt(d), np.float32))])
    onnx_graph = triodnn.onnx.from_onnx(model)
    runner = await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants)
    (partition,) = runner.compiled_partitions
    assert [p.impl.split(":")[1] for p in partition.primitives] == ["sdpa"]
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
    o = (await runner.run(await engine.stream(), {onnx_graph.inputs[n]: a for n, a in feeds.items()}))[
        onnx_graph.outputs["o"]]
    q, k, v, mask = (feeds[n].astype(np.float64) for n in ("q", "k", "v", "mask"))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d) + mask
    p = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(o, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
