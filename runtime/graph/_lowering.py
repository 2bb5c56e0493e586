"""Lowering: the ops of a partition as a plan of primitive executions over buffer slots.

A plan names its buffers by slot: the partition's input ports, its output ports, and
temporaries. Each step is a primitive descriptor with, per argument, a view: a slot seen
through a memory descriptor. Views make reshapes, transposes, the layouts of NXC convolutions
and the transposes of MatMul free: they change how the next primitive reads a buffer, not the
buffer. A step whose primitive cannot take a data type (most kernels compute f32) gets
reorders to and from f32 temporaries around it, so every op runs on every data type the
graph names.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from .._values import (
    BatchNormBackwardDesc,  # normalization training (issue 21)
    BatchNormInferenceDesc,
    BatchNormTrainingDesc,  # normalization training (issue 21)
    BinaryDesc,
    ConcatDesc,
    ConvolutionBackwardWeightsDesc,
    ConvolutionDesc,
    DeconvolutionDesc,
    DropoutDesc,  # Dropout (issue 21)
    DynamicQuantizeDesc,
    EltwiseBackwardDesc,
    EltwiseDesc,
    GenIndexDesc,
    GroupNormDesc,
    LayerNormBackwardDesc,  # normalization training (issue 21)
    LayerNormDesc,
    MatmulDesc,
    PoolingBackwardDesc,
    PoolingDesc,
    PreluBackwardDesc,
    PreluDesc,
    QuantizeDesc,
    ReductionDesc,
    ReorderDesc,
    ResamplingBackwardDesc,
    ResamplingDesc,
    RMSNormDesc,
    SdpaDesc,
    SoftmaxBackwardDesc,
    SoftmaxDesc,
)
from .._values._algorithms import eltwise_parameters as eltwise_defaults
from .._values._deconvolution_desc import deconv_out_size
from .._values._errors import UnsupportedError
from .._values._memory_desc import MemoryDesc
from .._values._op_desc import OpDesc
from ._logical_tensor import LogicalTensor, dense_strides, known_shape, storage_dtype
from ._op import Op
from ._op_schema import ELTWISE_BACKWARD_KINDS, UNARY_ELTWISE_KINDS, eltwise_backward_parameters, eltwise_parameters
from ._shape_inference import (
    conv_backward_geometry,
    conv_transpose_geometry,
    conv_transpose_weights_order,
    prelu_slope_shape,
    quantization_groups,
)


@attrs.frozen
class View:
    slot: int
    desc: MemoryDesc


@attrs.frozen
class Slot:
    """A buffer: ``("input", port index)``, ``("output", port index)`` or ``("temp", bytes)``."""

    role: str
    index: int
    nbytes: int = 0


@attrs.frozen
class Step:
    desc: OpDesc
    args: tuple[tuple[str, View], ...]
    op_id: int


@attrs.define
class Plan:
    slots: list[Slot] = attrs.field(factory=list)
    steps: list[Step] = attrs.field(factory=list)


def _row_major(desc: MemoryDesc) -> bool:
    return desc.strides == dense_strides(desc.dims)


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape) or (1,)


class Builder:
    """Turns ops (shapes already inferred) into a Plan."""

    def __init__(self, inputs: list[LogicalTensor], outputs: list[LogicalTensor]):
        self.plan = Plan()
        self.views: dict[int, View] = {}
        self.tensors: dict[int, LogicalTensor] = {}
        self.output_slots: dict[int, View] = {}
        # Post-op fusion: the anchor op's output is written as the chain's final tensor, and
        # run() attaches the chain (see _fusion.py) to the anchor's primitive.
        self._redirect: dict[int, LogicalTensor] = {}
        self._post: tuple = ()
        for i, lt in enumerate(inputs):
            slot = self._slot(Slot("input", i, lt.nbytes))
            self.views[lt.id] = View(slot, lt.memory_desc())
            self.tensors[lt.id] = lt
        for i, lt in enumerate(outputs):
            if lt.id in self.views:
                continue  # an input passed straight through is already bound
            slot = self._slot(Slot("output", i, lt.nbytes))
            self.output_slots[lt.id] = View(slot, lt.memory_desc())

    def _slot(self, slot: Slot) -> int:
        self.plan.slots.append(slot)
        return len(self.plan.slots) - 1

    def temp(self, desc: MemoryDesc) -> View:
        return View(self._slot(Slot("temp", -1, desc.nbytes)), desc)

    # -- tensors ----------------------------------------------------------------------------

    def view(self, lt: LogicalTensor) -> View:
        return self.views[lt.id]

    def is_port(self, lt: LogicalTensor) -> bool:
        return lt.id in self.output_slots

    def output(self, lt: LogicalTensor) -> View:
        """Where ``lt`` is written: its output port, or a new dense temporary."""
        lt = self._redirect.pop(lt.id, lt)
        view = self.output_slots.get(lt.id)
        if view is None:
            view = self.temp(MemoryDesc(_dims(known_shape(lt)), storage_dtype(lt.dtype)))
        self.views[lt.id] = view
        self.tensors[lt.id] = lt
        return view

    def alias(self, lt: LogicalTensor, view: View) -> None:
        """``lt`` is ``view``: no step; a port still gets a copy."""
        self.tensors[lt.id] = lt
        if lt.id in self.output_slots:
            self.copy(view, self.output(lt))
        else:
            self.views[lt.id] = view

    # -- steps ------------------------------------------------------------------------------

    def copy(self, src: View, dst: View, op_id: int = -1) -> None:
        self.plan.steps.append(Step(ReorderDesc(src.desc, dst.desc), (("src", src), ("dst", dst)), op_id))

    def _attach_post_ops(self, make, inputs: dict[str, View], dst: View):
        """``make`` wrapped to add the pending post-op chain, and the chain's operand views
        (laid out as the primitive's dst, which may be a channels-first view of the graph's)."""
        chain, operands = [], {}
        for i, entry in enumerate(self._post):
            if entry[0] == "eltwise":
                chain.append(entry)
                continue
            _, alg, lt, bias_format = entry
            view = self.views[lt.id]
            final_shape = entry_shape = self._final_shape
            if bias_format == "NCX" and len(final_shape) > 2:
                c = view.desc.dims[0]
                view = View(view.slot, MemoryDesc((c,) + (1,) * (len(final_shape) - 2), view.desc.dtype,
                                                  (view.desc.strides[0],) + (1,) * (len(final_shape) - 2)))
            view = _aligned(view, len(entry_shape))
            if dst.desc.dims != tuple(final_shape or (1,)):
                view = _channels_first(view)
            name = f"post_op_{i}_src1"
            operands[name] = view
            chain.append(("binary", alg, name))
        inputs = {**inputs, **operands}

        def with_chain(**descs):
            own = {k: v for k, v in descs.items() if k not in operands}
            post_ops = tuple(("binary", e[1], descs[e[2]]) if e[0] == "binary" else e for e in chain)
            return attrs.evolve(make(**own), post_ops=post_ops)

        return with_chain, inputs

    def run(self, op: Op, make: Callable[..., OpDesc], inputs: dict[str, View], outputs: dict[str, View]) -> None:
        """One primitive, ``make(**descs)``; through f32 temporaries when the kernel refuses the
        data types as they are."""
        if self._post:
            make, inputs = self._attach_post_ops(make, inputs, outputs["dst"])
            self._post = ()
        named = {**inputs, **outputs}
        desc = make(**{name: view.desc for name, view in named.items()})
        try:
            desc.check_supported()
        except UnsupportedError:
            if all(view.desc.dtype == "f32" for view in named.values()):
                raise
        else:
            self.plan.steps.append(Step(desc, tuple(named.items()), op.id))
            return
        converted: dict[str, View] = {}
        for name, view in inputs.items():
            if view.desc.dtype == "f32":
                converted[name] = view
            else:
                temp = self.temp(MemoryDesc(view.desc.dims, "f32"))
                self.copy(view, temp, op.id)
                converted[name] = temp
        after = []
        for name, view in outputs.items():
            if view.desc.dtype == "f32":
                converted[name] = view
            else:
                temp = self.temp(MemoryDesc(view.desc.dims, "f32"))
                converted[name] = temp
                after.append((temp, view))
        desc = make(**{name: view.desc for name, view in converted.items()})
        desc.check_supported()
        self.plan.steps.append(Step(desc, tuple(converted.items()), op.id))
        for temp, view in after:
            self.copy(temp, view, op.id)

    def lower_sdpa(self, first: Op, match) -> None:
        """One fused attention primitive for the ops of ``match`` (a ``_sdpa_pattern.SdpaMatch``)."""
        def last_two_swapped(view: View) -> View:
            n = view.desc.ndims
            return permuted(view, tuple(range(n - 2)) + (n - 1, n - 2))

        def one_element(lt) -> View:
            view = self.view(lt)
            return View(view.slot, MemoryDesc((1,), view.desc.dtype))

        key, value = self.view(match.key), self.view(match.value)
        inputs = {"query": self.view(match.query),
                  "key": last_two_swapped(key) if match.key_transposed else key,
                  "value": last_two_swapped(value) if match.value_transposed else value}
        for name in ("scale", "softcap", "fill", "causal_add", "causal_sub"):
            if getattr(match, name) is not None:
                inputs[name] = one_element(getattr(match, name))
        for name in ("select_mask", "mask"):
            if getattr(match, name) is not None:
                inputs[name] = self.view(getattr(match, name))
        # Grouped scales and zero points are seen as their operand is (K^T, V^T swapped).
        for operand, transposed in (("key", match.key_transposed), ("value", match.value_transposed)):
            for part in ("scales", "zps"):
                lt = getattr(match, f"{operand}_{part}")
                if lt is not None:
                    inputs[f"{operand}_{part}"] = last_two_swapped(self.view(lt)) if transposed else self.view(lt)
        # Without a scale SdpaDesc stores scale_mode "multiply" and fill_before_scale False.
        options = dict(scale_mode=match.scale_mode, causal=match.causal, fill_if=match.fill_if,
                       fill_before_scale=match.fill_before_scale, score_rounding=match.score_rounding,
                       **{name: getattr(match, name) for name in
                          ("query_quant", "key_quant", "value_quant", "probs_quant", "dst_quant")})

        def make(query, key, value, dst, **optional):
            return SdpaDesc(query, key, value, dst, **optional, **options)

        # The data movement after the attention (match.tail) costs nothing: the kernel writes
        # the last tensor's layout, seen with the attention output's dims.
        dst = _sdpa_dst(self, match)
        outputs = {"dst": dst if dst is not None else self.output(match.output)}
        if match.output_transposed:
            outputs["dst"] = last_two_swapped(outputs["dst"])
        if match.stats is not None:
            outputs["stats"] = self.output(match.stats)
        self.run(first, make, inputs, outputs)
        if dst is None:  # a reshape the layout cannot take without a copy: the tail op by op
            for op in match.tail:
                self.lower(op)

    def lower(self, op: Op, fused=None, *, lowering: Callable[[Builder, Op], None] | None = None,
              final: LogicalTensor | None = None) -> None:
        """Lower ``op``; with ``fused`` (a ``_fusion.Chain``), its post-op chain rides along and
        its output is the chain's final tensor. ``lowering`` replaces the op kind's own (the int8
        matmul fusion's), ``final`` is where the op writes when an absorbed op after it (a
        Quantize) had the last word."""
        if fused is not None:
            self._redirect[op.outputs[0].id] = fused.final
            self._post = fused.entries
            self._final_shape = tuple(fused.final.shape)
        if final is not None:
            self._redirect[op.outputs[0].id] = final
        (lowering or LOWERINGS[op.kind])(self, op)
        self._redirect.clear()
        self._post = ()


def _sdpa_dst(b: Builder, match) -> View | None:
    """Where the attention writes its output so that ``match.tail`` needs no step: the tail's
    last tensor seen back through each move; None where a reshape needs a copy."""
    final = match.final if match.final is not None else match.output
    port = b.output_slots.get(final.id)
    desc = port.desc if port is not None else MemoryDesc(_dims(known_shape(final)), storage_dtype(final.dtype))
    view = View(-1, desc)
    for op in reversed(match.tail):
        dims = _dims(known_shape(op.inputs[0]))
        if op.kind == "StaticTranspose":
            order = [o % len(dims) for o in op.attrs["order"]]
            inverse = [order.index(i) for i in range(len(order))]
            view = permuted(view, tuple(inverse))
        elif op.kind == "StaticReshape":
            regrouped = reshaped(view, dims)
            if regrouped is None:
                return None
            view = regrouped
        if view.desc.dims != dims:
            return None
    slot = b.output(final).slot
    return View(slot, view.desc)


def reshaped(view: View, dims: tuple[int, ...]) -> View | None:
    """``view`` read with ``dims`` (same element count), when its layout allows it without a copy."""
    if _row_major(view.desc):
        return _row_major_as(view, dims)
    return None


def _row_major_as(view: View, dims: tuple[int, ...]) -> View:
    """A row-major ``view`` read with ``dims`` (same element count)."""
    return View(view.slot, MemoryDesc(dims, view.desc.dtype))


def permuted(view: View, order: tuple[int, ...]) -> View:
    desc = view.desc
    return View(view.slot, MemoryDesc(tuple(desc.dims[i] for i in order), desc.dtype,
                                      tuple(desc.strides[i] for i in order)))


def _aligned(view: View, ndims: int) -> View:
    """``view`` with leading 1s up to ``ndims`` dims (numpy's right alignment)."""
    desc = view.desc
    pad = ndims - desc.ndims
    if pad <= 0:
        return view
    return View(view.slot, MemoryDesc((1,) * pad + desc.dims, desc.dtype, (1,) * pad + desc.strides))


def _dense(b: Builder, op: Op, view: View) -> View:
    """``view`` as a row-major buffer, copying when it is not one."""
    if _row_major(view.desc):
        return view
    temp = b.temp(MemoryDesc(view.desc.dims, view.desc.dtype))
    b.copy(view, temp, op.id)
    return temp


def _as_dims(b: Builder, op: Op, view: View, dims: tuple[int, ...]) -> View:
    return _row_major_as(_dense(b, op, view), dims)


# -- eltwise and binary ----------------------------------------------------------------------

_BINARY = {"Add": "add", "Subtract": "sub", "Multiply": "mul", "Divide": "div", "Maximum": "max",
           "Minimum": "min", "GreaterEqual": "ge"}


def _lower_unary(b: Builder, op: Op) -> None:
    # The kernel algorithm the op schema names (_op_schema.eltwise_parameters, which the numpy
    # reference uses too), so the lowering and the check cannot disagree.
    alg, alpha, beta = eltwise_parameters(op.kind, op.attrs)
    # None: the algorithm's default, resolved as the descriptor resolves an omitted parameter.
    alpha_, beta_ = eltwise_defaults(alg, alpha, beta)
    b.run(op, lambda src, dst: EltwiseDesc(alg, src, dst, alpha_, beta_),
          {"src": b.view(op.inputs[0])}, {"dst": b.output(op.outputs[0])})


def _lower_eltwise_backward(b: Builder, op: Op) -> None:
    # As _lower_unary: the algorithm of _op_schema.eltwise_backward_parameters, which the numpy
    # reference uses too.
    alg, alpha, beta, use_dst = eltwise_backward_parameters(op.kind, op.attrs)
    alpha_, beta_ = eltwise_defaults(alg, alpha, beta)
    b.run(op, lambda src_or_dst, diff_dst, diff_src: EltwiseBackwardDesc(
              alg, src_or_dst, diff_dst, diff_src, alpha_, beta_, use_dst=use_dst),
          {"src_or_dst": b.view(op.inputs[0]), "diff_dst": b.view(op.inputs[1])},
          {"diff_src": b.output(op.outputs[0])})


def _lower_binary(b: Builder, op: Op) -> None:
    alg = _BINARY[op.kind]
    b.run(op, lambda src0, src1, dst: BinaryDesc(alg, src0, src1, dst),
          {"src0": b.view(op.inputs[0]), "src1": b.view(op.inputs[1])},
          {"dst": b.output(op.outputs[0])})


def _lower_squared_difference(b: Builder, op: Op) -> None:
    """(a - b)^2: one binary with a square post-op."""
    b.run(op, lambda src0, src1, dst: BinaryDesc("sub", src0, src1, dst, post_ops=(("eltwise", "square"),)),
          {"src0": b.view(op.inputs[0]), "src1": b.view(op.inputs[1])},
          {"dst": b.output(op.outputs[0])})


def _lower_select(b: Builder, op: Op) -> None:
    cond, then, otherwise = (b.view(lt) for lt in op.inputs)
    b.run(op, lambda src0, src1, src2, dst: BinaryDesc("select", src0, src1, dst, src2=src2),
          {"src0": then, "src1": otherwise, "src2": cond}, {"dst": b.output(op.outputs[0])})


def _lower_bias_add(b: Builder, op: Op) -> None:
    src, bias = b.view(op.inputs[0]), b.view(op.inputs[1])
    ndims = len(known_shape(op.inputs[0]))
    if op.attrs.get("data_format", "NXC") == "NCX" and ndims > 2:
        c = bias.desc.dims[0]
        bias = View(bias.slot, MemoryDesc((c,) + (1,) * (ndims - 2), bias.desc.dtype,
                                          (bias.desc.strides[0],) + (1,) * (ndims - 2)))
    b.run(op, lambda src0, src1, dst: BinaryDesc("add", src0, src1, dst),
          {"src0": src, "src1": bias}, {"dst": b.output(op.outputs[0])})


def _lower_prelu(b: Builder, op: Op) -> None:
    src, slope = b.view(op.inputs[0]), b.view(op.inputs[1])
    placed = prelu_slope_shape(op.kind, op.attrs, known_shape(op.inputs[0]), known_shape(op.inputs[1]))
    pad = len(placed) - slope.desc.ndims
    if placed == (1,) * pad + slope.desc.dims:  # right-aligned: the slope's strides, 1s before
        strides = (1,) * pad + slope.desc.strides
    else:  # a 1-D slope on the channel dim of NCX
        strides = tuple(slope.desc.strides[0] if d != 1 else 1 for d in placed)
    slope = View(slope.slot, MemoryDesc(placed, slope.desc.dtype, strides))
    b.run(op, lambda src, weights, dst: PreluDesc(src, weights, dst),
          {"src": src, "weights": slope}, {"dst": b.output(op.outputs[0])})


# -- matmul ------------------------------------------------------------------------------------


def _lower_matmul(b: Builder, op: Op, make: Callable[..., OpDesc] | None = None) -> None:
    # make: another matmul kind on the same views (_int8_matmul's QuantizedMatmulDesc, issue 22)
    a, w = b.view(op.inputs[0]), b.view(op.inputs[1])
    if op.attrs.get("transpose_a") and a.desc.ndims >= 2:
        a = permuted(a, tuple(range(a.desc.ndims - 2)) + (a.desc.ndims - 1, a.desc.ndims - 2))
    if op.attrs.get("transpose_b") and w.desc.ndims >= 2:
        w = permuted(w, tuple(range(w.desc.ndims - 2)) + (w.desc.ndims - 1, w.desc.ndims - 2))
    a_vector, w_vector = len(known_shape(op.inputs[0])) == 1, len(known_shape(op.inputs[1])) == 1
    if a_vector:
        a = View(a.slot, MemoryDesc((1, a.desc.dims[0]), a.desc.dtype, (a.desc.strides[0], a.desc.strides[0])))
    if w_vector:
        w = View(w.slot, MemoryDesc((w.desc.dims[0], 1), w.desc.dtype, (w.desc.strides[0], w.desc.strides[0])))
    dst = b.output(op.outputs[0])
    full = tuple(_batch(a.desc.dims[:-2], w.desc.dims[:-2])) + (a.desc.dims[-2], w.desc.dims[-1])
    if dst.desc.dims != full:
        if not _row_major(dst.desc):
            raise UnsupportedError(f"MatMul {op.id}: a strided output of a vector product")
        dst = _as_dims(b, op, dst, full)
    inputs = {"src": a, "weights": w}
    if len(op.inputs) > 2:
        inputs["bias"] = b.view(op.inputs[2])
    b.run(op, make or (lambda src, weights, dst, bias=None: MatmulDesc(src, weights, dst, bias)), inputs, {"dst": dst})


def _batch(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    return tuple(max(p, q) for p, q in zip(x, y))


# -- convolution, pooling ----------------------------------------------------------------------


def _channels_first(view: View) -> View:
    """An NXC view as NCX: (N, spatial..., C) -> (N, C, spatial...)."""
    n = view.desc.ndims
    return permuted(view, (0, n - 1) + tuple(range(1, n - 1)))


def _weights_oix(view: View, fmt: str) -> View:
    n = view.desc.ndims
    if fmt == "OIX":
        return view
    if fmt == "XIO":  # (spatial..., I, O) -> (O, I, spatial...)
        return permuted(view, (n - 1, n - 2) + tuple(range(n - 2)))
    if fmt == "XOI":
        return permuted(view, (n - 2, n - 1) + tuple(range(n - 2)))
    if fmt == "IOX":
        return permuted(view, (1, 0) + tuple(range(2, n)))
    raise UnsupportedError(f"weights_format {fmt!r}")


def _pads(attrs_: dict, in_sizes, kernel, strides, dilations, out_sizes):
    """(pads_begin, pads_end) as the lowering needs them: auto_pad resolved, and the end
    padding grown where the output size was rounded up (``rounding_type`` ceil)."""
    auto = attrs_.get("auto_pad", "None")
    nsp = len(in_sizes)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nsp):
            eff = (kernel[i] - 1) * dilations[i] + 1
            total = max((math.ceil(in_sizes[i] / strides[i]) - 1) * strides[i] + eff - in_sizes[i], 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
    elif auto == "VALID":
        begin, end = [0] * nsp, [0] * nsp
    else:
        begin = list(attrs_.get("pads_begin", [0] * nsp))
        end = list(attrs_.get("pads_end", [0] * nsp))
    for i in range(nsp):
        eff = (kernel[i] - 1) * dilations[i] + 1
        need = (out_sizes[i] - 1) * strides[i] + eff - in_sizes[i] - begin[i]
        end[i] = max(end[i], need)
    return tuple(begin), tuple(end)


def _lower_convolution(b: Builder, op: Op, **quantization) -> None:
    """``quantization``: ConvolutionDesc's src_quant/weights_quant/dst_quant (the int8 fusion)."""
    a = op.attrs
    src, wei = b.view(op.inputs[0]), b.view(op.inputs[1])
    dst = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    wei = _weights_oix(wei, a.get("weights_format", "XIO"))
    nsp = src.desc.ndims - 2
    kernel = wei.desc.dims[2:]
    strides = tuple(a.get("strides", [1] * nsp))
    dilations = tuple(a.get("dilations", [1] * nsp))
    begin, end = _pads(a, src.desc.dims[2:], kernel, strides, dilations, dst.desc.dims[2:])
    inputs = {"src": src, "weights": wei}
    if len(op.inputs) > 2:
        inputs["bias"] = b.view(op.inputs[2])
    groups = a.get("groups", 1)

    def make(src, weights, dst, bias=None):
        return ConvolutionDesc(src, weights, dst, bias, strides=strides, padding_l=begin,
                               padding_r=end, dilation=dilations, groups=groups, **quantization)

    b.run(op, make, inputs, {"dst": dst})


def _lower_conv_transpose(b: Builder, op: Op) -> None:
    a = op.attrs
    geometry = conv_transpose_geometry(op.kind, a, known_shape(op.inputs[0]), known_shape(op.inputs[1]))
    src, wei = b.view(op.inputs[0]), b.view(op.inputs[1])
    dst = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    wei = permuted(wei, conv_transpose_weights_order(a.get("weights_format", "XOI"), wei.desc.ndims))
    inputs = {"src": src, "weights": wei}
    if len(op.inputs) > 2:
        inputs["bias"] = b.view(op.inputs[2])

    def make(src, weights, dst, bias=None):
        return DeconvolutionDesc(src, weights, dst, bias, strides=geometry.strides, padding_l=geometry.pads_begin,
                                 padding_r=geometry.pads_end, dilation=geometry.dilations, groups=geometry.groups,
                                 output_padding=geometry.output_padding)

    b.run(op, make, inputs, {"dst": dst})

# -- convolution backward (training) -------------------------------------------------------------
# Each of the four works on one convolution (conv_backward_geometry): ConvolutionBackwardData is
# that convolution transposed (a DeconvolutionDesc with the same weights), ConvTransposeBackwardData
# is it forward (a ConvolutionDesc), and both weights gradients are ConvolutionBackwardWeightsDesc,
# the ConvTranspose one with src and diff_dst swapped. The weights are views in (OC, C/groups, k...)
# order, so no copy is made for any weights_format.


def _lower_conv_backward(b: Builder, op: Op) -> None:
    a = op.attrs
    geometry = conv_backward_geometry(op.kind, a, [known_shape(lt) for lt in op.inputs])
    nxc = a.get("data_format", "NXC") == "NXC"

    def data(view: View) -> View:
        return _channels_first(view) if nxc else view

    s, pl, pr, dil, groups = (geometry.strides, geometry.pads_begin, geometry.pads_end, geometry.dilations,
                              geometry.groups)
    if op.kind.endswith("Weights"):
        src, diff_dst = data(b.view(op.inputs[0])), data(b.view(op.inputs[1]))
        if op.kind == "ConvTransposeBackwardWeights":
            src, diff_dst = diff_dst, src
        diff_weights = permuted(b.output(op.outputs[0]), geometry.weights_order)
        b.run(op, lambda src, diff_dst, diff_weights: ConvolutionBackwardWeightsDesc(
                  src, diff_dst, diff_weights, strides=s, padding_l=pl, padding_r=pr, dilation=dil, groups=groups),
              {"src": src, "diff_dst": diff_dst}, {"diff_weights": diff_weights})
        return
    diff_dst = data(b.view(op.inputs[0]))
    weights = permuted(b.view(op.inputs[1]), geometry.weights_order)
    diff_src = data(b.output(op.outputs[0]))
    if op.kind == "ConvTransposeBackwardData":
        b.run(op, lambda src, weights, dst: ConvolutionDesc(src, weights, dst, strides=s, padding_l=pl, padding_r=pr,
                                                            dilation=dil, groups=groups),
              {"src": diff_dst, "weights": weights}, {"dst": diff_src})
        return
    # The stride may leave trailing rows of the convolution's src that no output read: output_padding
    # adds them back, and their gradient (no tap reaches them) is zero.
    nsp = len(geometry.strides)
    output_padding = tuple(
        geometry.conv_src[2 + i] - deconv_out_size(geometry.conv_dst[2 + i], geometry.weights[2 + i],
                                                   geometry.strides[i], geometry.pads_begin[i],
                                                   geometry.pads_end[i], geometry.dilations[i])
        for i in range(nsp))
    b.run(op, lambda src, weights, dst: DeconvolutionDesc(src, weights, dst, strides=s, padding_l=pl, padding_r=pr,
                                                          dilation=dil, groups=groups, output_padding=output_padding),
          {"src": diff_dst, "weights": weights}, {"dst": diff_src})


def _lower_pool(b: Builder, op: Op) -> None:
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    nsp = src.desc.ndims - 2
    kernel = tuple(a["kernel"])
    strides = tuple(a.get("strides", [1] * nsp))
    dilations = tuple(a.get("dilations", [1] * nsp)) if op.kind == "MaxPool" else (1,) * nsp
    begin, end = _pads(a, src.desc.dims[2:], kernel, strides, dilations, dst.desc.dims[2:])
    if op.kind == "MaxPool":
        alg = "max"
    else:
        alg = "avg_exclude_padding" if a.get("exclude_pad", False) else "avg_include_padding"
    b.run(op, lambda src, dst: PoolingDesc(alg, src, dst, kernel=kernel, strides=strides,
                                           padding_l=begin, padding_r=end, dilation=dilations),
          {"src": src}, {"dst": dst})


# -- pooling backward (issue 21) --
def _lower_pool_backward(b: Builder, op: Op) -> None:
    # The geometry as _lower_pool's, taken on diff_src (the forward's src); AvgPoolBackward's
    # optional src_shape input adds nothing diff_src's shape does not say.
    a = op.attrs
    is_max = op.kind == "MaxPoolBackward"
    inputs = {"diff_dst": b.view(op.inputs[1] if is_max else op.inputs[0])}
    if is_max:
        inputs["src"] = b.view(op.inputs[0])
    diff_src = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        inputs = {name: _channels_first(view) for name, view in inputs.items()}
        diff_src = _channels_first(diff_src)
    nsp = diff_src.desc.ndims - 2
    kernel = tuple(a["kernel"])
    strides = tuple(a.get("strides", [1] * nsp))
    dilations = tuple(a.get("dilations", [1] * nsp)) if is_max else (1,) * nsp
    begin, end = _pads(a, diff_src.desc.dims[2:], kernel, strides, dilations, inputs["diff_dst"].desc.dims[2:])
    if is_max:
        alg = "max"
    else:
        alg = "avg_exclude_padding" if a.get("exclude_pad", False) else "avg_include_padding"

    def make(diff_dst, diff_src, src=None):
        return PoolingBackwardDesc(alg, diff_dst, diff_src, src, kernel=kernel, strides=strides,
                                   padding_l=begin, padding_r=end, dilation=dilations)

    b.run(op, make, inputs, {"diff_src": diff_src})


def _lower_interpolate(b: Builder, op: Op) -> None:
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])  # a sizes input: dst's shape says it
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    alg = "nearest" if a["mode"] == "nearest" else "linear"  # bilinear, trilinear: linear by rank
    align = a.get("coordinate_transformation_mode", "half_pixel") == "align_corners"
    b.run(op, lambda src, dst: ResamplingDesc(alg, src, dst, align_corners=align), {"src": src}, {"dst": dst})


