"""Fused attention on GPUs with both products register-blocked (``ocl:sdpa:flash``), as flash
attention 2 tiles it: one work-group of 256 per (batch index, block of BR query rows).

Per tile of BC keys: the work-group stages K in ``__local`` memory (d-major), computes the
``BR x BC`` scores as a small GEMM (each work-item 4 rows x BC*BR/1024 keys: a float4 of four
rows' q per head-dim step, reused over its keys), writes them to ``__local`` memory (key-major)
and stages V over K's buffer; the online softmax then runs 256 / BR work-items per row (each a
strided quarter or eighth of the tile's keys, the row's max and sum combined through
``__local`` memory), leaving ``p = exp(s - m')`` in place and each row's rescale factor; then
``O = O * alpha + P V`` runs as a second GEMM, each work-item 4 rows x Dv*BR/1024 columns of O
in registers, a float4 of four rows' p and a float4 of V per key. At the end ``dst = O / l``.
K and V tiles are loaded into registers one tile ahead (head sizes up to 64) and stored to local
memory when their turn comes, so their global latency overlaps the arithmetic. Under a causal mask the blocks of
rows run last first: they have the most key tiles, and starting them first leaves the device
the short ones to balance the end.

Why: the split kernel (``sdpa_gpu._gpu_split_generate``) gives each work-item one query row and a
sixteenth of the keys, so every K and V element read from local memory serves one FMA per row;
it ran 0.31-0.45x torch's fused SDPA on an H100 at head size 64, and the one-row-per-work-item
kernel taking D + Dv > 192 0.08-0.13x (BENCHMARKS.md §13). Blocked, each local read serves 4-8.

Applies (``flash_shape``) to float operands (f32, bf16, f16 storage) with any batch
broadcasting, a scale, an additive mask, an implicit causal mask filling with -inf (its offset
constant or read at run time) and statistics; head sizes up to 128. The graph's other variants
(soft-capping, Select masks, a causal fill value, quantized operands, rounded scores) stay on
``sdpa``'s kernels.
"""

from __future__ import annotations

import math

from .._values._sdpa_desc import SdpaDesc
from . import _dtype_io
from ._spec import KernelConfig, KernelSpec, up4
from .sdpa_gpu import kv_end_code

LOCAL = 256  # work-items per work-group
MAX_HEAD = 128  # D and Dv (rounded up to 4) at most: Q's block and a K or V tile in local memory


def flash_shape(desc: SdpaDesc, config: KernelConfig) -> tuple[int, int] | None:
    """(BR, BC): query rows per work-group and keys per tile, or None where the kernel does not
    apply (CPU shape, narrow work-groups, too little local memory, a variant it lacks)."""
    plain = (desc.query_quant is None and desc.key_quant is None and desc.value_quant is None
             and desc.probs_quant is None and desc.dst_quant is None and desc.score_rounding == "f32"
             and desc.softcap is None and desc.select_mask is None and desc.fill is None)
    d4, dv4 = up4(desc.query.dims[-1]), up4(desc.value.dims[-1])
    if not plain or config.vector_width != 1 or config.local_size < LOCAL or max(d4, dv4) > MAX_HEAD:
        return None
    # Head sizes over 64: 64 query rows against 16-key tiles where local memory holds them (48384
    # bytes at 128: NVIDIA's 48 KiB), else 32 x 32. Measured on an H200 (bench_sweep.py --family
    # sdpa --row d128, the four head-size-128 rows): 64 x 16 took 0.86-0.87x the time of 32 x 32
    # (0.38-0.40x torch's fused SDPA against 0.33-0.38x): each work-item holds 4 x 8 of O, so a
    # key's p and V reads serve 32 FMAs instead of 16, for twice the tiles' barriers.
    shapes = ((64, 32),) if max(d4, dv4) <= 64 else ((64, 16), (32, 32))
    for br, bc in shapes:
        if _local_floats(br, bc, d4, dv4) * 4 <= config.local_memory:
            return br, bc
    return None


def _local_floats(br: int, bc: int, d4: int, dv4: int) -> int:
    return br * d4 + bc * max(d4, dv4 + 4) + bc * (br + 4) + 3 * br + 2 * LOCAL


