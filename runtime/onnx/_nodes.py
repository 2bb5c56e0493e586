"""ONNX nodes as oneDNN Graph ops: one converter per ONNX op type, in ``CONVERTERS``.

A converter ``(builder, node, attrs)`` adds the ops of ``node`` (``attrs``: its ONNX attributes
as Python values) and binds its outputs, or returns False to leave the node to a Wildcard op (a
form of the node it does not take: a second output, an attribute without a oneDNN equivalent, a
shape it would need and cannot know). ONNX's defaults are spelled out here, since oneDNN's
differ (MaxPool's strides, Conv's pads, Softmax's axis before opset 13).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from ._builder import DTYPES, Builder

Converter = Callable[[Builder, onnx.NodeProto, dict], "bool | None"]
CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for op_type in op_types:
            CONVERTERS[op_type] = fn
        return fn
    return register


def _spatial(b: Builder, node: onnx.NodeProto, attrs: dict) -> int | None:
    """Spatial dims of a conv or pooling node: from its kernel, its weights or its input."""
    if "kernel_shape" in attrs:
        return len(attrs["kernel_shape"])
    rank = b.rank(node.input[1]) if node.op_type == "Conv" else b.rank(node.input[0])
    return None if rank is None else rank - 2


def _text(attrs: dict, name: str, default: str) -> str:
    """A string attribute (onnx.helper gives bytes)."""
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _one_to_one(b: Builder, node: onnx.NodeProto, kind: str, **attrs_) -> None:
    """``node`` as one op of ``kind`` from its first input to its first output."""
    b.add(kind, [b.tensor(node.input[0])], [b.output(node.output[0])], name=node.name, **attrs_)


def _window_attrs(b: Builder, node: onnx.NodeProto, attrs: dict) -> dict | None:
    """What convolutions and pools share, ONNX's defaults spelled out (strides, pads, dilations,
    auto_pad, NCX); None where the spatial rank is unknown."""
    nsp = _spatial(b, node, attrs)
    if nsp is None:
        return None
    pads = list(attrs.get("pads", [0] * (2 * nsp)))
    pad = _text(attrs, "auto_pad", "NOTSET")
    return dict(strides=list(attrs.get("strides", [1] * nsp)), pads_begin=pads[:nsp], pads_end=pads[nsp:],
                dilations=list(attrs.get("dilations", [1] * nsp)), auto_pad="None" if pad == "NOTSET" else pad,
                data_format="NCX")


@converter("Conv")
def _conv(b: Builder, node: onnx.NodeProto, attrs: dict):
    common = _window_attrs(b, node, attrs)
    if common is None:
        return False
    inputs = [b.tensor(name) for name in node.input if name]
    b.add("Convolution", inputs, [b.output(node.output[0])], name=node.name, weights_format="OIX",
          groups=int(attrs.get("group", 1)), **common)
    return None


@converter("MaxPool", "AveragePool")
def _pool(b: Builder, node: onnx.NodeProto, attrs: dict):
    common = _window_attrs(b, node, attrs)
    if common is None or len([o for o in node.output if o]) > 1:  # MaxPool's indices
        return False
    dilations = common.pop("dilations")
    if node.op_type == "AveragePool" and any(d != 1 for d in dilations):
        return False  # oneDNN's AvgPool has no dilations
    if attrs.get("ceil_mode", 0) and not _ceil_windows_agree(b, node, attrs["kernel_shape"], dilations, common):
        return False
    common.update(kernel=list(attrs["kernel_shape"]), rounding_type="ceil" if attrs.get("ceil_mode", 0) else "floor")
    if node.op_type == "MaxPool":
        _one_to_one(b, node, "MaxPool", dilations=dilations, **common)
    else:
        _one_to_one(b, node, "AvgPool", exclude_pad=not attrs.get("count_include_pad", 0), **common)
    return None


def _ceil_windows_agree(b: Builder, node: onnx.NodeProto, kernel: list, dilations: list, window_attrs: dict) -> bool:
    """ONNX's ceil mode drops a last window that would start in the end padding; oneDNN's keeps
    it. Where that happens (or the input shape is unknown) the node is left to the Wildcard."""
    shape = b.shape(node.input[0])
    if shape is None:
        return False
    strides, begin, end = window_attrs["strides"], window_attrs["pads_begin"], window_attrs["pads_end"]
    for i in range(len(strides)):
        size = shape[2 + i]
        window = (kernel[i] - 1) * dilations[i] + 1
        out = -(-(size + begin[i] + end[i] - window) // strides[i]) + 1
        if (out - 1) * strides[i] >= size + begin[i]:
            return False
    return True


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(b: Builder, node: onnx.NodeProto, attrs: dict):
    rank = b.rank(node.input[0])
    if rank is None:
        return False
    kind = "ReduceMean" if node.op_type == "GlobalAveragePool" else "ReduceMax"
    _one_to_one(b, node, kind, axes=list(range(2, rank)), keep_dims=True)
    return None


@converter("BatchNormalization")
def _batch_norm(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Inference BatchNormalization. After a convolution, with known statistics and parameters,
    it is the per-channel affine ``x * a + c`` (``a = scale / sqrt(var + eps)``, ``c = shift -
    mean * a``, computed here in float64): a Multiply and an Add of constants, which the fusion
    then puts on the convolution as binary post-ops, as ONNX Runtime folds BN into the conv.
    Measured on ShuffleNet on PoCL: the 49 separate BatchNormInference kernels took 19 of its
    45 ms of device time. Elsewhere, one BatchNormInference."""
    if len([o for o in node.output if o]) > 1 or attrs.get("training_mode", 0):
        return False
    epsilon = float(attrs.get("epsilon", 1e-5))
    params = [b.known(name) for name in node.input[1:5]]
    x = b.tensor(node.input[0])
    made_by = b.graph.producer(x.id)
    rank = b.rank(node.input[0])
    if made_by is not None and made_by.kind in ("Convolution", "ConvTranspose") and x.dtype == "f32" \
            and rank is not None and rank >= 2 and all(p is not None and p.ndim == 1 for p in params):
        scale, shift, mean, var = (np.asarray(p, np.float64) for p in params)
        a = scale / np.sqrt(var + epsilon)
        per_channel = (1, -1) + (1,) * (rank - 2)
        scaled = b.new()
        b.add("Multiply", [x, b.constant(a.astype(np.float32).reshape(per_channel))], [scaled], name=node.name)
        b.add("Add", [scaled, b.constant((shift - mean * a).astype(np.float32).reshape(per_channel))],
              [b.output(node.output[0])], name=node.name)
        return None
    b.add("BatchNormInference", [b.tensor(name) for name in node.input], [b.output(node.output[0])],
          name=node.name, epsilon=epsilon, data_format="NCX")
    return None