# -- softmax, normalization, reduction -------------------------------------------------------------


def _lower_softmax(b: Builder, op: Op) -> None:
    alg = "logsoftmax" if op.kind == "LogSoftmax" else "softmax"
    axis = op.attrs.get("axis", 1)
    inf_as_zero = op.attrs.get("mode", "none") == "inf_as_zero"
    outputs = {"dst": b.output(op.outputs[0])}
    if len(op.outputs) > 1:
        outputs["stats"] = b.output(op.outputs[1])
    b.run(op, lambda src, dst, stats=None: SoftmaxDesc(alg, src, dst, axis, stats=stats, inf_as_zero=inf_as_zero),
          {"src": b.view(op.inputs[0])}, outputs)


# -- softmax, PReLU and Interpolate backward (training; issue 21) ---------------------------------


def _lower_softmax_backward(b: Builder, op: Op) -> None:
    alg = "logsoftmax" if op.kind == "LogSoftmaxBackward" else "softmax"
    axis = op.attrs.get("axis", 1)
    b.run(op, lambda diff_dst, dst, diff_src: SoftmaxBackwardDesc(alg, dst, diff_dst, diff_src, axis),
          {"diff_dst": b.view(op.inputs[0]), "dst": b.view(op.inputs[1])}, {"diff_src": b.output(op.outputs[0])})


