"""Fused attention on CPUs (PoCL, ``vector_width >= 16``): the two kernels ``sdpa.generate``
picks there, on the common arguments it builds. Both start from ``_PRELUDE``'s helpers (unaligned
float16 access, 512-bit vectors on PoCL, min and max as selects rather than calls).

* Rows as lanes (``ocl:sdpa:rowlanes``, ``_cpu_generate``): work-groups of one work-item, no
  barriers (on PoCL they spill the accumulators). A work-item owns 32 query rows (16 where Sq <= 16,
  or where a float16 takes two registers: ``CPU_SHAPES_NARROW``) of one batch index,
  and the vector lanes are those rows: Q is transposed once into ``__local`` memory (a float16 of
  16 rows per head-dim index), so the scores of a block of keys are float16 accumulators, one per
  key, each FMA taking a K element as a broadcast (AVX-512 embedded broadcast: any K layout, K^T
  included, with no copy of K), and ``O`` (``__local``, one float16 of rows per Dv column) takes a
  V element as a broadcast the same way. The online softmax is then lane-wise too: the running
  max, sum and rescale factor of 16 rows are float16 vectors; no horizontal reductions, no lane
  extraction. ``exp`` is an inlined polynomial (``_EXP``; PoCL keeps exp() as a call). Under a
  causal mask the work-item stops at its last row's diagonal, and only blocks that cross it are
  masked. Measured against a first version with keys as lanes (K copied transposed into
  ``__local`` per block, then horizontal max/sum per row): 1.45x faster, the inlined exp another
  5%.
* Short queries (Sq <= 4, decoding; ``ocl:sdpa:rowdot``, ``_cpu_rowdot_generate``): one work-item
  per query row, the head dims (or, for a K^T layout, 16 keys) as lanes.

``cpu_row_vectors`` also tells ``sdpa.fusion_pays`` whether the CPU kernel can take quantized
probabilities (their two passes need the rows-as-lanes kernel).
"""

from __future__ import annotations

import math

from . import _dtype_io
from ._spec import VECTOR_TYPES, KernelSpec, c_float

# CPU shapes (float16 vectors of query rows per work-item, keys per block, Dv columns per register
# group of O), measured on PoCL at 1x8x128x64 and 1x16x384x64: (2, 8, 4) 0.31 / 2.7 ms, (1, 16, 8)
# 0.33 / 2.9 ms, (2, 16, 4) 0.41 / 3.7 ms (spills), (4, 4, 2) 0.36 / 2.9 ms. Rows as lanes: one
# vector of 16 rows where Sq <= 16, so that short queries do not compute 32 lanes.
CPU_SHAPES = {1: (16, 8), 2: (8, 4)}  # rv -> (keys per block, Dv columns per group)
# Where a float16 takes two registers (AVX2: ``KernelConfig.native_vector_width`` 8), one row
# vector, 6 keys per block, 4 Dv columns per group. PoCL on a 2-core AMD EPYC with AVX2, causal
# 1x8x512, d = 64 / 128, ms (a side script patching the shape per build, best of 4): (2; 8, 4)
# 6.1 / 10.2, (1; 16, 8) 4.3 / 8.4, (1; 8, 4) 5.6 / 6.3, (1; 4, 4) 2.6 / 5.3, (1; 6, 4) 2.4-2.6
# / 5.0-5.3, (1; 6, 2) 2.3 / 4.9, (1; 6, 6) 2.8 / 9.3, (2; 4, 4) 5.0 / 9.8.
CPU_SHAPES_NARROW = {1: (6, 4)}


def cpu_row_vectors(sq: int, d: int, dv: int, local_memory: int, native_vector_width: int = 16) -> int:
    """Float16 vectors of query rows per work-item: 2, or 1 where Sq <= 16, where a float16 takes
    two registers (``CPU_SHAPES_NARROW``) or where two would not fit ``local_memory`` (Q^T and O
    take 64 bytes per row vector and column); 0 where not even one fits, and the GPU kernels take
    the problem."""
    rv = 1 if sq <= 16 or native_vector_width < 16 else 2
    while rv > 0 and 64 * rv * (d + dv) > local_memory:
        rv -= 1
    return rv


