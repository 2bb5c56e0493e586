"""Eltwise forward: ``dst = f(src)`` elementwise, the generator of ``EltwiseDesc`` and its reference.

The algorithms' OpenCL C and numpy formulas live in ``_elementwise``, which post-op chains of
every kind share.

Algorithms follow oneDNN's names and parameters: ``relu`` takes the negative slope ``alpha``;
``clip`` keeps ``alpha < x <= beta``; ``linear`` is ``alpha*x + beta``, ``pow`` is ``alpha*x**beta``,
``hardsigmoid`` is ``max(0, min(1, alpha*x + beta))`` and ``hardswish`` is ``x`` times it; ``elu``,
``swish`` and ``soft_relu`` take ``alpha`` as oneDNN does. ``leaky_relu`` is ``relu`` under the
graph API's name. Where oneDNN gives a parameter a value of its own (``DEFAULTS``), an omitted
``alpha``/``beta`` takes it; every other omitted parameter is 0.

Dense tensors with matching strides run flat, ``vector_width`` elements per work-item (pointer
casts, not vloadN: PoCL keeps vloadN as a call); anything else runs one element per work-item with
index arithmetic.

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES``; the math is f32, and the
result is stored with dst's conversion (see ``_dtype_io``). Non-f32 storage loads and stores
element by element but keeps the vectorised math of the flat path.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._algorithms import ELTWISE_ALGORITHMS, ELTWISE_DEFAULTS, eltwise_parameters
from .._values._algorithms import NONZERO_ALPHA as NONZERO_ALPHA
from .._values._eltwise_desc import EltwiseDesc
from . import _dtype_io, _elementwise, _post_ops, tolerance
from ._elementwise import TRANSCENDENTAL as TRANSCENDENTAL
from ._elementwise import eltwise_function
from ._registry import register
from ._spec import GPU_VECTOR as GPU_VECTOR
from ._spec import GPU_VECTOR_MIN as GPU_VECTOR_MIN
from ._spec import VECTOR_TYPES, KernelConfig, KernelSpec, index_code, is_dense, padded_global

# The algorithms the kernels implement are exactly the descriptors' vocabulary.
if _elementwise.ELTWISE_ALGORITHMS != ELTWISE_ALGORITHMS:
    raise RuntimeError(
        f"eltwise kernels implement {_elementwise.ELTWISE_ALGORITHMS}, descriptors know {ELTWISE_ALGORITHMS}"
    )

# The names this module has always had (tests use them).
ALGORITHMS = ELTWISE_ALGORITHMS
DEFAULTS = ELTWISE_DEFAULTS
parameters = eltwise_parameters



def generate(desc: EltwiseDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source computing ``desc.alg`` from ``src`` into ``dst`` (may be one buffer when they
    share a layout and data type).

    Storage types are any of ``_dtype_io.DTYPES``, the math f32 either way. The descriptor's
    ``post_ops`` (validated; binary operands f32) apply before the store; a binary operand that
    needs broadcasting sends the kernel down the strided path (impl ``ocl:strided:...:po_bcast``)."""
    desc.check_supported()
    alg, alpha, beta, post_ops = desc.alg, desc.alpha, desc.beta, desc.post_ops
    dims, src_strides, dst_strides = desc.src.dims, desc.src.strides, desc.dst.strides
    src_dtype, dst_dtype = desc.src.dtype, desc.dst.dtype
    n = math.prod(dims)
    local = config.local_size
    scalar_fn = eltwise_function("op_scalar", "float", alg, alpha, beta)
    flat = src_strides == dst_strides and is_dense(dims, src_strides)
    access = _post_ops.operand_access(post_ops, dims, dst_strides) if flat else None
    po_bcast = flat and access is None
    flat = flat and access is not None
    po_names = _post_ops.arg_names(post_ops)
    types: tuple[str, ...] = ("float",)
    if flat and access is not None:  # flat: the operands' access is known
        vec = config.vector_width
        if vec == 1 and n >= GPU_VECTOR_MIN:
            vec = GPU_VECTOR  # GPU configuration, large tensors (see GPU_VECTOR)
        full, tail = divmod(n, vec)
        work_items = full + (1 if tail else 0)
        vec_type = VECTOR_TYPES[vec]
        vector_fn = eltwise_function("op_vector", vec_type, alg, alpha, beta) if vec > 1 else ""
        if vec > 1:
            types = ("float", vec_type)
        apply_vec, apply_tail = _dtype_io.apply_post_ops_flat(post_ops, "v", vec_type, vec, access, dst_dtype)
        load_vec = _dtype_io.load_vector(src_dtype, "src", "i", vec_type, vec)
        store_vec = _dtype_io.store_vector(dst_dtype, "dst", "i", vec_type, vec, "v")
        load_tail = _dtype_io.load(src_dtype, "src", "j")
        store_tail = _dtype_io.store(dst_dtype, "dst", "j", "v")
        body = f"""
    const ulong i = get_global_id(0);
    if (i < {full}UL) {{
        {vec_type} v = {"op_vector" if vec > 1 else "op_scalar"}({load_vec});
        {apply_vec}
        {store_vec}
    }} else if (i == {full}UL) {{
        for (ulong j = i * {vec}UL; j < {n}UL; ++j) {{ float v = op_scalar({load_tail}); {apply_tail} {store_tail} }}
    }}"""
        impl = f"ocl:flat:{config.name}" if vec == config.vector_width else f"ocl:flat:v{vec}l{local}"
    else:
        vector_fn = ""
        work_items = n
        offsets = index_code(
            dims,
            {"src": src_strides, "dst": dst_strides, **_post_ops.operand_strides(post_ops, len(dims))},
            "i",
        )
        apply = _dtype_io.apply_post_ops_scalar(
            post_ops, "v", "off_dst", {name: f"off_{name}" for name in po_names}, dst_dtype
        )
        body = f"""
    const ulong i = get_global_id(0);
    if (i >= {n}UL) return;
    {offsets}
    float v = op_scalar({_dtype_io.load(src_dtype, "src", "off_src")});
    {apply}
    {_dtype_io.store(dst_dtype, "dst", "off_dst", "v")}"""
        impl = f"ocl:strided:l{local}" + (":po_bcast" if po_bcast else "")
    source = (
        _dtype_io.functions(loads=(src_dtype, dst_dtype), stores=(dst_dtype,))
        + scalar_fn
        + vector_fn
        + _post_ops.functions(post_ops, types)
        + f"__kernel void eltwise_fwd({_dtype_io.param(src_dtype, 'src', const=True)},"
        + _post_ops.params(post_ops)
        + f" {_dtype_io.param(dst_dtype, 'dst', const=False)}) {{"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="eltwise_fwd",
        arg_names=("src", *po_names, "dst"),
        global_size=(padded_global(work_items, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(
    alg: str,
    src: np.ndarray,
    *,
    alpha: float | None = None,
    beta: float | None = None,
    dst_dtype: str = "f32",
) -> np.ndarray:
    """``alg`` applied to ``src`` (user-facing values of any data type) in float64, rounded to
    float32 and stored as ``dst_dtype`` (user-facing values: bf16 as float32): the formulas of
    ``_elementwise.eltwise_values``. ``alpha``/``beta`` of None take the algorithm's default."""
    y = _elementwise.eltwise_values(alg, _dtype_io.widen(src), alpha, beta)
    return _dtype_io.store_reference(y, dst_dtype)


def desc_reference(desc: EltwiseDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}``: src, the post-op operands, and dst's old
    values where a sum post-op reads them."""
    y = reference(desc.alg, inputs["src"], alpha=desc.alpha, beta=desc.beta)
    y = _post_ops.reference(desc.post_ops, y, inputs.get("dst"), inputs)
    return _dtype_io.store_reference(y, desc.dst.dtype)


register(
    EltwiseDesc, generate=generate, reference=desc_reference,
    tolerance=lambda desc: tolerance.eltwise(desc.alg),
)