def generate(*, shape, sq, skv, d, dv, nbatch, offsets, sa, has_mask, has_scale, scale_code, offset, dtypes,
             signature, functions, args, stats, **_) -> KernelSpec:
    """The kernel for ``sdpa.generate``'s common arguments (the variants ``flash_shape`` lets
    through)."""
    br, bc = shape
    qt, kt, vt, mt, dt = (dtypes[n] for n in ("query", "key", "value", "mask", "dst"))
    load, store = _dtype_io.load, _dtype_io.store
    d4, dv4 = up4(d), up4(dv)
    brp = br + 4  # P's rows (one per key) padded: float4 reads of 4 query rows stay aligned
    vp = dv4 + 4  # V's rows padded
    sqm, sqd = sa["q"][-2:]
    skj, skd = sa["k"][-2:]
    svj, svd = sa["v"][-2:]
    sdm, sdd = sa["d"][-2:]
    smq, smk = sa["m"][-2:] if has_mask else (0, 0)
    ty_n = br // 4  # row quads
    tx_n = LOCAL // ty_n  # work-items per row quad
    sc_n = bc // tx_n  # keys per work-item in the score GEMM (interleaved: key tx + tx_n * j)
    oc_n = math.ceil(dv4 / tx_n)  # O columns per work-item (interleaved: column tx + tx_n * j)
    parts = LOCAL // br  # work-items per row in the softmax
    kp = bc // parts  # keys per work-item there
    kv_full = skv % bc == 0

    q_copy = (f"for (uint u = lid; u < {br * d4}u; u += {LOCAL}u) {{ const uint r = u / {d4}u, c = u % {d4}u; "
              f"const ulong qi = r0 + r; "
              f"qs[c * {br}u + r] = (qi < {sq}UL && c < {d}u) ? "
              f"{load(qt, 'query', f'off_q + qi * {sqm}UL + (ulong)c * {sqd}UL')}{' * sc' if has_scale else ''} : 0.0f; }}")
    # K and V tiles pass through registers: the next tile's global loads are issued before the
    # current tile's arithmetic and stored to local memory after it (as matmul_gpu's slabs).
    def staged(tag: str, width: int, ext: int, ptr: str, dtype: str, s_row: int, s_col: int, at: str):
        total = bc * width
        n = math.ceil(total / LOCAL)
        loads, stores = [], []
        for i in range(n):
            u = f"(lid + {i * LOCAL}u)"
            guard = total % LOCAL != 0 and i == n - 1
            value = load(dtype, ptr, f"off_{tag} + (jn + {u} / {width}u) * {s_row}UL + (ulong)({u} % {width}u) * {s_col}UL")
            conds = [f"jn + {u} / {width}u < {skv}UL"] if not kv_full else []
            if width > ext:
                conds.append(f"{u} % {width}u < {ext}u")
            if guard:
                conds.append(f"{u} < {total}u")
            loads.append(f"{tag}r{i} = ({' && '.join(conds)}) ? {value} : 0.0f;" if conds else f"{tag}r{i} = {value};")
            store = f"kv[{at.format(j=f'{u} / {width}u', c=f'{u} % {width}u')}] = {tag}r{i};"
            stores.append(f"if ({u} < {total}u) {store}" if guard else store)
        declare = "float " + ", ".join(f"{tag}r{i} = 0.0f" for i in range(n)) + ";"
        return declare, " ".join(loads), " ".join(stores)

    # One tile ahead only where a tile is 8 floats a work-item: at head size 128 (16 + 16 more
    # registers) it ran 1.2x slower on an H200 (bench_sweep.py --family sdpa, masked rows).
    ahead = bc * max(d4, dv4) <= 8 * LOCAL
    k_declare, k_load, k_store = staged("k", d4, d, "key", kt, skj, skd, f"({{c}}) * {bc}u + {{j}}")
    v_declare, v_load, v_store = staged("v", dv4, dv, "value", vt, svj, svd, f"({{j}}) * {vp}u + {{c}}")

    # Scores: rows ty*4 + i, keys tx * sc_n + j (one float2 read for two keys: a warp's reads of
    # K then take one pass over the banks, and with q's broadcast float4 that is 2 reads per 8 FMAs).
    acc = " ".join(f"float s{i}_{j} = 0.0f;" for i in range(4) for j in range(sc_n))
    fmas = " ".join(f"s{i}_{j} += q.s{i} * k.s{j};" if sc_n > 1 else f"s{i}_{j} += q.s{i} * k;"
                    for i in range(4) for j in range(sc_n))
    vec = {1: "float", 2: "float2", 4: "float4"}
    kreads = f"const {vec[sc_n]} k = *(__local {vec[sc_n]}*)(kv + c * {bc}u + tx * {sc_n}u);"
    score_post = []
    for i in range(4):
        for j in range(sc_n):
            s = f"s{i}_{j}"
            key, row = f"(j0 + tx * {sc_n}UL + {j}UL)", f"(r0 + ty * 4UL + {i}UL)"
            conds = [] if kv_full else [f"{key} >= {skv}UL"]
            if offset is not None:
                conds.append(f"(long){key} > (long){row} + {offset}")
            if has_mask:
                mrow = f"min({row}, {sq - 1}UL)"
                value = load(mt, "mask", f"off_m + {mrow} * {smq}UL + {key} * {smk}UL")
                score_post.append(f"{s} += {value};" if kv_full else f"if ({key} < {skv}UL) {s} += {value};")
            if conds:
                score_post.append(f"if ({' || '.join(conds)}) {s} = -INFINITY;")
            score_post.append(f"ps[(tx * {sc_n}u + {j}u) * {brp}u + ty * 4u + {i}u] = {s};")

    # Softmax: row lid / parts, keys part + parts * i.
    keys = [f"(part + {parts * i}u) * {brp}u + srow" for i in range(kp)]
    smax = " ".join(f"mx = fmax(mx, ps[{k}]);" for k in keys)
    sexp = " ".join(f"{{ const float p = exp(ps[{k}] - mz); ps[{k}] = p; sum += p; }}" for k in keys)

    # P V: rows ty*4 + i, columns tx * oc_n + j (a float4 read of V where oc_n is 4; columns
    # past Dv4 neither read nor stored).
    cols = [(j, f"tx * {oc_n}u + {j}u") for j in range(oc_n)]
    o_init = " ".join(f"float o{i}_{j} = 0.0f;" for i in range(4) for j in range(oc_n))
    rescale = " ".join(f"o{i}_{j} *= al.s{i};" for i in range(4) for j in range(oc_n))
    if oc_n in vec and dv4 % oc_n == 0 and tx_n * oc_n == dv4:
        vreads = f"const {vec[oc_n]} v = *(__local {vec[oc_n]}*)(kv + j * {vp}u + tx * {oc_n}u);"
        vname = (lambda j: f"v.s{j}") if oc_n > 1 else (lambda j: "v")
    elif oc_n == 8 and tx_n * oc_n == dv4:
        # Two float4 reads (PoCL crashed building a float8 read of __local memory).
        vreads = " ".join(f"const float4 v{h} = *(__local float4*)(kv + j * {vp}u + tx * 8u + {4 * h}u);"
                          for h in range(2))
        vname = lambda j: f"v{j // 4}.s{j % 4}"  # noqa: E731
    else:
        vreads = " ".join(f"const float v{j} = ({c} < {dv4}u) ? kv[j * {vp}u + {c}] : 0.0f;" for j, c in cols)
        vname = lambda j: f"v{j}"  # noqa: E731
    pv_fmas = " ".join(f"o{i}_{j} += p.s{i} * {vname(j)};" for i in range(4) for j in range(oc_n))
    stores = []
    for i in range(4):
        row = f"(r0 + ty * 4UL + {i}UL)"
        for j, c in cols:
            conds = [f"{row} < {sq}UL", f"{c} < {dv}u"]
            value = f"o{i}_{j} * inv.s{i}"
            stores.append(f"if ({' && '.join(conds)}) "
                          f"{store(dt, 'dst', f'off_d + {row} * {sdm}UL + (ulong)({c}) * {sdd}UL', value)}")

    kv_end = kv_end_code(f"r0 + {br - 1}UL < {sq - 1}UL ? r0 + {br - 1}UL : {sq - 1}UL", offset, skv)
    prologue = f"if (kv_end > 0UL) {{ const ulong jn = 0UL; {k_load} {v_load} }}" if ahead else ""
    stats_store = (f"if (part == 0u && r0 + srow < {sq}UL) stats[off_s + (r0 + srow) * {sa['s'][-2]}UL] = "
                   f"ms[srow] + log(ls[srow]);" if stats else "")

    source = functions + f"""__attribute__((reqd_work_group_size({LOCAL}, 1, 1)))
{signature} {{
    __local float4 qs4[{br * d4 // 4}];
    __local float4 kv4[{(bc * max(d4, vp) + 3) // 4}];
    __local float4 ps4[{bc * brp // 4}];
    __local float4 ms4[{br // 4}], ls4[{br // 4}], al4[{br // 4}];
    __local float red_m[{LOCAL}], red_s[{LOCAL}];
    __local float* const ms = (__local float*)ms4;
    __local float* const ls = (__local float*)ls4;
    __local float* const als = (__local float*)al4;
    __local float* const qs = (__local float*)qs4;
    __local float* const kv = (__local float*)kv4;
    __local float* const ps = (__local float*)ps4;
    const uint lid = get_local_id(0);
    const uint ty = lid / {tx_n}u, tx = lid % {tx_n}u;   /* the two GEMMs */
    const uint srow = lid / {parts}u, part = lid % {parts}u;   /* the softmax */
    const ulong g = {f"{math.ceil(sq / br) - 1}UL - get_group_id(0)" if offset is not None else "get_group_id(0)"};
    const ulong bi = get_group_id(1);
    const ulong r0 = g * {br}UL;
    {offsets}
    {scale_code}
    {q_copy}
    if (lid < {br}u) {{ ms[lid] = -INFINITY; ls[lid] = 0.0f; }}
    {o_init}
    {kv_end}
    {k_declare} {v_declare}
    {prologue}
    for (ulong j0 = 0; j0 < kv_end; j0 += {bc}UL) {{
        {"const ulong jn = j0 + " + str(bc) + "UL;" if ahead else "const ulong jn = j0;"}
        barrier(CLK_LOCAL_MEM_FENCE);
        {k_store if ahead else k_load + " " + k_store}
        barrier(CLK_LOCAL_MEM_FENCE);
        {f"if (jn < kv_end) {{ {k_load} }}" if ahead else ""}
        {acc}
        #pragma unroll 4
        for (uint c = 0; c < {d4}u; ++c) {{
            const float4 q = *(__local float4*)(qs + c * {br}u + ty * 4u);
            {kreads}
            {fmas}
        }}
        {" ".join(score_post)}
        barrier(CLK_LOCAL_MEM_FENCE);
        {v_store if ahead else v_load + " " + v_store}
        {f"if (jn < kv_end) {{ {v_load} }}" if ahead else ""}
        {{
            float mx = -INFINITY; {smax}
            red_m[lid] = mx;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        {{
            const float m_old = ms[srow];
            float mb = m_old;
            for (uint w = 0; w < {parts}u; ++w) mb = fmax(mb, red_m[srow * {parts}u + w]);
            const float mz = mb == -INFINITY ? 0.0f : mb;
            float sum = 0.0f; {sexp}
            red_s[lid] = sum;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (part == 0u) {{
                float total = 0.0f;
                for (uint w = 0; w < {parts}u; ++w) total += red_s[srow * {parts}u + w];
                const float alpha = exp(m_old - mz);
                ls[srow] = ls[srow] * alpha + total;
                ms[srow] = mb;
                als[srow] = alpha;
            }}
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        {{
            const float4 al = al4[ty];
            {rescale}
        }}
        #pragma unroll 4
        for (uint j = 0; j < {bc}u; ++j) {{
            const float4 p = *(__local float4*)(ps + j * {brp}u + ty * 4u);
            {vreads}
            {pv_fmas}
        }}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    {stats_store}
    const float4 lv = ls4[ty];
    const float4 inv = (float4)(lv.s0 > 0.0f ? 1.0f / lv.s0 : 0.0f, lv.s1 > 0.0f ? 1.0f / lv.s1 : 0.0f,
                                lv.s2 > 0.0f ? 1.0f / lv.s2 : 0.0f, lv.s3 > 0.0f ? 1.0f / lv.s3 : 0.0f);
    {chr(10).join("    " + s for s in stores).lstrip()}
}}
"""
    return KernelSpec(
        source=source,
        name="sdpa_fwd",
        arg_names=args,
        global_size=(math.ceil(sq / br) * LOCAL, nbatch),
        local_size=(LOCAL, 1),
        impl=f"ocl:sdpa:flash:q{br}:k{bc}:l{LOCAL}",
    )
