"""Softmax backward over one axis: the generator of ``SoftmaxBackwardDesc`` and its float64
reference.

``softmax``: ``diff_src = dst * (diff_dst - sum(diff_dst * dst))``; ``logsoftmax``:
``diff_src = diff_dst - exp(dst) * sum(diff_dst)`` (oneDNN's ref_softmax backward), the sums
over the axis. One work-item per row, two passes: the Kahan-compensated sum, then the write.
Neighbouring work-items take neighbouring rows, so a strided axis (oneDNN's channel softmax on
NCHW, the benchdnn case) reads coalesced on a GPU. Dims and strides are baked in; any storage
types, f32 math.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._softmax_bwd_desc import SoftmaxBackwardDesc
from .._values._softmax_desc import SOFTMAX_ALGORITHMS
from . import _dtype_io
from . import tolerance as thresholds
from ._registry import register
from ._row_vector import kahan_step
from ._spec import KernelConfig, KernelSpec, index_code, padded_global


def generate(desc: SoftmaxBackwardDesc, config: KernelConfig) -> KernelSpec:
    """One row per work-item: the row's sum, then every ``diff_src`` element of the row."""
    desc.check_supported()
    axis = desc.axis
    dims = desc.dst.dims
    n = dims[axis]
    other = dims[:axis] + dims[axis + 1:]
    rows = math.prod(other)
    mds = {"dst": desc.dst, "dd": desc.diff_dst, "ds": desc.diff_src}
    offsets = index_code(other, {k: md.strides[:axis] + md.strides[axis + 1:] for k, md in mds.items()}, "row")
    at = {k: f"off_{k} + k * {md.strides[axis]}UL" for k, md in mds.items()}
    y = _dtype_io.load(desc.dst.dtype, "dst", at["dst"])
    dd = _dtype_io.load(desc.diff_dst.dtype, "diff_dst", at["dd"])
    if desc.alg == "softmax":
        term, value = f"{dd} * {y}", f"{y} * ({dd} - s)"
    else:
        term, value = dd, f"{dd} - exp({y}) * s"
    local = config.local_size
    source = (
        _dtype_io.functions(loads=(desc.dst.dtype, desc.diff_dst.dtype), stores=(desc.diff_src.dtype,))
        + f"__kernel void softmax_bwd({_dtype_io.param(desc.dst.dtype, 'dst', const=True)},"
        f" {_dtype_io.param(desc.diff_dst.dtype, 'diff_dst', const=True)},"
        f" {_dtype_io.param(desc.diff_src.dtype, 'diff_src', const=False)}) {{\n"
        "    const ulong row = get_global_id(0);\n"
        f"    if (row >= {rows}UL) return;\n"
        f"    {offsets}\n"
        "    float s = 0.0f, s_c = 0.0f;\n"
        f"    for (ulong k = 0; k < {n}UL; ++k) {kahan_step('s', 's_c', term)}\n"
        "    s -= s_c;\n"
        f"    for (ulong k = 0; k < {n}UL; ++k) {{ const float g = {value};"
        f" {_dtype_io.store(desc.diff_src.dtype, 'diff_src', at['ds'], 'g')} }}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name="softmax_bwd",
        arg_names=("dst", "diff_dst", "diff_src"),
        global_size=(padded_global(rows, local),),
        local_size=(local,),
        impl=f"ocl:row_bwd:l{local}",
    )


def reference(alg: str, dst: np.ndarray, diff_dst: np.ndarray, *, axis: int = -1,
              diff_src_dtype: str = "f32") -> np.ndarray:
    """The softmax (or logsoftmax) gradient from user-facing ``dst`` and ``diff_dst`` in float64,
    stored as ``diff_src_dtype``."""
    y, dd = _dtype_io.widen(dst), _dtype_io.widen(diff_dst)
    with np.errstate(all="ignore"):
        if alg == "softmax":
            g = y * (dd - np.sum(dd * y, axis=axis, keepdims=True))
        elif alg == "logsoftmax":
            g = dd - np.exp(y) * np.sum(dd, axis=axis, keepdims=True)
        else:
            raise ValueError(f"unknown softmax algorithm {alg!r}; known: {', '.join(SOFTMAX_ALGORITHMS)}")
    return _dtype_io.store_reference(g.astype(np.float32), diff_src_dtype)


def desc_reference(desc: SoftmaxBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(desc.alg, inputs["dst"], inputs["diff_dst"], axis=desc.axis, diff_src_dtype=desc.diff_src.dtype)


def threshold(alg: str) -> float:
    """benchdnn's softmax setup_cmp: the backward pass gets 4 times the forward's threshold."""
    return 4 * thresholds.softmax(alg)


register(SoftmaxBackwardDesc, generate=generate, reference=desc_reference, tolerance=lambda desc: threshold(desc.alg))
