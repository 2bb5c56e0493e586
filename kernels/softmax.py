"""Softmax forward over one axis: generator beside its OpenCL source, and the float64 reference.

``softmax``: ``dst = exp(x - max) / sum(exp(x - max))``; ``logsoftmax``: ``dst = (x - max) - log(sum)``,
both over ``axis``, with the maximum subtracted first so ``exp`` never overflows. The parentheses
matter: ``x - (max + log(sum))`` rounds ``max + log(sum)`` at the scale of ``max`` and lost 9e-4
on a row of 3e4s. A row is the axis at one value of all the other indices.

CPU configuration (vector width > 1): one work-item per row. On PoCL's CPU device a work-group per
row with local-memory reductions measured 6-7x slower, since every barrier spills the
accumulators. Three passes over the row (max, sum, write), which stays in cache between them.
When both tensors keep the axis contiguous and every row starts on a vector boundary, the passes
walk the row a float16 at a time (pointer casts: PoCL keeps vloadN and the math built-ins as
calls, so the wide vector amortises each ``exp`` call); otherwise one element at a time with the
strides baked in (``ocl:row:v{N}l{L}``).

GPU configuration (vector width 1): rows of 32 or more take one work-group each
(``ocl:wg_row:l{L}[r{n}]``, see ``_wg_reduce``): work-items stride over the row, a local-memory
tree gives the max, then the sum, then each work-item writes its elements; one work-item per row
on a GPU left it nearly idle (41.8 GB/s on 4096x4096 on an H200; 3649 this way, at the copy's
bandwidth). Shorter rows, and strided axes over many side-by-side rows (where one work-item per
row reads coalesced), keep the per-row path.

Every sum of ``exp`` terms is compensated: Kahan in the per-row paths (float16 lanes and scalar),
TwoSum (each addition's rounding error kept exactly) in the work-group path's work-items and tree;
the lanes and the tree's levels fold with TwoSum too. A plain f32 sum dropped every term
below half an ulp of the running sum, so a row of one dominant element and n - 1 terms of 6e-8
lost (n - 1) * 6e-8 relative (2e-5 at 384 on the GPU's row path, 1.5e-5 at 4096 in the CPU's
float16 lanes), past benchdnn's 10 * eps.

A post-op chain (see ``_post_ops``) applies to each softmax or logsoftmax value in the write pass.
Softmax normally keeps ``exp(x - max)`` in dst between its passes; a chain with a sum post-op needs
dst's old values there, so it recomputes ``exp`` in the write pass instead.

``src`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES`` (f32 math, as oneDNN's
bf16/f16 softmax): loads convert to float, the write pass stores with dst's conversion. A dst other
than f32 cannot hold ``exp(x - max)`` between passes without rounding it, so softmax recomputes
``exp`` in the write pass there too. Non-f32 rows on the vector path load and store element by
element into the same float16 math. The all-f32 kernels are the plain ones.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from .._values._memory_desc import MemoryDesc
from .._values._softmax_desc import SOFTMAX_ALGORITHMS, SoftmaxDesc
from . import _dtype_io, _post_ops, _row_vector, _wg_reduce
from . import tolerance as thresholds
from ._post_ops import generate_scaled
from ._registry import register
from ._row_vector import kahan_step
from ._spec import VECTOR_TYPES, KernelConfig, KernelSpec, index_code, padded_global

ALGORITHMS: tuple[str, ...] = SOFTMAX_ALGORITHMS


@attrs.frozen
class _Stats:
    """What the optional stats output and ``inf_as_zero`` add to each path's source: the stats
    pointer and its per-row offset, the log-sum-exp store once the row's sum is known, and the
    guard for rows of -inf only."""

    desc: MemoryDesc | None
    inf_as_zero: bool

    @classmethod
    def of(cls, desc: SoftmaxDesc) -> _Stats:
        return cls(desc.stats, desc.inf_as_zero)

    def strides(self, axis: int) -> dict[str, tuple[int, ...]]:
        """The stats' strides over the other dims, for ``index_code`` (``off_stats``)."""
        return {} if self.desc is None else {"stats": self.desc.strides[:axis] + self.desc.strides[axis + 1:]}

    @property
    def dtypes(self) -> tuple[str, ...]:
        return () if self.desc is None else (self.desc.dtype,)

    @property
    def param(self) -> str:
        return "" if self.desc is None else f", {_dtype_io.param(self.desc.dtype, 'stats', const=False)}"

    @property
    def arg_names(self) -> tuple[str, ...]:
        return () if self.desc is None else ("stats",)

    @property
    def empty_row(self) -> str:
        # A row of -inf only has max -inf, and x - max = -inf - -inf is NaN. Shifting by 0 instead
        # makes every exp 0, the sum 0, and (with ``inverse``) every value 0, the stats log(0) = -inf.
        return "if (m == -INFINITY) m = 0.0f;" if self.inf_as_zero else ""

    def inverse(self, total: str) -> str:
        return f"({total} > 0.0f ? 1.0f / {total} : 0.0f)" if self.inf_as_zero else f"1.0f / {total}"

    def store(self, total: str) -> str:
        """The row's log-sum-exp ``m + log(total)`` into ``stats``; nothing without stats."""
        return "" if self.desc is None else _dtype_io.store(self.desc.dtype, "stats", "off_stats", f"m + log({total})")