_PRELUDE = (
    # Unaligned float16 access (LLVM otherwise assumes 64-byte alignment of a float16 pointer).
    "typedef float16 __attribute__((aligned(4))) sd_float16u;\n"
    # LLVM prefers 256-bit vectors on this CPU and splits float16 in two unless the function's
    # "min-legal-vector-width" says 512; calling a function that takes a float16 sets it.
    "static float16 sd_wide(const float16 x) { return x; }\n"
    "#define SD_MIN(a, b) ((a) < (b) ? (a) : (b))\n"  # min() and max() stay calls on PoCL
    "#define SD_MAX(a, b) ((a) > (b) ? (a) : (b))\n"
)

# exp of x <= 0 on float16, inlined (PoCL keeps exp() as a call: 17 calls per 16 x 16 block of
# scores). Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, Cody-Waite), a
# degree-5 polynomial for exp(r), 2^n put in the exponent bits; n is rounded by adding 1.5 * 2^23,
# whose low mantissa bits then hold n (rint() and convert_int() would be calls too). Within 1 ulp
# of exp on [-86, 0]; below -86 (and at -inf) exactly 0: never a denormal (they would slow the
# FMAs), and a row whose scores are all -inf keeps l = 0. exp(-86) = 4e-38 is nothing next to the
# row maximum's term, exp(0) = 1.
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP = (
    "static inline float16 sd_exp(const float16 x) {\n"
    f"    const float16 t = x * (float16){c_float(1.44269504088896341)} + (float16){c_float(12582912.0)};\n"
    f"    const float16 n = t - (float16){c_float(12582912.0)};\n"
    f"    const float16 r = (x - n * (float16){c_float(0.693359375)}) - n * (float16){c_float(-2.12194440e-4)};\n"
    f"    float16 y = (float16){c_float(_EXP_POLY[0])};\n"
    + "".join(f"    y = y * r + (float16){c_float(c)};\n" for c in _EXP_POLY[1:])
    + "    y = y * (r * r) + r + (float16)(1.0f);\n"
    "    const int16 e = (as_int16(t) - (int16)(0x4b400000)) << 23;\n"
    "    return x < (float16)(-86.0f) ? (float16)(0.0f) : as_float16(as_int16(y) + e);\n"
    "}\n"
)


# tanh on float16, inlined through sd_exp (PoCL keeps tanh(), fabs() and copysign() as calls, one per lane: with rows
# as lanes, soft-capping a short query cost more than the rest of the kernel). Odd, so from
# t = exp(-2|x|) <= 1: tanh|x| = (1 - t) / (1 + t). Near 0 the subtraction loses relative, not
# absolute, precision (about 1e-7), which is what the softmax of capped scores sees.
_TANH = (
    "static inline float16 sd_tanh(const float16 x) {\n"
    "    const float16 t = sd_exp((x < (float16)(0.0f)) ? (float16)(2.0f) * x : (float16)(-2.0f) * x);\n"
    "    const float16 r = ((float16)(1.0f) - t) / ((float16)(1.0f) + t);\n"
    "    return (x < (float16)(0.0f)) ? -r : r;\n"
    "}\n"
)


def _hreduce(var: str, width: int, combine: str, out: str) -> str:
    """Statements declaring float ``out``: vector ``var`` of ``width`` lanes folded by halving."""
    lines, src = [], var
    while width > 1:
        width //= 2
        name = f"{out}_{width}"
        lines.append(f"const {VECTOR_TYPES[width]} {name} = {combine.format(a=f'{src}.lo', b=f'{src}.hi')};")
        src = name
    lines.append(f"const float {out} = {src};")
    return " ".join(lines)


