"""Resampling forward (nearest, linear): the generator of ``ResamplingDesc`` and its float64
reference, on oneDNN's coordinate rules (``src/cpu/resampling_utils.hpp``, which its reference
and benchdnn's share).

Each output coordinate ``y`` of a spatial dim (input size ``I``, output ``O``) maps back to the
input as ``s = (y + 0.5) * I / O - 0.5``, in float32 operation by operation (oneDNN's
``linear_map``). Nearest takes ``roundf(s)`` (half away from zero); linear takes the left
index ``max(trunc(s), 0)``, the right ``min(ceil(s), I - 1)`` (0 for negative ``s``), and
weights ``w1 = |s - left|``, ``w0 = 1 - w1``, interpolating over the 2, 4 or 8 corners (linear,
bilinear, trilinear). ``align_corners`` (oneDNN Graph's coordinate_transformation_mode) maps
``s = y * (I - 1) / (O - 1)`` (0 where ``O == 1``) instead.

The indices and weights depend on the sizes only, so ``coefficients`` computes them once in
numpy float32, exactly as oneDNN's C does, and the generator bakes them into the source as
``__constant`` tables: the kernel and the reference use the same numbers, and no device
division (OpenCL's single-precision division may be off by 2.5 ulp) can move a rounding tie.
One work-item per dst element; any strides and storage types, f32 math.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._values._resampling_desc import RESAMPLING_ALGORITHMS, ResamplingDesc
from . import _dtype_io
from . import tolerance as thresholds
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, padded_global

ALGORITHMS = RESAMPLING_ALGORITHMS
_F32 = np.float32


def _map(y: int, out: int, size: int, align_corners: bool) -> np.float32:
    """The input coordinate of output coordinate ``y``, in float32 as oneDNN's C computes it."""
    if align_corners:
        return _F32(0.0) if out == 1 else _F32(y) * _F32(size - 1) / _F32(out - 1)
    return (_F32(y) + _F32(0.5)) * _F32(size) / _F32(out) - _F32(0.5)


def _ceil_index(s: np.float32) -> int:
    if s < 0:
        return 0
    whole = int(s)
    return whole if float(whole) == float(s) else whole + 1


