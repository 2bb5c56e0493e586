"""Matmul forward on GPUs for a small dst and a long K: K split across a work-group, GEMV-style.

A matmul of 8 x 32768 by 32768 x 32 has 256 dst elements. The register-blocked kernel gives it
16 work-items (4 x 4 blocks), each walking all of K alone; the tiled one (``matmul_gpu``) one
work-group. Either leaves an H100's 132 SMs idle and pays 32768 dependent rounds of global loads.
Here a work-group of ``L`` work-items owns an ``RM x RN`` block of dst (as many work-groups as
blocks, times the batch) and splits K between its work-items:

- work-item ``lid`` is ``(kq, nq) = (lid / NT, lid % NT)``: ``NT`` work-items across the block's
  columns (``TN`` columns each) and ``KT = L / NT`` along K. It takes K in groups of ``KV = 4``
  consecutive k, groups ``kq, kq + KT, kq + 2 KT, ...``, and keeps ``RM x TN`` sums in registers.
  Neighbouring work-items read neighbouring groups, so an operand contiguous along K (a row-major
  src, a transposed weights) is read in float4s that a warp coalesces; one contiguous along N
  (a row-major weights) is read as rows of ``TN`` (float4 where aligned), ``NT`` work-items side
  by side covering the block's ``RN`` columns of each k.
- the sums meet in ``__local`` memory (``L x RM x TN`` floats): one barrier, then each output's
  ``KT`` partial sums are added by ``Q = L / (RM RN)`` work-items, ``RM TN`` values each (k order
  kept within each), and, where ``Q > 1``, the ``Q`` results by the output's own work-item after a
  second barrier. Work-item ``o < RM RN`` then runs the epilogue of output ``o`` (row ``o / RN``,
  column ``o % RN``): bias, the post-op chain (the output scale leading, ``generate_scaled``) and
  dst's storage conversion, through ``_dtype_io`` and ``_post_ops`` as ``matmul_gpu.tiled``.

One kernel, one launch: there is no second pass (a split across work-groups would need scratch
memory and a reduction kernel, or an epilogue it cannot apply until every part is in). Rows and
columns past M or N are clamped to the last (computed, never stored); the K tails (groups past a
whole round of ``KT``, k past a multiple of 4) are taken with checks outside the main loop, whose
trip count is a constant. Any strides, batch broadcasting and storage types, as the other matmul
kernels: f32 math, every element converted as it is loaded.

The block is chosen by ``choose_block`` from a bandwidth model (below); ``prefers`` says when
``matmul.generate`` takes this kernel rather than the register-blocked or tiled one.
"""

from __future__ import annotations

import math

import attrs

from .._values._matmul_desc import MatmulDesc
from . import _dtype_io, _post_ops
from ._post_ops import aligned_strides, generate_scaled
from ._spec import KernelConfig, KernelSpec, index_code
from .matmul_gpu import _WIDE  # group loads of 4 elements as one access, converted to float4

KV = 4  # consecutive k per work-item step: one float4 along K where the operand is contiguous there
MAX_ACC = 32  # sums per work-item (RM x TN): registers, and L x 32 floats = 32 KiB of __local at L = 256
MAX_RM, MAX_RN = 16, 128
MIN_KT = 8  # work-items along K at least: below that the split no longer shortens the chain much
MIN_LOCAL = 32  # a work-group narrower than a warp leaves lanes idle; the K split wants a warp at least

# The selection rule (``prefers``), from the arithmetic of an H100 (132 SMs, 2048 resident work-items
# each, ~270K in all): a kernel needs some 64K work-items in flight to hide its memory latency, and
# a kernel whose work-items each wait on a long chain of dependent global-load rounds (the
# register-blocked kernel: one round per k; the tiled one: one per K slab) is latency-bound
# whatever else it does: 128 rounds at ~0.5 us (an L2 or DRAM round trip, an estimate) already
# cost ~64 us, where all 5 MB of 8 x 32768 x 32 take ~1.5 us of an H100's 3.35 TB/s.
TARGET_ITEMS = 64 * 1024
MIN_ROUNDS = 128

