"""Reduction forward: ``dst`` holds ``alg`` over the dimensions where ``dst`` has 1 and ``src`` more.

oneDNN's convention: ``dst`` dims equal ``src`` dims with each reduced dimension set to 1.
Algorithms, by oneDNN name: ``sum``, ``mean``, ``max``, ``min``, ``mul`` (product), and
``norm_lp_sum`` with p=1 and p=2, named here ``l1`` (sum of |x|) and ``l2`` (sqrt of sum of x²);
oneDNN's ``eps`` is 0.

One work-item per ``dst`` element, looping over the reduced index space with the strides baked
in, the smallest stride innermost so a reduction over a dense axis walks contiguous memory. No
local memory or barriers (they measured slower on PoCL's CPU device); the cost is that a
reduction to very few outputs runs on very few work-items.

Sums (``sum``, ``mean``, ``l1``, ``l2``) accumulate in f32 with compensation (Kahan-Babuska /
Neumaier): a plain f32 sum of 1e5 random values drifts by ~1e-5 relative, far above benchdnn's
eps-level threshold, and plain Kahan still lost 3-4 ulp on sums of mixed signs that cancel; the
Neumaier sum stays within about an ulp of the exact result. The build has no fast-math flags, so the compiler
may not reassociate the compensation away. ``max``/``min`` ignore NaN inputs (ternaries, as
binary's max/min), where numpy would propagate them.

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES``: elements convert to float as
they are loaded (the accumulation stays f32) and the result converts to dst's type as it is
stored. The all-f32 kernel is the plain one.

GPU configuration (``vector_width == 1``), few outputs over long reductions
(``_wg_reduce.use_work_group``): one work-group per output (``ocl:wg_output``), work-item ``lid``
taking reduced elements ``lid``, ``lid + L``, ... in linear order, the smallest stride fastest, so
neighbouring work-items read neighbouring elements; each keeps a compensated partial sum (TwoSum)
or fold, and a tree in ``__local`` memory combines them. The per-output kernel ran a 256 x 4096
row sum on an H100 at 0.05x the copy bandwidth (256 work-items walking 4096 elements each).
"""

from __future__ import annotations

import math

import numpy as np

from .._values._reduction_desc import REDUCTION_ALGORITHMS, ReductionDesc
from .._values._reduction_desc import reduced_axes as reduced_axes
from . import _dtype_io, _wg_reduce
from . import tolerance as thresholds
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, index_code, padded_global

ALGORITHMS: tuple[str, ...] = REDUCTION_ALGORITHMS

# Per algorithm: the initial accumulator, the term each element contributes, and whether the
# terms are summed (with compensation) or folded with a combining expression of ``acc`` and ``t``.
_INIT = {"max": "-INFINITY", "min": "INFINITY"}
_FOLD = {"max": "t > acc ? t : acc", "min": "t < acc ? t : acc"}

# The product keeps its exponent apart: ``acc * 2^e`` with ``acc`` held in [2^-62, 2^62] (or 0,
# inf, NaN). A plain f32 product overflowed to inf (and inf * 0 to NaN) part way through a row
# whose whole product fits f32 (ReduceProd over 784 elements: numpy's float64 product had a
# number there). Comparisons and multiplications by powers of two only: exact, and no built-in
# calls (PoCL does not inline them).
_MUL_RENORMALISE = ("if (acc > 0x1p62f || acc < -0x1p62f) { acc *= 0x1p-64f; e += 64; }"
                    " else if (acc != 0.0f && acc < 0x1p-62f && acc > -0x1p-62f) { acc *= 0x1p64f; e -= 64; }")
# One factor t: brought within [2^-64, 2^64] first, so the product stays a normal f32.
_MUL_STEP = ("{ float u = t; int eu = 0;"
             " if (u > 0x1p64f || u < -0x1p64f) { u *= 0x1p-64f; eu = 64; }"
             " else if (u != 0.0f && u < 0x1p-64f && u > -0x1p-64f) { u *= 0x1p64f; eu = -64; }"
             f" acc *= u; e += eu; {_MUL_RENORMALISE} }}")
