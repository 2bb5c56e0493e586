"""Softmax forward over one axis: generator beside its OpenCL source, and the float64 reference.

``softmax``: ``dst = exp(x - max) / sum(exp(x - max))``; ``logsoftmax``: ``dst = (x - max) - log(sum)``,
both over ``axis``, with the maximum subtracted first so ``exp`` never overflows. The parentheses
matter: ``x - (max + log(sum))`` rounds ``max + log(sum)`` at the scale of ``max`` and lost 9e-4
on a row of 3e4s. One work-item
per row (a row is the axis at one value of all the other indices): on PoCL's CPU device a
work-group per row with local-memory reductions measured 6-7x slower, since every barrier spills
the accumulators. Three passes over the row (max, sum, write), which stays in cache between them.
When both tensors keep the axis contiguous and every row starts on a vector boundary, the passes
walk the row a float16 at a time (pointer casts: PoCL keeps vloadN and the math built-ins as
calls, so the wide vector amortises each ``exp`` call); otherwise one element at a time with the
strides baked in.

A post-op chain (see ``_post_ops``) applies to each softmax or logsoftmax value in the write pass.
Softmax normally keeps ``exp(x - max)`` in dst between its passes; a chain with a sum post-op needs
dst's old values there, so it recomputes ``exp`` in the write pass instead.
"""

from __future__ import annotations

import math

import numpy as np

from . import _post_ops
from ._spec import VECTOR_TYPES, KernelConfig, KernelSpec, index_code, padded_global

ALGORITHMS: tuple[str, ...] = ("softmax", "logsoftmax")


def _row_vector_width(
    axis_len: int,
    other_strides: tuple[tuple[int, ...], ...],
    axis_strides: tuple[int, ...],
    other_dims: tuple[int, ...],
    widest: int,
) -> int:
    """Widest vector that tiles every row exactly and starts it aligned, 1 when none does.

    A pointer cast to floatN needs N-element alignment (LLVM emits aligned loads); buffers are
    aligned far beyond 64 bytes, so a row is aligned when each stride that moves between rows is
    a multiple of N. Rows that do not divide by N take the scalar path rather than a tail loop:
    the next row would then start unaligned.
    """
    if any(s != 1 for s in axis_strides):
        return 1
    width = widest
    while width > 1:
        if axis_len % width == 0 and all(
            s % width == 0 for strides in other_strides for s, d in zip(strides, other_dims) if d > 1
        ):
            return width
        width //= 2
    return 1


def _reduce_code(var: str, width: int, combine: str) -> str:
    """Statements folding vector ``{var}v`` of ``width`` lanes into scalar ``var`` by halving."""
    lines = []
    src = f"{var}v"
    while width > 1:
        half = width // 2
        name = f"{var}_{half}"
        lo, hi = f"{src}.lo", f"{src}.hi"
        expr = combine.format(a=lo, b=hi)
        type_name = VECTOR_TYPES[half]
        lines.append(f"const {type_name} {name} = {expr};")
        src = name
        width = half
    lines.append(f"{var} = {src};")
    return "\n        ".join(lines)