def _placed_slope(view: View, placed: tuple[int, ...]) -> View:
    """A slope (or its gradient) as the dims ``placed`` it broadcasts to src with, as
    ``_lower_prelu`` places it: right-aligned, or a 1-D slope on NCX's channel dim."""
    pad = len(placed) - view.desc.ndims
    if placed == (1,) * pad + view.desc.dims:
        strides = (1,) * pad + view.desc.strides
    else:
        strides = tuple(view.desc.strides[0] if d != 1 else 1 for d in placed)
    return View(view.slot, MemoryDesc(placed, view.desc.dtype, strides))


def _lower_prelu_backward(b: Builder, op: Op) -> None:
    placed = prelu_slope_shape(op.kind, op.attrs, known_shape(op.inputs[0]), known_shape(op.inputs[1]))
    inputs = {"src": b.view(op.inputs[0]), "weights": _placed_slope(b.view(op.inputs[1]), placed),
              "diff_dst": b.view(op.inputs[2])}
    outputs = {"diff_src": b.output(op.outputs[0]), "diff_weights": _placed_slope(b.output(op.outputs[1]), placed)}
    b.run(op, lambda src, weights, diff_dst, diff_src, diff_weights: PreluBackwardDesc(
              src, weights, diff_dst, diff_src, diff_weights), inputs, outputs)


