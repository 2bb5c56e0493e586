"""Reorder: ``dst = convert(src)`` elementwise between any two layouts and data types.

Every value goes through f32: the source is widened to float (exact for f16, bf16, s8, u8 and
boolean; s32 magnitudes above 2**24 round to nearest even there, as in oneDNN's reorders), then
narrowed to the destination type:

* f16: ``vstore_half_rte`` (a core built-in, no cl_khr_fp16 needed): round to nearest even,
  overflow to inf, NaN kept NaN.
* bf16: round to nearest even on the 16 dropped bits, NaN kept NaN with the quiet bit set:
  bit for bit what ``triodnn._dtypes.to_storage`` does.
* s32, s8, u8: round to nearest even, saturate to the type's range, NaN -> 0. This is
  OpenCL C's ``convert_<type>_sat_rte`` (the spec maps NaN to 0), which oneDNN's OpenCL kernels
  use for integer destinations; it is written out by hand because PoCL keeps the built-in as a
  call.
* boolean (oneDNN Graph's one-byte truth type): ``value != 0`` as 1 or 0 (NaN is nonzero: 1); a
  boolean source reads any nonzero byte as 1.0.

The conversions are ``_dtype_io``'s load and store helpers, which every other kind uses too.

A source and destination of one data type copy the stored bits without any conversion (s32 stays
exact, NaN payloads survive, boolean bytes are copied as they are). Dense tensors of one data type
and one layout take the ``copy`` path: a flat copy, ``vector_width`` elements per work-item.
On the GPU configuration, a transpose (src contiguous along one axis, dst along another, both at
least ``TILE`` long) goes through ``__local`` tiles (``ocl:tiled``): a work-group of TILE x
TILE_ROWS work-items reads a TILE x TILE tile with consecutive work-items on src's contiguous
axis and writes it with consecutive work-items on dst's, so both sides coalesce; the tile's rows
are padded by one element against bank conflicts. The element-per-work-item form coalesced only
its writes: 0.16-0.68x the copy bandwidth on an H100 (bench_sweep.py, 1024² to 8192² f32).
Everything else runs one element per work-item, the offsets found by index arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._reorder_desc import CrossEngineReorderDesc, ReorderDesc
from . import _dtype_io
from ._registry import register
from ._spec import KernelConfig, KernelSpec, index_code, is_dense, padded_global

# s4/u4 too: every element is its own work-item's load and store (``_dtype_io``'s packed stores
# keep neighbouring nibbles intact), never a flat copy of elements as bytes.
DTYPES: tuple[str, ...] = (*_dtype_io.DTYPES, *_dtype_io.PACKED)

# OpenCL type that moves a stored value's bits unchanged: ``_dtype_io.BITS``, but f32 copies as
# uint, so no float load or store can touch a NaN payload.
_BITS = {**_dtype_io.BITS, "f32": "uint"}


TILE, TILE_ROWS = 32, 8


def _transpose_axes(desc: ReorderDesc, config: KernelConfig) -> tuple[int, int] | None:
    """(src's contiguous axis, dst's contiguous axis) where the tiled transpose applies."""
    if config.vector_width != 1 or config.local_size < TILE * TILE_ROWS:
        return None
    if desc.src.dtype in _dtype_io.PACKED or desc.dst.dtype in _dtype_io.PACKED:
        return None
    dims = desc.src.dims
    a = [i for i, s in enumerate(desc.src.strides) if s == 1 and dims[i] > 1]
    b = [i for i, s in enumerate(desc.dst.strides) if s == 1 and dims[i] > 1]
    if len(a) != 1 or len(b) != 1 or a[0] == b[0] or min(dims[a[0]], dims[b[0]]) < TILE:
        return None
    return a[0], b[0]


def _tiled(desc: ReorderDesc, axes: tuple[int, int], same_type: bool) -> KernelSpec:
    dims = desc.src.dims
    a, b = axes
    ss, ds = desc.src.strides, desc.dst.strides
    rest = [i for i in range(len(dims)) if i not in axes]
    nrest = math.prod(dims[i] for i in rest)
    offsets = index_code(tuple(dims[i] for i in rest), {"src": tuple(ss[i] for i in rest),
                                                        "dst": tuple(ds[i] for i in rest)}, "z") if rest else (
        "const ulong off_src = 0; const ulong off_dst = 0;")
    if same_type:
        src_type = dst_type = tile_type = _BITS[desc.src.dtype]
        helpers = ""

        def load(off: str) -> str:
            return f"src[{off}]"

        def store(off: str, value: str) -> str:
            return f"dst[{off}] = {value};"
    else:
        src_type, dst_type, tile_type = _dtype_io.STORAGE[desc.src.dtype], _dtype_io.STORAGE[desc.dst.dtype], "float"
        helpers = _dtype_io.functions(loads=(desc.src.dtype,), stores=(desc.dst.dtype,))

        def load(off: str) -> str:
            return _dtype_io.load(desc.src.dtype, "src", off)

        def store(off: str, value: str) -> str:
            return _dtype_io.store(desc.dst.dtype, "dst", off, value)
    da, db = dims[a], dims[b]
    reads = " ".join(
        f"{{ const ulong bb = b0 + ty + {k}UL; if (aa < {da}UL && bb < {db}UL)"
        f" tile[ty + {k}u][tx] = {load(f'off_src + aa + bb * {ss[b]}UL')}; }}"
        for k in range(0, TILE, TILE_ROWS))
    writes = " ".join(
        f"{{ const ulong a2 = a0 + ty + {k}UL; if (a2 < {da}UL && b2 < {db}UL)"
        f" {store(f'off_dst + b2 + a2 * {ds[a]}UL', f'tile[tx][ty + {k}u]')} }}"
        for k in range(0, TILE, TILE_ROWS))
    source = helpers + f"""__attribute__((reqd_work_group_size({TILE}, {TILE_ROWS}, 1)))