# acc * 2^e as an f32 (inf past its range, 0 or a subnormal below).
_MUL_FINISH = ("while (e > 120) { acc *= 0x1p120f; e -= 120; } while (e < -120) { acc *= 0x1p-120f; e += 120; }"
               " acc *= as_float((uint)(e + 127) << 23);")
_TERM = {"l1": "x < 0.0f ? -x : x", "l2": "x * x"}
_SUMMED = frozenset({"sum", "mean", "l1", "l2"})


def generate(desc: ReductionDesc, config: KernelConfig) -> KernelSpec:
    """The kernel reducing ``desc.src`` into ``desc.dst`` (dims as oneDNN's) with ``desc.alg``, for
    ``config``; src and dst of any storage types, the math f32."""
    desc.check_supported()
    alg, axes = desc.alg, desc.axes
    src_dims, src_strides, src_dtype = desc.src.dims, desc.src.strides, desc.src.dtype
    dst_dims, dst_strides, dst_dtype = desc.dst.dims, desc.dst.strides, desc.dst.dtype
    outputs = math.prod(dst_dims)
    count = math.prod(src_dims[a] for a in axes)
    local = config.local_size
    # index_code skips dst's size-1 dimensions, so src's offset comes from the kept ones only.
    offsets = index_code(dst_dims, {"src": src_strides, "dst": dst_strides}, "i")

    # Outermost loop first: largest stride outside, smallest inside.
    order = sorted(axes, key=lambda a: -src_strides[a])
    x = "x"
    term = _TERM.get(alg, "x")
    if alg in _SUMMED:
        # Neumaier's variant of Kahan summation: the correction is taken from whichever of
        # acc and y is larger, so it survives cancellation (Kahan's bound grows with sum |x|,
        # Neumaier's first-order term is an ulp of the result); ternaries, not fabs (PoCL).
        init = "float acc = 0.0f; float comp = 0.0f;"
        step = (
            f"const float y = {term}; const float t = acc + y;"
            " const float aa = acc < 0.0f ? -acc : acc; const float ay = y < 0.0f ? -y : y;"
            " comp += aa >= ay ? (acc - t) + y : (y - t) + acc; acc = t;"
        )
    elif alg == "mul":
        init = "float acc = 1.0f; int e = 0;"
        step = f"const float t = {term}; {_MUL_STEP}"
    else:
        init = f"float acc = {_INIT[alg]};"
        step = f"const float t = {term}; acc = {_FOLD[alg]};"
    loops, closes = [], []
    base = "off_src"
    for depth, a in enumerate(order):
        loops.append(
            f"for (ulong j{depth} = 0; j{depth} < {src_dims[a]}UL; ++j{depth}) {{ "
            f"const ulong o{depth} = {base} + j{depth} * {src_strides[a]}UL;"
        )
        closes.append("}")
        base = f"o{depth}"
    inner = f"{{ const float {x} = {_dtype_io.load(src_dtype, 'src', base)}; {step} }}"
    loop_code = "\n    ".join(loops + [inner] + ["".join(closes)] if loops else [inner])
    if alg in _SUMMED:
        lines_after = "acc += comp;"
    elif alg == "mul":
        lines_after = _MUL_FINISH
    else:
        lines_after = ""
    if alg == "mean":
        result = f"acc / {c_float(count)}"
    elif alg == "l2":
        result = "sqrt(acc)"
    else:
        result = "acc"
    helpers = _dtype_io.functions(loads=(src_dtype,), stores=(dst_dtype,))
    src_param = _dtype_io.param(src_dtype, "src", const=True)
    dst_param = _dtype_io.param(dst_dtype, "dst", const=False)
    kept = [a for a in range(len(src_dims)) if a not in axes]
    if axes and _wg_reduce.use_work_group(config, count, outputs, src_strides[order[-1]],
                                          tuple(src_dims[a] for a in kept), tuple(src_strides[a] for a in kept)):
        return _work_group_per_output(desc, config, order, count, outputs, offsets, term, result, helpers,
                                      src_param, dst_param)
    source = helpers + f"""__kernel void reduction_fwd({src_param}, {dst_param}) {{
    const ulong i = get_global_id(0);
    if (i >= {outputs}UL) return;
    {offsets}
    {init}
    {loop_code}
    {lines_after}
    {_dtype_io.store(dst_dtype, "dst", "off_dst", result)}
}}
"""
    return KernelSpec(
        source=source,
        name="reduction_fwd",
        arg_names=("src", "dst"),
        global_size=(padded_global(outputs, local),),
        local_size=(local,),
        impl=f"ocl:per_output:l{local}",
    )


