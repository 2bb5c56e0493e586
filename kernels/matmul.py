"""Matmul forward: ``dst[..., m, n] = sum_k src[..., m, k] * weights[..., k, n] + bias``.

Batch dimensions broadcast as numpy's ``matmul`` does; any strides (a transposed input is just
swapped strides). Each work-item keeps a ``TM x TN`` block of ``dst`` in registers and walks K once:
register blocking, no local memory (on PoCL's CPU device local-memory tiling with barriers is
slower: accumulators spill at every barrier). Work-items whose block lies inside the matrix take a
path without bounds checks; edge blocks check each row and column. That is the GPU kernel for
small dst (``matmul_gpu``'s tiled SGEMM takes dst of 64 x 64+, ``matmul_skinny``'s K split across a
work-group takes small dst with long K: ``generate``); the CPU device (``vector_width`` 16) gets
``_cpu_generate``'s: the same register blocking inside a GotoBLAS-like work-item that copies its
weights panel to __local memory by K chunks (no barriers), its epilogue a function of its own
where there are post-ops.

``src``, ``weights``, ``bias`` and ``dst`` each have any storage type of ``_dtype_io.DTYPES`` (f32
math, as oneDNN's bf16/f16 matmul accumulates in f32): every element converts to float as it is
loaded, inside the same register blocking, and the result converts to dst's type as it is stored.
Integer inputs accumulate in f32 too, so integer sums are exact only below 2**24. The all-f32
kernel is the plain one (no conversion helpers).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._values._matmul_desc import MatmulDesc
from . import _dtype_io, _post_ops, matmul_gpu, matmul_mma, matmul_skinny, tolerance
from ._post_ops import aligned_strides, generate_scaled
from ._registry import register
from ._spec import KernelConfig, KernelSpec, index_code, padded_global


def tiles(config: KernelConfig) -> tuple[int, int, tuple[int, int]]:
    """Block rows, block columns and the (n, m) work-group shape for a device configuration.

    CPU (16-wide vectors): 16 x 16 blocks, each row of the block one float16 FMA chain (16 of
    AVX-512's 32 registers); measured on PoCL at 1024^3: 4 x 16 gave 55 GFLOP/s, 8 x 16 80,
    16 x 16 98 (numpy 200+ on the same 2 cores). ``generate`` no longer uses the CPU answer: the CPU
    path is ``_cpu_generate`` (``_cpu_tile``). GPU: 4 x 4 blocks in 16 x 16 work-groups.
    """
    if config.vector_width >= 16:
        return 16, 16, (1, 1)
    side = max(1, int(math.isqrt(config.local_size)))
    return 4, 4, (side, side)


# -- CPU (PoCL) path -------------------------------------------------------------------------------
#
# GotoBLAS-like, inside one work-item (work-groups of one, so no barriers): each work-item owns a
# column panel of dst (CPU_TN columns) and up to CPU_MC rows. For each chunk of CPU_KC rows of K it
# copies its panel of weights (CPU_KC x CPU_TN) into __local memory, contiguous and converted to
# float, zero past N (weights contiguous along K are transposed 16 x 16 in registers); then it runs
# micro-tiles down its rows: CPU_TM x CPU_TN = 24 float16 accumulators, 4 weight vectors and one
# broadcast of src per k (AVX-512 has 32 registers), K loop unrolled CPU_UNROLL times. Partial sums
# between chunks wait in __local memory. The copy makes the weights reads unit-stride whatever
# their layout (a power-of-two row stride otherwise lands every row in one L1 set) and is paid
# once per CPU_MC rows. A micro-tile crossing M moves up to end at row M, so src rows are always
# one base plus constant offsets (per-row clamped pointers made LLVM vectorise the address
# arithmetic inside the K loop).
#
# Measured (PoCL 3.0 / LLVM 14, 2-core AVX-512 Xeon shared with other jobs, best of N, GFLOP/s at
# 1024^3 unless said): the previous 16x16 kernel 87; 8x32 reading weights in place 95, weights
# pre-packed by the host 107, copied in the kernel 175, plus K chunks of 256 199 (numpy 115 in that
# run). Without mm_wide (ymm code) 8x32 pre-packed 65 vs 70. 16x32 spills (32 accumulators).
# 6x64 vs 8x32 at 2048: 251-267 vs 209-237 over four runs, at 1024 within noise; unroll 4 at 2048
# 274 vs 252. Not better: KC 64/128/512, MC 64/128, 12x32, 4x96, 5x64, src rows padded off 4 KiB.

CPU_TM, CPU_TN, CPU_KC, CPU_MC, CPU_UNROLL, CPU_ITEMS = 6, 64, 256, 256, 4, 16
CPU_TM_NARROW = 6  # rows of the micro-tile where float16 is two registers (16 columns)


def _cpu_tile(m: int, n: int, native_vector_width: int = 16) -> tuple[int, int]:
    """Micro-tile rows x columns: CPU_TM x CPU_TN (24 float16 accumulators) where N fills it,
    else 8 x 32 or 16 x 16 (16 accumulators), so narrow matrices compute fewer padding columns.
    M <= 8 takes 8 x 32 (one micro-tile of M rows reading the weights in place: 8x1024x1024 54
    GFLOP/s against 37 with two 4 x 64 tiles).

    Where a float16 takes two registers (AVX2: 16 of 8 floats), CPU_TM_NARROW x 16: six float16
    accumulators in 12 registers, BLIS's Haswell block. Measured on PoCL, 2-core AMD EPYC with
    AVX2 (a side script patching ``_cpu_tile`` per build, best of 5, GFLOP/s at 1024^3 /
    2048^3): 6x64 54.5 / 55.4, 6x16 132 / 145, 5x16 - / 133, 4x16 138 / 128, 3x32 111 / 112,
    8x16 74 / -, 4x32 69 / -, 2x64 65 / - (numpy 125 / 137). A few rows (M <= 3, matrix-vector
    products, memory-bound) take wider panels, each work-item reading 128-256 contiguous bytes
    of a weights row: 4096 x 4096 weights, ms, M = 1: 1x16 8.0, 1x32 3.8, 1x64 3.0 (numpy 2.3);
    M = 2: 2x16 7.4, 2x32 4.5, 2x64 4.4 (numpy 6.2); M = 3: 3x16 7.4, 3x32 5.1 (numpy 6.9).
    9-16 rows take 3 x 32 too: 16x4096x4096 6x16 11.5, 3x32 9.1, 1x64 11.3 (numpy 9.9);
    16x32768x1024 26.1 against 19.8 (numpy 15.8); at 24 rows and at 8 (4 x 16: 0.27 against
    0.35 ms for 8x32768x32) the 16-wide blocks stay as fast or faster."""
    if native_vector_width < 16:
        if m == 1:
            return 1, 64
        if m <= 3 or (9 <= m <= 16 and n >= 32):
            return min(m, 3), 32
        return CPU_TM_NARROW, 16
    if n >= CPU_TN and m > 8:
        return CPU_TM, CPU_TN
    return (8, 32) if n > 16 else (16, 16)

# LLVM prefers 256-bit vectors on this CPU and splits float16 into two ymm halves unless the
# function's "min-legal-vector-width" says 512; calling any function that takes a float16 sets it.
_CPU_PRELUDE = (
    "typedef float16 __attribute__((aligned(4))) mm_float16u;\n"  # unaligned float16 access
    "static float16 mm_wide(const float16 x) { return x; }\n"
    "#define MM_MIN(a, b) ((a) < (b) ? (a) : (b))\n"  # OpenCL's min() stays a call on PoCL
)


def _cpu_rows_per_item(m: int, n_panels: int, nbatch: int, tm: int) -> int:
    """Rows per work-item, a multiple of ``tm``: at most CPU_MC, fewer while that leaves under
    CPU_ITEMS work-items (load balance over the cores), then evened out over the row blocks."""
    tiles = math.ceil(m / tm)
    blocks = math.ceil(tiles / max(1, CPU_MC // tm))
    while blocks < tiles and n_panels * blocks * nbatch < CPU_ITEMS:
        blocks += 1
    return math.ceil(tiles / blocks) * tm


def _cpu_local_bytes(k: int, kc: int, mc: int, tm: int, nv: int) -> int:
    """__local bytes of a work-item: the weights panel (kc x 16nv floats), the edge tile and,
    where K takes several chunks, the partial sums of its mc rows."""
    return 64 * nv * (kc + tm + (mc if k > kc else 0))


def _cpu_fit_local(k: int, kc: int, mc: int, tm: int, nv: int, budget: int) -> tuple[int, int]:
    """Halve the K chunk or the rows per work-item, the larger first, until the work-item's
    __local arrays fit ``budget``. PoCL's 1 MiB never asks; a 32 KiB device does."""
    while _cpu_local_bytes(k, kc, mc, tm, nv) > budget:
        if kc > 16 and (kc >= mc or mc <= tm):
            kc = max(16, kc // 2)
        elif mc > tm:
            mc = max(tm, mc // 2 // tm * tm)
        else:
            break
    return kc, mc


def _cpu_generate(
    *, m: int, n: int, k: int, nbatch: int, batch_offsets: str,
    sa: tuple, sb: tuple, sd: tuple, sc: tuple, has_bias: bool,
    post_ops: tuple, po_strides: dict, dtypes: dict[str, str], local_memory: int, native_vector_width: int = 16,
) -> KernelSpec:
    tm, tn = _cpu_tile(m, n, native_vector_width)
    tm = math.ceil(m / math.ceil(m / tm))  # as many micro-tiles, fewest rows (M=8: 2 x 4, not 2 x 6)
    nv = tn // 16
    nt = math.ceil(n / tn)
    staged = bool(post_ops)  # the epilogue a function of its own (see staged_fn below)
    kc, mc = _cpu_fit_local(k, min(k, CPU_KC), _cpu_rows_per_item(m, nt, nbatch, tm), tm, nv, local_memory)
    # One micro-tile per work-item: nothing reuses a copy of the weights, so full panels of f32
    # row-major weights are read in place.
    direct = mc == tm and dtypes["weights"] == "f32" and sb[-1] == 1 and n >= tn
    mt = math.ceil(m / mc)
    chunks = math.ceil(k / kc)
    sam, sak = sa[-2], sa[-1]
    sbk, sbn = sb[-2], sb[-1]
    sdm, sdn = sd[-2], sd[-1]
    scm, scn = sc[-2], sc[-1]
    sdt, wdt, cdt, ddt = dtypes["src"], dtypes["weights"], dtypes["bias"], dtypes["dst"]
    po_names = tuple(po_strides)
    load, store = _dtype_io.load, _dtype_io.store
    accs = [(i, j) for i in range(tm) for j in range(nv)]

    # Weights chunk -> bp (kc rows of tn floats). Full panels of f32 row-major weights copy float16
    # vectors; the N-edge panel and other layouts copy element by element, in the order that
    # reads memory contiguously, zero past N.
    def copy(full: bool) -> str:
        if full and wdt == "f32" and sbn == 1:
            return (f"for (ulong kk = 0; kk < kc; ++kk) {{ const ulong o = off_b + (k0 + kk) * {sbk}UL + n0;"
                    + "".join(f" bp[kk * {nv}UL + {j}UL] = *(__global const mm_float16u*)(wei + o + {16 * j}UL);"
                              for j in range(nv)) + " }")
        value = load(wdt, "wei", f"off_b + (k0 + kk) * {sbk}UL + (n0 + j) * {sbn}UL")
        if full and wdt == "f32" and sbk == 1:
            # Weights contiguous along K (N x K, e.g. a linear layer's): 16 float16 reads down K,
            # transposed in registers (4 rounds of even/odd shuffles), 16 float16 stores.
            rounds = []
            t = [f"t{r}" for r in range(16)]
            for stage in range(4):
                u = [f"u{stage}_{r}" for r in range(16)]
                rounds += [f"const float16 {u[q]} = (float16)({t[2 * q]}.even, {t[2 * q + 1]}.even);"
                           f" const float16 {u[q + 8]} = (float16)({t[2 * q]}.odd, {t[2 * q + 1]}.odd);"
                           for q in range(8)]
                t = u
            block = (
                " ".join(f"const float16 t{r} = *(__global const mm_float16u*)"
                         f"(wei + off_b + (n0 + j + {r}UL) * {sbn}UL + k0 + kk);"
                         for r in range(16))
                + " " + " ".join(rounds) + " "
                + " ".join(f"bp[(kk + {r}UL) * {nv}UL + j / 16UL] = {t[r]};" for r in range(16)))
            return (f"for (ulong kk = 0; kk + 16UL <= kc; kk += 16UL) for (ulong j = 0; j < {tn}UL; j += 16UL) {{ {block} }}"
                    f" for (ulong kk = kc / 16UL * 16UL; kk < kc; ++kk) for (ulong j = 0; j < {tn}UL; ++j)"
                    f" bpf[kk * {tn}UL + j] = {value};")
        if not full:
            value = f"(n0 + j < N) ? {value} : 0.0f"
        inner, outer = ("kk < kc; ++kk", f"j < {tn}UL; ++j") if abs(sbk) < abs(sbn) else (f"j < {tn}UL; ++j", "kk < kc; ++kk")
        var = lambda s: s.split(" ")[0]  # noqa: E731
        return (f"for (ulong {var(outer)} = 0; {outer}) for (ulong {var(inner)} = 0; {inner}) "
                f"bpf[kk * {tn}UL + j] = {value};")

    # A micro-tile past M moves up to end at row M (rows mr..mr+tm-1, all real: src rows are one
    # base plus constant offsets; tm <= M) and stores only its rows from mi on.
    a_rows = f"const ulong mr = MM_MIN(mi, M - {tm}UL); const ulong a0 = off_a + mr * {sam}UL;"

    def k_loop(b_in_place: bool) -> str:
        b = (lambda j: f"*(__global const mm_float16u*)(wei + off_b + (k0 + kk) * {sbk}UL + n0 + {16 * j}UL)"
             ) if b_in_place else (lambda j: f"bp[kk * {nv}UL + {j}UL]")
        body = "\n".join(
            [f"                const float16 b{j} = {b(j)};" for j in range(nv)]
            + [f"                {{ const float16 a = (float16)({load(sdt, 'src', f'a0 + {i * sam}UL + (k0 + kk) * {sak}UL')});"
               + "".join(f" c{i}_{j} += a * b{j};" for j in range(nv)) + " }" for i in range(tm)])
        return f"""__attribute__((opencl_unroll_hint({CPU_UNROLL})))
            for (ulong kk = 0; kk < kc; ++kk) {{
{body}
            }}"""
    zero = " ".join(f"c{i}_{j} = (float16)(0.0f);" for i, j in accs)
    reload = " ".join(f"c{i}_{j} = cs[(mi - m0 + {i}UL) * {nv}UL + {j}UL];" for i, j in accs)
    save = " ".join(f"cs[(mi - m0 + {i}UL) * {nv}UL + {j}UL] = c{i}_{j};" for i, j in accs)

    # Epilogue of a full micro-tile: acc + bias, the post-ops and the store on float16 rows.
    def row(i: int, j: int, name: str, base: str, sm: int, sn: int, dtype: str) -> str:
        if dtype == "f32" and sn == 1:
            return f"(*(__global const mm_float16u*)({name} + {base} + (mr + {i}UL) * {sm}UL + n0 + {16 * j}UL))"
        return "(float16)(" + ", ".join(
            load(dtype, name, f"{base} + (mr + {i}UL) * {sm}UL + (n0 + {16 * j + l}UL) * {sn}UL") for l in range(16)) + ")"

    def vector_store(i: int, j: int) -> str:
        value = f"c{i}_{j}" + (f" + {row(i, j, 'bias', 'off_c', scm, scn, cdt)}" if has_bias else "")
        post = _post_ops.apply(
            post_ops, "r", "float16", row(i, j, "dst", "off_d", sdm, sdn, ddt),
            lambda name: row(i, j, name, f"off_{name}", po_strides[name][-2], po_strides[name][-1], "f32"))
        if ddt == "f32" and sdn == 1:
            out = f"*(__global mm_float16u*)(dst + off_d + (mr + {i}UL) * {sdm}UL + n0 + {16 * j}UL) = r;"
        else:
            out = " ".join(store(ddt, "dst", f"off_d + (mr + {i}UL) * {sdm}UL + (n0 + {16 * j + l}UL) * {sdn}UL", f"r.s{l:x}")
                           for l in range(16))
        return f"{{ float16 r = {value}; {post} {out} }}"

    # Edge micro-tiles: the accumulators go through __local memory, then one checked scalar loop.
    bias = load(cdt, "bias", f"off_c + (mr + i) * {scm}UL + (n0 + j) * {scn}UL") if has_bias else "0.0f"
    po_scalar = _dtype_io.apply_post_ops_scalar(post_ops, "v", "od", {
        name: f"off_{name} + (mr + i) * {po_strides[name][-2]}UL + (n0 + j) * {po_strides[name][-1]}UL"
        for name in po_names}, ddt)
    edge = (" ".join(f"ce[{i * nv + j}] = c{i}_{j};" for i, j in accs) + f"""
                for (ulong i = 0; i < {tm}UL; ++i) if (mr + i >= mi && mr + i < M) """
            f"""for (ulong j = 0; j < {tn}UL; ++j) if (n0 + j < N) {{
                    const ulong od = off_d + (mr + i) * {sdm}UL + (n0 + j) * {sdn}UL;
                    float v = cef[i * {tn}UL + j] + {bias};
                    {po_scalar}
                    {store(ddt, "dst", "od", "v")}
                }}""")
    epilogue = f"""if (mr == mi && mi + {tm}UL <= M && n0 + {tn}UL <= N) {{
                {(chr(10) + '                ').join(vector_store(i, j) for i, j in accs)}
            }} else {{
                {edge}
            }}"""
    start = f"if (k0 == 0) {{ {zero} }} else {{ {reload} }}" if chunks > 1 else zero
    bias_param = f" {_dtype_io.param(cdt, 'bias', const=True)}," if has_bias else ""
    dst_param = _dtype_io.param(ddt, "dst", const=False)
    staged_fn = ""
    if staged:
        # Post-ops: the epilogue is a function of its own, called once per micro-tile with the
        # sums in a private array; the kernel body is the plain kernel's plus that call. PoCL
        # keeps math built-ins as calls, and with the epilogue inline the K loop lost its
        # registers: 8 x 32768 x 32 (one work-item) 246 us plain, 398 with a tanh post-op, 484
        # with exp; relu 338-380 us even with the epilogue moved past the loop nest. Called: all
        # 242-247. (PoCL 3.0 miscompiles __local pointers handed to a function that is not
        # inlined: hence the private array, and ``ce`` private in the function.)
        offsets = ["off_d", "off_c"] + [f"off_{name}" for name in po_names]
        staged_fn = f"""static __attribute__((noinline)) void mm_epilogue({bias_param}{_post_ops.params(post_ops)}
        {dst_param}, const ulong mr, const ulong mi, const ulong n0, {", ".join(f"const ulong {o}" for o in offsets)},
        const float16* acc) {{
    float16 ce[{tm * nv}];
    float* const cef = (float*)ce;
    {" ".join(f"const float16 c{i}_{j} = acc[{x}];" for x, (i, j) in enumerate(accs))}
    {epilogue}
}}
"""
        call_args = "".join(f"{name}, " for name in (("bias",) if has_bias else ()) + po_names)
        epilogue = (f"{{ float16 acc[{len(accs)}]; " + " ".join(f"acc[{x}] = c{i}_{j};" for x, (i, j) in enumerate(accs))
                    + f" mm_epilogue({call_args}dst, mr, mi, n0, {', '.join(offsets)}, acc); }}")
    finish = f"if (k0 + {kc}UL < K) {{ {save} }} else {epilogue}" if chunks > 1 else epilogue

    loads = (sdt, wdt, ddt) + ((cdt,) if has_bias else ())
    src_param = _dtype_io.param(sdt, "src", const=True)
    wei_param = _dtype_io.param(wdt, "wei", const=True)
    source = (_dtype_io.functions(loads=loads, stores=(ddt,), called_stores=True)
              + _post_ops.functions(post_ops, ("float", "float16")) + _CPU_PRELUDE + f"""#define M {m}UL
#define N {n}UL
#define K {k}UL
{staged_fn}__kernel void matmul_fwd({src_param}, {wei_param},{bias_param}{_post_ops.params(post_ops)}
                         {dst_param}) {{
    __local float16 bp[{kc * nv}];
    __local float* const bpf = (__local float*)bp;
    __local float16 ce[{tm * nv}];
    __local float* const cef = (__local float*)ce;
    {f"__local float16 cs[{mc * nv}];" if chunks > 1 else ""}
    const ulong nb = get_global_id(0), mb = get_global_id(1);
    if (nb >= {nt}UL || mb >= {mt}UL || get_global_id(2) >= {nbatch}UL) return;
    {batch_offsets}
    const ulong n0 = nb * {tn}UL, m0 = mb * {mc}UL, m1 = MM_MIN(m0 + {mc}UL, M);
    float16 {", ".join(f"c{i}_{j}" for i, j in accs)};
    c0_0 = mm_wide((float16)(0.0f));
    for (ulong k0 = 0; k0 < K; k0 += {kc}UL) {{
        const ulong kc = {f"{kc}UL" if k % kc == 0 else f"MM_MIN({kc}UL, K - k0)"};
        {"if (n0 + " + str(tn) + "UL > N) {" + copy(False) + "}" if direct
         else "if (n0 + " + str(tn) + "UL <= N) {" + copy(True) + "} else {" + copy(False) + "}"}
        for (ulong mi = m0; mi < m1; mi += {tm}UL) {{
            {a_rows}
            {start}
            {f"if (n0 + {tn}UL <= N) {{ {k_loop(True)} }} else {{ {k_loop(False)} }}" if direct else k_loop(False)}
            {finish}
        }}
    }}
}}
""")
    args = ("src", "weights") + (("bias",) if has_bias else ()) + po_names + ("dst",)
    return KernelSpec(
        source=source,
        name="matmul_fwd",
        arg_names=args,
        global_size=(nt, mt, nbatch),
        local_size=(1, 1, 1),
        impl=f"ocl:regblock:{tm}x{tn}:k{kc}:m{mc}{':direct' if direct else ''}{':staged' if staged else ''}:l1x1",
    )


def generate(desc: MatmulDesc, config: KernelConfig) -> KernelSpec:
    """The kernel of ``desc`` for ``config`` (``impl``): bf16 and f16 on an NVIDIA GPU of sm_80+,
    ``matmul_mma``'s tensor cores where it reads the layout (``matmul_mma.applies``) and
    ``matmul_skinny`` is not preferred to it; otherwise on a GPU shape (``vector_width`` 1),
    ``matmul_gpu``'s local-memory tiled SGEMM where dst is 64 x 64+ (``matmul_gpu.applies``),
    else ``_regblock``'s 4 x 4 blocks, unless ``matmul_skinny.prefers`` the K split across a
    work-group to what that choice gives (``existing_work``); on the CPU, ``_regblock``'s
    (``_cpu_generate``). ``output_scale`` reaches each as a leading ``linear`` post-op
    (``_post_ops.generate_scaled``)."""
    desc.check_supported()
    m, n = desc.dst.dims[-2:]
    make: Callable[[MatmulDesc, tuple, KernelConfig], KernelSpec]
    if matmul_mma.applies(desc, config) and not matmul_skinny.prefers(*matmul_mma.work(desc, config), config):
        make = matmul_mma.mma_gemm
    elif matmul_skinny.prefers(*existing_work(desc, config), config):
        make = matmul_skinny.skinny
    elif matmul_gpu.applies(m, n, config):
        make = matmul_gpu.tiled
    else:
        make = _regblock
    return generate_scaled(lambda chain: make(desc, chain, config), desc.post_ops, desc.output_scale)


# One K slab of a small tile of the tiled kernel (``matmul_gpu.SMALL_PREFERENCE``: a barrier, the
# next slab's loads, bk steps of 4 x 4 FMAs out of local memory) counts as this many
# register-blocked rounds; the large 8 x 8 tiles have the arithmetic to hide a slab and count one.
# Measured on an H100 at 64x1024x1024: the tiled kernel's 16 slabs per split over 16K work-items
# took 18.9 µs, the K split across a work-group 11.5 (skinny_check.py); 16 x 8 reaches
# matmul_skinny.MIN_ROUNDS.
TILED_ROUND_WEIGHT = 8


def existing_work(desc: MatmulDesc, config: KernelConfig) -> tuple[int, int]:
    """Useful work-items and the dependent rounds of global loads each runs, of the kernel
    ``generate`` picks for ``desc`` without ``matmul_skinny``: the tiled kernel's work-groups
    times their work-items and its K slabs per split (``TILED_ROUND_WEIGHT`` rounds each for a
    small tile), or
    ``_regblock``'s blocks and K (one round per k)."""
    m, n = desc.dst.dims[-2:]
    k = desc.src.dims[-1]
    nbatch = math.prod(desc.dst.dims[:-2])
    if matmul_gpu.applies(m, n, config):
        tile = matmul_gpu.choose_tile(m, n, nbatch, config, k)
        groups = math.ceil(m / tile.bm) * math.ceil(n / tile.bn) * nbatch
        # 4 x 4 per work-item: little arithmetic to overlap a slab's loads with
        small = any(tile == matmul_gpu.TILES[name] for name in matmul_gpu.SMALL_PREFERENCE)
        return groups * tile.threads, math.ceil(k / tile.ks / tile.bk) * (TILED_ROUND_WEIGHT if small else 1)
    tm, tn, _ = tiles(config)
    return math.ceil(m / tm) * math.ceil(n / tn) * nbatch, k


def _regblock(desc: MatmulDesc, post_ops: tuple, config: KernelConfig) -> KernelSpec:
    """The register-blocked kernels: ``_cpu_generate``'s on the CPU (``vector_width`` 16), the
    4 x 4 blocks below elsewhere. ``post_ops``: the validated chain (binary operands f32, the
    output scale leading), applied to ``acc + bias`` before the store, on float16 rows in full
    blocks and element by element in edge blocks. Any storage types (``_dtype_io.DTYPES``); the
    math is f32 either way."""
    src_dims, src_strides, src_dtype = desc.src.dims, desc.src.strides, desc.src.dtype
    wei_dims, wei_strides, wei_dtype = desc.weights.dims, desc.weights.strides, desc.weights.dtype
    dst_strides, dst_dtype = desc.dst.strides, desc.dst.dtype
    bias_dims = None if desc.bias is None else desc.bias.dims
    bias_dtype = "f32" if desc.bias is None else desc.bias.dtype
    m, k = src_dims[-2:]
    n = wei_dims[-1]
    dst_dims = desc.dst.dims  # batch dims broadcast (the descriptor checked them), then (M, N)
    batch = dst_dims[:-2]
    nd = len(dst_dims)
    sa = aligned_strides(src_dims, src_strides, nd)
    sb = aligned_strides(wei_dims, wei_strides, nd)
    sd = tuple(dst_strides)
    has_bias = bias_dims is not None
    sc = aligned_strides(desc.bias.dims, desc.bias.strides, nd) if desc.bias is not None else (0,) * nd
    tm, tn, (ln, lm) = tiles(config)
    mt, nt = math.ceil(m / tm), math.ceil(n / tn)
    nbatch = math.prod(batch)
    strides = {"a": sa[:-2], "b": sb[:-2], "d": sd[:-2]}
    if has_bias:
        strides["c"] = sc[:-2]
    po_strides = _post_ops.operand_strides(post_ops, nd)
    po_names = tuple(po_strides)
    strides.update({name: s[:-2] for name, s in po_strides.items()})
    batch_offsets = index_code(batch, strides, "get_global_id(2)") if batch else (
        "ulong off_a = 0; ulong off_b = 0; ulong off_d = 0; ulong off_c = 0;"
        + "".join(f" ulong off_{name} = 0;" for name in po_names)
    )
    if batch and not has_bias:
        batch_offsets += "\n    const ulong off_c = 0;"
    sam, sak = sa[-2], sa[-1]
    sbk, sbn = sb[-2], sb[-1]
    sdm, sdn = sd[-2], sd[-1]
    scm, scn = sc[-2], sc[-1]
    if config.vector_width >= 16:  # CPU device
        return _cpu_generate(
            m=m, n=n, k=k, nbatch=nbatch, batch_offsets=batch_offsets, sa=sa, sb=sb, sd=sd, sc=sc,
            has_bias=has_bias, post_ops=post_ops, po_strides=po_strides,
            dtypes={"src": src_dtype, "weights": wei_dtype, "bias": bias_dtype, "dst": dst_dtype},
            local_memory=config.local_memory, native_vector_width=config.native_vector_width,
        )

    def vector_block() -> str:
        # 16 columns as one float16 per row: four FMA chains of 16 lanes. The row of weights is
        # gathered from scalar loads (LLVM merges contiguous ones into one vector load without
        # assuming alignment, which a pointer cast would).
        lanes = ", ".join(_dtype_io.load(wei_dtype, "wei", f"wk + {j * sbn}UL") for j in range(16))
        rows = "\n".join(
            f"            acc{i} += (float16)("
            f"{_dtype_io.load(src_dtype, 'src', f'off_a + (m0 + {i}) * {sam}UL + k * {sak}UL')}) * b;"
            for i in range(tm)
        )
        bias_row = (
            lambda i: " + (float16)(" + ", ".join(
                _dtype_io.load(bias_dtype, "bias", f"off_c + (m0 + {i}) * {scm}UL + (n0 + {j}) * {scn}UL")
                for j in range(16)) + ")"
        ) if has_bias else (lambda i: "")
        def po_row(i: int) -> str:
            def row(base: str, sm: int, sn: int) -> str:
                return "(float16)(" + ", ".join(
                    _dtype_io.load(dst_dtype if base == "dst" else "f32", base,
                                   f"off_{'d' if base == 'dst' else base} + (m0 + {i}) * {sm}UL + (n0 + {j}) * {sn}UL")
                    for j in range(16)) + ")"
            return _post_ops.apply(
                post_ops, "r", "float16", row("dst", sdm, sdn),
                lambda name: row(name, po_strides[name][-2], po_strides[name][-1]),
            )

        stores = "\n".join(
            f"        {{ float16 r = acc{i}{bias_row(i)}; {po_row(i)} "
            + " ".join(_dtype_io.store(dst_dtype, "dst", f"off_d + (m0 + {i}) * {sdm}UL + (n0 + {j}) * {sdn}UL", f"r.s{j:x}")
                       for j in range(16))
            + " }"
            for i in range(tm)
        )
        accs = " ".join(f"float16 acc{i} = (float16)(0.0f);" for i in range(tm))
        return f"""
        {accs}
        for (ulong k = 0; k < K; ++k) {{
            const ulong wk = off_b + k * {sbk}UL + n0 * {sbn}UL;
            const float16 b = (float16)({lanes});
{rows}
        }}
{stores}"""

    def block(check: bool) -> str:
        # Every access to the TM x TN sums is unrolled here, in Python, so they are scalars the
        # compiler keeps in registers. The sums were a C array indexed in C loops, in registers
        # only while the compiler unrolls every loop over it; a tanh post-op makes the epilogue
        # loop big enough not to be, and the array then lives in per-thread memory that every k
        # step reads and writes. That is the likely cause of bench_graph_dag's 44 ms per request
        # fused (MatMul 8 x 32768 x 32 with its Tanh) against 8.3 ms unfused on an H100; the last
        # row of .device/scratch/skinny_check.py times that kernel's source with and without tanh.
        sums = [(i, j) for i in range(tm) for j in range(tn)]
        a_load = lambda i: _dtype_io.load(src_dtype, "src", f"off_a + (m0 + {i}UL) * {sam}UL + k * {sak}UL")  # noqa: E731
        b_load = lambda j: _dtype_io.load(wei_dtype, "wei", f"off_b + k * {sbk}UL + (n0 + {j}UL) * {sbn}UL")  # noqa: E731
        loads = [f"const float a{i} = {f'(m0 + {i}UL < M) ? ' if check else ''}{a_load(i)}{' : 0.0f' if check else ''};"
                 for i in range(tm)]
        loads += [f"const float b{j} = {f'(n0 + {j}UL < N) ? ' if check else ''}{b_load(j)}{' : 0.0f' if check else ''};"
                  for j in range(tn)]
        stores = []
        for i, j in sums:
            row, col = f"(m0 + {i}UL)", f"(n0 + {j}UL)"
            od = f"off_d + {row} * {sdm}UL + {col} * {sdn}UL"
            bias = (" + " + _dtype_io.load(bias_dtype, "bias", f"off_c + {row} * {scm}UL + {col} * {scn}UL")) if has_bias else ""
            post = _dtype_io.apply_post_ops_scalar(post_ops, "v", od, {
                name: f"off_{name} + {row} * {po_strides[name][-2]}UL + {col} * {po_strides[name][-1]}UL"
                for name in po_names
            }, dst_dtype)
            guard = f"if ({row} < M && {col} < N) " if check else ""
            stores.append(f"{guard}{{ float v = acc{i}_{j}{bias}; {post} {_dtype_io.store(dst_dtype, 'dst', od, 'v')} }}")
        return f"""
        float {", ".join(f"acc{i}_{j} = 0.0f" for i, j in sums)};
        for (ulong k = 0; k < K; ++k) {{
            {" ".join(loads)}
            {" ".join(f"acc{i}_{j} += a{i} * b{j};" for i, j in sums)}
        }}
        {(chr(10) + "        ").join(stores)}"""

    bias_param = f" {_dtype_io.param(bias_dtype, 'bias', const=True)}," if has_bias else ""
    types = ("float", "float16") if tn == 16 else ("float",)
    loads = (src_dtype, wei_dtype, dst_dtype) + ((bias_dtype,) if has_bias else ())
    src_param = _dtype_io.param(src_dtype, "src", const=True)
    wei_param = _dtype_io.param(wei_dtype, "wei", const=True)
    dst_param = _dtype_io.param(dst_dtype, "dst", const=False)
    source = _dtype_io.functions(loads=loads, stores=(dst_dtype,)) + _post_ops.functions(post_ops, types) + f"""#define M {m}UL
#define N {n}UL
#define K {k}UL
#define TM {tm}
#define TN {tn}
__kernel void matmul_fwd({src_param}, {wei_param},{bias_param}{_post_ops.params(post_ops)}
                         {dst_param}) {{
    const ulong nb = get_global_id(0), mb = get_global_id(1);
    if (nb >= {nt}UL || mb >= {mt}UL || get_global_id(2) >= {nbatch}UL) return;
    {batch_offsets}
    const ulong m0 = mb * TM, n0 = nb * TN;
    if (m0 + TM <= M && n0 + TN <= N) {{{vector_block() if tn == 16 else block(False)}
    }} else {{{block(True)}
    }}
}}
"""
    args = ("src", "weights") + (("bias",) if has_bias else ()) + po_names + ("dst",)
    return KernelSpec(
        source=source,
        name="matmul_fwd",
        arg_names=args,
        global_size=(padded_global(nt, ln), padded_global(mt, lm), nbatch),
        local_size=(ln, lm, 1),
        impl=f"ocl:regblock:{tm}x{tn}:l{ln}x{lm}",
    )


def reference(
    src: np.ndarray, weights: np.ndarray, bias: np.ndarray | None = None, *, dst_dtype: str = "f32"
) -> np.ndarray:
    """``src @ weights (+ bias)`` of user-facing values of any data type (bf16 as float32) in
    float64, rounded to float32 and stored as ``dst_dtype`` (``_dtype_io.store_reference``)."""
    y = np.matmul(_dtype_io.widen(src), _dtype_io.widen(weights))
    if bias is not None:
        y = y + _dtype_io.widen(bias)
    return _dtype_io.store_reference(y.astype(np.float32), dst_dtype)


def desc_reference(desc: MatmulDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}``: ``reference``, times ``output_scale``,
    then the post-ops (``inputs["dst"]``, dst's old value, for a sum post-op; the binary operands
    by argument name), stored as dst's data type."""
    y = reference(inputs["src"], inputs["weights"], inputs.get("bias"))
    y = _post_ops.scaled_reference(desc.post_ops, y, inputs.get("dst"), inputs, output_scale=desc.output_scale)
    return _dtype_io.store_reference(y, desc.dst.dtype)


register(
    MatmulDesc, generate=generate, reference=desc_reference,
    # Plus one ulp of dst's type: an f32 sum next to a rounding tie of a bf16 or f16 dst lands on
    # either neighbour, whatever order the sum took.
    tolerance=lambda desc: (tolerance.matmul(desc.src.dims[-1], tf32=matmul_mma.tf32_operands(desc))
                            + _dtype_io.EPSILON[desc.dst.dtype]),
)
