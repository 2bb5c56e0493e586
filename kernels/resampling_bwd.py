"""Resampling backward (nearest, linear): the generator of ``ResamplingBackwardDesc`` and its
float64 reference, on the forward's coordinates and weights (``resampling.coefficients``).

The forward reads, for dst coordinate ``y`` of a spatial dim, source ``near[y]`` (nearest) or
``left[y]`` and ``right[y]`` with weights ``w0[y]``, ``w1[y]`` (linear); a dst element's weight
is the product over the spatial dims. The backward is the transpose: ``diff_src[x]`` sums
``diff_dst[y] * weight`` over every ``y`` that read ``x``. Written as a gather, one work-item per
diff_src element, no atomics: per spatial dim the generator inverts the forward's tables into
a compressed list (for each ``x``, the range ``first[x] .. first[x + 1]`` of ``(y, weight)``
pairs, ``y`` ascending, the left side before the right), baked into ``__constant`` tables, and
the kernel nests one loop per spatial dim over those ranges, summing with Kahan compensation.
Any strides and storage types, f32 math.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._resampling_bwd_desc import ResamplingBackwardDesc
from . import _dtype_io
from . import tolerance as thresholds
from ._registry import register
from ._row_vector import kahan_step
from ._spec import KernelConfig, KernelSpec, c_float, padded_global
from .resampling import ALGORITHMS, coefficients


def contributions(alg: str, size: int, out: int, align_corners: bool = False) -> list[list[tuple[int, np.float32]]]:
    """For each source coordinate ``x`` of one spatial dim (input ``size``, output ``out``), the
    ``(y, weight)`` pairs of the dst coordinates that read it, in the order the kernel sums them."""
    if alg not in ALGORITHMS:
        raise ValueError(f"unknown resampling algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    pairs: list[list[tuple[int, np.float32]]] = [[] for _ in range(size)]
    if alg == "nearest":
        for y, x in enumerate(coefficients("nearest", size, out)):
            pairs[x].append((y, np.float32(1.0)))
        return pairs
    left, right, w0, w1 = coefficients("linear", size, out, align_corners)
    for y in range(out):
        pairs[left[y]].append((y, w0[y]))
        pairs[right[y]].append((y, w1[y]))
    return pairs


def table(name: str, values, c_type: str) -> str:
    body = ", ".join(c_float(v) if c_type == "float" else str(int(v)) for v in values)
    return f"__constant {c_type} {name}[{len(values)}] = {{{body}}};\n"


def _matrix(alg: str, size: int, out: int, align_corners: bool) -> np.ndarray:
    """The forward's (out, size) weights of one spatial dim, in float64."""
    m = np.zeros((out, size))
    for x, pairs in enumerate(contributions(alg, size, out, align_corners)):
        for y, w in pairs:
            m[y, x] += float(w)
    return m


def generate(desc: ResamplingBackwardDesc, config: KernelConfig) -> KernelSpec:
    """One work-item per diff_src element: its coordinates from the linear index, then one loop
    per spatial dim over the dst coordinates that read it."""
    desc.check_supported()
    dims, ds_strides, dd_strides = desc.diff_src.dims, desc.diff_src.strides, desc.diff_dst.strides
    nsp = len(dims) - 2
    total = math.prod(dims)
    nearest = desc.alg == "nearest"
    tables = ""
    decompose = ["ulong r = gid;"]
    for d in reversed(range(len(dims))):
        decompose.append(f"const ulong i{d} = r % {dims[d]}UL; r /= {dims[d]}UL;")
    for i, (size, out) in enumerate(desc.spatial):
        pairs = contributions(desc.alg, size, out, desc.align_corners)
        first = np.cumsum([0] + [len(p) for p in pairs])
        tables += table(f"first{i}", first, "uint") + table(f"ys{i}", [y for p in pairs for y, _ in p], "uint")
        if not nearest:
            tables += table(f"ws{i}", [w for p in pairs for _, w in p], "float")
    offset = " + ".join([f"i0 * {dd_strides[0]}UL + i1 * {dd_strides[1]}UL"]
                        + [f"(ulong)ys{i}[a{i}] * {dd_strides[i + 2]}UL" for i in range(nsp)])
    term = _dtype_io.load(desc.diff_dst.dtype, "diff_dst", offset)
    if not nearest:
        term += "".join(f" * ws{i}[a{i}]" for i in range(nsp))
    loops = "".join(f"for (uint a{i} = first{i}[i{i + 2}]; a{i} < first{i}[i{i + 2} + 1]; ++a{i}) "
                    for i in range(nsp))
    ds_off = " + ".join(f"i{d} * {ds_strides[d]}UL" for d in range(len(dims)))
    local = config.local_size
    source = (
        _dtype_io.functions(loads=(desc.diff_dst.dtype,), stores=(desc.diff_src.dtype,))
        + tables
        + f"__kernel void resampling_bwd({_dtype_io.param(desc.diff_dst.dtype, 'diff_dst', const=True)},"
        f" {_dtype_io.param(desc.diff_src.dtype, 'diff_src', const=False)}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        "    " + "\n    ".join(decompose) + "\n"
        "    float s = 0.0f, s_c = 0.0f;\n"
        f"    {loops}{kahan_step('s', 's_c', term)}\n"
        f"    {_dtype_io.store(desc.diff_src.dtype, 'diff_src', ds_off, 's - s_c')}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name="resampling_bwd",
        arg_names=("diff_dst", "diff_src"),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:resampling_bwd:{desc.alg}:l{local}",
    )


def reference(alg: str, diff_dst: np.ndarray, in_spatial: tuple[int, ...], *, align_corners: bool = False,
              diff_src_dtype: str = "f32") -> np.ndarray:
    """The gradient of resampling ``(N, C, *in_spatial)`` to diff_dst's spatial sizes, from
    user-facing ``diff_dst`` (N, C, spatial'...) in float64: diff_dst contracted with each
    dim's forward weights (oneDNN's float32 ones), stored as ``diff_src_dtype``."""
    g = _dtype_io.widen(diff_dst)
    out_spatial = g.shape[2:]
    if len(in_spatial) != len(out_spatial):
        raise ValueError(f"in_spatial {in_spatial} must have one size per spatial dim of diff_dst {g.shape}")
    for i, (size, out) in enumerate(zip(in_spatial, out_spatial)):
        m = _matrix(alg, size, out, align_corners)
        g = np.moveaxis(np.tensordot(g, m, axes=([2 + i], [0])), -1, 2 + i)
    return _dtype_io.store_reference(g.astype(np.float32), diff_src_dtype)


def desc_reference(desc: ResamplingBackwardDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(desc.alg, inputs["diff_dst"], desc.diff_src.dims[2:], align_corners=desc.align_corners,
                     diff_src_dtype=desc.diff_src.dtype)


def max_terms(desc: ResamplingBackwardDesc) -> int:
    """The most diff_dst terms one diff_src element sums."""
    return math.prod(max(len(p) for p in contributions(desc.alg, size, out, desc.align_corners))
                     for size, out in desc.spatial)


def desc_tolerance(desc: ResamplingBackwardDesc) -> float:
    """A copy where each element receives at most one nearest term; otherwise a few ulp per
    term (each a product of float32 weights and a value, rounded, then summed)."""
    terms = max_terms(desc)
    if desc.alg == "nearest" and terms == 1:
        return 0.0
    return 4 * terms * thresholds.BINARY


register(ResamplingBackwardDesc, generate=generate, reference=desc_reference, tolerance=desc_tolerance)