@converter("MatMul")
def _matmul(b: Builder, node: onnx.NodeProto, attrs: dict):
    b.add("MatMul", [b.tensor(node.input[0]), b.tensor(node.input[1])], [b.output(node.output[0])], name=node.name)
    return None


@converter("Gemm")
def _gemm(b: Builder, node: onnx.NodeProto, attrs: dict):
    """alpha * A' B' + beta * C: MatMul with C as its bias where C is a row (times beta, folded
    when C is known), else an Add; alpha a Multiply after."""
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    inputs = [b.tensor(node.input[0]), b.tensor(node.input[1])]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    c_known = b.known(c) if c is not None else None
    bias_in_matmul = c is not None and alpha == 1.0 and (
        c_known is not None and c_known.ndim == 1 or beta == 1.0 and b.rank(c) == 1)
    if bias_in_matmul and c is not None:
        inputs.append(b.constant(c_known * np.asarray(beta, c_known.dtype)) if c_known is not None and beta != 1.0
                      else b.tensor(c))
    last = node.output[0] if (c is None or bias_in_matmul) and alpha == 1.0 else None
    out = b.output(last) if last else b.new()
    b.add("MatMul", inputs, [out], name=node.name, transpose_a=bool(attrs.get("transA", 0)),
          transpose_b=bool(attrs.get("transB", 0)))
    if alpha != 1.0:
        scaled = b.output(node.output[0]) if c is None or bias_in_matmul else b.new()
        b.add("Multiply", [out, b.constant(np.asarray(alpha, np.float32))], [scaled])
        out = scaled
    if c is not None and not bias_in_matmul:
        term = b.tensor(c)
        if beta != 1.0:
            weighted = b.new()
            b.add("Multiply", [term, b.constant(np.asarray(beta, np.float32))], [weighted])
            term = weighted
        b.add("Add", [out, term], [b.output(node.output[0])])
    return None


_UNARY = {"Relu": "ReLU", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt",
          "Abs": "Abs", "Reciprocal": "Reciprocal", "Round": "Round", "HardSwish": "HardSwish", "Mish": "Mish",
          "Softplus": "SoftPlus"}


@converter(*_UNARY)
def _unary(b: Builder, node: onnx.NodeProto, attrs: dict):
    _one_to_one(b, node, _UNARY[node.op_type])
    return None