__kernel void reorder(__global const {src_type}* src, __global {dst_type}* dst) {{
    __local {tile_type} tile[{TILE}][{TILE + 1}];
    const uint tx = get_local_id(0), ty = get_local_id(1);
    const ulong a0 = get_group_id(0) * {TILE}UL, b0 = get_group_id(1) * {TILE}UL, z = get_group_id(2);
    {offsets}
    const ulong aa = a0 + tx;
    {reads}
    barrier(CLK_LOCAL_MEM_FENCE);
    const ulong b2 = b0 + tx;
    {writes}
}}
"""
    return KernelSpec(
        source=source,
        name="reorder",
        arg_names=("src", "dst"),
        global_size=(math.ceil(da / TILE) * TILE, math.ceil(db / TILE) * TILE_ROWS, nrest),
        local_size=(TILE, TILE_ROWS, 1),
        impl=f"ocl:tiled:{TILE}x{TILE_ROWS}",
    )


def _check_dtype(name: str, dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"{name} dtype {dtype!r} is not reorderable; known: {', '.join(DTYPES)}")


def generate(desc: ReorderDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source converting ``desc.src`` into ``desc.dst`` (their dims match: the descriptor
    checked them)."""
    desc.check_supported()
    dims = desc.src.dims
    src_dtype, src_strides = desc.src.dtype, desc.src.strides
    dst_dtype, dst_strides = desc.dst.dtype, desc.dst.strides
    n = math.prod(dims)
    local = config.local_size
    same_type = src_dtype == dst_dtype and src_dtype not in _dtype_io.PACKED
    helpers = ""
    if same_type and src_strides == dst_strides and is_dense(dims, src_strides):
        bits = _BITS[src_dtype]
        vec = config.vector_width
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_type = bits if vec == 1 else f"{bits}{vec}"
        src_type = dst_type = bits
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        ((__global {vec_type}*)dst)[i] = ((__global const {vec_type}*)src)[i];
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) dst[j] = src[j];
    }}"""
        impl = f"ocl:copy:{config.name}"
    elif (axes := _transpose_axes(desc, config)) is not None:
        return _tiled(desc, axes, same_type)
    else:
        work_items = n
        offsets = index_code(dims, {"src": src_strides, "dst": dst_strides}, "i")
        if same_type:
            src_type = dst_type = _BITS[src_dtype]
            move = "dst[off_dst] = src[off_src];"
            impl = f"ocl:strided:l{local}"
        else:
            src_type, dst_type = _dtype_io.STORAGE[src_dtype], _dtype_io.STORAGE[dst_dtype]
            helpers = _dtype_io.functions(loads=(src_dtype,), stores=(dst_dtype,))
            move = _dtype_io.store(dst_dtype, "dst", "off_dst", _dtype_io.load(src_dtype, "src", "off_src"))
            impl = f"ocl:convert:l{local}"
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    {move}"""
    source = (
        helpers
        + f"__kernel void reorder(__global const {src_type}* src, __global {dst_type}* dst) {{"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="reorder",
        arg_names=("src", "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(src: np.ndarray, src_dtype: str, dst_dtype: str) -> np.ndarray:
    """``src`` (user-facing values: bf16 as float32, boolean as bool) converted as the kernel
    does; returns user-facing values of ``dst_dtype``. One data type on both sides copies."""
    _check_dtype("src", src_dtype)
    _check_dtype("dst", dst_dtype)
    src = np.asarray(src)
    if src_dtype == dst_dtype:
        return src.copy()  # s4/u4 too: their values are exact through f32
    # Every source value is exact in f32 once widened (s32 rounds through f32, as the kernel).
    return _dtype_io.store_reference(_dtype_io.widen(src).astype(np.float32), dst_dtype)


def _reference(desc: ReorderDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(inputs["src"], desc.src.dtype, desc.dst.dtype)


def _tolerance(desc: ReorderDesc) -> float:
    # Exact: the reference converts as the kernel does, bit for bit (the tests compare equality).
    return 0.0


# The cross-engine reorder's key runs its reorder's kernel; the copies around it are the
# primitive's (``triodnn._cross_engine_reorder``).


def _generate_cross_engine(desc: CrossEngineReorderDesc, config: KernelConfig) -> KernelSpec:
    return generate(desc.reorder, config)


def _reference_cross_engine(desc: CrossEngineReorderDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return _reference(desc.reorder, inputs)


def _tolerance_cross_engine(desc: CrossEngineReorderDesc) -> float:
    return _tolerance(desc.reorder)


register(ReorderDesc, generate=generate, reference=_reference, tolerance=_tolerance)
register(
    CrossEngineReorderDesc,
    generate=_generate_cross_engine,
    reference=_reference_cross_engine,
    tolerance=_tolerance_cross_engine,
)
