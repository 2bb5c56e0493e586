"""Concat forward: ``dst = concatenate(srcs, axis)``, generator beside its source.

Every source has dst's dims except along ``axis``; each source and dst in any layout. One element
of dst per work-item: the work-item peels its coordinates from the linear index, finds its source
by comparing the axis coordinate with the baked cumulative offsets (a binary search, unrolled),
and reads that source with its own strides. A copy: results are exact.
"""

from __future__ import annotations

import math

import numpy as np

from ._spec import KernelConfig, KernelSpec, padded_global

MAX_INPUTS = 64


def _select(lo: int, hi: int, starts: list[int], loads: list[str], indent: str) -> list[str]:
    """Nested ifs choosing among sources ``lo`` .. ``hi - 1`` by the axis coordinate ``ca``."""
    if hi - lo == 1:
        return [indent + loads[lo]]
    mid = (lo + hi) // 2
    return (
        [f"{indent}if (ca < {starts[mid]}UL) {{"]
        + _select(lo, mid, starts, loads, indent + "    ")
        + [f"{indent}}} else {{"]
        + _select(mid, hi, starts, loads, indent + "    ")
        + [f"{indent}}}"]
    )


def generate(
    *,
    src_dims: tuple[tuple[int, ...], ...],
    src_strides: tuple[tuple[int, ...], ...],
    axis: int,
    dst_strides: tuple[int, ...],
    config: KernelConfig,
) -> KernelSpec:
    """OpenCL source concatenating sources of ``src_dims`` along ``axis`` (non-negative) into dst."""
    n_inputs = len(src_dims)
    if not 1 <= n_inputs <= MAX_INPUTS or len(src_strides) != n_inputs:
        raise ValueError(f"concat takes 1 to {MAX_INPUTS} inputs with strides each, got {n_inputs}")
    ndims = len(src_dims[0])
    if not 0 <= axis < ndims:
        raise ValueError(f"axis {axis} out of range for {ndims} dimensions")
    for dims, strides in zip(src_dims, src_strides):
        if len(dims) != ndims or len(strides) != ndims:
            raise ValueError(f"source dims {dims} / strides {strides} do not have {ndims} dimensions")
        if any(d != d0 for k, (d, d0) in enumerate(zip(dims, src_dims[0])) if k != axis):
            raise ValueError(f"source dims {dims} differ from {src_dims[0]} off axis {axis}")
    if len(dst_strides) != ndims:
        raise ValueError(f"dst_strides {dst_strides} do not have {ndims} dimensions")
    dims = list(src_dims[0])
    dims[axis] = sum(d[axis] for d in src_dims)
    n = math.prod(dims)
    starts = [0]
    for d in src_dims:
        starts.append(starts[-1] + d[axis])
    local = config.local_size

    # Coordinates, innermost first; off_dst accumulates as they are peeled.
    lines = ["ulong r = i;", "ulong off_dst = 0;"]
    for k in reversed(range(ndims)):
        d = dims[k]
        if d == 1:
            lines.append(f"const ulong c{k} = 0;")
            continue
        lines.append(f"const ulong c{k} = r % {d}UL; r /= {d}UL;")
        if dst_strides[k]:
            lines.append(f"off_dst += c{k} * {dst_strides[k]}UL;")
    lines.append(f"const ulong ca = c{axis};")

    loads = []
    for s, (sdims, strides) in enumerate(zip(src_dims, src_strides)):
        terms = []
        for k in range(ndims):
            if sdims[k] == 1 or strides[k] == 0:
                continue
            coord = f"(c{k} - {starts[s]}UL)" if k == axis and starts[s] else f"c{k}"
            terms.append(f"{coord} * {strides[k]}UL")
        loads.append(f"dst[off_dst] = src{s}[{' + '.join(terms) or '0'}];")
    lines += _select(0, n_inputs, starts, loads, "")

    names = [f"src{i}" for i in range(n_inputs)]
    params = ", ".join(f"__global const float* {name}" for name in names)
    body = "\n    ".join(lines)
    source = (
        f"__kernel void concat_fwd({params}, __global float* dst) {{\n"
        f"    const ulong i = get_global_id(0);\n"
        f"    if (i >= {n}UL) return;\n"
        f"    {body}\n}}\n"
    )
    return KernelSpec(
        source=source,
        name="concat_fwd",
        arg_names=(*names, "dst"),
        global_size=(padded_global(n, local),),
        local_size=(local,),
        impl=f"ocl:strided:l{local}",
    )


def reference(srcs, axis: int) -> np.ndarray:
    """``numpy.concatenate(srcs, axis)`` as float32."""
    return np.concatenate([np.asarray(s, dtype=np.float32) for s in srcs], axis=axis)