def generate(
    alg: str,
    *,
    dims: tuple[int, ...],
    src_strides: tuple[int, ...],
    dst_strides: tuple[int, ...],
    axis: int,
    config: KernelConfig,
    post_ops: tuple = (),
) -> KernelSpec:
    """OpenCL source for ``alg`` over ``axis`` (already normalised) from ``src`` into ``dst``.

    ``src`` and ``dst`` may be one buffer: each row is read in full (pass 1) before any of it is
    written, and later passes read only the element they then write (so a sum post-op in place
    adds src). ``post_ops``: a validated chain applied to each result before its store.
    """
    if alg not in ALGORITHMS:
        raise ValueError(f"unknown softmax algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    if not 0 <= axis < len(dims):
        raise ValueError(f"axis {axis} out of range for {len(dims)}-D dims {dims}")
    n = dims[axis]
    other_dims = dims[:axis] + dims[axis + 1:]
    other_src = src_strides[:axis] + src_strides[axis + 1:]
    other_dst = dst_strides[:axis] + dst_strides[axis + 1:]
    rows = math.prod(other_dims)
    local = config.local_size
    po_strides = _post_ops.operand_strides(post_ops, len(dims))
    po_axis = {name: s[axis] for name, s in po_strides.items()}
    offsets = index_code(
        other_dims,
        {"src": other_src, "dst": other_dst, **{name: s[:axis] + s[axis + 1:] for name, s in po_strides.items()}},
        "row",
    )
    # A sum post-op reads dst's old values in the write pass, so dst cannot hold exp(x - m) before it.
    sum_reads_dst = any(op[0] == "sum" for op in post_ops)
    vec = _row_vector_width(n, (other_src, other_dst), (src_strides[axis], dst_strides[axis]),
                            other_dims, config.vector_width)

    if vec > 1:
        T = VECTOR_TYPES[vec]
        chunks = n // vec
        max_fold = _reduce_code("m", vec, "{a} > {b} ? {a} : {b}")
        sum_fold = _reduce_code("s", vec, "{a} + {b}")
        # Pass 2 of softmax stores exp(x - m) in dst and pass 3 scales it, so exp is called once
        # per element (twice under a sum post-op); logsoftmax needs only the sum, and pass 3
        # recomputes from src.
        if alg == "softmax" and not sum_reads_dst:
            sum_body = f"const {T} e = exp(xs[k] - ({T})(m)); xd[k] = e; sv += e;"
            value = f"xd[k] * ({T})(inv)"
            finish = "const float inv = 1.0f / s;"
        elif alg == "softmax":
            sum_body = f"sv += exp(xs[k] - ({T})(m));"
            value = f"exp(xs[k] - ({T})(m)) * ({T})(inv)"
            finish = "const float inv = 1.0f / s;"
        else:
            sum_body = f"sv += exp(xs[k] - ({T})(m));"
            value = f"(xs[k] - ({T})(m)) - ({T})(log_s)"
            finish = "const float log_s = log(s);"

        def operand(name: str) -> str:
            # Gathered lane by lane: an operand's rows need not start on a vector boundary.
            stride = po_axis[name]
            if stride == 0:
                return f"(({T})({name}[off_{name}]))"
            lanes = ", ".join(f"{name}[off_{name} + k * {vec * stride}UL + {t * stride}UL]" for t in range(vec))
            return f"(({T})({lanes}))"

        chain = _post_ops.apply(post_ops, "y", T, "xd[k]", operand)
        write_body = f"{T} y = {value}; {chain} xd[k] = y;" if post_ops else f"xd[k] = {value};"
        functions = _post_ops.functions(post_ops, (T,))
        body = f"""
    __global const {T}* xs = (__global const {T}*)(src + off_src);
    __global {T}* xd = (__global {T}*)(dst + off_dst);
    float m, s;
    {{
        {T} mv = ({T})(-INFINITY);
        for (ulong k = 0; k < {chunks}UL; ++k) {{ const {T} x = xs[k]; mv = x > mv ? x : mv; }}
        {max_fold}
    }}
    {{
        {T} sv = ({T})(0.0f);
        for (ulong k = 0; k < {chunks}UL; ++k) {{ {sum_body} }}
        {sum_fold}
    }}
    {finish}
    for (ulong k = 0; k < {chunks}UL; ++k) {{ {write_body} }}"""
        impl = f"ocl:row:v{vec}l{local}"
    else:
        ss, ds = src_strides[axis], dst_strides[axis]
        if alg == "softmax" and not sum_reads_dst:
            sum_body = (
                f"const float e = exp(src[off_src + k * {ss}UL] - m);"
                f" dst[off_dst + k * {ds}UL] = e; s += e;"
            )
            value = f"dst[off_dst + k * {ds}UL] * inv"
            finish = "const float inv = 1.0f / s;"
        elif alg == "softmax":
            sum_body = f"s += exp(src[off_src + k * {ss}UL] - m);"
            value = f"exp(src[off_src + k * {ss}UL] - m) * inv"
            finish = "const float inv = 1.0f / s;"
        else:
            sum_body = f"s += exp(src[off_src + k * {ss}UL] - m);"
            value = f"(src[off_src + k * {ss}UL] - m) - log_s"
            finish = "const float log_s = log(s);"
        chain = _post_ops.apply_scalar(
            post_ops, "y", f"off_dst + k * {ds}UL",
            {name: f"off_{name} + k * {stride}UL" for name, stride in po_axis.items()},
        )
        write_body = f"float y = {value}; {chain} dst[off_dst + k * {ds}UL] = y;"
        functions = _post_ops.functions(post_ops)
        body = f"""
    float m = -INFINITY;
    for (ulong k = 0; k < {n}UL; ++k) {{ const float x = src[off_src + k * {ss}UL]; m = x > m ? x : m; }}
    float s = 0.0f;
    for (ulong k = 0; k < {n}UL; ++k) {{ {sum_body} }}
    {finish}
    for (ulong k = 0; k < {n}UL; ++k) {{ {write_body} }}"""
        impl = f"ocl:row:v1l{local}"

    # No restrict on the pointers: in place they are one buffer, and pass 2 writes it.
    source = (
        functions
        + f"__kernel void softmax_fwd(__global const float* src,{_post_ops.params(post_ops)} __global float* dst) {{\n"
        "    const ulong row = get_global_id(0);\n"
        f"    if (row >= {rows}UL) return;\n"
        f"    {offsets}"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="softmax_fwd",
        arg_names=("src",) + tuple(po_strides) + ("dst",),
        global_size=(padded_global(rows, local),),
        local_size=(local,),
        impl=impl,
    )


def reference(
    alg: str,
    src: np.ndarray,
    *,
    axis: int = -1,
    output_scale: float = 1.0,
    post_ops: tuple = (),
    old_dst: np.ndarray | None = None,
    operands=None,
) -> np.ndarray:
    """``alg`` of ``src`` over ``axis`` in float64, returned as float32; then times
    ``output_scale`` and ``post_ops`` as ``_post_ops.scaled_reference`` (``old_dst`` for sum
    post-ops, ``operands`` for binary ones)."""
    x = np.asarray(src, dtype=np.float64)
    with np.errstate(all="ignore"):
        shifted = x - np.max(x, axis=axis, keepdims=True)
        log_sum = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        if alg == "softmax":
            y = np.exp(shifted - log_sum)
        elif alg == "logsoftmax":
            y = shifted - log_sum
        else:
            raise ValueError(f"unknown softmax algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    return _post_ops.scaled_reference(post_ops, y.astype(np.float32), old_dst, operands, output_scale=output_scale)
