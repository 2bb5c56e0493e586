"""Fused attention on GPUs (``vector_width == 1``) for the variants ``sdpa_flash``'s kernel does
not take (soft-capping, Select masks, fill values, quantized operands or probabilities, rounded
scores): the two kernels ``sdpa.generate`` picks there, on the common arguments it builds.

* Split (``ocl:sdpa:wgsplit``, ``_gpu_split_generate``): one work-group of 256 per (batch index,
  block of 16 query rows), 16 work-items per row. The work-group stages Q, then each
  tile of 64 K and V rows, in ``__local`` memory (rows padded so that float4 reads are free of bank
  conflicts); work-item t of a row takes keys t, t + 16, ... of each tile with its own online
  softmax state, q (scale folded in) and ``O`` as float4 registers, and the 16 states of a row
  merge through ``__local`` memory at the end.
* One work-item per row (``ocl:sdpa:wg``, ``_gpu_generate``): where q and ``O`` would not fit in
  registers (D + Dv > 192) or work-groups must be narrower than 64; K/V tiles in ``__local`` memory.

``gpu_split_shape`` also tells ``sdpa.fusion_pays`` where fusing pays on the GPU: only where the
split kernel applies.
"""

from __future__ import annotations

import math

from . import _dtype_io
from ._spec import KernelConfig, KernelSpec, up4


def kv_end_code(last_row: str | None, offset: str | None, skv: int) -> str:
    """C declaring ``kv_end``, the keys a block of query rows visits: up to the causal diagonal
    (``offset``, a C expression of type long) of its last row (``last_row``, C), or all ``skv``
    where either is None (no causal mask, or one filling masked scores, which still count)."""
    if last_row is None or offset is None:
        return f"const ulong kv_end = {skv}UL;"
    return (f"const long kv_lim = (long)({last_row}) + {offset} + 1L; "
            f"const ulong kv_end = kv_lim <= 0L ? 0UL : ((ulong)kv_lim < {skv}UL ? (ulong)kv_lim : {skv}UL);")

# GPU shape: keys per tile, and the most floats the K and V tiles may take in __local memory.
GPU_BK, GPU_TILE_FLOATS = 32, 8192


def _gpu_local(sq: int, config: KernelConfig) -> int:
    """Work-group size: one work-item per query row, at most the config's (and 128, so that short
    sequences still give the device several work-groups per head), at least 32 (a warp)."""
    limit = 1 << (max(1, min(config.local_size, 128)).bit_length() - 1)
    want = 1 << max(0, sq - 1).bit_length()
    return max(1, min(limit, max(32, want)))