def _lower_interpolate_backward(b: Builder, op: Op) -> None:
    a = op.attrs
    diff_dst, diff_src = b.view(op.inputs[1]), b.output(op.outputs[0])  # src: diff_src's shape only
    if a.get("data_format", "NXC") == "NXC":
        diff_dst, diff_src = _channels_first(diff_dst), _channels_first(diff_src)
    alg = "nearest" if a["mode"] == "nearest" else "linear"
    align = a.get("coordinate_transformation_mode", "half_pixel") == "align_corners"
    b.run(op, lambda diff_dst, diff_src: ResamplingBackwardDesc(alg, diff_dst, diff_src, align_corners=align),
          {"diff_dst": diff_dst}, {"diff_src": diff_src})


def _norm_views(b: Builder, op: Op, begin_axis: int, views: dict[str, View]):
    """Views with the normalised dims collapsed into the last one when they are several."""
    shape = known_shape(op.inputs[0])
    begin = begin_axis % len(shape)
    if begin == len(shape) - 1:
        return views
    outer, inner = math.prod(shape[:begin]), math.prod(shape[begin:])
    out = {}
    for name, view in views.items():
        if name in ("src", "dst"):
            out[name] = _as_dims(b, op, view, (outer, inner)) if name == "src" or _row_major(view.desc) else None
            if out[name] is None:
                raise UnsupportedError(f"{op.kind} {op.id}: a strided dst over several normalised dims")
        elif name in ("mean", "variance", "rrms"):
            out[name] = _as_dims(b, op, view, (outer,))
        else:
            out[name] = _as_dims(b, op, view, (inner,))
    return out