def generate(desc: SoftmaxDesc, config: KernelConfig) -> KernelSpec:
    """The kernel of ``desc`` for ``config``: ``alg`` over the (normalised) axis from ``src`` into
    ``dst``, ``output_scale`` reaching it as a leading ``linear`` post-op (``generate_scaled``).

    ``src`` and ``dst`` may be one buffer (of one data type): each row is read in full (pass 1)
    before any of it is written, and later passes read only the element they then write (so a sum
    post-op in place adds src). The post-op chain (binary operands f32) applies to each result
    before its store. src and dst: any storage types, the math f32.
    """
    desc.check_supported()
    return generate_scaled(lambda chain: _generate(desc, chain, config), desc.post_ops, desc.output_scale)


def _generate(desc: SoftmaxDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    """``generate`` with the chain ``post_ops`` (the output scale leading where it is not 1)."""
    alg, axis = desc.alg, desc.axis
    dims, src_strides, dst_strides = desc.src.dims, desc.src.strides, desc.dst.strides
    src_dtype, dst_dtype = desc.src.dtype, desc.dst.dtype
    n = dims[axis]
    other_dims = dims[:axis] + dims[axis + 1:]
    other_src = src_strides[:axis] + src_strides[axis + 1:]
    other_dst = dst_strides[:axis] + dst_strides[axis + 1:]
    rows = math.prod(other_dims)
    local = config.local_size
    po_strides = _post_ops.operand_strides(post_ops, len(dims))
    po_axis = {name: s[axis] for name, s in po_strides.items()}
    stats = _Stats.of(desc)
    offsets = index_code(
        other_dims,
        {"src": other_src, "dst": other_dst, **{name: s[:axis] + s[axis + 1:] for name, s in po_strides.items()},
         **stats.strides(axis)},
        "row",
    )
    # A sum post-op reads dst's old values in the write pass, so dst cannot hold exp(x - m) before it.
    sum_reads_dst = any(op[0] == "sum" for op in post_ops)
    # Softmax keeps exp(x - m) in dst between passes only where dst holds it unrounded (f32).
    recompute = sum_reads_dst or dst_dtype != "f32"
    if _wg_reduce.use_work_group(config, n, rows, src_strides[axis], other_dims, other_src):
        return _generate_work_group(
            alg, n=n, rows=rows, offsets=offsets, ss=src_strides[axis], ds=dst_strides[axis], po_axis=po_axis,
            config=config, post_ops=post_ops, src_dtype=src_dtype, dst_dtype=dst_dtype, stats=stats,
        )
    vec = _row_vector.vector_width(n, (other_src, other_dst), (src_strides[axis], dst_strides[axis]),
                                   other_dims, config.vector_width)

    if vec > 1:
        T = VECTOR_TYPES[vec]
        chunks = n // vec
        max_fold = _row_vector.fold_code("m", vec, "{a} > {b} ? {a} : {b}")
        sum_fold = _row_vector.sum_fold_code(vec)
        # Pass 2 of softmax stores exp(x - m) in dst and pass 3 scales it, so exp is called once
        # per element (twice under a sum post-op); logsoftmax needs only the sum, and pass 3
        # recomputes from src.
        # Chunk k of the row: through a vector pointer for f32, element by element otherwise.
        xs_decl, xd_decl, xs_k, xd_k = _row_vector.row_pointers(src_dtype, dst_dtype, vec)

        if alg == "softmax" and not recompute:
            sum_body = f"const {T} e = exp({xs_k} - ({T})(m)); xd[k] = e; {kahan_step('sv', 'cv', 'e', T)}"
            value = f"xd[k] * ({T})(inv)"
            finish = f"const float inv = {stats.inverse('s')};"
        elif alg == "softmax":
            sum_body = kahan_step("sv", "cv", f"exp({xs_k} - ({T})(m))", T)
            value = f"exp({xs_k} - ({T})(m)) * ({T})(inv)"
            finish = f"const float inv = {stats.inverse('s')};"
        else:
            sum_body = kahan_step("sv", "cv", f"exp({xs_k} - ({T})(m))", T)
            value = f"({xs_k} - ({T})(m)) - ({T})(log_s)"
            finish = "const float log_s = log(s);"

        # Operands are gathered lane by lane: their rows need not start on a vector boundary.
        chain = _post_ops.apply(
            post_ops, "y", T, xd_k, lambda name: _row_vector.gather(name, po_axis[name], vec, f"off_{name}")
        )
        store = _row_vector.store_chunk(dst_dtype, vec, "y")
        if post_ops:
            write_body = f"{T} y = {value}; {chain} {store}"
        elif dst_dtype == "f32":
            write_body = f"xd[k] = {value};"
        else:
            write_body = f"const {T} y = {value}; {store}"
        functions = _post_ops.functions(post_ops, (T,))
        body = f"""
    {xs_decl}
    {xd_decl}
    float m, s;
    {{
        {T} mv = ({T})(-INFINITY);
        for (ulong k = 0; k < {chunks}UL; ++k) {{ const {T} x = {xs_k}; mv = x > mv ? x : mv; }}
        {max_fold}
    }}
    {stats.empty_row}
    {{
        {T} sv = ({T})(0.0f), cv = ({T})(0.0f);
        for (ulong k = 0; k < {chunks}UL; ++k) {{ {sum_body} }}
        cv = -cv;  /* Kahan keeps minus the lost low parts; the fold adds error terms */
        {sum_fold}
    }}
    {finish}
    {stats.store("s")}
    for (ulong k = 0; k < {chunks}UL; ++k) {{ {write_body} }}"""
        impl = f"ocl:row:v{vec}l{local}"
    else:
        ss, ds = src_strides[axis], dst_strides[axis]
        x_k = _dtype_io.load(src_dtype, "src", f"off_src + k * {ss}UL")
        if alg == "softmax" and not recompute:
            sum_body = (
                f"const float e = exp({x_k} - m);"
                f" dst[off_dst + k * {ds}UL] = e; {kahan_step('s', 's_c', 'e')}"
            )
            value = f"dst[off_dst + k * {ds}UL] * inv"
            finish = f"s -= s_c; const float inv = {stats.inverse('s')};"
        elif alg == "softmax":
            sum_body = kahan_step("s", "s_c", f"exp({x_k} - m)")
            value = f"exp({x_k} - m) * inv"
            finish = f"s -= s_c; const float inv = {stats.inverse('s')};"
        else:
            sum_body = kahan_step("s", "s_c", f"exp({x_k} - m)")
            value = f"({x_k} - m) - log_s"
            finish = "s -= s_c; const float log_s = log(s);"
        chain = _dtype_io.apply_post_ops_scalar(
            post_ops, "y", f"off_dst + k * {ds}UL",
            {name: f"off_{name} + k * {stride}UL" for name, stride in po_axis.items()},
            dst_dtype,
        )
        write_body = f"float y = {value}; {chain} {_dtype_io.store(dst_dtype, 'dst', f'off_dst + k * {ds}UL', 'y')}"
        functions = _post_ops.functions(post_ops)
        body = f"""
    float m = -INFINITY;
    for (ulong k = 0; k < {n}UL; ++k) {{ const float x = {x_k}; m = x > m ? x : m; }}
    {stats.empty_row}
    float s = 0.0f, s_c = 0.0f;
    for (ulong k = 0; k < {n}UL; ++k) {{ {sum_body} }}
    {finish}
    {stats.store("s")}
    for (ulong k = 0; k < {n}UL; ++k) {{ {write_body} }}"""
        impl = f"ocl:row:v1l{local}"

    # No restrict on the pointers: in place they are one buffer, and pass 2 writes it.
    source = (
        _dtype_io.functions(loads=(src_dtype, dst_dtype), stores=(dst_dtype, *stats.dtypes))
        + functions
        + f"__kernel void softmax_fwd({_dtype_io.param(src_dtype, 'src', const=True)},{_post_ops.params(post_ops)}"
        f" {_dtype_io.param(dst_dtype, 'dst', const=False)}{stats.param}) {{\n"
        "    const ulong row = get_global_id(0);\n"
        f"    if (row >= {rows}UL) return;\n"
        f"    {offsets}"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="softmax_fwd",
        arg_names=("src",) + tuple(po_strides) + ("dst",) + stats.arg_names,
        global_size=(padded_global(rows, local),),
        local_size=(local,),
        impl=impl,
    )


def _generate_work_group(
    alg: str,
    *,
    n: int,
    rows: int,
    offsets: str,
    ss: int,
    ds: int,
    po_axis: dict[str, int],
    config: KernelConfig,
    post_ops: tuple,
    src_dtype: str,
    dst_dtype: str,
    stats: _Stats,
) -> KernelSpec:
    """One work-group per row (see ``_wg_reduce``): max, then the compensated sum, then every
    work-item writes its elements. Rows of up to ``CACHE_MAX`` elements per work-item stay in
    registers (softmax keeps ``exp(x - m)`` there); longer ones are re-read and softmax recomputes
    ``exp`` in the write pass, so dst is written once and never read but by a sum post-op.
    In place is safe: a work-item reads and writes only its own elements, each read before its
    write."""
    local = _wg_reduce.local_size(n, config)
    per = _wg_reduce.per_item(n, local)
    cached = per <= _wg_reduce.CACHE_MAX
    x_k = _dtype_io.load(src_dtype, "src", f"off_src + k * {ss}UL")
    dst_k = f"off_dst + k * {ds}UL"
    chain = _dtype_io.apply_post_ops_scalar(
        post_ops, "y", dst_k, {name: f"off_{name} + k * {stride}UL" for name, stride in po_axis.items()}, dst_dtype,
    )
    x = "xv[j]" if cached else "x"
    load = f"xv[j] = {x_k};" if cached else f"const float x = {x_k};"
    if alg == "softmax":
        # Cached: the sum pass turns xv[j] into exp(x - m), which the write pass scales.
        sum_body = (f"xv[j] = exp(xv[j] - m); {_wg_reduce.two_sum_step('s', 's_c', 'xv[j]')}" if cached
                    else f"{load} {_wg_reduce.two_sum_step('s', 's_c', 'exp(x - m)')}")
        value = "xv[j] * inv" if cached else "exp(x - m) * inv"
        finish = f"const float inv = {stats.inverse('total')};"
    else:
        sum_body = f"{'' if cached else load} {_wg_reduce.two_sum_step('s', 's_c', f'exp({x} - m)')}"
        value = f"({x} - m) - log_s"
        finish = "const float log_s = log(total);"
    write_body = (f"{'' if cached else load} float y = {value}; {chain}"
                  f" {_dtype_io.store(dst_dtype, 'dst', dst_k, 'y')}")
    loop = lambda body: _wg_reduce.loop(n, local, cached, body)  # noqa: E731
    body = f"""
    {f"float xv[{per}];" if cached else ""}
    float m = -INFINITY;
    {loop(f"{load} m = {x} > m ? {x} : m;")}
    {_wg_reduce.max_code("m", local)}
    {stats.empty_row}
    float s = 0.0f, s_c = 0.0f;
    {loop(sum_body)}
    {_wg_reduce.sum_code("s", "s_c", "total", local)}
    {finish}
    if (lid == 0) {{ {stats.store("total")} }}
    {loop(write_body)}"""
    source = (
        _dtype_io.functions(loads=(src_dtype, dst_dtype), stores=(dst_dtype, *stats.dtypes))
        + _post_ops.functions(post_ops)
        + f"__kernel {_wg_reduce.attribute(local)}void softmax_fwd("
        f"{_dtype_io.param(src_dtype, 'src', const=True)},{_post_ops.params(post_ops)}"
        f" {_dtype_io.param(dst_dtype, 'dst', const=False)}{stats.param}) {{\n"
        f"    {_wg_reduce.declarations(local)}\n"
        "    const ulong row = get_group_id(0);\n"
        f"    if (row >= {rows}UL) return;  /* the whole work-group: no barrier is left waiting */\n"
        f"    {offsets}"
        + body
        + "\n}\n"
    )
    return KernelSpec(
        source=source,
        name="softmax_fwd",
        arg_names=("src",) + tuple(po_axis) + ("dst",) + stats.arg_names,
        global_size=(max(1, rows) * local,),
        local_size=(local,),
        impl=f"ocl:wg_row:l{local}" + (f"r{per}" if cached else ""),
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
    dst_dtype: str = "f32",
    inf_as_zero: bool = False,
) -> np.ndarray:
    """``alg`` of ``src`` (user-facing values of any data type) over ``axis`` in float64, rounded
    to float32 (0 on rows of -inf only with ``inf_as_zero``); then times ``output_scale`` and
    ``post_ops`` as ``_post_ops.scaled_reference`` (``old_dst`` for sum post-ops, ``operands`` for
    binary ones); stored as ``dst_dtype``."""
    x = _dtype_io.widen(src)
    with np.errstate(all="ignore"):
        row_max = np.max(x, axis=axis, keepdims=True)
        shifted = x - row_max
        log_sum = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
        if alg == "softmax":
            y = np.exp(shifted - log_sum)
        elif alg == "logsoftmax":
            y = shifted - log_sum
        else:
            raise ValueError(f"unknown softmax algorithm {alg!r}; known: {', '.join(ALGORITHMS)}")
    if inf_as_zero:
        y = np.where(np.isneginf(row_max), 0.0, y)
    y = _post_ops.scaled_reference(post_ops, y.astype(np.float32), old_dst, operands, output_scale=output_scale)
    return _dtype_io.store_reference(y, dst_dtype)


def stats_reference(src: np.ndarray, *, axis: int = -1, dtype: str = "f32", inf_as_zero: bool = False) -> np.ndarray:
    """Each row's log-sum-exp ``max + log(sum(exp(x - max)))`` in float64 (the axis kept as 1),
    stored as ``dtype``. A row of -inf only gives -inf with ``inf_as_zero``, NaN without it
    (``-inf - -inf``), as the kernels."""
    x = _dtype_io.widen(src)
    with np.errstate(all="ignore"):
        row_max = np.max(x, axis=axis, keepdims=True)
        empty = np.isneginf(row_max)
        safe = np.where(empty, 0.0, row_max)
        lse = safe + np.log(np.sum(np.exp(x - safe), axis=axis, keepdims=True))
        if not inf_as_zero:
            lse = np.where(empty, np.nan, lse)
    return _dtype_io.store_reference(lse.astype(np.float32), dtype)


def desc_reference(desc: SoftmaxDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}``: ``reference`` with the descriptor's axis,
    output scale and post-ops (``inputs["dst"]``, dst's old value, for a sum post-op; the binary
    operands by argument name), stored as dst's data type."""
    return reference(
        desc.alg, inputs["src"], axis=desc.axis, output_scale=desc.output_scale, post_ops=desc.post_ops,
        old_dst=inputs.get("dst"), operands=inputs, dst_dtype=desc.dst.dtype, inf_as_zero=desc.inf_as_zero,
    )


def desc_stats_reference(desc: SoftmaxDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The stats output of ``desc`` (which must have one) from ``inputs["src"]``."""
    if desc.stats is None:
        raise ValueError("the descriptor has no stats output")
    return stats_reference(inputs["src"], axis=desc.axis, dtype=desc.stats.dtype, inf_as_zero=desc.inf_as_zero)


def desc_tolerance(desc: SoftmaxDesc) -> float:
    return thresholds.softmax(desc.alg)


register(SoftmaxDesc, generate=generate, reference=desc_reference, tolerance=desc_tolerance)