def _work_group_per_output(desc: ReductionDesc, config: KernelConfig, order: list[int], count: int, outputs: int,
                           offsets: str, term: str, result: str, helpers: str, src_param: str,
                           dst_param: str) -> KernelSpec:
    """One work-group per dst element (see the module docstring)."""
    alg, src_dims, src_strides = desc.alg, desc.src.dims, desc.src.strides
    local = _wg_reduce.local_size(count, config)
    # The element's offset from its linear index r over the reduced axes, innermost (smallest
    # stride) fastest: divisions by constants.
    peel = ["ulong q = r; ulong o = off_src;"]
    for a in reversed(order):
        peel.append(f"o += (q % {src_dims[a]}UL) * {src_strides[a]}UL; q /= {src_dims[a]}UL;")
    load = _dtype_io.load(desc.src.dtype, "src", "o")
    if alg in _SUMMED:
        init = "float acc = 0.0f, comp = 0.0f;"
        step = _wg_reduce.two_sum_step("acc", "comp", term)
        combine = _wg_reduce.sum_code("acc", "comp", "total", local) + " acc = total;"
    elif alg == "mul":
        init = "float acc = 1.0f; int e = 0;"
        step = f"{{ const float t = {term}; {_MUL_STEP} }}"
        combine = _product_tree(local) + " " + _MUL_FINISH
    else:
        init = f"float acc = {_INIT[alg]};"
        step = f"{{ const float t = {term}; acc = {_FOLD[alg]}; }}"
        combine = _fold_tree(local, _FOLD[alg])
    source = helpers + _wg_reduce.attribute(local) + f"""__kernel void reduction_fwd({src_param}, {dst_param}) {{
    {_wg_reduce.declarations(local)}
    const ulong i = get_group_id(0);
    {offsets}
    {init}
    for (ulong r = lid; r < {count}UL; r += {local}UL) {{
        {" ".join(peel)}
        const float x = {load};
        {step}
    }}
    {combine}
    if (lid == 0u) {{ {_dtype_io.store(desc.dst.dtype, "dst", "off_dst", result)} }}
}}
"""
    return KernelSpec(
        source=source,
        name="reduction_fwd",
        arg_names=("src", "dst"),
        global_size=(outputs * local,),
        local_size=(local,),
        impl=f"ocl:wg_output:l{local}",
    )


def _product_tree(local: int) -> str:
    """Statements leaving every work-item's ``acc`` and ``e`` the work-group's product, through
    ``red_a`` (the factors) and ``red_b`` (their exponents, as the float of the same bits)."""
    lines = ["red_a[lid] = acc; red_b[lid] = as_float(e);", "barrier(CLK_LOCAL_MEM_FENCE);"]
    step = local // 2
    while step >= 1:
        lines.append(f"if (lid < {step}u) {{ float acc = red_a[lid] * red_a[lid + {step}u];"
                     f" int e = as_int(red_b[lid]) + as_int(red_b[lid + {step}u]); {_MUL_RENORMALISE}"
                     " red_a[lid] = acc; red_b[lid] = as_float(e); }")
        lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
        step //= 2
    lines.append("acc = red_a[0]; e = as_int(red_b[0]);")
    return "\n    ".join(lines)