def _lower_layer_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    inputs = {"src": b.view(op.inputs[0])}
    if a.get("use_affine", True) and len(op.inputs) >= 3:
        inputs["scale"], inputs["shift"] = b.view(op.inputs[1]), b.view(op.inputs[2])
    outputs = {"dst": b.output(op.outputs[0])}
    if a.get("keep_stats", True) and len(op.outputs) >= 3:
        outputs["mean"], outputs["variance"] = b.output(op.outputs[1]), b.output(op.outputs[2])
    views = _norm_views(b, op, a.get("begin_norm_axis", -1), {**inputs, **outputs})
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, dst, scale=None, shift=None, mean=None, variance=None: LayerNormDesc(
        src, dst, -1, eps, scale, shift, mean, variance),
        {k: views[k] for k in inputs}, {k: views[k] for k in outputs})


def _lower_rms_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    inputs = {"src": b.view(op.inputs[0])}
    if a.get("use_affine", True) and len(op.inputs) >= 2:
        inputs["scale"] = b.view(op.inputs[1])
    outputs = {"dst": b.output(op.outputs[0])}
    if len(op.outputs) >= 2:  # oneDNN's optional rrms, 1 / sqrt(mean(x^2) + eps) per row
        outputs["rrms"] = b.output(op.outputs[1])
    views = _norm_views(b, op, a.get("begin_norm_axis", -1), {**inputs, **outputs})
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, dst, scale=None, rrms=None: RMSNormDesc(src, dst, eps, scale, rrms),
          {k: views[k] for k in inputs}, {k: views[k] for k in outputs})