@converter("Elu", "LeakyRelu", "HardSigmoid", "Gelu")
def _unary_with_attrs(b: Builder, node: onnx.NodeProto, attrs: dict):
    if node.op_type == "Elu":
        _one_to_one(b, node, "Elu", alpha=float(attrs.get("alpha", 1.0)))
    elif node.op_type == "LeakyRelu":
        _one_to_one(b, node, "LeakyReLU", alpha=float(attrs.get("alpha", 0.01)))
    elif node.op_type == "HardSigmoid":
        _one_to_one(b, node, "HardSigmoid", alpha=float(attrs.get("alpha", 0.2)), beta=float(attrs.get("beta", 0.5)))
    else:
        tanh = _text(attrs, "approximate", "none") == "tanh"
        _one_to_one(b, node, "GELU", mode="gelu_tanh" if tanh else "gelu_erf")
    return None


@converter("Neg")
def _neg(b: Builder, node: onnx.NodeProto, attrs: dict):
    """oneDNN has no negation: a Multiply by -1 (torch's Softmin exports as Neg, Softmax)."""
    if _integers(b, node.input):
        return False
    b.add("Multiply", [b.tensor(node.input[0]), b.constant(np.asarray(-1.0, np.float32))],
          [b.output(node.output[0])], name=node.name)
    return None


