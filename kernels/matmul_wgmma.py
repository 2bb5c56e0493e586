"""Matmul forward on Hopper's warp-group tensor cores: bf16 and f16 operands, f32 accumulation.

Not chosen by ``matmul.generate`` yet: at 4096^3 on an H200 it reaches 191 TFLOP/s where
``matmul_mma`` reaches 262 (figures at ``TILES``). Its tiles run in tests/kernels/test_matmul_wgmma.py
and benchmarks/tune_mma_tiles.py, so the work of making it the faster one starts from a kernel
whose results are checked.

``wgmma.mma_async`` (sm_90a: H100, H200) multiplies a 64 x 16 slab of src by a 16 x N slab of
weights, both read by the tensor cores straight from local memory, into 64 x N f32 accumulators
spread over the 128 threads of a warp group; it runs asynchronously, so the next K slab's copies
are issued while it works. A loop of m64n256k16 on an H200 runs at 835 TFLOP/s where the
``mma.sync`` that ``matmul_mma`` issues peaks at 554 (``.device``-style probe, see ``_ptx``).
NVIDIA's OpenCL writes PTX for sm_90, so the instructions travel behind ``_ptx.MARK`` and the
spec asks its builder for ``sm_90a`` (``KernelSpec.ptx_target``).

A work-group of ``bm / 64`` warp groups computes a ``bm x bn`` tile of dst, each warp group 64
rows by all ``bn`` columns, one ``m64n{bn}k16`` per 16 of K. Operands sit in local memory as the
tensor cores' "core matrices" without swizzling: 8 rows of 16 contiguous bytes, 128 bytes each,
ordered along M (or N) first, so a descriptor's stride between 8-row groups is 128 bytes and
between K groups the tile's rows x 16 bytes. Weights stored N-contiguous are read transposed
(``trans-b``), in core matrices of 8 K rows by 8 columns. Each thread copies 16-byte chunks with
``cp.async``, eight threads the eight rows of one core matrix, so a copy's eight stores fall in
eight different bank groups, and a warp's 32 chunks cover whole 32-byte sectors of global memory.

Stages: ``stages`` slabs of local memory; ``inflight`` warp-group MMAs left running across an
iteration's barrier (0 or 1). Two ways to fill them:

- ``cp.async`` (``prefetch`` 0): slab ``t + stages - 1 - inflight`` is copied while slab ``t`` is
  multiplied. Measured: 130-197 TFLOP/s at 4096^3 whatever the lookahead, 623 with the copies
  taken out; the warp-group MMA seems to wait for cp.async still writing its work-group's local
  memory.
- through registers (``prefetch`` P): slabs are loaded P ahead into registers and stored to local
  memory while the MMA of the slab before runs (``_register_staged_loop``): 191 TFLOP/s at any P,
  so something other than the loads' latency bounds it now.

Either way the slab a copy overwrites was read by an MMA every warp group has waited for before
the barrier, and the copies become visible to the tensor cores (the async proxy) through
``fence.proxy.async`` before that barrier.

Layouts, edges, bias, post-ops and stores are ``matmul_mma``'s (``applies``, ``fragment_epilogue``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from .._values._matmul_desc import MatmulDesc
from ._post_ops import generate_scaled
from ._ptx import MARK, marked
from ._spec import KernelConfig, KernelSpec
from .matmul_mma import (
    LOCAL_MEMORY,
    MMA_TYPES,
    cp_async_helpers,
    first_filling,
    fragment_epilogue,
    gemm_operands,
    weights_k_major,
)

# wgmma is sm_90a: Hopper only (Blackwell has its own tensor-core instructions).
SM = 90
PTX_TARGET = "sm_90a"
_CHUNK = 8  # halves per 16-byte copy
_CORE = 128  # bytes of one core matrix: 8 rows of 16 bytes


@attrs.frozen
class WgmmaTile:
    """``bm x bn`` dst per work-group (``bm / 64`` warp groups), ``bk`` K per slab, ``stages``
    slabs in local memory, ``inflight`` MMAs left running across a barrier."""

    bm: int
    bn: int
    bk: int
    stages: int
    inflight: int = 1
    # Slabs loaded ahead into registers (then stored to local memory) instead of cp.async: 0 for
    # cp.async. See the module docstring.
    prefetch: int = 0

    @property
    def warp_groups(self) -> int:
        return self.bm // 64

    @property
    def threads(self) -> int:
        return 128 * self.warp_groups

    @property
    def lookahead(self) -> int:
        """Slabs being copied by cp.async while one is multiplied (cp.async tiles)."""
        return self.stages - 1 - self.inflight

    @property
    def name(self) -> str:
        staged = f":r{self.prefetch}" if self.prefetch else ""
        return f"{self.bm}x{self.bn}x{self.bk}:p{self.stages}:i{self.inflight}{staged}"

    def local_bytes(self) -> int:
        return 2 * self.stages * (self.bm + self.bn) * self.bk

    def check(self) -> None:
        ok = (self.bm % 64 == 0 and 64 <= self.bm <= 256 and self.bn % 8 == 0 and 8 <= self.bn <= 256
              and self.bk % 16 == 0 and self.inflight in (0, 1) and self.prefetch >= 0
              and (self.lookahead >= 1 if not self.prefetch else self.stages == 2 + self.inflight)
              and (self.bn * self.bk // _CHUNK) % self.threads == 0
              and self.local_bytes() <= LOCAL_MEMORY)
        if not ok:
            raise ValueError(f"warp-group tile {self.name} does not fit the kernel's layout")


def _tile(name: str) -> WgmmaTile:
    """``"128x256x16:p3:i1"`` or ``"128x256x16:p3:i1:r4"`` -> WgmmaTile."""
    sizes, stages, inflight, *prefetch = name.split(":")
    bm, bn, bk = map(int, sizes.split("x"))
    tile = WgmmaTile(bm, bn, bk, int(stages[1:]), int(inflight[1:]), int(prefetch[0][1:]) if prefetch else 0)
    tile.check()
    return tile


TILES: dict[str, WgmmaTile] = {name: _tile(name) for name in (
    "128x256x16:p3:i1:r4",
    "128x256x16:p2:i0:r4",
    "128x128x32:p2:i0:r2",
    "128x128x16:p3:i1:r4",
    "64x256x16:p3:i1:r4",
    "64x128x32:p3:i1:r2",
    "128x256x16:p3:i0",
    "128x128x16:p5:i1",
    "64x64x32:p4:i1",
)}
# Measured on an H200 (.device-style variants of bf16 4096^3, wall time over 20 queued runs, median
# of 5; mma.sync's best tile 262 TFLOP/s in the same session): through registers 128x256x16 191
# TFLOP/s at any prefetch depth (r2, r4, r6) and with i0 or i1, 128x128x32:p2:i0:r2 154,
# 128x128x16:p3:i1:r4 149, 64x256x16 132, 64x128x32 104; by cp.async 128x256x16:p3:i0 197 (i1:
# 128), 128x128x16:p5:i1 157, 64x64x32 78. Slower than mma.sync at every size measured, so
# ``matmul.generate`` does not choose this kernel yet; the largest first, as for matmul_mma:
PREFERENCE: tuple[str, ...] = ("128x256x16:p3:i1:r4", "128x128x16:p3:i1:r4", "64x128x32:p3:i1:r2", "64x64x32:p4:i1")
MIN_GROUPS = 132


def applies(desc: MatmulDesc, config: KernelConfig) -> bool:
    """Whether this kernel takes ``desc`` on ``config``'s device: an sm_90 NVIDIA GPU, and what
    ``matmul_mma`` reads (bf16 or f16 src and weights, 16-byte chunks aligned, dst 16 x 16+)."""
    m, n = desc.dst.dims[-2:]
    return (config.nvidia_sm == SM and desc.src.dtype in MMA_TYPES and desc.weights.dtype == desc.src.dtype
            and m >= 16 and n >= 16 and weights_k_major(desc) is not None)


def choose_tile(m: int, n: int, nbatch: int, config: KernelConfig) -> WgmmaTile:
    fitting = [TILES[name] for name in PREFERENCE
               if TILES[name].threads <= config.local_size and TILES[name].local_bytes() <= config.local_memory]
    return first_filling(fitting, m, n, nbatch, MIN_GROUPS)


def generate(desc: MatmulDesc, config: KernelConfig, *, tile: WgmmaTile | str | None = None) -> KernelSpec:
    """The warp-group kernel of ``desc`` (which ``applies``); ``tile`` (a WgmmaTile or a name of
    ``TILES``) overrides ``choose_tile``."""
    desc.check_supported()
    return generate_scaled(lambda chain: wgmma_gemm(desc, chain, config, tile), desc.post_ops, desc.output_scale)


def wgmma_gemm(desc: MatmulDesc, post_ops: tuple, config: KernelConfig,
               tile: WgmmaTile | str | None = None) -> KernelSpec:
    """The kernel of ``desc`` with the chain ``post_ops`` (the output scale leading)."""
    ops = gemm_operands(desc, "warp-group matmul")
    k_major, m, k, n, nbatch, sa, sb = ops.k_major, ops.m, ops.k, ops.n, ops.nbatch, ops.sa, ops.sb
    if tile is None:
        tile = choose_tile(m, n, nbatch, config)
    elif isinstance(tile, str):
        tile = TILES[tile] if tile in TILES else _tile(tile)
    tile.check()

    mma_type = ops.mma_type
    bm, bn, bk, threads, stages = tile.bm, tile.bn, tile.bk, tile.threads, tile.stages
    a_stage, b_stage = bm * bk * 2, bn * bk * 2  # bytes
    slabs = math.ceil(k / bk)
    tail = k % bk != 0
    a_chunks = bm * bk // _CHUNK // threads
    b_chunks = bn * bk // _CHUNK // threads

    # Chunk c = tid + i * threads of a slab: row (or K row) c % 8 of core matrix c / 8, core
    # matrices ordered along M (N) first, then along K.
    setup = []
    for i in range(a_chunks):
        c = f"(tid + {i * threads}u)"
        setup.append(f"const uint a_r{i} = ({c} / {8 * (bk // _CHUNK)}u) * 8u + {c} % 8u, "
                     f"a_k{i} = (({c} / 8u) % {bk // _CHUNK}u) * 8u;")
        setup.append(f"const ulong a_g{i} = off_a + min(m0 + a_r{i}, {m - 1}UL) * {sa[-2]}UL;")
        setup.append(f"const uint a_s{i} = ((a_k{i} / 8u) * {bm // 8}u + a_r{i} / 8u) * {_CORE}u + (a_r{i} % 8u) * 16u;")
    for i in range(b_chunks):
        c = f"(tid + {i * threads}u)"
        if k_major:  # core matrices of 8 K rows x 8 columns
            setup.append(f"const uint b_k{i} = ({c} / {8 * (bn // _CHUNK)}u) * 8u + {c} % 8u, "
                         f"b_n{i} = (({c} / 8u) % {bn // _CHUNK}u) * 8u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - _CHUNK}UL);")
            setup.append(f"const uint b_s{i} = ((b_k{i} / 8u) * {bn // 8}u + b_n{i} / 8u) * {_CORE}u + (b_k{i} % 8u) * 16u;")
        else:  # core matrices of 8 rows of N x 8 of K
            setup.append(f"const uint b_n{i} = ({c} / {8 * (bk // _CHUNK)}u) * 8u + {c} % 8u, "
                         f"b_k{i} = (({c} / 8u) % {bk // _CHUNK}u) * 8u;")
            setup.append(f"const ulong b_g{i} = off_b + min(n0 + b_n{i}, {n - 1}UL) * {sb[-1]}UL;")
            setup.append(f"const uint b_s{i} = ((b_k{i} / 8u) * {bn // 8}u + b_n{i} / 8u) * {_CORE}u + (b_n{i} % 8u) * 16u;")

    def slab_chunks(slab: str) -> list[tuple[str, int, str, str | None]]:
        """This thread's chunks of slab ``slab`` (K from slab * bk): operand ("a" or "b"), chunk
        index, global pointer, and the condition of lying inside K (None: always), the pointer
        clamped into the tensor either way. Evaluated where ``k0`` is the slab's first K."""
        out: list[tuple[str, int, str, str | None]] = []
        for i in range(a_chunks):
            kk = f"k0 + a_k{i}"
            src = f"a_g{i} + (ulong)min({kk}, {k - _CHUNK}u)" if tail else f"a_g{i} + {kk}"
            out.append(("a", i, f"src + {src}", f"({kk}) < {k}u" if tail else None))
        for i in range(b_chunks):
            kk = f"k0 + b_k{i}"
            if k_major:
                row = f"(ulong)min({kk}, {k - 1}u)" if tail else f"(ulong)({kk})"
                src = f"b_g{i} + {row} * {sb[-2]}UL"
            else:
                src = f"b_g{i} + (ulong)min({kk}, {k - _CHUNK}u)" if tail else f"b_g{i} + {kk}"
            out.append(("b", i, f"wei + {src}", f"({kk}) < {k}u" if tail else None))
        return out

    stage_bytes = {"a": a_stage, "b": b_stage}

    def copy_slab(slab: str, stage: str) -> str:
        """cp.async of slab ``slab`` into stage ``stage``; zero past K (a source size of 0)."""
        out = [f"{{ const uint k0 = ({slab}) * {bk}u;"]
        for op, i, ptr, inside in slab_chunks(slab):
            size = f"({inside} ? 16u : 0u)" if inside else "16u"
            out.append(f"cp_async16({op}s_base + ({stage}) * {stage_bytes[op]}u + {op}_s{i}, (ulong)({ptr}), {size});")
        out.append("}")
        return " ".join(out)

    def load_slab(slab: str, buffer: int) -> str:
        """Slab ``slab`` into this thread's registers of buffer ``buffer``; zero past K."""
        out = [f"{{ const uint k0 = ({slab}) * {bk}u;"]
        for op, i, ptr, inside in slab_chunks(slab):
            value = f"*(__global const uint4*)({ptr})"
            out.append(f"r{op}{buffer}_{i} = {f'{inside} ? {value} : (uint4)(0u)' if inside else value};")
        out.append("}")
        return " ".join(out)

    def store_slab(buffer: int, stage: str) -> str:
        """Buffer ``buffer``'s registers into stage ``stage`` of local memory."""
        return " ".join(f"{op.upper()}s[(({stage}) * {stage_bytes[op]}u + {op}_s{i}) >> 4] = r{op}{buffer}_{i};"
                        for op, i, _, _ in slab_chunks("0"))

    # One m64n{bn}k16 per 16 of K: descriptors advance two core matrices along K.
    step = [f"WGMMA(a_desc + ((cur * {a_stage}u + {kk * 2 * bm * 16}u) >> 4), "
            f"b_desc + ((cur * {b_stage}u + {kk * 2 * bn * 16}u) >> 4));" for kk in range(bk // 16)]

    # Accumulator 4j + r of warp w in warp group g: row g*64 + w*16 + lane/4 + (r/2)*8, column
    # j*8 + (lane%4)*2 + r%2 of the work-group's tile, as mma.sync leaves its fragments.
    nacc = bn // 2
    ep = fragment_epilogue(desc, post_ops, bm, bn, 1, bn // 8, lambda mi, ni, r: f"d{4 * ni + r}")
    helpers = ep.helpers + cp_async_helpers() + _wgmma_helpers(mma_type, bn, trans_b=1 if k_major else 0)
    accs = ", ".join(f"d{i} = 0.0f" for i in range(nacc))
    if tile.prefetch:
        main_loop = _register_staged_loop(tile, slabs, step, load_slab, store_slab, a_chunks, b_chunks)
    else:
        main_loop = _cp_async_loop(tile, slabs, step, copy_slab)
    source = helpers + f"""#define M {m}UL
#define N {n}UL
__kernel __attribute__((reqd_work_group_size({threads}, 1, 1)))
void matmul_fwd({ep.params}) {{
    __local uint4 As[{stages * a_stage // 16}];
    __local uint4 Bs[{stages * b_stage // 16}];
    const uint as_base = (uint)(size_t)As, bs_base = (uint)(size_t)Bs;
    const uint tid = get_local_id(0), lane = tid % 32u, warp = tid / 32u, group = tid / 128u;
    const ulong m0 = get_group_id(1) * {bm}UL, n0 = get_group_id(0) * {bn}UL;
    {ep.offsets}
    {(chr(10) + "    ").join(setup)}
    const ulong a_desc = smem_desc(as_base + group * {8 * _CORE}u, {bm * 16}u), b_desc = smem_desc(bs_base, {bn * 16}u);
    float {accs};
    {main_loop}
    wgmma_wait_0();
    const ulong row0 = m0 + group * 64u + (warp % 4u) * 16u + lane / 4u, col0 = n0 + (lane % 4u) * 2u;
    {ep.stores}
}}
"""
    return KernelSpec(
        source=source, name="matmul_fwd", arg_names=ep.args,
        global_size=(math.ceil(n / bn) * threads, math.ceil(m / bm), nbatch),
        local_size=(threads, 1, 1), impl=f"ocl:gemm_wgmma:{tile.name}", ptx_target=PTX_TARGET,
    )


def _cp_async_loop(tile: WgmmaTile, slabs: int, step: list[str], copy_slab: Callable[[str, str], str]) -> str:
    """The K loop fed by cp.async, ``tile.lookahead`` slabs ahead. ``#pragma unroll 1``: unrolled,
    ptxas took 45 s over one kernel (2048^3, 128 slabs)."""
    look, stages = tile.lookahead, tile.stages
    return f"""#pragma unroll
    for (uint s = 0; s < {look}u; ++s) {{
        if (s < {slabs}u) {copy_slab("s", "s")}
        cp_async_commit();
    }}
    #pragma unroll 1
    for (uint t = 0; t < {slabs}u; ++t) {{
        cp_async_wait_{look - 1}();
        fence_proxy_async();
        barrier(CLK_LOCAL_MEM_FENCE);
        {{ const uint nt = t + {look}u;
        if (nt < {slabs}u) {copy_slab("nt", f"nt % {stages}u")}
        cp_async_commit(); }}
        const uint cur = t % {stages}u;
        wgmma_fence();
        {(chr(10) + "        ").join(step)}
        wgmma_commit();
        wgmma_wait_{tile.inflight}();
    }}"""


def _register_staged_loop(tile: WgmmaTile, slabs: int, step: list[str], load_slab: Callable[[str, int], str],
                          store_slab: Callable[[int, str], str], a_chunks: int, b_chunks: int) -> str:
    """The K loop fed through registers: slab s is loaded into buffer s % P (P = ``tile.prefetch``)
    P slabs before it is stored, and stored to local memory while the MMA of the slab before it
    runs. The loop is unrolled P times, so every buffer is named statically. Stage (t + 1) % S,
    written at iteration t, was last read by the MMA of slab t + 1 - S, which every warp group
    has waited for (``wgmma_wait_{inflight}``) before iteration t's barrier: S = 2 + inflight."""
    p, stages = tile.prefetch, tile.stages
    regs = ", ".join([f"ra{j}_{i}" for j in range(p) for i in range(a_chunks)]
                     + [f"rb{j}_{i}" for j in range(p) for i in range(b_chunks)])
    prologue = [f"if ({j}u < {slabs}u) {load_slab(str(j), j)}" for j in range(p)]
    prologue.append(store_slab(0, "0"))
    prologue.append(f"if ({p}u < {slabs}u) {load_slab(str(p), 0)}")
    body = []
    for j in range(p):
        nxt = (j + 1) % p
        body.append(f"""{{ const uint t = t0 + {j}u;
        if (t < {slabs}u) {{
            fence_proxy_async();
            barrier(CLK_LOCAL_MEM_FENCE);
            const uint cur = t % {stages}u;
            wgmma_fence();
            {(chr(10) + "            ").join(step)}
            wgmma_commit();
            if (t + 1u < {slabs}u) {{
                {store_slab(nxt, f"(t + 1u) % {stages}u")}
                if (t + {1 + p}u < {slabs}u) {load_slab(f"t + {1 + p}u", nxt)}
            }}
            wgmma_wait_{tile.inflight}();
        }} }}""")
    return f"""uint4 {regs};
    {(chr(10) + "    ").join(prologue)}
    #pragma unroll 1
    for (uint t0 = 0; t0 < {slabs}u; t0 += {p}u) {{
        {(chr(10) + "        ").join(body)}
    }}"""


def _wgmma_helpers(mma_type: str, bn: int, trans_b: int) -> str:
    """The descriptor builder and the warp-group instructions, hidden behind ``_ptx.MARK``."""
    nacc = bn // 2
    regs = ",".join(f"%{i}" for i in range(nacc))
    instruction = marked(
        "{", ".reg .pred p;", f"setp.ne.b32 p, %{nacc + 2}, 0;",
        f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{mma_type}.{mma_type} {{{regs}}}, %{nacc}, %{nacc + 1}, "
        f"p, 1, 1, 0, {trans_b};", "}")
    outs = ", ".join(f'"+f"(d{i})' for i in range(nacc))
    waits = "\n".join(f'static inline void wgmma_wait_{n}(void) {{ '
                      f'asm volatile("{MARK}wgmma.wait_group.sync.aligned {n};" ::: "memory"); }}' for n in (0, 1))
    return f"""static inline ulong smem_desc(uint address, uint k_stride) {{
    /* Start address, stride between K groups of core matrices ("leading"), between 8-row groups
       ("stride", 128 bytes), all in 16-byte units; no swizzling. */
    return (ulong)((address & 0x3FFFFu) >> 4) | ((ulong)(k_stride >> 4) << 16) | ((ulong)({_CORE} >> 4) << 32);
}}
static inline void fence_proxy_async(void) {{ asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }}
static inline void wgmma_fence(void) {{ asm volatile("{MARK}wgmma.fence.sync.aligned;" ::: "memory"); }}
static inline void wgmma_commit(void) {{ asm volatile("{MARK}wgmma.commit_group.sync.aligned;" ::: "memory"); }}
{waits}
#define WGMMA(da, db) asm volatile("{instruction}" : {outs} : "l"(da), "l"(db), "r"(1u) : "memory")
"""