def _lower_batch_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    src, gamma, beta, mean, var = (b.view(lt) for lt in op.inputs[:5])
    dst = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, dst, mean, variance, scale, shift: BatchNormInferenceDesc(
        src, mean, variance, dst, eps, scale, shift),
        {"src": src, "mean": mean, "variance": var, "scale": gamma, "shift": beta}, {"dst": dst})


# -- normalization training (issue 21) --


def _lower_batch_norm_training(b: Builder, op: Op) -> None:
    """BatchNormForwardTraining: inputs src, the old running mean and variance, [gamma, beta];
    outputs dst, the new running mean and variance, the batch mean and variance."""
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    inputs = {"src": src, "running_mean": b.view(op.inputs[1]), "running_variance": b.view(op.inputs[2])}
    if len(op.inputs) == 5:
        inputs["scale"], inputs["shift"] = b.view(op.inputs[3]), b.view(op.inputs[4])
    outputs = {"dst": dst}
    for name, lt in zip(("running_mean_dst", "running_variance_dst", "mean", "variance"), op.outputs[1:]):
        outputs[name] = b.output(lt)
    eps, momentum = a["epsilon"], a.get("momentum", 0.5)
    b.run(op, lambda src, dst, **named: BatchNormTrainingDesc(src, dst, eps, momentum, **named), inputs, outputs)