@converter("Selu")
def _selu(b: Builder, node: onnx.NodeProto, attrs: dict):
    """gamma * elu(x, alpha): oneDNN's Elu, then a Multiply (ONNX's defaults, SELU's constants)."""
    alpha = float(attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(attrs.get("gamma", 1.05070102214813232421875))
    elu = b.new()
    b.add("Elu", [b.tensor(node.input[0])], [elu], name=node.name, alpha=alpha)
    b.add("Multiply", [elu, b.constant(np.asarray(gamma, np.float32))], [b.output(node.output[0])])
    return None


@converter("InstanceNormalization")
def _instance_norm(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Each (sample, channel) plane normalized, then scaled and shifted per channel: oneDNN's
    GroupNorm with one group per channel."""
    shape = b.shape(node.input[1])
    if shape is None or len(shape) != 1:
        return False
    b.add("GroupNorm", [b.tensor(name) for name in node.input], [b.output(node.output[0])], name=node.name,
          groups=int(shape[0]), use_affine=True, keep_stats=False, epsilon=float(attrs.get("epsilon", 1e-5)),
          data_format="NCX")
    return None


@converter("Clip")
def _clip(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Clip's bounds are attributes before opset 11, optional known inputs after."""
    low, high = attrs.get("min", -np.inf), attrs.get("max", np.inf)
    for position in (1, 2):
        if len(node.input) > position and node.input[position]:
            value = b.known(node.input[position])
            if value is None:
                return False
            if position == 1:
                low = float(value)
            else:
                high = float(value)
    _one_to_one(b, node, "Clamp", min=float(max(low, -3.4e38)), max=float(min(high, 3.4e38)))
    return None


def _integers(b: Builder, names) -> bool:
    """Whether any of ``names`` is an integer tensor: triodnn's arithmetic computes in f32 (s64
    refused, integer division not truncated), so such nodes are left to the Wildcard."""
    return any(b.dtype(name) in ("s8", "u8", "s32", "s64") for name in names if name)


_BINARY = {"Add": "Add", "Sub": "Subtract", "Mul": "Multiply", "Div": "Divide", "Max": "Maximum",
           "Min": "Minimum", "Sum": "Add"}


@converter(*_BINARY)
def _binary(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Numpy broadcasting on both sides; ONNX's n-ary Max, Min and Sum as a chain."""
    names = [name for name in node.input if name]
    if len(names) == 1:
        b.alias(node.output[0], names[0])
        return None
    if _integers(b, names):
        return False
    left = b.tensor(names[0])
    for i, name in enumerate(names[1:]):
        out = b.output(node.output[0]) if i == len(names) - 2 else b.new()
        b.add(_BINARY[node.op_type], [left, b.tensor(name)], [out], name=node.name, auto_broadcast="numpy")
        left = out
    return None


@converter("Pow")
def _pow(b: Builder, node: onnx.NodeProto, attrs: dict):
    exponent = b.known(node.input[1])
    if exponent is None or exponent.size != 1:
        return False
    _one_to_one(b, node, "Pow", beta=float(exponent))
    return None


@converter("Where")
def _where(b: Builder, node: onnx.NodeProto, attrs: dict):
    if _integers(b, node.input[1:]):
        return False
    b.add("Select", [b.tensor(name) for name in node.input], [b.output(node.output[0])], name=node.name)
    return None


@converter("Softmax", "LogSoftmax")
def _softmax(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Before opset 13 the input is seen as 2-D, split at ``axis`` (default 1): a softmax over
    ``axis`` where that is the last dim, else over the flattened trailing dims (reshaped to 2-D
    and back, where the shape is known)."""
    kind = "SoftMax" if node.op_type == "Softmax" else "LogSoftmax"
    rank = b.rank(node.input[0])
    if b.opset >= 13:
        _one_to_one(b, node, kind, axis=int(attrs.get("axis", -1)))
        return None
    axis = int(attrs.get("axis", 1))
    if rank is not None and axis % rank == rank - 1:
        _one_to_one(b, node, kind, axis=rank - 1)
        return None
    shape = b.shape(node.input[0])
    if shape is None:
        return False
    axis %= len(shape)
    rows, cols = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    flat = b.new(shape=(rows, cols))
    b.add("StaticReshape", [b.tensor(node.input[0])], [flat], shape=[rows, cols], special_zero=False)
    normalized = b.new(shape=(rows, cols))
    b.add(kind, [flat], [normalized], name=node.name, axis=1)
    b.add("StaticReshape", [normalized], [b.output(node.output[0])], shape=list(shape), special_zero=False)
    return None


@converter("Flatten")
def _flatten(b: Builder, node: onnx.NodeProto, attrs: dict):
    axis = int(attrs.get("axis", 1))
    shape = b.shape(node.input[0])
    if axis in (0, 1):
        target = [1, -1] if axis == 0 else [0, -1]
    elif shape is not None:
        target = [int(np.prod(shape[:axis])), -1]
    else:
        return False
    _one_to_one(b, node, "StaticReshape", shape=target, special_zero=True)
    return None


@converter("Reshape")
def _reshape(b: Builder, node: onnx.NodeProto, attrs: dict):
    target = b.known(node.input[1])
    if target is None:
        return False
    _one_to_one(b, node, "StaticReshape", shape=[int(d) for d in target], special_zero=not attrs.get("allowzero", 0))
    return None


@converter("Squeeze", "Unsqueeze")
def _squeeze(b: Builder, node: onnx.NodeProto, attrs: dict):
    """A reshape to the output shape shape inference found (axes move to an input at opset 13)."""
    shape = b.shape(node.output[0])
    if shape is None:
        return False
    _one_to_one(b, node, "StaticReshape", shape=list(shape), special_zero=False)
    return None


@converter("Transpose")
def _transpose(b: Builder, node: onnx.NodeProto, attrs: dict):
    rank = b.rank(node.input[0])
    perm = attrs.get("perm")
    if perm is None:
        if rank is None:
            return False
        perm = list(reversed(range(rank)))
    _one_to_one(b, node, "StaticTranspose", order=[int(p) for p in perm])
    return None


@converter("Concat")
def _concat(b: Builder, node: onnx.NodeProto, attrs: dict):
    b.add("Concat", [b.tensor(name) for name in node.input if name], [b.output(node.output[0])], name=node.name,
          axis=int(attrs["axis"]))
    return None


@converter("Cast")
def _cast(b: Builder, node: onnx.NodeProto, attrs: dict):
    dtype = DTYPES.get(int(attrs["to"]))
    if dtype is None:
        return False
    b.add("TypeCast", [b.tensor(node.input[0])], [b.output(node.output[0], dtype)], name=node.name)
    return None


@converter("Identity", "Dropout")
def _identity(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Inference: Dropout passes its input (a mask output some node reads is left to the
    Wildcard)."""
    if any(name in b.used for name in node.output[1:]) or attrs.get("training_mode"):
        return False
    b.alias(node.output[0], node.input[0])
    return None


_REDUCE = {"ReduceMean": "ReduceMean", "ReduceSum": "ReduceSum", "ReduceMax": "ReduceMax", "ReduceMin": "ReduceMin",
           "ReduceProd": "ReduceProd", "ReduceL1": "ReduceL1", "ReduceL2": "ReduceL2"}


@converter(*_REDUCE)
def _reduce(b: Builder, node: onnx.NodeProto, attrs: dict):
    """``axes``: an attribute, or (ReduceSum from opset 13, the others from 18) a known input;
    none means every axis unless ``noop_with_empty_axes``."""
    if _integers(b, node.input[:1]) or 0 in (b.shape(node.input[0]) or ()):
        return False
    axes = attrs.get("axes")
    if len(node.input) > 1 and node.input[1]:
        known = b.known(node.input[1])
        if known is None:
            return False
        axes = [int(a) for a in known.reshape(-1)]
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            b.alias(node.output[0], node.input[0])
            return None
        rank = b.rank(node.input[0])
        if rank is None:
            return False
        axes = list(range(rank))
    _one_to_one(b, node, _REDUCE[node.op_type], axes=[int(a) for a in axes], keep_dims=bool(attrs.get("keepdims", 1)))
    return None


@converter("LayerNormalization")
def _layer_norm(b: Builder, node: onnx.NodeProto, attrs: dict):
    if len([o for o in node.output if o]) > 1:
        return False
    rank = b.rank(node.input[0])
    axis = int(attrs.get("axis", -1))
    if rank is None or axis % rank != rank - 1:
        return False  # oneDNN normalizes over the last dim with a scale of that dim
    inputs = [b.tensor(name) for name in node.input if name]
    if len(inputs) == 2:
        inputs.append(b.constant(np.zeros(b.shape(node.input[1]) or (1,), np.float32)))
    b.add("LayerNorm", inputs, [b.output(node.output[0])], name=node.name, begin_norm_axis=-1,
          epsilon=float(attrs.get("epsilon", 1e-5)), use_affine=True, keep_stats=False)
    return None


@converter("ConvTranspose")
def _conv_transpose(b: Builder, node: onnx.NodeProto, attrs: dict):
    """ONNX's weights are (C_in, C_out / group, k...): oneDNN's IOX. ``output_shape`` (pads
    worked out from a target) is left to the Wildcard."""
    if "output_shape" in attrs:
        return False
    common = _window_attrs(b, node, attrs)
    if common is None:
        return False
    inputs = [b.tensor(name) for name in node.input if name]
    b.add("ConvTranspose", inputs, [b.output(node.output[0])], name=node.name, weights_format="IOX",
          groups=int(attrs.get("group", 1)),
          output_padding=list(attrs.get("output_padding", [0] * len(common["strides"]))), **common)
    return None


@converter("PRelu")
def _prelu(b: Builder, node: onnx.NodeProto, attrs: dict):
    """From opset 7 ONNX broadcasts the slope numpy-style against the input: a known slope gets
    the input's rank (leading ones), as oneDNN's PReLU takes it without per-channel
    broadcasting."""
    slope, rank = b.known(node.input[1]), b.rank(node.input[0])
    if slope is None or rank is None or slope.ndim > rank:
        return False
    if b.opset < 7 and slope.ndim == 1:  # before opset 7 a 1-D slope is per channel (axis 1)
        b.add("PReLU", [b.tensor(node.input[0]), b.tensor(node.input[1])], [b.output(node.output[0])],
              name=node.name, data_format="NCX", per_channel_broadcast=True)
        return None
    shaped = b.constant(slope.reshape((1,) * (rank - slope.ndim) + slope.shape))
    b.add("PReLU", [b.tensor(node.input[0]), shaped], [b.output(node.output[0])], name=node.name,
          data_format="NCX", per_channel_broadcast=False)
    return None


@converter("QuantizeLinear", "DequantizeLinear")
def _quantize(b: Builder, node: onnx.NodeProto, attrs: dict):
    """Known scales and zero points, per tensor or per axis: oneDNN's Quantize / Dequantize
    (u8 and s8; a zero point's type is the quantized type, u8 without one). Blocked
    quantization and other types are left to the Wildcard."""
    scale = b.known(node.input[1])
    zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    zp = b.known(zp_name) if zp_name else np.zeros((), np.uint8)
    if scale is None or zp is None or attrs.get("block_size", 0) or zp.dtype not in (np.uint8, np.int8) \
            or scale.dtype != np.float32:
        return False
    per_axis = scale.ndim == 1 and scale.size > 1
    rank = b.rank(node.input[0])
    if per_axis and rank is None:
        return False
    axis = int(attrs.get("axis", 1)) % rank if per_axis and rank else 1
    zps = [int(z) for z in np.broadcast_to(zp, scale.shape).reshape(-1)]
    common = dict(qtype="per_channel" if per_axis else "per_tensor", axis=axis,
                  scales=[float(s) for s in scale.reshape(-1)], zps=zps)
    if node.op_type == "QuantizeLinear":
        qtype = "u8" if zp.dtype == np.uint8 else "s8"
        b.add("Quantize", [b.tensor(node.input[0])], [b.output(node.output[0], qtype)], name=node.name, **common)
    else:
        b.add("Dequantize", [b.tensor(node.input[0])], [b.output(node.output[0], "f32")], name=node.name, **common)
    return None
