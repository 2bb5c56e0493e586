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
    ReorderDesc,
    SdpaDesc,
)
from .._values._errors import UnsupportedError
from .._values._memory_desc import MemoryDesc
from .._values._op_desc import OpDesc
from ._logical_tensor import LogicalTensor, dense_strides, known_shape, storage_dtype
from ._op import Op
from ._op_registry import graph_op, is_registered


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


def row_major(desc: MemoryDesc) -> bool:
    return desc.strides == dense_strides(desc.dims)


def dims_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape) or (1,)


class Builder:
    """Turns ops (shapes already inferred) into a Plan."""

    def __init__(self, inputs: list[LogicalTensor], outputs: list[LogicalTensor], *, fpmath_mode: str = "strict"):
        self.plan = Plan()
        # The partition's fpmath mode, which the primitives that honour one take (MatmulDesc).
        self.fpmath_mode = fpmath_mode
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
            view = self.temp(MemoryDesc(dims_of(known_shape(lt)), storage_dtype(lt.dtype)))
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
            view = aligned(view, len(entry_shape))
            if dst.desc.dims != tuple(final_shape or (1,)):
                view = channels_first(view)
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
        if lowering is None:
            lowering = graph_op(op.kind).lower
            assert lowering is not None, "partitions hold only kinds that lower (is_supported)"
        lowering(self, op)
        self._redirect.clear()
        self._post = ()


def _sdpa_dst(b: Builder, match) -> View | None:
    """Where the attention writes its output so that ``match.tail`` needs no step: the tail's
    last tensor seen back through each move; None where a reshape needs a copy."""
    final = match.final if match.final is not None else match.output
    port = b.output_slots.get(final.id)
    desc = port.desc if port is not None else MemoryDesc(dims_of(known_shape(final)), storage_dtype(final.dtype))
    view = View(-1, desc)
    for op in reversed(match.tail):
        dims = dims_of(known_shape(op.inputs[0]))
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
    if row_major(view.desc):
        return row_major_as(view, dims)
    return None


def row_major_as(view: View, dims: tuple[int, ...]) -> View:
    """A row-major ``view`` read with ``dims`` (same element count)."""
    return View(view.slot, MemoryDesc(dims, view.desc.dtype))


def permuted(view: View, order: tuple[int, ...]) -> View:
    desc = view.desc
    return View(view.slot, MemoryDesc(tuple(desc.dims[i] for i in order), desc.dtype,
                                      tuple(desc.strides[i] for i in order)))


def aligned(view: View, ndims: int) -> View:
    """``view`` with leading 1s up to ``ndims`` dims (numpy's right alignment)."""
    desc = view.desc
    pad = ndims - desc.ndims
    if pad <= 0:
        return view
    return View(view.slot, MemoryDesc((1,) * pad + desc.dims, desc.dtype, (1,) * pad + desc.strides))


def dense(b: Builder, op: Op, view: View) -> View:
    """``view`` as a row-major buffer, copying when it is not one."""
    if row_major(view.desc):
        return view
    temp = b.temp(MemoryDesc(view.desc.dims, view.desc.dtype))
    b.copy(view, temp, op.id)
    return temp


def as_dims(b: Builder, op: Op, view: View, dims: tuple[int, ...]) -> View:
    return row_major_as(dense(b, op, view), dims)


# -- eltwise and binary ----------------------------------------------------------------------


# -- matmul ------------------------------------------------------------------------------------


# -- convolution, pooling ----------------------------------------------------------------------


def channels_first(view: View) -> View:
    """An NXC view as NCX: (N, spatial..., C) -> (N, C, spatial...)."""
    n = view.desc.ndims
    return permuted(view, (0, n - 1) + tuple(range(1, n - 1)))


def weights_oix(view: View, fmt: str) -> View:
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


def explicit_pads(attrs_: dict, in_sizes, kernel, strides, dilations, out_sizes):
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


def is_supported(op: Op) -> bool:
    """Whether the op lowers, with every output it declares."""
    declared = graph_op(op.kind) if is_registered(op.kind) else None
    if declared is None or declared.lower is None:
        return False
    return declared.lowers is None or declared.lowers(op)