def _lower_batch_norm_backward(b: Builder, op: Op) -> None:
    """BatchNormTrainingBackward: gamma counts only with diff_gamma and diff_beta asked for, as
    oneDNN's documentation says."""
    a = op.attrs
    src, diff_dst = b.view(op.inputs[0]), b.view(op.inputs[1])
    diff_src = b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, diff_dst, diff_src = (_channels_first(v) for v in (src, diff_dst, diff_src))
    inputs = {"src": src, "diff_dst": diff_dst, "mean": b.view(op.inputs[2]), "variance": b.view(op.inputs[3])}
    outputs = {"diff_src": diff_src}
    if len(op.outputs) == 3:
        outputs["diff_scale"], outputs["diff_shift"] = b.output(op.outputs[1]), b.output(op.outputs[2])
        if len(op.inputs) == 5:
            inputs["scale"] = b.view(op.inputs[4])
    eps = a["epsilon"]
    b.run(op, lambda src, diff_dst, mean, variance, diff_src, **named: BatchNormBackwardDesc(
        src, diff_dst, mean, variance, diff_src, eps, **named), inputs, outputs)


def _lower_layer_norm_backward(b: Builder, op: Op) -> None:
    """LayerNormBackward over the dims from begin_norm_axis, collapsed into one (copies where the
    layout cannot be read so)."""
    a = op.attrs
    inputs = {name: b.view(lt) for name, lt in zip(("src", "diff_dst", "mean", "variance"), op.inputs)}
    if a.get("use_affine", True) and len(op.inputs) >= 5:
        inputs["scale"] = b.view(op.inputs[4])
    outputs = {"diff_src": b.output(op.outputs[0])}
    if len(op.outputs) == 3:
        outputs["diff_scale"], outputs["diff_shift"] = b.output(op.outputs[1]), b.output(op.outputs[2])
    shape = known_shape(op.inputs[0])
    begin = a.get("begin_norm_axis", -1) % len(shape)
    if begin != len(shape) - 1:
        outer, inner = math.prod(shape[:begin]), math.prod(shape[begin:])
        for name, view in inputs.items():
            dims = {"src": (outer, inner), "diff_dst": (outer, inner), "mean": (outer,), "variance": (outer,)}
            inputs[name] = _as_dims(b, op, view, dims.get(name, (inner,)))
        for name, view in outputs.items():
            if not _row_major(view.desc):
                raise UnsupportedError(f"{op.kind} {op.id}: a strided {name} over several normalised dims")
            outputs[name] = _row_major_as(view, (outer, inner) if name == "diff_src" else (inner,))
    eps = a.get("epsilon", 1e-5)
    b.run(op, lambda src, diff_dst, mean, variance, diff_src, **named: LayerNormBackwardDesc(
        src, diff_dst, mean, variance, diff_src, eps, **named), inputs, outputs)


def _lower_group_norm(b: Builder, op: Op) -> None:
    a = op.attrs
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    if a.get("data_format", "NXC") == "NXC":
        src, dst = _channels_first(src), _channels_first(dst)
    inputs = {"src": src}
    if a.get("use_affine", True) and len(op.inputs) >= 3:
        inputs["scale"], inputs["shift"] = b.view(op.inputs[1]), b.view(op.inputs[2])
    outputs = {"dst": dst}
    if a.get("keep_stats", True) and len(op.outputs) >= 3:  # (N, groups) each
        outputs["mean"], outputs["variance"] = b.output(op.outputs[1]), b.output(op.outputs[2])
    eps, groups = a.get("epsilon", 1e-5), a["groups"]
    b.run(op, lambda src, dst, scale=None, shift=None, mean=None, variance=None: GroupNormDesc(
        src, groups, dst, eps, scale, shift, mean, variance), inputs, outputs)


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceProd": "mul", "ReduceL1": "l1", "ReduceL2": "l2"}


def _lower_reduce(b: Builder, op: Op) -> None:
    src = b.view(op.inputs[0])
    dst = b.output(op.outputs[0])
    ndims = src.desc.ndims
    axes = sorted({x % ndims for x in op.attrs.get("axes", [])})
    keep_dims = [1 if i in axes else d for i, d in enumerate(src.desc.dims)]
    if not op.attrs.get("keep_dims", False):
        # Insert the reduced dims back as 1s: a size-1 dim may take any stride.
        strides, it = [], iter(dst.desc.strides if op.outputs[0].shape else ())
        for i in range(ndims):
            strides.append(1 if i in axes else next(it))
        dst = View(dst.slot, MemoryDesc(tuple(keep_dims), dst.desc.dtype, tuple(strides)))
    alg = _REDUCE[op.kind]
    b.run(op, lambda src, dst: ReductionDesc(alg, src, dst), {"src": src}, {"dst": dst})


# -- data movement ---------------------------------------------------------------------------


def _lower_quantize(b: Builder, op: Op) -> None:
    a = op.attrs
    axis = a["axis"] if a["qtype"] == "per_channel" else None
    alg = op.kind.lower()
    b.run(op, lambda src, dst: QuantizeDesc(alg, src, dst, scales=a["scales"], zps=a["zps"], axis=axis),
          {"src": b.view(op.inputs[0])}, {"dst": b.output(op.outputs[0])})