def _tree(lines: list[str], names: list[str], combine: str, prefix: str) -> str:
    """Append statements folding the float16 values ``names`` pairwise (a tree, for instruction
    parallelism); returns the name holding the result."""
    level = names
    while len(level) > 1:
        nxt = []
        for a in range(0, len(level) - 1, 2):
            name = f"{prefix}{len(level)}_{a // 2}"
            lines.append(f"const float16 {name} = {combine.format(a=level[a], b=level[a + 1])};")
            nxt.append(name)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _cpu_generate(*, rv, shape, sq, skv, d, dv, nbatch, offsets, sa, has_mask, has_scale, scale_code, offset,
                  dtypes, signature, functions, args, softcap, select, causal_fill, stats, ops,
                  local_memory) -> KernelSpec:
    bk, ge = shape
    rb = 16 * rv  # query rows per work-item: rv float16 vectors, one row per lane
    qt, kt, vt, dt = (dtypes[n] for n in ("query", "key", "value", "dst"))
    load, store = _dtype_io.load, _dtype_io.store
    groups = math.ceil(sq / rb)
    sqm, sqd = sa["q"][-2:]
    skj, skd = sa["k"][-2:]
    svj, svd = sa["v"][-2:]
    sdm, sdd = sa["d"][-2:]
    edge_keys = skv % bk
    hs = range(rv)

    def row(t: str) -> str:  # query row of lane t, clamped: lanes past Sq compute on a real row
        return f"SD_MIN(q0 + {t}, {sq - 1}UL)"

    def gather_rows(h: int, expr) -> str:  # a float16 of one value per lane of vector h
        return "((float16)(" + ", ".join(expr(f"{16 * h + t}UL") for t in range(16)) + "))"

    # Q^T of the rb rows: qt[dd * rv + h] holds q[row][dd] of every lane of vector h, converted once.
    q_value = ops.value("query", f"off_q + {row('t')} * {sqm}UL + dd * {sqd}UL", row("t"), "dd")
    q_loop = (f"for (ulong t = 0; t < {rb}UL; ++t) for (ulong dd = 0; dd < {d}UL; ++dd)" if abs(sqd) <= abs(sqm)
              else f"for (ulong dd = 0; dd < {d}UL; ++dd) for (ulong t = 0; t < {rb}UL; ++t)")
    q_copy = f"{q_loop} qtf[dd * {rb}UL + t] = {q_value};"

    # Score-shaped operands (the additive mask "m", the Select condition "c"): a tensor broadcast
    # over keys is one vector of the rows' values (loaded once), one broadcast over rows a scalar
    # per key (loaded per block), else a gather per key and row vector.
    operands = ([("m", "mask")] if has_mask else []) + ([("c", "select_mask")] if select is not None else [])
    row_vectors: list[str] = []
    for tag, ptr in operands:
        oq, ok = sa[tag][-2:]
        if ok == 0 and oq != 0:
            row_vectors.extend(
                f"const float16 {tag}row{h} = "
                + gather_rows(h, lambda t, ptr=ptr, tag=tag, oq=oq: load(dtypes[ptr], ptr, f"off_{tag} + {row(t)} * {oq}UL"))
                + ";" for h in hs)
    operand_rows = " ".join(row_vectors)

    def operand_loads(tag: str, ptr: str, nk: int) -> str:
        oq, ok = sa[tag][-2:]
        if oq != 0:
            return ""
        return " ".join(f"const float16 {tag}k{j} = (float16)({load(dtypes[ptr], ptr, f'off_{tag} + (j0 + {j}UL) * {ok}UL')});"
                        for j in range(nk))

    def operand_vector(tag: str, ptr: str, j: int, h: int) -> str:
        oq, ok = sa[tag][-2:]
        if oq == 0:
            return f"{tag}k{j}"
        if ok == 0:
            return f"{tag}row{h}"
        return gather_rows(h, lambda t: load(dtypes[ptr], ptr, f"off_{tag} + {row(t)} * {oq}UL + (j0 + {j}UL) * {ok}UL"))

    # Quantized probabilities take two passes over the keys; the first keeps its scores in
    # __local memory (a float16 of rows per key) where they fit, so the second only reads them.
    two_pass = ops.desc.probs_quant is not None
    cache_scores = two_pass and 64 * rv * (d + dv + skv) <= local_memory

    def block(nk: int, phase: str = "online") -> str:
        """Keys j0 .. j0 + nk - 1 against the rb rows: scores, then for phase "online" the online
        softmax and O += p @ V; "stats" only the running max and sum (the first pass of quantized
        probabilities); "final" O += Q(p) @ V with p normalised by the first pass's m and l."""
        s = {h: [f"s{j}_{h}" for j in range(nk)] for h in hs}
        lines = [" ".join(f"float16 {x} = (float16)(0.0f);" for h in hs for x in s[h])]
        k_terms = "".join(
            f" {{ const float16 k = (float16)({ops.value('key', f'kb + {j * skj}UL + dd * {skd}UL', f'j0 + {j}UL', 'dd')});"
            + "".join(f" s{j}_{h} += q{h} * k;" for h in hs) + " }"
            for j in range(nk))
        q_vecs = " ".join(f"const float16 q{h} = qt[dd * {rv}UL + {h}UL];" for h in hs)
        lines.append(f"""{{ const ulong kb = off_k + j0 * {skj}UL;
            __attribute__((opencl_unroll_hint(2)))
            for (ulong dd = 0; dd < {d}UL; ++dd) {{ {q_vecs}{k_terms} }} }}""")
        rounds = ops.desc.score_rounding != "f32"
        if rounds:
            lines.append(" ".join(f"{x} = {ops.score(x, True)};" for h in hs for x in s[h]))
        if has_scale:
            lines.append(" ".join(f"{x} = {ops.score(f'{x} * (float16)(sc)', True)};" for h in hs for x in s[h]))
        if softcap:
            lines.append(" ".join(f"{x} = {ops.score(f'(float16)(cap) * sd_tanh({x})', True)};" for h in hs for x in s[h]))
        if select is not None:
            lines.append(operand_loads("c", "select_mask", nk))
            test = "!=" if select else "=="
            lines.append(" ".join(
                f"s{j}_{h} = ({operand_vector('c', 'select_mask', j, h)} {test} (float16)(0.0f)) ? (float16)(fl) : s{j}_{h};"
                for h in hs for j in range(nk)))
        if has_mask:
            lines.append(operand_loads("m", "mask", nk))
            added = {(j, h): f"s{j}_{h} + {operand_vector('m', 'mask', j, h)}" for h in hs for j in range(nk)}
            lines.append(" ".join(f"s{j}_{h} = {ops.score(added[j, h], True)};" for h in hs for j in range(nk)))
        if offset is not None:
            # Key j0 + j is masked for the rows q < j0 + j - offset; only blocks crossing the diagonal.
            body = " ".join(
                f"s{j}_{h} = (rowi{h} < (int16)((int)((long)j0 + {j}L - {offset}))) ? {masked} : s{j}_{h};"
                for h in hs for j in range(nk))
            lines.append(f"if ((long)j0 + {nk - 1}L > (long)q0 + {offset}) {{ {body} }}")
        if cache_scores and phase == "stats":
            lines.append(" ".join(f"scs[(j0 + {j}UL) * {rv}UL + {h}UL] = s{j}_{h};" for h in hs for j in range(nk)))
        if cache_scores and phase == "final":  # the first pass's scores, not a second Q @ K^T
            lines = [" ".join(f"float16 s{j}_{h} = scs[(j0 + {j}UL) * {rv}UL + {h}UL];" for h in hs for j in range(nk))]
        if phase == "final":  # normalised by the first pass, through the graph's Quantize -> Dequantize
            for h in hs:
                lines.append(" ".join(
                    f"{x} = (l{h} > (float16)(0.0f)) ? {ops.probability(f'sd_exp({x} - mzf{h}) / l{h}', True)} : (float16)(0.0f);"
                    for x in s[h]))
                lines.append(f"const float16 alpha{h} = (float16)(1.0f);")
        # Lane-wise online softmax: no horizontal reductions, the lanes are rows.
        for h in (hs if phase != "final" else ()):
            top = _tree(lines, s[h], "SD_MAX({a}, {b})", f"mx{h}_")
            lines.append(f"const float16 mn{h} = SD_MAX(m{h}, {top});")
            lines.append(f"const float16 mz{h} = (mn{h} == (float16)(-INFINITY)) ? (float16)(0.0f) : mn{h};")
            lines.append(f"const float16 alpha{h} = sd_exp(m{h} - mz{h}); m{h} = mn{h};")
            lines.append(" ".join(f"{x} = sd_exp({x} - mz{h});" for x in s[h]))
            total = _tree(lines, s[h], "{a} + {b}", f"ps{h}_")
            lines.append(f"l{h} = l{h} * alpha{h} + {total};")
        if phase == "stats":
            return "\n            ".join(lines)

        def v_at(j: int, u: int, e0: str) -> str:
            return ops.value("value", f"vb + {j * svj}UL + ({e0} + {u}UL) * {svd}UL", f"j0 + {j}UL", f"({e0} + {u}UL)")

        def pv(count: int, e0: str) -> str:
            accs = " ".join(f"float16 o{u}_{h} = os[({e0} + {u}UL) * {rv}UL + {h}UL] * alpha{h};"
                            for u in range(count) for h in hs)
            fmas = "\n                ".join(
                "".join(f" {{ const float16 v = (float16)({v_at(j, u, e0)});"
                        + "".join(f" o{u}_{h} += s{j}_{h} * v;" for h in hs) + " }"
                        for u in range(count)) for j in range(nk))
            saves = " ".join(f"os[({e0} + {u}UL) * {rv}UL + {h}UL] = o{u}_{h};" for u in range(count) for h in hs)
            return f"""{{ {accs}
                {fmas}
                {saves} }}"""
        lines.append(f"const ulong vb = off_v + j0 * {svj}UL;")
        if dv >= ge:
            lines.append(f"for (ulong e0 = 0; e0 < {dv - dv % ge}UL; e0 += {ge}UL) {pv(ge, 'e0')}")
        if dv % ge:
            lines.append(pv(dv % ge, f"{dv - dv % ge}UL"))
        return "\n            ".join(lines)

    # A causal mask filling with a value rather than -inf: every key still counts (exp(fill - m)
    # need not be 0), so no block is skipped.
    masked = "(float16)(fl)" if causal_fill else "(float16)(-INFINITY)"
    if offset is not None and not causal_fill:
        kv_end = (f"const long kv_lim = (long)q0 + {rb}L + {offset}; "
                  f"const ulong kv_end = kv_lim <= 0L ? 0UL : SD_MIN((ulong)kv_lim, {skv}UL);")
        row_index = " ".join(
            f"const int16 rowi{h} = (int16)((int)q0 + {16 * h}) + (int16)(" + ", ".join(map(str, range(16))) + ");"
            for h in hs)
    else:
        kv_end, row_index = f"const ulong kv_end = {skv}UL;", ""
    if offset is not None and causal_fill:
        row_index = " ".join(
            f"const int16 rowi{h} = (int16)((int)q0 + {16 * h}) + (int16)(" + ", ".join(map(str, range(16))) + ");"
            for h in hs)
    full_blocks = skv // bk

    def loop_of(phase: str) -> str:
        if edge_keys == 0:
            return f"for (ulong j0 = 0; j0 < kv_end; j0 += {bk}UL) {{\n            {block(bk, phase)}\n        }}"
        if full_blocks == 0:
            return f"if (kv_end > 0UL) {{ const ulong j0 = 0;\n            {block(edge_keys, phase)}\n        }}"
        return (f"for (ulong j0 = 0; j0 < kv_end; j0 += {bk}UL) {{ if (j0 + {bk}UL <= {skv}UL) {{"
                f"\n            {block(bk, phase)}\n        }}"
                f" else {{\n            {block(edge_keys, phase)}\n        }} }}")

    if two_pass:
        # A quantized probability needs its row's final max and sum: a first pass makes them, the
        # second recomputes the scores and adds Q(p) @ V (FlashAttention's online rescaling cannot
        # commute with a rounding to integers).
        loop = (loop_of("stats") + "\n    "
                + " ".join(f"const float16 mzf{h} = (m{h} == (float16)(-INFINITY)) ? (float16)(0.0f) : m{h};" for h in hs)
                + "\n    " + loop_of("final"))
    else:
        loop = loop_of("online")
    state = " ".join(f"float16 m{h} = sd_wide((float16)(-INFINITY)), l{h} = (float16)(0.0f);" for h in hs)
    # SoftMax's statistics, max + log(sum): -inf for a row of -inf scores (m = -inf, l = 0).
    stats_code = ""
    if stats:
        ssm = sa["s"][-2]
        stats_code = (" ".join(f"st[{h}] = m{h} + log(l{h});" for h in hs)
                      + f" for (ulong t = 0; t < SD_MIN({rb}UL, {sq}UL - q0); ++t)"
                      f" stats[off_s + (q0 + t) * {ssm}UL] = ((__local float*)st)[t];")
    normalise = "" if two_pass else " ".join(
        f"{{ const float16 inv = (l{h} > (float16)(0.0f)) ? (float16)(1.0f) / l{h} : (float16)(0.0f);"
        f" for (ulong e = 0; e < {dv}UL; ++e) os[e * {rv}UL + {h}UL] *= inv; }}" for h in hs)
    source = functions + _PRELUDE + _EXP + (_TANH if softcap else "") + f"""{signature} {{
    __local float16 qt[{d * rv}];
    __local float* const qtf = (__local float*)qt;
    __local float16 os[{dv * rv}];
    __local float* const osf = (__local float*)os;
    {f"__local float16 st[{rv}];" if stats else ""}
    {f"__local float16 scs[{skv * rv}];" if cache_scores else ""}
    const ulong g = get_global_id(0), bi = get_global_id(1);
    if (g >= {groups}UL || bi >= {nbatch}UL) return;
    {offsets}
    {scale_code}
    const ulong q0 = g * {rb}UL;
    {q_copy}
    {operand_rows}
    {row_index}
    for (ulong e = 0; e < {dv * rv}UL; ++e) os[e] = (float16)(0.0f);
    {state}
    {kv_end}
    {loop}
    {stats_code}
    {normalise}
    const ulong nq = SD_MIN({rb}UL, {sq}UL - q0);
    for (ulong t = 0; t < nq; ++t) for (ulong e = 0; e < {dv}UL; ++e)
        {store(dt, "dst", f"off_d + (q0 + t) * {sdm}UL + e * {sdd}UL", ops.dst(f"osf[e * {rb}UL + t]"))}
}}
"""
    return KernelSpec(
        source=source,
        name="sdpa_fwd",
        arg_names=args,
        global_size=(groups, nbatch),
        local_size=(1, 1),
        impl=f"ocl:sdpa:rowlanes:q{rb}x{bk}:e{ge}:l1x1",
    )