# The block model (``choose_block``), fitted to an H100 sweep of every block (skinny_check.py,
# 2026-11-25; device µs, best block vs the first model's pick): 8x32768x32 1x4 22.5 (1x8 24.0),
# 1x4096x4096 1x16 30.4 (1x64 52.0), 16x1024x1024 4x16 10.1 (16x16 15.6), 64x1024x1024 8x32 11.5
# (the tiled kernel 18.9), 4x8192x256 4x4 12.7 (4x8 15.6). Time ~ the larger of latency and
# traffic: each work-item runs ``rounds`` dependent rounds of ``rm + tn`` loads at ROUND_US each,
# in ceil(G / RESIDENT) waves of G work-groups; and all groups' bytes (B each, in 32-byte sectors:
# a k-row of an operand contiguous along M or N costs max(RN x size, 32) bytes unless the block
# spans whole rows) at L2_BYTES_PER_US. These constants picked 4 of the 5 best blocks above (the
# fifth, 16x1024x1024, gets 8x8, unmeasured); the first model (one wave per 132 SMs, traffic past
# 48 SMs) picked none.
ROUND_US = 0.1
L2_BYTES_PER_US = 5e6
RESIDENT = 264  # work-groups of 256 in flight: 2 per SM
SECTOR = 32

_SIZE = {"f32": 4, "s32": 4, "f16": 2, "bf16": 2, "s8": 1, "u8": 1, "boolean": 1}

@attrs.frozen
class Block:
    """``rm x rn`` dst per work-group of ``local`` work-items, ``tn`` columns per work-item."""

    rm: int
    rn: int
    tn: int
    local: int

    @property
    def nt(self) -> int:
        return self.rn // self.tn

    @property
    def kt(self) -> int:
        return self.local // self.nt

    @property
    def name(self) -> str:
        return f"{self.rm}x{self.rn}:t{self.tn}:l{self.local}"

    def local_bytes(self) -> int:
        return 4 * self.local * (self.rm * self.tn + 1)

    def check(self) -> None:
        pow2 = lambda x: x >= 1 and x & (x - 1) == 0  # noqa: E731
        ok = (all(pow2(v) for v in (self.rm, self.rn, self.tn, self.local))
              and self.tn <= self.rn and self.rm * self.tn <= MAX_ACC
              and self.rm * self.rn <= self.local and self.nt <= self.local)
        if not ok:
            raise ValueError(f"block {self.name} does not fit the kernel's layout")


def block(name: str) -> Block:
    """``"1x8:t4:l256"`` -> Block."""
    sizes, tn, local = name.split(":")
    rm, rn = map(int, sizes.split("x"))
    b = Block(rm, rn, int(tn[1:]), int(local[1:]))
    b.check()
    return b


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def local_size(config: KernelConfig) -> int:
    return min(256, _pow2_floor(config.local_size))


def applies(config: KernelConfig) -> bool:
    """Whether this generator can serve ``config`` at all: a GPU shape with work-groups of a warp."""
    return (config.vector_width == 1 and local_size(config) >= MIN_LOCAL
            and Block(1, 1, 1, local_size(config)).local_bytes() <= config.local_memory)


def prefers(items: int, rounds: int, config: KernelConfig) -> bool:
    """The selection rule: this kernel rather than the one ``matmul.generate`` would pick
    otherwise, which runs ``items`` useful work-items each through ``rounds`` dependent rounds of
    global loads, when that leaves the device short of TARGET_ITEMS work-items and the chain is
    MIN_ROUNDS long or more (see above)."""
    return applies(config) and items < TARGET_ITEMS and rounds >= MIN_ROUNDS


class _Layout:
    """One input's strides: ``s_x`` along its M (or N), ``s_k`` along K, ``batch`` the batch ones."""

    def __init__(self, dtype: str, ext: int, k: int, s_x: int, s_k: int, batch: tuple[int, ...]):
        self.dtype, self.ext, self.k, self.s_x, self.s_k = dtype, ext, k, s_x, s_k
        others_aligned = all(s % 4 == 0 for s in batch)
        # float4 along K: contiguous along K, every row start a multiple of 4 elements.
        self.wide_k = (dtype in _WIDE and k >= KV and s_k == 1 and s_x % 4 == 0 and others_aligned)
        # contiguous along M/N (and not along K, or K is one long)
        self.along_x = s_x == 1 and ext > 1 and not (s_k == 1 and k > 1)
        self.x_aligned = (dtype in _WIDE and self.along_x and ext % 4 == 0
                          and (s_k % 4 == 0 or k == 1) and others_aligned)

    def bytes_per_k(self, r: int) -> int:
        """Sector bytes a work-group reads per k for ``r`` of its rows (columns)."""
        size = _SIZE[self.dtype]
        if self.s_k == 1 and self.k > 1:
            return r * size  # along K, coalesced across work-items
        if self.along_x:
            if r >= self.ext and self.s_k == self.ext:
                return self.ext * size  # whole rows, back to back
            return max(r * size, SECTOR)
        return r * SECTOR  # neither dimension contiguous: a sector per element