def _lower_dynamic_quantize(b: Builder, op: Op) -> None:
    src = b.view(op.inputs[0])
    group = quantization_groups(op.kind, op.attrs, src.desc.dims, known_shape(op.inputs[1]))
    placed = tuple(d // g for d, g in zip(src.desc.dims, group))

    def at_src_rank(lt: LogicalTensor) -> View:
        # One scale, one per channel, or per group (src's rank already): the same elements in
        # order, seen with src's rank (a view); dims of 1 take any stride.
        view = b.view(lt)
        if view.desc.dims == placed:
            return view
        step = view.desc.strides[-1] if view.desc.ndims else 1
        return View(view.slot, MemoryDesc(placed, view.desc.dtype, tuple(step for _ in placed)))

    inputs = {"src": src, "scales": at_src_rank(op.inputs[1])}
    if len(op.inputs) > 2:
        inputs["zps"] = at_src_rank(op.inputs[2])
    alg = op.kind[len("Dynamic"):].lower()
    b.run(op, lambda src, scales, dst, zps=None: DynamicQuantizeDesc(alg, src, scales, dst, group, zps),
          inputs, {"dst": b.output(op.outputs[0])})


def _lower_reorder(b: Builder, op: Op) -> None:
    src, dst = b.view(op.inputs[0]), b.output(op.outputs[0])
    b.copy(src, dst, op.id)


def _lower_reshape(b: Builder, op: Op) -> None:
    out = op.outputs[0]
    src = b.view(op.inputs[0])
    view = reshaped(src, _dims(known_shape(out)))
    if view is None and out.id in b.output_slots and _row_major(b.output_slots[out.id].desc):
        # A strided source into a row-major port: one copy, into the port seen with the
        # source's dims (row-major either way, so the same bytes).
        port = b.output(out)
        b.copy(src, View(port.slot, MemoryDesc(src.desc.dims, port.desc.dtype)), op.id)
        return
    if view is None:
        view = _as_dims(b, op, src, _dims(known_shape(out)))
    b.alias(out, view)


def _lower_transpose(b: Builder, op: Op) -> None:
    src = b.view(op.inputs[0])
    ndims = src.desc.ndims
    order = tuple(o % ndims for o in op.attrs["order"]) if op.attrs.get("order") else tuple(reversed(range(ndims)))
    b.alias(op.outputs[0], permuted(src, order))


def _lower_concat(b: Builder, op: Op) -> None:
    srcs = [b.view(lt) for lt in op.inputs]
    axis = op.attrs["axis"]
    names = [f"src{i}" for i in range(len(srcs))]

    def make(dst, **descs):
        return ConcatDesc(tuple(descs[n] for n in names), axis, dst)

    b.run(op, make, dict(zip(names, srcs)), {"dst": b.output(op.outputs[0])})


def _lower_gen_index(b: Builder, op: Op) -> None:
    axis = op.attrs["axis"]
    b.run(op, lambda dst: GenIndexDesc(dst, axis), {}, {"dst": b.output(op.outputs[0])})


# Dropout (issue 21): seed, offset and probability stay device buffers (a host scalar is
# uploaded per execution), so one compiled partition serves every seed.
def _lower_dropout(b: Builder, op: Op) -> None:
    inputs = {name: b.view(lt) for name, lt in zip(("src", "seed", "offset", "probability"), op.inputs)}
    outputs = {"dst": b.output(op.outputs[0])}
    if len(op.outputs) > 1:
        outputs["mask"] = b.output(op.outputs[1])
    b.run(op, lambda src, seed, offset, probability, dst, mask=None: DropoutDesc(
              src, seed, offset, probability, dst, mask), inputs, outputs)


LOWERINGS: dict[str, Callable[[Builder, Op], None]] = {
    **{kind: _lower_unary for kind in UNARY_ELTWISE_KINDS},
    **{kind: _lower_eltwise_backward for kind in ELTWISE_BACKWARD_KINDS},
    **{kind: _lower_binary for kind in _BINARY},
    "Select": _lower_select,
    "PReLU": _lower_prelu,
    "SquaredDifference": _lower_squared_difference,
    "BiasAdd": _lower_bias_add,
    "MatMul": _lower_matmul,
    "Convolution": _lower_convolution,
    "ConvTranspose": _lower_conv_transpose,
    # convolution backward (training)
    "ConvolutionBackwardData": _lower_conv_backward,
    "ConvolutionBackwardWeights": _lower_conv_backward,
    "ConvTransposeBackwardData": _lower_conv_backward,
    "ConvTransposeBackwardWeights": _lower_conv_backward,
    "MaxPool": _lower_pool,
    "AvgPool": _lower_pool,
    "MaxPoolBackward": _lower_pool_backward,  # pooling backward (issue 21)
    "AvgPoolBackward": _lower_pool_backward,
    "Interpolate": _lower_interpolate,
    "SoftMax": _lower_softmax,
    "LogSoftmax": _lower_softmax,
    # softmax, PReLU and Interpolate backward (issue 21)
    "SoftMaxBackward": _lower_softmax_backward,
    "LogSoftmaxBackward": _lower_softmax_backward,
    "PReLUBackward": _lower_prelu_backward,
    "InterpolateBackward": _lower_interpolate_backward,
    "LayerNorm": _lower_layer_norm,
    "RMSNorm": _lower_rms_norm,
    "BatchNormInference": _lower_batch_norm,
    "BatchNormForwardTraining": _lower_batch_norm_training,  # normalization training (issue 21)
    "BatchNormTrainingBackward": _lower_batch_norm_backward,
    "LayerNormBackward": _lower_layer_norm_backward,
    "GroupNorm": _lower_group_norm,
    **{kind: _lower_reduce for kind in _REDUCE},
    "Reorder": _lower_reorder,
    "Quantize": _lower_quantize,
    "DynamicQuantize": _lower_dynamic_quantize,
    "DynamicDequantize": _lower_dynamic_quantize,
    "Dequantize": _lower_quantize,
    "TypeCast": _lower_reorder,
    "StaticReshape": _lower_reshape,
    "StaticTranspose": _lower_transpose,
    "Concat": _lower_concat,
    "GenIndex": _lower_gen_index,
    "Dropout": _lower_dropout,  # Dropout (issue 21)
}


def is_supported(op: Op) -> bool:
    """Whether the op lowers, with every output it declares."""
    if op.kind not in LOWERINGS:
        return False
    if op.kind in ("Interpolate", "InterpolateBackward") and op.attrs.get("mode") == "nearest" and \
            op.attrs.get("coordinate_transformation_mode") == "align_corners":
        return False  # no rounding rule is defined for it (oneDNN runs no align_corners at all)
    return True