# -- CPU path for short queries (decoding) -----------------------------------------------------------

ROWDOT_MAX_SQ = 4  # rows as lanes would leave 12 of 16 lanes idle or more


def rowdot_applies(sq: int, d: int, dv: int, sa: dict) -> bool:
    """The short-query CPU kernel takes the problem: Sq <= ROWDOT_MAX_SQ, head sizes in float16
    steps, the head dims of Q and V contiguous, K contiguous along D or along keys (K^T)."""
    return (sq <= ROWDOT_MAX_SQ and d % 16 == 0 and dv % 16 == 0 and sa["q"][-1] == 1 and sa["v"][-1] == 1
            and 1 in sa["k"][-2:])


def _cpu_rowdot_generate(*, sq, skv, d, dv, nbatch, offsets, sa, has_mask, has_scale, scale_code, offset, dtypes,
                         signature, functions, args, softcap, select, causal_fill, stats, ops) -> KernelSpec:
    """One work-item per (query row, batch index). Scores by blocks of 16 keys: where K is
    contiguous along D, each key's score is a float16 dot product and one horizontal sum; where
    K is contiguous along keys (a graph's K^T), the 16 keys are the lanes, one FMA per head-dim
    index. Then a scalar online softmax per key, and ``O += p * v`` in float16 steps. For Sq of
    a few rows (decoding: gemma2's one query row per head), where the rows-as-lanes kernel would
    compute 16 lanes for one row: gemma2-bf16-f32 took 1.6 ms that way, 0.4 ms this way."""
    qt, kt, vt, dt = (dtypes[n] for n in ("query", "key", "value", "dst"))
    load, store = _dtype_io.load, _dtype_io.store
    sqm, skj, svj = sa["q"][-2], sa["k"][-2], sa["v"][-2]
    sdm, sdd = sa["d"][-2:]
    nd, ndv = d // 16, dv // 16

    def vec(dtype: str, ptr: str, base: str) -> str:  # 16 contiguous elements from base, unaligned
        if dtype == "f32":
            return f"(*(__global const sd_float16u*)({ptr} + {base}))"
        if dtype == "bf16":  # one 32-byte load and a shift, not 16 scalar conversions
            return f"as_float16(convert_uint16(*(__global const sd_ushort16u*)({ptr} + {base})) << 16)"
        return "((float16)(" + ", ".join(load(dtype, ptr, f"{base} + {k}UL") for k in range(16)) + "))"

    score = []
    if has_scale:
        score.append("x *= sc;")
    if softcap:
        score.append("x = cap * tanh(x);")
    if select is not None:
        scq, sck = sa["c"][-2:]
        c = load(dtypes["select_mask"], "select_mask", f"off_c + qi * {scq}UL + j * {sck}UL")
        score.append(f"if ({c} {'!=' if select else '=='} 0.0f) x = fl;")
    if has_mask:
        smq, smk = sa["m"][-2:]
        score.append(f"x += {load(dtypes['mask'], 'mask', f'off_m + qi * {smq}UL + j * {smk}UL')};")
    if offset is not None:
        score.append(f"if ((long)j > (long)qi + {offset}) x = {'fl' if causal_fill else '-INFINITY'};")
    if offset is not None and not causal_fill:
        kv_end = (f"const long kv_lim = (long)qi + {offset} + 1L; "
                  f"const ulong kv_end = kv_lim <= 0L ? 0UL : SD_MIN((ulong)kv_lim, {skv}UL);")
    else:
        kv_end = f"const ulong kv_end = {skv}UL;"
    skd = sa["k"][-1]
    edge = skv % 16
    if skd == 1:
        dot = _hreduce("acc", 16, "{a} + {b}", "x0")
        scores = (f"for (ulong jj = 0; jj < 16UL; ++jj) {{ const ulong kb = off_k + SD_MIN(j0 + jj, {skv - 1}UL) * {skj}UL;"
                  f" float16 acc = q[0] * {vec(kt, 'key', 'kb')};"
                  f" for (ulong c = 1; c < {nd}UL; ++c) acc += q[c] * {vec(kt, 'key', 'kb + c * 16UL')};"
                  f" {dot} xs[jj] = x0; }}")
    else:  # keys contiguous: 16 keys per vector load, past Skv clamped to the last key's block
        kb = f"off_k + SD_MIN(j0, {max(0, skv - 16)}UL)" if edge and skv >= 16 else "off_k + j0"
        if skv < 16:
            scores = (f"for (ulong jj = 0; jj < 16UL; ++jj) {{ float x = 0.0f; const ulong kb = off_k + SD_MIN(jj, {skv - 1}UL);"
                      f" for (ulong dd = 0; dd < {d}UL; ++dd) x += qf[dd] * {load(kt, 'key', f'kb + dd * {skd}UL')};"
                      " xs[jj] = x; }")
        else:
            shift = f" const ulong sh = j0 - SD_MIN(j0, {skv - 16}UL);" if edge else " const ulong sh = 0;"
            k_block = vec(kt, "key", f"{kb} + dd * {skd}UL")
            scores = (f"{{ float16 acc = (float16)(0.0f);{shift}"
                      f" for (ulong dd = 0; dd < {d}UL; ++dd) acc += (float16)(qf[dd]) * {k_block};"
                      " *(float16*)xs16 = acc; for (ulong jj = 0; jj < 16UL; ++jj) xs[jj] = xs16[SD_MIN(jj + sh, 15UL)]; }")
    stats_code = f"stats[off_s + qi * {sa['s'][-2]}UL] = m + log(l);" if stats else ""
    out = store(dt, "dst", f"off_d + qi * {sdm}UL + (c * 16UL + e) * {sdd}UL", "o[c][e] * inv")
    source = functions + _PRELUDE + "typedef ushort16 __attribute__((aligned(2))) sd_ushort16u;\n" + f"""{signature} {{
    const ulong qi = get_global_id(0), bi = get_global_id(1);
    if (qi >= {sq}UL || bi >= {nbatch}UL) return;
    {offsets}
    {scale_code}
    float16 q[{nd}], o[{ndv}];
    __attribute__((aligned(64))) float xs[16], xs16[16];
    for (ulong c = 0; c < {nd}UL; ++c) q[c] = sd_wide({vec(qt, "query", f"off_q + qi * {sqm}UL + c * 16UL")});
    const float* const qf = (const float*)q;
    for (ulong c = 0; c < {ndv}UL; ++c) o[c] = (float16)(0.0f);
    float m = -INFINITY, l = 0.0f;
    {kv_end}
    for (ulong j0 = 0; j0 < kv_end; j0 += 16UL) {{
      {scores}
      for (ulong jj = 0; jj < 16UL && j0 + jj < kv_end; ++jj) {{
        const ulong j = j0 + jj;
        float x = xs[jj];
        {" ".join(score)}
        const float mn = x > m ? x : m;
        const float mz = mn == -INFINITY ? 0.0f : mn;
        const float alpha = exp(m - mz), p = exp(x - mz);
        m = mn;
        l = l * alpha + p;
        const ulong vb = off_v + j * {svj}UL;
        for (ulong c = 0; c < {ndv}UL; ++c) o[c] = o[c] * alpha + p * {vec(vt, "value", "vb + c * 16UL")};
      }}
    }}
    {stats_code}
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (ulong c = 0; c < {ndv}UL; ++c) for (ulong e = 0; e < 16UL; ++e) {{ {out} }}
}}
"""
    return KernelSpec(
        source=source,
        name="sdpa_fwd",
        arg_names=args,
        global_size=(sq, nbatch),
        local_size=(1, 1),
        impl="ocl:sdpa:rowdot:l1x1",
    )