def _tn(rm: int, rn: int, wei: _Layout) -> int:
    """Columns per work-item: 4 (one float4 of a row) where weights run along N, else all the
    block's (each read along K); never more than MAX_ACC sums."""
    tn = min(4, rn) if wei.along_x else rn
    return max(1, min(tn, MAX_ACC // rm))


def choose_block(m: int, n: int, k: int, nbatch: int, src: _Layout, wei: _Layout, config: KernelConfig) -> Block:
    """The block of least modelled time (see ROUND_US); ties: more work-groups, then fewer rows."""
    local = local_size(config)
    best: tuple | None = None
    for rm in (1, 2, 4, 8, 16):
        if rm > min(MAX_RM, _pow2_ceil(m)):
            break
        for rn in (1, 2, 4, 8, 16, 32, 64, 128):
            if rn > min(MAX_RN, _pow2_ceil(n)):
                break
            b = Block(rm, rn, _tn(rm, rn, wei), local)
            if (b.rm * b.tn > MAX_ACC or b.rm * b.rn > local or b.nt > local or b.kt < min(MIN_KT, local)
                    or b.local_bytes() > config.local_memory):
                continue
            groups = math.ceil(m / rm) * math.ceil(n / rn) * nbatch
            traffic = groups * k * (src.bytes_per_k(rm) + wei.bytes_per_k(rn))
            rounds = math.ceil(k / (b.kt * KV))
            latency = math.ceil(groups / RESIDENT) * rounds * (rm + b.tn) * ROUND_US
            cost = max(latency, traffic / L2_BYTES_PER_US)
            key = (cost, -groups, rm)
            if best is None or key < best[0]:
                best = (key, b)
    assert best is not None  # Block(1, 1, 1, local) always fits where ``applies``
    return best[1]


def generate(desc: MatmulDesc, config: KernelConfig, *, block: Block | str | None = None) -> KernelSpec:
    """This kernel for ``desc`` whatever ``prefers`` says (``matmul.generate`` dispatches);
    ``block`` (a Block or its name) overrides ``choose_block``."""
    desc.check_supported()
    return generate_scaled(lambda chain: skinny(desc, chain, config, block), desc.post_ops, desc.output_scale)


def skinny(desc: MatmulDesc, post_ops: tuple, config: KernelConfig, blk: Block | str | None = None) -> KernelSpec:
    """The kernel of ``desc`` with the chain ``post_ops`` (the output scale leading, as
    ``generate_scaled`` hands it); ValueError for a block that does not fit."""
    src_dims, src_strides, src_dtype = desc.src.dims, desc.src.strides, desc.src.dtype
    wei_dims, wei_strides, wei_dtype = desc.weights.dims, desc.weights.strides, desc.weights.dtype
    dst_strides, dst_dtype = desc.dst.strides, desc.dst.dtype
    bias_dtype = "f32" if desc.bias is None else desc.bias.dtype
    m, k = src_dims[-2:]
    n = wei_dims[-1]
    batch = desc.dst.dims[:-2]
    nd = len(batch) + 2
    nbatch = math.prod(batch)
    sa = aligned_strides(src_dims, src_strides, nd)
    sb = aligned_strides(wei_dims, wei_strides, nd)
    sd = tuple(dst_strides)
    has_bias = desc.bias is not None
    sc = aligned_strides(desc.bias.dims, desc.bias.strides, nd) if desc.bias is not None else (0,) * nd
    po_strides = _post_ops.operand_strides(post_ops, nd)
    po_names = tuple(po_strides)
    src = _Layout(src_dtype, m, k, sa[-2], sa[-1], sa[:-2])
    wei = _Layout(wei_dtype, n, k, sb[-1], sb[-2], sb[:-2])

    if blk is None:
        blk = choose_block(m, n, k, nbatch, src, wei, config)
    elif isinstance(blk, str):
        blk = block(blk)
    blk.check()
    if blk.local_bytes() > config.local_memory:
        raise ValueError(f"block {blk.name} needs {blk.local_bytes()} bytes of local memory; "
                         f"the configuration has {config.local_memory}")
    rm, rn, tn, nt, kt, L = blk.rm, blk.rn, blk.tn, blk.nt, blk.kt, blk.local
    outs = rm * rn
    q_per = L // outs  # work-items adding each output's partial sums
    per_q = kt // q_per  # partial sums each of them adds (= rm * tn)

    strides = {"a": sa[:-2], "b": sb[:-2], "d": sd[:-2]}
    if has_bias:
        strides["c"] = sc[:-2]
    strides.update({name: s[:-2] for name, s in po_strides.items()})
    if batch:
        offsets = index_code(batch, strides, "get_group_id(2)")
    else:
        offsets = " ".join(f"const ulong off_{name} = 0;" for name in strides)

    # Each row of src and column of weights this work-item reads: its offset at k = 0, clamped.
    setup = []
    for i in range(rm):
        row = f"m0 + {i}UL" if m % rm == 0 else f"min(m0 + {i}UL, {m - 1}UL)"
        setup.append(f"const ulong ra{i} = off_a + ({row}) * {sa[-2]}UL;")
    wide_n = wei.x_aligned and tn == 4 and not wei.wide_k
    if wide_n:
        col = "n0 + nq * 4UL" if n % rn == 0 else f"min(n0 + nq * 4UL, {n - 4}UL)"
        setup.append(f"const ulong cb = off_b + ({col}) * {sb[-1]}UL;")
    else:
        for j in range(tn):
            col = f"n0 + nq * {tn}UL + {j}UL"
            col = col if n % rn == 0 else f"min({col}, {n - 1}UL)"
            setup.append(f"const ulong cb{j} = off_b + ({col}) * {sb[-1]}UL;")

    def step(kk: str, count: int) -> str:
        """Statements adding the products of ``count`` consecutive k from ``kk`` (ulong) on."""
        lines = []
        b: list[list[str]] = [[] for _ in range(count)]  # b[c][j]: weights at k = kk + c, column j of the work-item
        if wide_n:
            for c in range(count):
                lines.append(f"const float4 b{c} = {_WIDE[wei_dtype]('wei', f'cb + ({kk} + {c}UL) * {sb[-2]}UL')};")
                b[c] = [f"b{c}.s{j}" for j in range(tn)]
        else:
            for j in range(tn):
                if count == KV and wei.wide_k:
                    lines.append(f"const float4 b_{j} = {_WIDE[wei_dtype]('wei', f'cb{j} + {kk}')};")
                    for c in range(count):
                        b[c].append(f"b_{j}.s{c}")
                    continue
                for c in range(count):
                    value = _dtype_io.load(wei_dtype, "wei", f"cb{j} + ({kk} + {c}UL) * {sb[-2]}UL")
                    lines.append(f"const float b{c}_{j} = {value};")
                    b[c].append(f"b{c}_{j}")
        for i in range(rm):
            if count == KV and src.wide_k:
                lines.append(f"const float4 a{i} = {_WIDE[src_dtype]('src', f'ra{i} + {kk}')};")
                a = [f"a{i}.s{c}" for c in range(count)]
            else:
                a = [f"a{i}_{c}" for c in range(count)]
                lines.append(" ".join(
                    f"const float a{i}_{c} = {_dtype_io.load(src_dtype, 'src', f'ra{i} + ({kk} + {c}UL) * {sa[-1]}UL')};"
                    for c in range(count)))
            lines.append(" ".join(f"s{i}_{j} = fma({a[c]}, {b[c][j]}, s{i}_{j});"
                                  for c in range(count) for j in range(tn)))
        return "\n            ".join(lines)

    groups_k = k // KV if k >= KV else k  # KV-groups (k >= 4) or single k (k < 4)
    count = KV if k >= KV else 1
    rounds, rest = groups_k // kt, groups_k % kt
    tail_k = k - groups_k * count  # k past the last whole group (k >= 4 only)
    # unrolled for some 16 loads in flight per work-item (rows of src + rows or columns of weights)
    unroll = _pow2_floor(max(1, min(4, 16 // (rm + (count if wide_n or not wei.wide_k else tn)), rounds or 1)))
    main = ""
    if rounds:
        main = f"""
    #pragma unroll {unroll}
    for (uint r = 0; r < {rounds}u; ++r) {{
        const ulong kk = (r * {kt}UL + kq) * {count}UL;
        {{
            {step("kk", count)}
        }}
    }}"""
    if rest:
        main += f"""
    if (kq < {rest}u) {{
        const ulong kk = ({rounds * kt}UL + kq) * {count}UL;
        {step("kk", count)}
    }}"""
    if tail_k:
        main += f"""
    if (kq < {tail_k}u) {{
        const ulong kk = {groups_k * count}UL + kq;
        {step("kk", 1)}
    }}"""

    sums = [f"s{i}_{j}" for i in range(rm) for j in range(tn)]
    to_local = " ".join(f"red[{x * L}u + lid] = {name};" for x, name in enumerate(sums))
    reduce1 = f"""{{
        const uint o = lid / {q_per}u, q = lid % {q_per}u;
        const uint j = o % {rn}u, x = (o / {rn}u) * {tn}u + j % {tn}u;
        __local const float* p = red + x * {L}u + q * {per_q * nt}u + j / {tn}u;
        float t = 0.0f;
        for (uint u = 0; u < {per_q}u; ++u) t += p[u * {nt}u];
        {"red2[lid] = t;" if q_per > 1 else "total = t;"}
    }}"""
    reduce2 = f"""barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < {outs}u) for (uint q = 0; q < {q_per}u; ++q) total += red2[lid * {q_per}u + q];""" if q_per > 1 else ""

    sdm, sdn, scm, scn = sd[-2], sd[-1], sc[-2], sc[-1]
    od = f"off_d + row * {sdm}UL + col * {sdn}UL"
    bias = (" + " + _dtype_io.load(bias_dtype, "bias", f"off_c + row * {scm}UL + col * {scn}UL")) if has_bias else ""
    post = _dtype_io.apply_post_ops_scalar(post_ops, "v", od, {
        name: f"off_{name} + row * {po_strides[name][-2]}UL + col * {po_strides[name][-1]}UL" for name in po_names
    }, dst_dtype)
    guard = " && ".join(([] if m % rm == 0 else ["row < M"]) + ([] if n % rn == 0 else ["col < N"]))
    epilogue = f"""if (lid < {outs}u) {{
        const ulong row = m0 + lid / {rn}u, col = n0 + lid % {rn}u;
        {f"if ({guard}) " if guard else ""}{{
            float v = total{bias};
            {post}
            {_dtype_io.store(dst_dtype, "dst", od, "v")}
        }}
    }}"""

    bias_param = f" {_dtype_io.param(bias_dtype, 'bias', const=True)}," if has_bias else ""
    loads = (src_dtype, wei_dtype, dst_dtype) + ((bias_dtype,) if has_bias else ())
    src_param = _dtype_io.param(src_dtype, "src", const=True)
    wei_param = _dtype_io.param(wei_dtype, "wei", const=True)
    dst_param = _dtype_io.param(dst_dtype, "dst", const=False)
    source = (_dtype_io.functions(loads=loads, stores=(dst_dtype,)) + _post_ops.functions(post_ops, ("float",))
              + f"""#define M {m}UL
#define N {n}UL
#define K {k}UL
__kernel __attribute__((reqd_work_group_size({L}, 1, 1)))
void matmul_fwd({src_param}, {wei_param},{bias_param}{_post_ops.params(post_ops)}
                {dst_param}) {{
    __local float red[{L * rm * tn}];
    {f"__local float red2[{L}];" if q_per > 1 else ""}
    const uint lid = get_local_id(0), kq = lid / {nt}u, nq = lid % {nt}u;
    const ulong m0 = get_group_id(1) * {rm}UL, n0 = get_group_id(0) * {rn}UL;
    {offsets}
    {(chr(10) + "    ").join(setup)}
    float {", ".join(f"{s} = 0.0f" for s in sums)};{main}
    {to_local}
    barrier(CLK_LOCAL_MEM_FENCE);
    float total = 0.0f;
    {reduce1}
    {reduce2}
    {epilogue}
}}
""")
    args = ("src", "weights") + (("bias",) if has_bias else ()) + po_names + ("dst",)
    return KernelSpec(
        source=source,
        name="matmul_fwd",
        arg_names=args,
        global_size=(math.ceil(n / rn) * L, math.ceil(m / rm), nbatch),
        local_size=(L, 1, 1),
        impl=f"ocl:skinny:{blk.name}",
    )