def _gpu_generate(*, config, sq, skv, d, dv, nbatch, offsets, sa, has_mask, has_scale, scale_code,
                  offset, dtypes, signature, functions, args, softcap, select, causal_fill, stats, ops) -> KernelSpec:
    qt, kt, vt, mt, dt = (dtypes[n] for n in ("query", "key", "value", "mask", "dst"))
    load = _dtype_io.load
    local = _gpu_local(sq, config)
    tile_floats = min(GPU_TILE_FLOATS, config.local_memory // 4)
    bk = max(1, min(GPU_BK, skv, 1 << (max(1, tile_floats // (d + dv)).bit_length() - 1)))
    groups = math.ceil(sq / local)
    sqm, sqd = sa["q"][-2:]
    skj, skd = sa["k"][-2:]
    svj, svd = sa["v"][-2:]
    sdm, sdd = sa["d"][-2:]
    smq, smk = sa["m"][-2:] if has_mask else (0, 0)
    score = ["float x = 0.0f;", f"for (uint dd = 0; dd < {d}u; ++dd) x += qr[dd] * kl[j * {d}u + dd];",
             f"x = {ops.score('x')};"]
    if has_scale:
        score.append(f"x = {ops.score('x * sc')};")
    if softcap:
        score.append(f"x = {ops.score('cap * tanh(x)')};")
    if select is not None:
        scq, sck = sa["c"][-2:]
        c = load(dtypes["select_mask"], "select_mask", f"off_c + qc * {scq}UL + (j0 + j) * {sck}UL")
        score.append(f"if (j0 + j < {skv}UL && ({c} {'!=' if select else '=='} 0.0f)) x = fl;")
    masked = [f"j0 + j >= {skv}UL"]
    if has_mask:
        added = f"x + {load(mt, 'mask', f'off_m + qc * {smq}UL + (j0 + j) * {smk}UL')}"
        score.append(f"if (j0 + j < {skv}UL) x = {ops.score(added)};")
    if offset is not None and causal_fill:
        score.append(f"if ((long)(j0 + j) > (long)qi + {offset}) x = fl;")
    elif offset is not None:
        masked.append(f"(long)(j0 + j) > (long)qi + {offset}")
    score.append(f"if ({' || '.join(masked)}) x = -INFINITY;")
    kv_end = kv_end_code(None if causal_fill else f"g * {local}UL + {local - 1}UL", offset, skv)
    store_row = _dtype_io.store(dt, "dst", f"off_d + qi * {sdm}UL + e * {sdd}UL", ops.dst("o[e] * inv"))
    source = functions + f"""__attribute__((reqd_work_group_size({local}, 1, 1)))
{signature} {{
    __local float kl[{bk * d}];
    __local float vl[{bk * dv}];
    const uint lid = get_local_id(0);
    const ulong g = get_group_id(0), bi = get_group_id(1);
    {offsets}
    {scale_code}
    const ulong qi = g * {local}UL + lid;
    const ulong qc = qi < {sq}UL ? qi : {sq - 1}UL;
    float qr[{d}];
    for (uint dd = 0; dd < {d}u; ++dd) qr[dd] = {ops.value('query', f'off_q + qc * {sqm}UL + dd * {sqd}UL', 'qc', 'dd')};
    float o[{dv}];
    for (uint e = 0; e < {dv}u; ++e) o[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    {kv_end}
    for (ulong j0 = 0; j0 < kv_end; j0 += {bk}UL) {{
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint t = lid; t < {bk * d}u; t += {local}u) {{
            const ulong j = t / {d}u, dd = t % {d}u;
            kl[t] = j0 + j < {skv}UL ? {ops.value('key', f'off_k + (j0 + j) * {skj}UL + dd * {skd}UL', 'j0 + j', 'dd')} : 0.0f;
        }}
        for (uint t = lid; t < {bk * dv}u; t += {local}u) {{
            const ulong j = t / {dv}u, e = t % {dv}u;
            vl[t] = j0 + j < {skv}UL ? {ops.value('value', f'off_v + (j0 + j) * {svj}UL + e * {svd}UL', 'j0 + j', 'e')} : 0.0f;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[{bk}];
        float bm = -INFINITY;
        for (uint j = 0; j < {bk}u; ++j) {{
            {" ".join(score)}
            s[j] = x;
            bm = x > bm ? x : bm;
        }}
        const float mn = m > bm ? m : bm;
        const float mz = mn == -INFINITY ? 0.0f : mn;
        const float alpha = exp(m - mz);
        l *= alpha;
        for (uint e = 0; e < {dv}u; ++e) o[e] *= alpha;
        for (uint j = 0; j < {bk}u; ++j) {{
            const float p = exp(s[j] - mz);
            l += p;
            for (uint e = 0; e < {dv}u; ++e) o[e] += p * vl[j * {dv}u + e];
        }}
        m = mn;
    }}
    if (qi < {sq}UL) {{
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (uint e = 0; e < {dv}u; ++e) {{ {store_row} }}
        {f"stats[off_s + qi * {sa['s'][-2]}UL] = m + log(l);" if stats else ""}
    }}
}}
"""
    return KernelSpec(
        source=source,
        name="sdpa_fwd",
        arg_names=args,
        global_size=(groups * local, nbatch),
        local_size=(local, 1),
        impl=f"ocl:sdpa:wg:k{bk}:l{local}",
    )


# GPU split shape: work-items per query row (each takes every T-th key of a tile), keys per tile
# (the K and V tiles in __local memory), work-group size; rows per work-group = local / T.
# Used where q and O fit in registers (D and Dv rounded up to 4, at most GPU_SPLIT_REGS floats).
# Measured on an H200 (NVIDIA OpenCL, device time, median of 100), (T, BK, local) at 1x8x128x64
# with a mask / 1x16x384x64 / 1x16x384x64 with a mask / 2x4x200x64 causal, in us: (8, 64, 128)
# 20.4 / 95.3 / 67.2 / 27.8, (16, 64, 128) 21.4 / 104 / 116 / 26.2, (4, 64, 128) 22.0 / 77.2 / 80.0
# / 37.7, (8, 32, 128) 27.4 / 81.0 / 82.5 / 30.1, (8, 64, 256) 19.0 / 82.6 / 82.8 / 31.8,
# (16, 64, 256) 13.2 / 80.6 / 81.1 / 22.6 (the 384-token figures vary by +-30% run to run; torch
# 2.x fused SDPA 18.8 / 43.4 / 49.8, eager 58.3 / 48.9 / 59.1). The one row per work-item kernel:
# 83.0 / 184 / 207 / 118.
GPU_SPLIT_T, GPU_SPLIT_BK, GPU_SPLIT_LOCAL, GPU_SPLIT_REGS = 16, 64, 256, 192
GPU_SPLIT_LOCAL_FLOATS = 11 * 1024  # K and V tiles (reused for Q and the final merge): 44 KiB
GPU_CACHED_SCORES = 64  # scores a work-item keeps between the two passes of quantized probabilities


def _odd4(x: int) -> int:
    """A local row length >= x (a multiple of 4) whose float4 count is odd: a quarter-warp's float4
    reads of 8 consecutive rows hit distinct banks."""
    return x if (x // 4) % 2 else x + 4


def gpu_split_shape(sq: int, skv: int, d: int, dv: int, config: KernelConfig) -> tuple[int, int, int] | None:
    """(T, BK, local) of the split GPU kernel, or None where it does not apply (then the one
    row per work-item kernel)."""
    local = min(GPU_SPLIT_LOCAL, config.local_size)
    t = GPU_SPLIT_T
    if local < 64 or up4(d) + up4(dv) > GPU_SPLIT_REGS:
        return None
    # red_m and red_l, the merge's max and sum per work-item, sit beside the tile
    budget = min(GPU_SPLIT_LOCAL_FLOATS, config.local_memory // 4 - 2 * local)
    bk = max(t, min(GPU_SPLIT_BK, 1 << max(0, skv - 1).bit_length()))
    while bk > t and _split_local_floats(t, bk, local, d, dv) > budget:
        bk //= 2
    if _split_local_floats(t, bk, local, d, dv) > budget:
        return None
    return t, bk, local


def _split_local_floats(t: int, bk: int, local: int, d: int, dv: int) -> int:
    """Floats of the split kernel's __local buffer: the K and V tiles, reused to stage Q and to
    merge the T states of each row."""
    return max(bk * (_odd4(up4(d)) + _odd4(up4(dv))), local // t * up4(d), local * 8)


def _gpu_split_generate(*, shape, sq, skv, d, dv, nbatch, offsets, sa, has_mask, has_scale, scale_code,
                        offset, dtypes, signature, functions, args, softcap, select, causal_fill,
                        stats, ops) -> KernelSpec:
    """T work-items per query row, local / T rows per work-group. Work-item t of a row takes keys
    t, t + T, ... of each tile (a quarter-warp's 8 work-items read 8 consecutive K/V rows of the
    tile: float4 reads free of bank conflicts, the rows of a warp share them as broadcasts) and
    keeps its own online-softmax state (m, l, O) over its keys: q (scale folded in) and O are
    float4 registers. At the end the T states of a row merge through __local memory:
    M = max m_t, f_t = exp(m_t - M), L = sum l_t f_t, dst = sum f_t O_t / L."""
    t_, bk, local = shape
    qt, kt, vt, mt, dt = (dtypes[n] for n in ("query", "key", "value", "mask", "dst"))
    load, store = _dtype_io.load, _dtype_io.store
    rows = local // t_
    kc = bk // t_  # keys per work-item per tile
    d4, dv4 = up4(d), up4(dv)
    ks, vs = _odd4(d4), _odd4(dv4)  # local row lengths of the K and V tiles
    tile_floats = _split_local_floats(t_, bk, local, d, dv)
    groups = math.ceil(sq / rows)
    sqm, sqd = sa["q"][-2:]
    skj, skd = sa["k"][-2:]
    svj, svd = sa["v"][-2:]
    sdm, sdd = sa["d"][-2:]
    smq, smk = sa["m"][-2:] if has_mask else (0, 0)
    nq4, nv4 = d4 // 4, dv4 // 4

    def copy(dst_name: str, row_len: int, n_rows: int, width: int, ext: int, base: str, s_row: int, s_col: int,
             dtype: str, ptr: str, row_limit: str | None, row0: str) -> str:
        """Cooperative copy of n_rows x width (zero past ext columns / row_limit rows) into local."""
        col_fast = abs(s_col) <= abs(s_row) or s_row == 0
        if col_fast:
            idx = f"const uint r = u / {width}u, c = u % {width}u;"
        else:
            idx = f"const uint c = u / {n_rows}u, r = u % {n_rows}u;"
        conds = []
        if width > ext:
            conds.append(f"c < {ext}u")
        if row_limit is not None:
            conds.append(row_limit)
        value = ops.value(ptr, f"{base} + (ulong)r * {s_row}UL + (ulong)c * {s_col}UL", f"{row0} + (ulong)r", "(ulong)c")
        if conds:
            value = f"({' && '.join(conds)}) ? {value} : 0.0f"
        return (f"for (uint u = lid; u < {n_rows * width}u; u += {local}u) {{ {idx} "
                f"{dst_name}[r * {row_len}u + c] = {value}; }}")

    # Q rows of the group (clamped past Sq) through local memory, then into float4 registers.
    q_rows_end = f"g * {rows}UL + r < {sq}UL"
    q_copy = copy("tl", d4, rows, d4, d, f"off_q + g * {rows * sqm}UL", sqm, sqd, qt, "query",
                  q_rows_end if sq % rows else None, f"g * {rows}UL")
    # The scale folds into q, unless the graph rounds the scores before and after scaling them.
    rounds = ops.desc.score_rounding != "f32"
    fold = has_scale and not rounds
    q_regs = " ".join(f"const float4 q{i} = L4(tl + rw * {d4}u + {4 * i}u){' * sc' if fold else ''};" for i in range(nq4))

    kv_full = skv % bk == 0
    k_copy = copy("kl", ks, bk, d4, d, f"off_k + j0 * {skj}UL", skj, skd, kt, "key",
                  None if kv_full else f"j0 + r < {skv}UL", "j0")
    v_copy = copy("vl", vs, bk, dv4, dv, f"off_v + j0 * {svj}UL", svj, svd, vt, "value",
                  None if kv_full else f"j0 + r < {skv}UL", "j0")

    lines = []
    if has_mask:
        for c in range(kc):
            key = f"j0 + {c * t_}UL + t"
            value = load(mt, "mask", f"off_m + qc * {smq}UL + ({key}) * {smk}UL")
            lines.append(f"const float mk{c} = " + (value if kv_full else f"({key} < {skv}UL) ? {value} : 0.0f") + ";")
    mask_loads = " ".join(lines)
    # scores: kc accumulators, the head dim in float4 steps (K rows t + T c of the tile)
    score = [" ".join(f"float s{c} = 0.0f;" for c in range(kc))]
    for i in range(nq4):
        score.append(" ".join(
            f"{{ const float4 k = L4(kl + t * {ks}u + {c * t_ * ks + 4 * i}u);"
            f" s{c} = fma(q{i}.x, k.x, fma(q{i}.y, k.y, fma(q{i}.z, k.z, fma(q{i}.w, k.w, s{c})))); }}"
            for c in range(kc)))
    post = []
    for c in range(kc):
        key = f"j0 + {c * t_}UL + t"
        if rounds:
            post.append(f"s{c} = {ops.score(f's{c}')};")
            if has_scale:
                post.append(f"s{c} = {ops.score(f's{c} * sc')};")
        if softcap:
            post.append(f"s{c} = {ops.score(f'cap * tanh(s{c})')};")
        if select is not None:
            scq, sck = sa["c"][-2:]
            cv = load(dtypes["select_mask"], "select_mask", f"off_c + qc * {scq}UL + ({key}) * {sck}UL")
            in_range = "" if kv_full else f"{key} < {skv}UL && "
            post.append(f"if ({in_range}{cv} {'!=' if select else '=='} 0.0f) s{c} = fl;")
        if has_mask:
            post.append(f"s{c} = {ops.score(f's{c} + mk{c}')};")
        conds = []
        if not kv_full:
            conds.append(f"{key} >= {skv}UL")
        if offset is not None and causal_fill:
            post.append(f"if ((long)({key}) > (long)qi + {offset}) s{c} = fl;")
        elif offset is not None:
            conds.append(f"(long)({key}) > (long)qi + {offset}")
        if conds:
            post.append(f"if ({' || '.join(conds)}) s{c} = -INFINITY;")
    top = " ".join(f"bm = fmax(bm, s{c});" for c in range(kc))
    exps = " ".join(f"const float p{c} = exp(s{c} - mz);" for c in range(kc))
    psum = " + ".join(f"p{c}" for c in range(kc))
    pv = []
    for e in range(nv4):
        terms = "".join(f" o{e} = fma((float4)(p{c}), L4(vl + t * {vs}u + {c * t_ * vs + 4 * e}u), o{e});"
                        for c in range(kc))
        pv.append(f"o{e} *= alpha;{terms}")
    kv_end = kv_end_code(None if causal_fill else f"g * {rows}UL + {rows - 1}UL", offset, skv)

    # Merge: chunks of ce O columns per pass through the tile area (row-padded by 4 floats).
    ce = dv4
    while local * (ce + 4) > tile_floats and ce > 4:
        ce = up4(ce // 2)
    merge = []
    for e0 in range(0, dv4, ce):
        n = min(ce, dv4 - e0)
        writes = " ".join(f"L4(tl + lid * {ce + 4}u + {4 * i}u) = o{(e0 // 4) + i} * fo;" for i in range(n // 4))
        out = store(dt, "dst", f"off_d + qi * {sdm}UL + (ulong)({e0}u + e) * {sdd}UL", ops.dst("acc * invo"))
        merge.append(f"""barrier(CLK_LOCAL_MEM_FENCE);
    {writes}
    barrier(CLK_LOCAL_MEM_FENCE);
    if (qi < {sq}UL) for (uint e = t; e < {min(n, dv - e0)}u; e += {t_}u) {{
        float acc = 0.0f;
        for (uint w = 0; w < {t_}u; ++w) acc += tl[(rw * {t_}u + w) * {ce + 4}u + e];
        {out}
    }}""")
    o_init = " ".join(f"float4 o{e} = (float4)(0.0f);" for e in range(nv4))
    score_code = chr(10).join("        " + s for s in score).lstrip()
    tile = f"""{mask_loads}
        barrier(CLK_LOCAL_MEM_FENCE);
        {k_copy}
        @V_COPY@
        barrier(CLK_LOCAL_MEM_FENCE);
        {score_code}
        {" ".join(post)}"""
    if ops.desc.probs_quant is None:
        main = f"""for (ulong j0 = 0; j0 < kv_end; j0 += {bk}UL) {{
        {tile.replace("@V_COPY@", v_copy)}
        float bm = m; {top}
        const float mz = bm == -INFINITY ? 0.0f : bm;
        const float alpha = exp(m - mz);
        {exps}
        l = l * alpha + ({psum});
        {chr(10).join("        " + s for s in pv).lstrip()}
        m = bm;
    }}"""
        second, scaling = "", "const float fo = f, invo = inv;"
    else:
        # Quantized probabilities need the row's final max and sum: a first pass over the keys
        # (K tiles only) makes each work-item's m and l, merged below; the second adds
        # Q(exp(s - M) / L) @ V, already normalised, with the first pass's scores kept in
        # registers (spilling to the L1-cached private memory) up to GPU_CACHED_SCORES a
        # work-item, recomputed past that.
        n_tiles = math.ceil(skv / bk)
        cached = n_tiles * kc <= GPU_CACHED_SCORES
        keep = " ".join(f"sv[(j0 / {bk}UL) * {kc}UL + {c}UL] = s{c};" for c in range(kc)) if cached else ""
        main = f"""for (ulong j0 = 0; j0 < kv_end; j0 += {bk}UL) {{
        {tile.replace("@V_COPY@", "")}
        {keep}
        float bm = m; {top}
        const float mz = bm == -INFINITY ? 0.0f : bm;
        const float alpha = exp(m - mz);
        {exps}
        l = l * alpha + ({psum});
        m = bm;
    }}"""
        probs = " ".join(f"const float p{c} = ll > 0.0f ? {ops.probability(f'exp(s{c} - mmz) / ll')} : 0.0f;"
                         for c in range(kc))
        pv_final = [p_line.replace(f"o{e} *= alpha;", "") for e, p_line in enumerate(pv)]
        reread = (f"barrier(CLK_LOCAL_MEM_FENCE); {v_copy} barrier(CLK_LOCAL_MEM_FENCE); "
                  + " ".join(f"const float s{c} = sv[(j0 / {bk}UL) * {kc}UL + {c}UL];" for c in range(kc)))
        second = f"""for (ulong j0 = 0; j0 < kv_end; j0 += {bk}UL) {{
        {reread if cached else tile.replace("@V_COPY@", v_copy)}
        {probs}
        {chr(10).join("        " + s for s in pv_final).lstrip()}
    }}"""
        scaling = "const float fo = 1.0f, invo = 1.0f;"
        if cached:
            main = f"float sv[{n_tiles * kc}];\n    " + main
    source = functions + "#define L4(p) (*(__local float4*)(p))\n" + f"""__attribute__((reqd_work_group_size({local}, 1, 1)))
{signature} {{
    __local float4 tl4[{tile_floats // 4}];
    __local float* const tl = (__local float*)tl4;
    __local float* const kl = tl;
    __local float* const vl = tl + {bk * ks};
    __local float red_m[{local}], red_l[{local}];
    const uint lid = get_local_id(0), t = lid % {t_}u, rw = lid / {t_}u;
    const ulong g = get_group_id(0), bi = get_group_id(1);
    {offsets}
    {scale_code}
    const ulong qi = g * {rows}UL + rw;
    const ulong qc = qi < {sq}UL ? qi : {sq - 1}UL;
    {q_copy}
    barrier(CLK_LOCAL_MEM_FENCE);
    {q_regs}
    {o_init}
    float m = -INFINITY, l = 0.0f;
    {kv_end}
    {main}
    red_m[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    float mm = -INFINITY;
    for (uint w = 0; w < {t_}u; ++w) mm = fmax(mm, red_m[rw * {t_}u + w]);
    const float mmz = mm == -INFINITY ? 0.0f : mm;
    const float f = exp(m - mmz);
    red_l[lid] = l * f;
    barrier(CLK_LOCAL_MEM_FENCE);
    float ll = 0.0f;
    for (uint w = 0; w < {t_}u; ++w) ll += red_l[rw * {t_}u + w];
    const float inv = ll > 0.0f ? 1.0f / ll : 0.0f;
    {f"if (qi < {sq}UL && t == 0u) stats[off_s + qi * {sa['s'][-2]}UL] = mm + log(ll);" if stats else ""}
    {second}
    {scaling}
    {chr(10).join("    " + s for s in merge).lstrip()}
}}
"""
    return KernelSpec(
        source=source,
        name="sdpa_fwd",
        arg_names=args,
        global_size=(groups * local, nbatch),
        local_size=(local, 1),
        impl=f"ocl:sdpa:wgsplit:q{rows}x{t_}:k{bk}:l{local}",
    )