def coefficients(alg: str, size: int, out: int, align_corners: bool = False):
    """For one spatial dim of input ``size`` and output ``out``: nearest, a list of input
    indices; linear, ``(left, right, w0, w1)`` lists (indices, float32 weights)."""
    if alg == "nearest":
        indices = []
        for y in range(out):
            coord = float(_map(y, out, size, align_corners))
            rounded = int(math.copysign(math.floor(abs(coord) + 0.5), coord))  # roundf: half away from 0
            indices.append(min(max(rounded, 0), size - 1))
        return indices
    if alg != "linear":
        raise ValueError(f"unknown resampling algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    left, right, w0, w1 = [], [], [], []
    for y in range(out):
        s = _map(y, out, size, align_corners)
        lo = max(int(s), 0)  # C's (dim_t)s truncates towards 0
        left.append(lo)
        right.append(min(_ceil_index(s), size - 1))
        weight = _F32(abs(s - _F32(lo)))
        w1.append(weight)
        w0.append(_F32(1.0) - weight)
    return left, right, w0, w1


def _table(name: str, values, c_type: str) -> str:
    body = ", ".join(c_float(v) if c_type == "float" else str(int(v)) for v in values)
    return f"__constant {c_type} {name}[{len(values)}] = {{{body}}};\n"


def generate(desc: ResamplingDesc, config: KernelConfig) -> KernelSpec:
    """One work-item per dst element: its (n, c, spatial) coordinates from the linear index,
    the input coordinates and weights from the baked tables, then the nearest element or the
    weighted sum over the corners (in oneDNN's reference order)."""
    desc.check_supported()
    dims, src_strides, dst_strides = desc.dst.dims, desc.src.strides, desc.dst.strides
    nsp = len(dims) - 2
    total = math.prod(dims)
    tables = ""
    decompose = ["ulong r = gid;"]
    for d in reversed(range(len(dims))):
        decompose.append(f"const ulong i{d} = r % {dims[d]}UL; r /= {dims[d]}UL;")
    base_src = f"i0 * {src_strides[0]}UL + i1 * {src_strides[1]}UL"
    dst_off = " + ".join(f"i{d} * {dst_strides[d]}UL" for d in range(len(dims)))
    load = lambda off: _dtype_io.load(desc.src.dtype, "src", off)  # noqa: E731
    if desc.alg == "nearest":
        for i, (size, out) in enumerate(desc.spatial):
            tables += _table(f"near{i}", coefficients("nearest", size, out), "uint")
        off = " + ".join([base_src] + [f"(ulong)near{i}[i{i + 2}] * {src_strides[i + 2]}UL" for i in range(nsp)])
        compute = f"const float y = {load(off)};"
    else:
        for i, (size, out) in enumerate(desc.spatial):
            left, right, w0, w1 = coefficients("linear", size, out, desc.align_corners)
            tables += (_table(f"idx{i}_0", left, "uint") + _table(f"idx{i}_1", right, "uint")
                       + _table(f"wei{i}_0", w0, "float") + _table(f"wei{i}_1", w1, "float"))
        terms = []
        for corner in itertools.product((0, 1), repeat=nsp):
            off = " + ".join([base_src] + [f"(ulong)idx{i}_{c}[i{i + 2}] * {src_strides[i + 2]}UL"
                                           for i, c in enumerate(corner)])
            weights = "".join(f" * wei{i}_{c}[i{i + 2}]" for i, c in enumerate(corner))
            terms.append(f"y += {load(off)}{weights};")
        compute = "float y = 0.0f;\n    " + "\n    ".join(terms)
    local = config.local_size
    source = (
        _dtype_io.functions(loads=(desc.src.dtype,), stores=(desc.dst.dtype,))
        + tables
        + f"__kernel void resampling_fwd({_dtype_io.param(desc.src.dtype, 'src', const=True)},"
        f" {_dtype_io.param(desc.dst.dtype, 'dst', const=False)}) {{\n"
        "    const ulong gid = get_global_id(0);\n"
        f"    if (gid >= {total}UL) return;\n"
        "    " + "\n    ".join(decompose) + "\n"
        f"    {compute}\n"
        f"    {_dtype_io.store(desc.dst.dtype, 'dst', dst_off, 'y')}\n"
        "}\n"
    )
    return KernelSpec(
        source=source,
        name="resampling_fwd",
        arg_names=("src", "dst"),
        global_size=(padded_global(total, local),),
        local_size=(local,),
        impl=f"ocl:resampling:{desc.alg}:l{local}",
    )


def reference(alg: str, src: np.ndarray, out_spatial: tuple[int, ...], *, align_corners: bool = False,
              dst_dtype: str = "f32") -> np.ndarray:
    """``src`` (N, C, spatial...; user-facing values) resampled to ``out_spatial`` in float64
    with oneDNN's float32 indices and weights (``coefficients``), stored as ``dst_dtype``."""
    x = _dtype_io.widen(src)
    sizes = x.shape[2:]
    if len(out_spatial) != len(sizes):
        raise ValueError(f"out_spatial {out_spatial} must have one size per spatial dim of src {x.shape}")
    if alg == "nearest":
        index = [coefficients("nearest", size, out) for size, out in zip(sizes, out_spatial)]
        y = x[(slice(None), slice(None)) + np.ix_(*index)]
    else:
        coeffs = [coefficients(alg, size, out, align_corners) for size, out in zip(sizes, out_spatial)]
        y = np.zeros(x.shape[:2] + tuple(out_spatial))
        for corner in itertools.product((0, 1), repeat=len(sizes)):
            gathered = x[(slice(None), slice(None)) + np.ix_(*(c[side] for c, side in zip(coeffs, corner)))]
            weight = np.ones(tuple(out_spatial))
            for i, (c, side) in enumerate(zip(coeffs, corner)):
                shape = [1] * len(sizes)
                shape[i] = -1
                weight = weight * np.asarray(c[2 + side], np.float64).reshape(shape)
            y += gathered * weight
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)


def desc_reference(desc: ResamplingDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(desc.alg, inputs["src"], desc.dst.dims[2:], align_corners=desc.align_corners,
                     dst_dtype=desc.dst.dtype)


def desc_tolerance(desc: ResamplingDesc) -> float:
    """Nearest copies elements: exact. Linear sums 2^d products of float32 weights (summing to 1)
    and values, each rounded: a few ulp of the largest term per corner."""
    if desc.alg == "nearest":
        return 0.0
    return 4 * (2 ** (desc.src.ndims - 2)) * thresholds.BINARY


register(ResamplingDesc, generate=generate, reference=desc_reference, tolerance=desc_tolerance)