def _fold_tree(local: int, fold: str) -> str:
    """Statements leaving every work-item's ``acc`` folded over the work-group with ``fold`` (an
    expression of ``acc`` and ``t``), through ``red_a``."""
    lines = ["red_a[lid] = acc;", "barrier(CLK_LOCAL_MEM_FENCE);"]
    step = local // 2
    while step >= 1:
        lines.append(f"if (lid < {step}u) {{ const float acc = red_a[lid]; const float t = red_a[lid + {step}u];"
                     f" red_a[lid] = {fold}; }}")
        lines.append("barrier(CLK_LOCAL_MEM_FENCE);")
        step //= 2
    lines.append("acc = red_a[0];")
    return "\n    ".join(lines)


def product(x: np.ndarray, axes: tuple[int, ...], keepdims: bool = False) -> np.ndarray:
    """The product of ``x`` over ``axes`` in float64 without overflowing or underflowing part way
    (mantissas and exponents multiplied and added apart, as the kernel keeps them): ``np.prod``
    gave inf for a row of 1e10 x40, 1e-10 x40 and 3, whose product is 3."""
    x = np.asarray(x, dtype=np.float64)
    axes = tuple(sorted(a % x.ndim for a in axes)) if x.ndim else ()
    moved = np.moveaxis(x, axes, tuple(range(x.ndim - len(axes), x.ndim)))
    kept = moved.shape[:x.ndim - len(axes)]
    count = math.prod(x.shape[a] for a in axes)
    mantissas, exponents = np.frexp(moved.reshape(kept + (count,)))
    acc, exponent = np.ones(kept), np.zeros(kept, np.int64)
    for start in range(0, count, 256):  # 256 mantissas of [1/2, 1) stay above 2^-256
        acc, carried = np.frexp(acc * np.prod(mantissas[..., start:start + 256], axis=-1))
        exponent += carried + exponents[..., start:start + 256].sum(axis=-1)
    # Past +-2100 the result is inf or 0 whatever the mantissa; ldexp takes a C int.
    y = np.ldexp(acc, np.clip(exponent, -2100, 2100).astype(np.int32))
    return np.expand_dims(y, axes) if keepdims else y


def reference(alg: str, src: np.ndarray, dst_dims: tuple[int, ...], *, dst_dtype: str = "f32") -> np.ndarray:
    """``alg`` of ``src`` (user-facing values of any data type) reduced to ``dst_dims`` (oneDNN
    convention) in float64, rounded to float32 and stored as ``dst_dtype``."""
    x = _dtype_io.widen(src)
    axes = reduced_axes(tuple(x.shape), tuple(dst_dims))
    with np.errstate(all="ignore"):
        if alg == "sum":
            y = np.sum(x, axis=axes, keepdims=True)
        elif alg == "mean":
            y = np.mean(x, axis=axes, keepdims=True)
        elif alg == "max":
            y = np.max(x, axis=axes, keepdims=True)
        elif alg == "min":
            y = np.min(x, axis=axes, keepdims=True)
        elif alg == "mul":
            y = product(x, axes, keepdims=True)
        elif alg == "l1":
            y = np.sum(np.abs(x), axis=axes, keepdims=True)
        elif alg == "l2":
            y = np.sqrt(np.sum(x * x, axis=axes, keepdims=True))
        else:
            raise ValueError(f"unknown reduction algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    return _dtype_io.store_reference(y.reshape(dst_dims).astype(np.float32), dst_dtype)


def desc_reference(desc: ReductionDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{"src": array}``, stored as dst's data type."""
    return reference(desc.alg, inputs["src"], desc.dst.dims, dst_dtype=desc.dst.dtype)


def desc_tolerance(desc: ReductionDesc) -> float:
    return thresholds.reduction(desc.alg, math.prod(desc.src.dims[a] for a in desc.axes))


register(ReductionDesc, generate=generate, reference=desc_reference, tolerance=desc_tolerance)
