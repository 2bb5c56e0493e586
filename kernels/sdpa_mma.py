"""Fused attention on NVIDIA tensor cores (``ocl:sdpa:mma``): bf16 or f16 Q, K and V, both
products by ``mma.sync.m16n8k16`` with f32 sums, as flash attention 2 tiles them.

A work-group of 4 warps takes 64 query rows (16 a warp) of one batch index. Q's block passes
through local memory once (``cp.async``) into each warp's registers as ``ldmatrix`` fragments.
Per tile of 64 keys: K's tile arrives by ``cp.async`` while the previous tile's P V ran, V's
while the scores are made; the scores ``S = Q K^T`` come from ``ldmatrix`` fragments of K (its
rows are K-contiguous, as a transposed weights' are) into 16 x 8 f32 accumulators, which hold a
lane's two rows (``lane / 4`` and 8 below) at two neighbouring keys each. The online softmax
runs on those registers: a row's maximum and sum combine the 4 lanes of a quad by ``shfl``; the
probabilities, rounded to the operand type two at a time (``cvt.rn.{bf16,f16}x2.f32``), are
already in the layout of the second product's A fragments (two score tiles of 8 keys make one
16-deep k step), and V's fragments come by ``ldmatrix.trans`` (V is N-contiguous). At the end
``dst = O / l``.

Applies (``applies``) on NVIDIA sm_80+ to float Q, K, V of one 16-bit type, head sizes multiples
of 16 up to 128, the last dim of each contiguous and every other stride a multiple of 8 elements:
a scale, an additive mask, an implicit causal mask filling with -inf (its offset constant or read
at run time) and statistics, as ``sdpa_flash``. The other variants stay on ``sdpa``'s kernels.
"""

from __future__ import annotations

import math

from .._values._sdpa_desc import SdpaDesc
from . import _dtype_io
from ._spec import KernelConfig, KernelSpec
from .matmul_mma import LOCAL_MEMORY, MIN_SM, ptx_helpers
from .sdpa_gpu import kv_end_code

BR = 64  # query rows per work-group: 4 warps of 16
BC = 64  # keys per tile
THREADS = 128
MAX_HEAD = 128
_CHUNK = 8  # halves per 16-byte copy
TYPES = ("bf16", "f16")
# Whether ``sdpa.generate`` picks this kernel by itself. Off until test_sdpa_mma.py and
# ``bench_sweep.py --family sdpa --dtype bf16`` have run on an NVIDIA GPU: written in a session
# whose device time was spent, its results are checked only with its PTX emulated under Oclgrind
# (tests/kernels/test_tensor_core_emulation.py). ``sdpa.generate(..., tensor_cores=True)`` builds it.
# Choosing it also means sdpa's registered tolerance for 16-bit operands must allow the
# probabilities' rounding to the operand type (up to its unit roundoff times max |v|).
CHOSEN = False


def _aligned(md) -> bool:
    return md.strides[-1] == 1 and all(s % _CHUNK == 0 for s, d in zip(md.strides[:-1], md.dims[:-1]) if d > 1)


def local_bytes(d: int, dv: int) -> int:
    """K's and V's tiles (rows padded by 16 bytes), Q's block passing through the same space."""
    return max(BR * (d + _CHUNK), BC * (d + _CHUNK) + BC * (dv + _CHUNK)) * 2


def applies(desc: SdpaDesc, config: KernelConfig) -> bool:
    plain = (desc.query_quant is None and desc.key_quant is None and desc.value_quant is None
             and desc.probs_quant is None and desc.dst_quant is None and desc.score_rounding == "f32"
             and desc.softcap is None and desc.select_mask is None and desc.fill is None)
    d, dv = desc.query.dims[-1], desc.value.dims[-1]
    return (plain and config.nvidia_sm >= MIN_SM and desc.query.dtype in TYPES
            and desc.key.dtype == desc.value.dtype == desc.query.dtype
            and d % 16 == 0 and dv % 16 == 0 and max(d, dv) <= MAX_HEAD
            and all(_aligned(md) for md in (desc.query, desc.key, desc.value))
            and config.local_size >= THREADS and local_bytes(d, dv) <= min(config.local_memory, LOCAL_MEMORY))


