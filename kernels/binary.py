"""Binary forward: ``dst = op(src0, src1)`` with numpy broadcasting, the generator of ``BinaryDesc``
and its reference. The algorithms' OpenCL C and numpy formulas live in ``_elementwise``, which
post-op chains of every kind share.

Shapes are aligned from the right, as numpy does; a dimension of 1 broadcasts. Four code paths:
all tensors dense with one layout (flat, vectorised), ``src1`` (or ``src2``) a single value
broadcast over a dense ``src0`` (flat, vectorised), rows (``_row_vector``: a row-major dst whose
last dimension every source either reads contiguously or broadcasts, e.g. a bias row or a
per-row column; vectorised along the row, offsets by index arithmetic per vector), and the
general case (one element per work-item, offsets by index arithmetic with stride 0 on broadcast
dimensions).

Comparisons (``ge gt le lt eq ne``) write 1.0 or 0.0, as oneDNN's binary comparisons do in f32; a
NaN operand compares false except for ``ne``. ``select`` is oneDNN's ``binary_select``:
``dst = src2 ? src0 : src1`` with a third input ``src2``, broadcast like the others, true where
nonzero (NaN included, -0 not).

Each argument has its own storage type of ``_dtype_io.DTYPES``: the math is f32, and the result
is stored with dst's conversion. So a comparison into a ``boolean`` (or any) dst writes 1 or 0,
and select's condition may be boolean, u8, s32 or f32 (true where its value is nonzero). Non-f32
storage loads and stores element by element but keeps the vectorised math of the flat paths.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._algorithms import BINARY_ALGORITHMS
from .._values._algorithms import COMPARISONS as COMPARISONS
from .._values._algorithms import TERNARY as TERNARY
from .._values._algorithms import broadcast_dims as broadcast_dims
from .._values._binary_desc import BinaryDesc
from . import _dtype_io, _elementwise, _post_ops, tolerance
from ._elementwise import EXACT as EXACT
from ._elementwise import binary_expression
from ._post_ops import aligned_strides
from ._registry import register
from ._spec import (
    GPU_VECTOR,
    GPU_VECTOR_MIN,
    VECTOR_TYPES,
    KernelConfig,
    KernelSpec,
    dense_strides,
    index_code,
    is_dense,
    padded_global,
)

# The algorithms the kernels implement are exactly the descriptors' vocabulary.
if _elementwise.BINARY_ALGORITHMS != BINARY_ALGORITHMS:
    raise RuntimeError(
        f"binary kernels implement {_elementwise.BINARY_ALGORITHMS}, descriptors know {BINARY_ALGORITHMS}"
    )

# The names this module has always had (tests use them).
ALGORITHMS = BINARY_ALGORITHMS


def _row_vector(dims: tuple[int, ...], dst_strides: tuple[int, ...], aligned: dict, n: int,
                config: KernelConfig) -> int:
    """Elements per work-item of the row path, or 0 where it does not apply: dst row-major and
    dense, every source's last dimension contiguous (stride 1, its other strides whole vectors)
    or broadcast (stride 0), and the row a multiple of the vector. The vector is the CPU's
    ``vector_width`` (float16: PoCL keeps per-element work scalar otherwise), or GPU_VECTOR from
    GPU_VECTOR_MIN elements as the flat eltwise takes; halved until it divides the row.

    Why: the general path's one element per work-item ran a broadcast add (65536 x 1024 plus a
    1 x 1024 row) at 0.68x the copy bandwidth on an H200 (bench_sweep.py --family memory)."""
    vec = config.vector_width if config.vector_width > 1 else (GPU_VECTOR if n >= GPU_VECTOR_MIN else 1)
    while vec > 1 and dims[-1] % vec:
        vec //= 2
    if vec < 2 or len(dims) < 2 or tuple(dst_strides) != dense_strides(dims):
        return 0
    for strides in aligned.values():
        if strides[-1] not in (0, 1) or (strides[-1] == 1 and any(s % vec for s in strides[:-1])):
            return 0
    return vec


def generate(desc: BinaryDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source for ``dst = alg(src0, src1[, src2])``; dst has the broadcast shape of the
    sources, and ``src2`` is select's condition. Storage types are any of ``_dtype_io.DTYPES``, the
    math f32 either way. The descriptor's ``post_ops`` (validated; binary operands f32) apply
    before the store; a binary post-op operand needing broadcasting sends the kernel down the
    broadcast path (impl ``ocl:broadcast:...:po_bcast``)."""
    desc.check_supported()
    alg, post_ops, dst_strides = desc.alg, desc.post_ops, desc.dst.strides
    sources = {"src0": desc.src0, "src1": desc.src1}
    if desc.src2 is not None:
        sources["src2"] = desc.src2
    shapes = {name: md.dims for name, md in sources.items()}
    dtypes = {**{name: md.dtype for name, md in sources.items()}, "dst": desc.dst.dtype}
    dims = desc.dst.dims
    n = math.prod(dims)
    local = config.local_size
    aligned = {name: aligned_strides(md.dims, md.strides, len(dims)) for name, md in sources.items()}
    # The value names the expressions use, and the kernel parameters, in argument order.
    values = {"src0": "a", "src1": "b", "src2": "cond"}
    inputs = list(shapes)
    others = inputs[1:]
    dense_dst = is_dense(dims, dst_strides)
    same_layout = dense_dst and aligned["src0"] == dst_strides and desc.src0.dims == dims
    # An operand other than src0 runs flat when it has dst's layout, or is one value (scalar).
    scalar = {
        name for name in others if math.prod(shapes[name]) == 1 and aligned[name] != dst_strides
    }
    flat = same_layout and all(aligned[name] == dst_strides or name in scalar for name in others)
    access = _post_ops.operand_access(post_ops, dims, dst_strides) if flat else None
    po_bcast = flat and access is None
    flat = flat and access is not None
    po_names = _post_ops.arg_names(post_ops)
    types: tuple[str, ...] = ("float",)
    row_vec = 0
    row_access = None
    if not flat and is_dense(dims, dst_strides):
        row_access = _post_ops.operand_access(post_ops, dims, dst_strides)
        if row_access is not None:
            row_vec = _row_vector(dims, dst_strides, aligned, n, config)
    if row_vec and row_access is not None:
        vec, vec_type = row_vec, VECTOR_TYPES[row_vec]
        work_items = n // vec
        # Sources laid out as dst read vector i; the others from offsets of the vector's first
        # element (the row's vectors as the last dimension, so no division by the vector).
        located = {name: aligned[name] for name in inputs if aligned[name] != dst_strides}
        offsets = index_code(
            dims[:-1] + (dims[-1] // vec,),
            {name: strides[:-1] + (strides[-1] * vec,) for name, strides in located.items()}, "i"
        ) if located else ""

        def row_load(name: str) -> str:
            dtype = dtypes[name]
            if name not in located:
                return _dtype_io.load_vector(dtype, name, "i", vec_type, vec)
            if located[name][-1] == 0:
                return f"(({vec_type})({_dtype_io.load(dtype, name, f'off_{name}')}))"
            if dtype == "f32":
                return f"(*(__global const {vec_type}*)({name} + off_{name}))"
            return f"(({vec_type})({', '.join(_dtype_io.load(dtype, name, f'off_{name} + {k}UL') for k in range(vec))}))"

        types = ("float", vec_type)
        apply_vec, _ = _dtype_io.apply_post_ops_flat(post_ops, "v", vec_type, vec, row_access, dtypes["dst"])
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {work_items}UL) return;
    {offsets}
    {" ".join(f"const {vec_type} {values[name]} = {row_load(name)};" for name in inputs)}
    {vec_type} v = {binary_expression(alg, vec_type)};
    {apply_vec}
    {_dtype_io.store_vector(dtypes["dst"], "dst", "i", vec_type, vec, "v")}"""
        impl = f"ocl:rows:v{vec}l{local}"
    elif flat and access is not None:  # flat: the operands' access is known
        vec = config.vector_width
        vec_type = VECTOR_TYPES[vec]
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        loads_vec = [
            f"const {vec_type} {values[name]} = "
            + (f"(({vec_type})({_dtype_io.load(dtypes[name], name, '0')}));" if name in scalar
               else _dtype_io.load_vector(dtypes[name], name, "i", vec_type, vec) + ";")
            for name in inputs
        ]
        loads_tail = [
            f"const float {values[name]} = {_dtype_io.load(dtypes[name], name, '0' if name in scalar else 'j')};"
            for name in inputs
        ]
        types = ("float", vec_type) if vec > 1 else ("float",)
        apply_vec, apply_tail = _dtype_io.apply_post_ops_flat(
            post_ops, "v", vec_type, vec, access, dtypes["dst"]
        )
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        {" ".join(loads_vec)}
        {vec_type} v = {binary_expression(alg, vec_type)};
        {apply_vec}
        {_dtype_io.store_vector(dtypes["dst"], "dst", "i", vec_type, vec, "v")}
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{
            {" ".join(loads_tail)}
            float v = {binary_expression(alg, "float")};
            {apply_tail}
            {_dtype_io.store(dtypes["dst"], "dst", "j", "v")}
        }}
    }}"""
        # "scalar_b" when src1 is one value, "scalar_c" when src2 is, "scalar_bc" when both are.
        suffix = "".join({"src1": "b", "src2": "c"}[name] for name in others if name in scalar)
        impl = f"ocl:{'scalar_' + suffix if suffix else 'flat'}:{config.name}"
    else:
        work_items = n
        offsets = index_code(
            dims, {**aligned, "dst": dst_strides, **_post_ops.operand_strides(post_ops, len(dims))}, "i"
        )
        loads = "\n    ".join(
            f"const float {values[name]} = {_dtype_io.load(dtypes[name], name, f'off_{name}')};"
            for name in inputs
        )
        apply = _dtype_io.apply_post_ops_scalar(
            post_ops, "v", "off_dst", {name: f"off_{name}" for name in po_names}, dtypes["dst"]
        )
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    {loads}
    float v = {binary_expression(alg, "float")};
    {apply}
    {_dtype_io.store(dtypes["dst"], "dst", "off_dst", "v")}"""
        impl = f"ocl:broadcast:l{local}" + (":po_bcast" if po_bcast else "")
    params = ", ".join(_dtype_io.param(dtypes[name], name, const=True) for name in inputs)
    source = (
        _dtype_io.functions(loads=dtypes.values(), stores=(dtypes["dst"],))
        + _post_ops.functions(post_ops, types)
        + f"__kernel void binary_fwd({params},{_post_ops.params(post_ops)}"
        + f" {_dtype_io.param(dtypes['dst'], 'dst', const=False)}) {{"
        + body + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="binary_fwd",
        arg_names=(*inputs, *po_names, "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(
    alg: str,
    src0: np.ndarray,
    src1: np.ndarray,
    src2: np.ndarray | None = None,
    *,
    dst_dtype: str = "f32",
) -> np.ndarray:
    """``alg`` of the broadcast sources (user-facing values of any data type) in float64, rounded
    to float32 and stored as ``dst_dtype`` (user-facing values: bf16 as float32, boolean as bool):
    the formulas of ``_elementwise.binary_values``. ``src2``: select's condition."""
    widen = _dtype_io.widen
    y = _elementwise.binary_values(alg, widen(src0), widen(src1), None if src2 is None else widen(src2))
    return _dtype_io.store_reference(y, dst_dtype)


def desc_reference(desc: BinaryDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}``: the sources, the post-op operands, and
    dst's old values where a sum post-op reads them."""
    src2 = None if desc.src2 is None else inputs["src2"]
    y = reference(desc.alg, inputs["src0"], inputs["src1"], src2)
    y = _post_ops.reference(desc.post_ops, y, inputs.get("dst"), inputs)
    return _dtype_io.store_reference(y, desc.dst.dtype)


register(
    BinaryDesc, generate=generate, reference=desc_reference,
    tolerance=lambda desc: tolerance.binary(desc.alg),
)