def warp_helpers(dtype: str) -> str:
    """``shfl_xor`` (a butterfly exchange across a warp) and ``pack2`` (two f32 rounded into one
    register of the operand type, ``lo`` in the low half), as inline PTX."""
    return f"""static inline float shfl_xor(float v, uint mask) {{
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
    return r;
}}
static inline uint pack2(float lo, float hi) {{
    uint d;
    asm("cvt.rn.{dtype}x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}}
"""


def generate(*, sq, skv, d, dv, nbatch, offsets, sa, has_mask, has_scale, scale_code, offset, dtypes,
             signature, functions, args, stats, **_) -> KernelSpec:
    """The kernel for ``sdpa.generate``'s common arguments (the variants ``applies`` lets through)."""
    mt, dt = dtypes["mask"], dtypes["dst"]
    load, store = _dtype_io.load, _dtype_io.store
    ldk, ldv = d + _CHUNK, dv + _CHUNK  # local row pitches, halves
    v_at = BC * ldk * 2  # V's tile after K's, bytes
    sqm, skj, svj = sa["q"][-2], sa["k"][-2], sa["v"][-2]
    sdm, sdd = sa["d"][-2:]
    smq, smk = sa["m"][-2:] if has_mask else (0, 0)
    nt_s, nt_o, ks_q = BC // 8, dv // 8, d // 16

    def copies(rows: int, width: int, pitch: int, base: str, ptr: str, off: str, row0: str, limit: int,
               stride: int) -> str:
        """cp.async of ``rows`` rows of ``width`` halves from ``row0`` (rows from ``limit`` on
        zero-filled, their address clamped) to local memory at ``base``."""
        chunks = rows * width // _CHUNK
        out = []
        for i in range(math.ceil(chunks / THREADS)):
            c = f"(tid + {i * THREADS}u)"
            row, col = f"{c} / {width // _CHUNK}u", f"({c} % {width // _CHUNK}u) * {_CHUNK}u"
            at = f"{row0} + {row}"
            body = (f"cp_async16({base} + ({row} * {pitch}u + {col}) * 2u, "
                    f"(ulong)({ptr} + {off} + min({at}, {limit - 1}UL) * {stride}UL + {col}), "
                    f"{at} < {limit}UL ? 16u : 0u);")
            out.append(f"if ({c} < {chunks}u) {body}" if chunks % THREADS else body)
        return " ".join(out)

    q_copy = copies(BR, d, ldk, "kv_base", "query", "off_q", "r0", sq, sqm)
    k_copy = copies(BC, d, ldk, "kv_base", "key", "off_k", "jk", skv, skj)
    v_copy = copies(BC, dv, ldv, f"(kv_base + {v_at}u)", "value", "off_v", "j0", skv, svj)
    q_frags = " ".join(
        f"ldsm_x4(kv_base + ((warp * 16u + lane % 16u) * {ldk}u + {t * 16}u + (lane / 16u) * 8u) * 2u, "
        f"&q{t}_0, &q{t}_1, &q{t}_2, &q{t}_3);" for t in range(ks_q))

    # S = Q K^T: K's rows are keys, K-contiguous (the B operand's "col" layout, ldmatrix plain).
    scores = []
    for t in range(ks_q):
        for nj in range(BC // 16):
            address = (f"kv_base + ((({nj * 16}u + lane % 8u + (lane / 16u) * 8u) * {ldk}u) + {t * 16}u"
                       f" + ((lane / 8u) % 2u) * 8u) * 2u")
            scores.append(f"ldsm_x4({address}, &b0, &b1, &b2, &b3);")
            for half, (x, y) in enumerate((("b0", "b1"), ("b2", "b3"))):
                s = ", ".join(f"s{2 * nj + half}_{r}" for r in range(4))
                scores.append(f"MMA({s}, q{t}_0, q{t}_1, q{t}_2, q{t}_3, {x}, {y});")

    # Each score: scaled, masked, out of range or above the causal diagonal to -inf.
    post = []
    for nt in range(nt_s):
        for r in range(4):
            s = f"s{nt}_{r}"
            key, row = f"(j0 + {nt * 8 + r % 2}UL + (lane % 4u) * 2UL)", f"(rw + {(r // 2) * 8}UL)"
            if has_scale:
                post.append(f"{s} *= sc;")
            if has_mask:
                value = load(mt, "mask", f"off_m + min({row}, {sq - 1}UL) * {smq}UL + {key} * {smk}UL")
                post.append(f"if ({key} < {skv}UL) {s} += {value};")
            conds = [f"{key} >= {skv}UL"] + ([f"(long){key} > (long){row} + {offset}"] if offset is not None else [])
            post.append(f"if ({' || '.join(conds)}) {s} = -INFINITY;")

    def row_reduce(var: str, op: str) -> str:
        return " ".join(f"{var} = {op.format(a=var, b=f'shfl_xor({var}, {m}u)')};" for m in (1, 2))

    lo = [f"s{nt}_{r}" for nt in range(nt_s) for r in (0, 1)]
    hi = [f"s{nt}_{r}" for nt in range(nt_s) for r in (2, 3)]
    softmax = [
        f"float mx_lo = fmax({lo[0]}, {lo[1]}), mx_hi = fmax({hi[0]}, {hi[1]});",
        " ".join(f"mx_lo = fmax(mx_lo, {a}); mx_hi = fmax(mx_hi, {b});" for a, b in zip(lo[2:], hi[2:])),
        row_reduce("mx_lo", "fmax({a}, {b})"), row_reduce("mx_hi", "fmax({a}, {b})"),
        "const float mn_lo = fmax(m_lo, mx_lo), mn_hi = fmax(m_hi, mx_hi);",
        "const float mz_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, mz_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;",
        "const float al_lo = exp(m_lo - mz_lo), al_hi = exp(m_hi - mz_hi);",
        "m_lo = mn_lo; m_hi = mn_hi;",
        "float sum_lo = 0.0f, sum_hi = 0.0f;",
        " ".join(f"{a} = exp({a} - mz_lo); sum_lo += {a};" for a in lo),
        " ".join(f"{b} = exp({b} - mz_hi); sum_hi += {b};" for b in hi),
        "l_lo = l_lo * al_lo + sum_lo; l_hi = l_hi * al_hi + sum_hi;",
        " ".join(f"o{nt}_0 *= al_lo; o{nt}_1 *= al_lo; o{nt}_2 *= al_hi; o{nt}_3 *= al_hi;" for nt in range(nt_o)),
    ]

    # O += P V: two score tiles (16 keys) are one k step's A fragments; V by ldmatrix.trans.
    pv = []
    for t in range(BC // 16):
        e, o = 2 * t, 2 * t + 1
        pv.append(f"{{ const uint p0 = pack2(s{e}_0, s{e}_1), p1 = pack2(s{e}_2, s{e}_3), "
                  f"p2 = pack2(s{o}_0, s{o}_1), p3 = pack2(s{o}_2, s{o}_3);")
        for nj in range(dv // 16):
            address = f"kv_base + {v_at}u + (({t * 16}u + lane % 16u) * {ldv}u + {nj * 16}u + (lane / 16u) * 8u) * 2u"
            pv.append(f"ldsm_x4_trans({address}, &b0, &b1, &b2, &b3);")
            for half, (x, y) in enumerate((("b0", "b1"), ("b2", "b3"))):
                acc = ", ".join(f"o{2 * nj + half}_{r}" for r in range(4))
                pv.append(f"MMA({acc}, p0, p1, p2, p3, {x}, {y});")
        pv.append("}")

    stores = []
    for r_half, (rowv, inv) in enumerate((("rw", "inv_lo"), ("rw + 8UL", "inv_hi"))):
        cols = []
        for nt in range(nt_o):
            for c in range(2):
                col = f"({nt * 8 + c}u + (lane % 4u) * 2u)"
                value = f"o{nt}_{2 * r_half + c} * {inv}"
                cols.append(store(dt, "dst", f"off_d + row * {sdm}UL + (ulong){col} * {sdd}UL", value))
        stores.append(f"{{ const ulong row = {rowv}; if (row < {sq}UL) {{ {' '.join(cols)} }} }}")
    stats_store = ""
    if stats:
        ss = sa["s"][-2]
        stats_store = ("if (lane % 4u == 0u) { "
                       f"if (rw < {sq}UL) stats[off_s + rw * {ss}UL] = m_lo + log(l_lo); "
                       f"if (rw + 8UL < {sq}UL) stats[off_s + (rw + 8UL) * {ss}UL] = m_hi + log(l_hi); }}")

    kv_end = kv_end_code(f"r0 + {BR - 1}UL < {sq - 1}UL ? r0 + {BR - 1}UL : {sq - 1}UL", offset, skv)
    q_regs = ", ".join(f"q{t}_{j}" for t in range(ks_q) for j in range(4))
    s_regs = ", ".join(f"s{nt}_{r} = 0.0f" for nt in range(nt_s) for r in range(4))
    o_regs = ", ".join(f"o{nt}_{r} = 0.0f" for nt in range(nt_o) for r in range(4))
    helpers = functions + ptx_helpers(dtypes["query"]) + warp_helpers(dtypes["query"])
    source = helpers + f"""__attribute__((reqd_work_group_size({THREADS}, 1, 1)))
{signature} {{
    __local uint4 KV[{local_bytes(d, dv) // 16}];
    const uint kv_base = (uint)(size_t)KV;
    const uint tid = get_local_id(0), lane = tid % 32u, warp = tid / 32u;
    const ulong g = {f"{math.ceil(sq / BR) - 1}UL - get_group_id(0)" if offset is not None else "get_group_id(0)"};
    const ulong bi = get_group_id(1);
    const ulong r0 = g * {BR}UL, rw = r0 + warp * 16u + lane / 4u;
    {offsets}
    {scale_code}
    {q_copy}
    cp_async_commit();
    cp_async_wait_0();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint {q_regs}, b0, b1, b2, b3;
    {q_frags}
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    float {o_regs};
    {kv_end}
    barrier(CLK_LOCAL_MEM_FENCE);
    if (kv_end > 0UL) {{ const ulong jk = 0UL; {k_copy} }}
    cp_async_commit();
    for (ulong j0 = 0; j0 < kv_end; j0 += {BC}UL) {{
        cp_async_wait_0();
        barrier(CLK_LOCAL_MEM_FENCE);
        {v_copy}
        cp_async_commit();
        float {s_regs};
        {(chr(10) + "        ").join(scores)}
        {" ".join(post)}
        {(chr(10) + "        ").join(softmax)}
        cp_async_wait_0();
        barrier(CLK_LOCAL_MEM_FENCE);
        if (j0 + {BC}UL < kv_end) {{ const ulong jk = j0 + {BC}UL; {k_copy} }}
        cp_async_commit();
        {(chr(10) + "        ").join(pv)}
    }}
    {row_reduce("l_lo", "{a} + {b}")} {row_reduce("l_hi", "{a} + {b}")}
    {stats_store}
    const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
    {(chr(10) + "    ").join(stores)}
}}
"""
    return KernelSpec(
        source=source,
        name="sdpa_fwd",
        arg_names=args,
        global_size=(math.ceil(sq / BR) * THREADS, nbatch),
        local_size=(THREADS, 1),
        impl=f"ocl:sdpa:mma:q{BR}:k{BC}:l{THREADS}",
    )
