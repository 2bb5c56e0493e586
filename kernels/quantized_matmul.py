"""Int8 matmul: ``QuantizedMatmulDesc``'s generator and its numpy reference (int64 sums).

One work-item per dst element, work-groups along N: neighbouring work-items read neighbouring
weights and one broadcast src value, which PoCL's work-group vectoriser turns into vector code
and a GPU coalesces. The K loop is integer math, ``acc += (a - zp) * (w - zp)`` on ints (no fma,
nothing float until the end); the scales, zero points and dst quantization are the descriptor's
frozen values, baked in as constants (per-channel ones as ``__constant`` tables indexed by n).

The epilogue keeps each float step its own statement (``(float)acc * scale``, then ``+ bias``,
then the chain, then ``/ dst_scale``, then ``+ dst_zp``) so no compiler contracts two of them
into one fma: the reference rounds each step to f32 the same way, so integer outputs match it
exactly.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._quantized_matmul_desc import QuantizedMatmulDesc
from . import _dtype_io, _post_ops, quantized_matmul_mma, tolerance
from ._post_ops import aligned_strides
from ._registry import register
from ._spec import KernelConfig, KernelSpec, c_float, index_code, padded_global


def scales(desc: QuantizedMatmulDesc) -> np.ndarray:
    """The f32 product ``src_scale * wei_scale[n]`` per output channel (one value per tensor)."""
    return (np.float64(desc.src_scale) * np.asarray(desc.wei_scales, np.float64)).astype(np.float32)


def _table(ctype: str, name: str, values, fmt) -> str:
    return f"__constant {ctype} {name}[{len(values)}] = {{{', '.join(fmt(v) for v in values)}}};\n"


# CPU (``vector_width`` 16, a clang-based OpenCL: PoCL): each work-item a CPU_TM x CPU_TN block of
# dst in int16 accumulators (4 x 64: 16 of AVX-512's 32 registers), CPU_TN / 16 weights vectors
# and one broadcast src value per row per k (no int16 built-in calls: __builtin_convertvector and
# plain vector stores, as a call taking int16 drops to 256-bit code, see matmul's mm_wide); rows
# and columns past the matrix are clamped to its last one (loads stay in bounds without branches
# in the K loop) and not stored. Measured on PoCL (2 shared cores), u8 x s8 -> u8: 128x512x512,
# one element per work-item 129 ms, 8 x 32 blocks 2.1; 384x1024x1024, 8 x 32 34-40 ms, 4 x 64
# 20-23 (2 x 64 22-32, 6 x 64 39, 12 x 32 59, 16 x 16 50, 4 x 128 51). Weights are read in place
# (a K-chunked copy as matmul's CPU path makes is left to do).
CPU_TM, CPU_TN = 4, 64


def _layout(desc: QuantizedMatmulDesc) -> dict:
    """Strides aligned to dst's rank (0 on broadcast dims) and the batch offsets' C code."""
    dst_dims = desc.dst.dims
    nd = len(dst_dims)
    sa = aligned_strides(desc.src.dims, desc.src.strides, nd)
    sb = aligned_strides(desc.weights.dims, desc.weights.strides, nd)
    sd = tuple(desc.dst.strides)
    strides = {"a": sa[:-2], "b": sb[:-2], "d": sd[:-2]}
    sc = aligned_strides(desc.bias.dims, desc.bias.strides, nd) if desc.bias is not None else (0,) * nd
    if desc.bias is not None:
        strides["c"] = sc[:-2]
    po_strides = _post_ops.operand_strides(desc.post_ops, nd)
    strides.update({name: st[:-2] for name, st in po_strides.items()})
    batch = dst_dims[:-2]
    offsets = index_code(batch, strides, "get_global_id(2)") if batch else " ".join(
        f"const ulong off_{name} = 0;" for name in strides)
    return dict(sa=sa, sb=sb, sd=sd, sc=sc, po_strides=po_strides, offsets=offsets, nbatch=math.prod(batch))


def _epilogue(desc: QuantizedMatmulDesc, lay: dict) -> tuple[str, str, str]:
    """The per-element epilogue as a C function (int sum -> dst element), its tables and the
    arguments a kernel passes it."""
    combined = scales(desc)
    tables = ""
    if combined.size > 1:
        tables += _table("float", "SCALES", combined, c_float)
        scale = "SCALES[nn]"
    else:
        scale = c_float(float(combined[0]))
    ddt = desc.dst.dtype
    sd, sc, po_strides = lay["sd"], lay["sc"], lay["po_strides"]
    bias = desc.bias
    has_bias = bias is not None
    od = f"off_d + mm * {sd[-2]}UL + nn * {sd[-1]}UL"
    lines = [f"float y = (float)acc; y = y * {scale};"]
    if bias is not None:
        lines.append(f"y = y + {_dtype_io.load(bias.dtype, 'bias', f'off_c + mm * {sc[-2]}UL + nn * {sc[-1]}UL')};")
    if desc.post_ops:
        lines.append(_dtype_io.apply_post_ops_scalar(desc.post_ops, "y", od, {
            name: f"off_{name} + mm * {st[-2]}UL + nn * {st[-1]}UL" for name, st in po_strides.items()}, ddt))
    if desc.dst_scale != 1.0:
        lines.append(f"y = y / {c_float(desc.dst_scale)};")
    if desc.dst_zp:
        lines.append(f"y = y + {c_float(float(desc.dst_zp))};")
    lines.append(_dtype_io.store(ddt, "dst", od, "y"))
    names = ("bias",) * has_bias + tuple(po_strides)
    bias_param = f"{_dtype_io.param(bias.dtype, 'bias', const=True)}," if bias is not None else ""
    offs = "".join(f" const ulong off_{x}," for x in ("d",) + ("c",) * has_bias + tuple(po_strides))
    fn = (f"static inline void qm_epilogue({bias_param}{_post_ops.params(desc.post_ops)}"
          f" {_dtype_io.param(ddt, 'dst', const=False)},{offs} const ulong mm, const ulong nn, const int acc) {{\n"
          f"    {' '.join(lines)}\n}}\n")
    call = "".join(f"{x}, " for x in names) + "dst, " + "".join(
        f"off_{x}, " for x in ("d",) + ("c",) * has_bias + tuple(po_strides))
    return tables, fn, call


def _wzp_table(desc: QuantizedMatmulDesc) -> tuple[str, str | None]:
    """The weights' zero points: a per-channel table, or one constant (None for zero)."""
    wzps = desc.wei_zps
    if len(wzps) > 1 and any(wzps):
        return _table("int", "WZPS", wzps, str), None
    return "", (str(wzps[0]) if wzps and wzps[0] else None)


def generate(desc: QuantizedMatmulDesc, config: KernelConfig, *, mma_tile: str | None = None) -> KernelSpec:
    """The int8 kernel of ``desc`` on ``config``'s device: NVIDIA's tensor cores where
    ``quantized_matmul_mma`` reads the layout and ``mma_tile`` names its tile (by itself only
    once ``quantized_matmul_mma.CHOSEN``), else the CPU's blocks or the GPU's integer tiles."""
    desc.check_supported()
    lay = _layout(desc)
    tables, epilogue, call = _epilogue(desc, lay)
    wtable, wzp_const = _wzp_table(desc)
    m, n = desc.dst.dims[-2:]
    k = desc.src.dims[-1]
    sa, sb = lay["sa"], lay["sb"]
    params = (f"{_dtype_io.param(desc.src.dtype, 'src', const=True)}, {_dtype_io.param(desc.weights.dtype, 'wei', const=True)},"
              + (f" {_dtype_io.param(desc.bias.dtype, 'bias', const=True)}," if desc.bias is not None else "")
              + f"{_post_ops.params(desc.post_ops)} {_dtype_io.param(desc.dst.dtype, 'dst', const=False)}")
    loads = (desc.dst.dtype,) + ((desc.bias.dtype,) if desc.bias is not None else ())
    head = (_dtype_io.functions(loads=loads, stores=(desc.dst.dtype,)) + _post_ops.functions(desc.post_ops)
            + tables + wtable + epilogue)
    args = ("src", "weights") + (("bias",) if desc.bias is not None else ()) + tuple(lay["po_strides"]) + ("dst",)
    zpa = f" - {desc.src_zp}" if desc.src_zp else ""
    if quantized_matmul_mma.applies(desc, config) and (mma_tile is not None or quantized_matmul_mma.CHOSEN):
        wzp = "WZPS[nn]" if wtable else wzp_const
        return quantized_matmul_mma.generate(desc, config, head, params, call, args, lay, wzp, tile=mma_tile)
    if config.vector_width >= 16 and sa[-1] == 1 and sb[-2] == 1 and k >= 16:
        return _cpu_dot_generate(desc, lay, head, params, call, args, bool(wtable), wzp_const)
    if config.vector_width >= 16:
        return _cpu_generate(desc, lay, head, params, call, args, wzp_const, zpa)
    if config.local_size >= 256 and m * n >= TILED_MIN_DST:
        return _gpu_tiled(desc, lay, head, params, call, args, bool(wtable), wzp_const, zpa)
    # Elsewhere (GPU, small dst): one dst element per work-item, work-groups along N (coalesced weights).
    wzp = "WZPS[nn]" if wtable else (wzp_const or "0")
    shifted_w = f"(int)wei[wk] - {wzp}" if wzp != "0" else "(int)wei[wk]"
    local = min(config.local_size, 256)
    source = head + (
        f"__kernel void quantized_matmul({params}) {{\n"
        "    const ulong nn = get_global_id(0), mm = get_global_id(1);\n"
        f"    if (nn >= {n}UL || mm >= {m}UL || get_global_id(2) >= {lay['nbatch']}UL) return;\n"
        f"    {lay['offsets']}\n"
        f"    const ulong a0 = off_a + mm * {sa[-2]}UL, b0 = off_b + nn * {sb[-1]}UL;\n"
        "    int acc = 0;\n"
        f"    for (ulong kk = 0; kk < {k}UL; ++kk) {{\n"
        f"        const ulong ak = a0 + kk * {sa[-1]}UL, wk = b0 + kk * {sb[-2]}UL;\n"
        f"        acc += ((int)src[ak]{zpa}) * ({shifted_w});\n"
        "    }\n"
        f"    qm_epilogue({call}mm, nn, acc);\n"
        "}\n"
    )
    return KernelSpec(source=source, name="quantized_matmul", arg_names=args,
                      global_size=(padded_global(n, local), m, lay["nbatch"]), local_size=(local, 1, 1),
                      impl=f"ocl:int8:l{local}")


# GPU, dst of TILED_MIN_DST elements or more: 16 x 16 work-groups each own a 64 x 64 tile of dst,
# 4 x 4 elements per work-item (rows ty + 16 i, columns tx + 16 j: neighbouring work-items read
# neighbouring local words); K walks in slabs of 16, each work-item copying 4 src and 4 weights
# values, zero-point shifted, into __local ints (0 past the matrix, so padding adds nothing).
# Measured on an H200 against one element per work-item: 128x512x512 0.159 vs 0.056 ms (16
# work-groups cannot fill the GPU), 384x1024x1024 0.227 vs 0.284, 2048x4096x4096 5.5 vs 12.9
# (dequantize + the f32 tiled SGEMM + quantize: 2.1; int32 multiply-adds, no dp4a).
TILED_MIN_DST = 1 << 18


def _gpu_tiled(desc, lay, head, params, call, args, w_table, wzp_const, zpa) -> KernelSpec:
    m, n = desc.dst.dims[-2:]
    k = desc.src.dims[-1]
    sa, sb = lay["sa"], lay["sb"]
    wzp = " - WZPS[gn]" if w_table else (f" - {wzp_const}" if wzp_const else "")
    acc = [(i, j) for i in range(4) for j in range(4)]
    source = head + (
        f"__kernel __attribute__((reqd_work_group_size(16, 16, 1))) void quantized_matmul({params}) {{\n"
        "    __local int As[16][64]; __local int Bs[16][64];\n"
        "    const uint tx = get_local_id(0), ty = get_local_id(1), lid = ty * 16u + tx;\n"
        "    const ulong n_base = get_group_id(0) * 64UL, m_base = get_group_id(1) * 64UL;\n"
        f"    {lay['offsets']}\n"
        f"    int {', '.join(f'c{i}_{j} = 0' for i, j in acc)};\n"
        f"    for (ulong k0 = 0; k0 < {k}UL; k0 += 16UL) {{\n"
        "        for (uint r = 0; r < 4u; ++r) {\n"
        "            const uint idx = lid + r * 256u;\n"
        "            { const uint mi = idx / 16u, ki = idx % 16u; const ulong gm = m_base + mi, gk = k0 + ki;\n"
        f"    As[ki][mi] = (gm < {m}UL && gk < {k}UL) ? (int)src[off_a + gm * {sa[-2]}UL + gk * {sa[-1]}UL]{zpa} : 0; }}\n"
        "            { const uint ki = idx / 64u, ni = idx % 64u; const ulong gk = k0 + ki, gn = n_base + ni;\n"
        f"    Bs[ki][ni] = (gn < {n}UL && gk < {k}UL) ? (int)wei[off_b + gk * {sb[-2]}UL + gn * {sb[-1]}UL]{wzp} : 0; }}\n"
        "        }\n"
        "        barrier(CLK_LOCAL_MEM_FENCE);\n"
        "        for (uint kk = 0; kk < 16u; ++kk) {\n"
        + "".join(f"            const int a{i} = As[kk][ty + {16 * i}u];\n" for i in range(4))
        + "".join(f"            const int b{j} = Bs[kk][tx + {16 * j}u];\n" for j in range(4))
        + "            " + " ".join(f"c{i}_{j} += a{i} * b{j};" for i, j in acc) + "\n"
        "        }\n"
        "        barrier(CLK_LOCAL_MEM_FENCE);\n"
        "    }\n"
        + "".join(f"    {{ const ulong mm = m_base + ty + {16 * i}UL, nn = n_base + tx + {16 * j}UL;"
                  f" if (mm < {m}UL && nn < {n}UL) qm_epilogue({call}mm, nn, c{i}_{j}); }}\n" for i, j in acc)
        + "}\n"
    )
    return KernelSpec(source=source, name="quantized_matmul", arg_names=args,
                      global_size=(math.ceil(n / 64) * 16, math.ceil(m / 64) * 16, lay["nbatch"]),
                      local_size=(16, 16, 1), impl="ocl:int8:tiled:64x64:l16x16")


# CPU, src and weights both contiguous along K (weights N x K, a linear layer's, or attention's
# K^T): each work-item a DOT_TM x DOT_TN block of dst as int16 partial dot products along K (16
# accumulators), 16 k at a time from one vector load of each row and column, summed across lanes
# at the end; the K tail element by element. Measured on PoCL: MHA-bert int8's Q @ K^T
# (16 x 384x64 @ 64x384, weights K-contiguous) read through _cpu_generate's gathers left the graph
# at 0.95x of op by op.
DOT_TM, DOT_TN = 4, 4


def _cpu_dot_generate(desc, lay, head, params, call, args, w_table, wzp_const) -> KernelSpec:
    m, n = desc.dst.dims[-2:]
    k = desc.src.dims[-1]
    sa, sb = lay["sa"], lay["sb"]
    tm, tn = min(DOT_TM, m), min(DOT_TN, n)
    mt, nt = math.ceil(m / tm), math.ceil(n / tn)
    kv = k // 16
    atype, wtype = _dtype_io.STORAGE[desc.src.dtype], _dtype_io.STORAGE[desc.weights.dtype]
    zwa = [f"WZPS[c{j}]" if w_table else (wzp_const or "0") for j in range(tn)]
    cols = " ".join(f"const ulong c{j} = MIN(n0 + {j}UL, {n - 1}UL); const ulong b{j} = off_b + c{j} * {sb[-1]}UL;"
                    for j in range(tn))
    rows = " ".join(f"const ulong a{i} = off_a + MIN(m0 + {i}UL, {m - 1}UL) * {sa[-2]}UL;" for i in range(tm))
    accs = " ".join(f"int16 v{i}_{j} = (int16)(0);" for i in range(tm) for j in range(tn))
    loop = (
        f"for (ulong kv = 0; kv < {kv}UL; ++kv) {{ "
        + " ".join(f"const int16 x{i} = __builtin_convertvector(*(__global const qm_a16u*)(src + a{i} + kv * 16UL), int16)"
                   f"{f' - (int16)({desc.src_zp})' if desc.src_zp else ''};" for i in range(tm))
        + " " + " ".join(f"const int16 y{j} = __builtin_convertvector(*(__global const qm_w16u*)(wei + b{j} + kv * 16UL), int16)"
                         f"{f' - (int16)({zwa[j]})' if zwa[j] != '0' else ''};" for j in range(tn))
        + " " + " ".join(f"v{i}_{j} += x{i} * y{j};" for i in range(tm) for j in range(tn)) + " }")
    lanes = lambda v: " + ".join(f"{v}.s{lane:x}" for lane in range(16))  # noqa: E731
    sums = " ".join(f"int s{i}_{j} = {lanes(f'v{i}_{j}')};" for i in range(tm) for j in range(tn))
    tail = ""
    if k % 16:
        zpa = f" - {desc.src_zp}" if desc.src_zp else ""
        tail = (f"for (ulong kk = {kv * 16}UL; kk < {k}UL; ++kk) {{ "
                + " ".join(f"s{i}_{j} += ((int)src[a{i} + kk]{zpa}) * ((int)wei[b{j} + kk] - {zwa[j]});"
                           for i in range(tm) for j in range(tn)) + " }")
    stores = " ".join(f"if (m0 + {i}UL < {m}UL && n0 + {j}UL < {n}UL) qm_epilogue({call}m0 + {i}UL, n0 + {j}UL, s{i}_{j});"
                      for i in range(tm) for j in range(tn))
    source = (
        f"typedef {atype}16 __attribute__((aligned(1))) qm_a16u;\n"
        f"typedef {wtype}16 __attribute__((aligned(1))) qm_w16u;\n#define MIN(a, b) ((a) < (b) ? (a) : (b))\n"
        + head
        + f"__kernel void quantized_matmul({params}) {{\n"
        "    const ulong nb = get_global_id(0), mb = get_global_id(1);\n"
        f"    if (nb >= {nt}UL || mb >= {mt}UL || get_global_id(2) >= {lay['nbatch']}UL) return;\n"
        f"    {lay['offsets']}\n"
        f"    const ulong n0 = nb * {tn}UL, m0 = mb * {tm}UL;\n"
        f"    {cols}\n    {rows}\n    {accs}\n    {loop}\n    {sums}\n    {tail}\n    {stores}\n"
        "}\n"
    )
    return KernelSpec(source=source, name="quantized_matmul", arg_names=args,
                      global_size=(nt, mt, lay["nbatch"]), local_size=(1, 1, 1),
                      impl=f"ocl:int8:dot:{tm}x{tn}:l1x1")


def _cpu_generate(desc, lay, head, params, call, args, wzp_const, zpa) -> KernelSpec:
    m, n = desc.dst.dims[-2:]
    k = desc.src.dims[-1]
    sa, sb = lay["sa"], lay["sb"]
    tm, tn = min(CPU_TM, m), CPU_TN
    nv = tn // 16
    mt, nt = math.ceil(m / tm), math.ceil(n / tn)
    wtype = _dtype_io.STORAGE[desc.weights.dtype]
    sbk, sbn = sb[-2], sb[-1]

    def wvec(j: int, clamp: bool) -> str:
        col = (lambda l: f"MIN(n0 + {16 * j + l}UL, {n - 1}UL)") if clamp else (lambda l: f"n0 + {16 * j + l}UL")
        if not clamp and sbn == 1:
            return f"__builtin_convertvector(*(__global const qm_w16u*)(wei + wk + n0 + {16 * j}UL), int16)"
        return "(int16)(" + ", ".join(f"(int)wei[wk + ({col(l)}) * {sbn}UL]" for l in range(16)) + ")"

    def k_loop(clamp: bool) -> str:
        body = [f"const ulong wk = off_b + kk * {sbk}UL;"]
        for j in range(nv):
            body.append(f"const int16 w{j} = {wvec(j, clamp)}{f' - zw{j}' if zw_needed else ''};")
        for i in range(tm):
            body.append(f"{{ const int16 a = (int16)((int)src[a{i} + kk * {sa[-1]}UL]{zpa});"
                        + "".join(f" c{i}_{j} += a * w{j};" for j in range(nv)) + " }")
        return f"for (ulong kk = 0; kk < {k}UL; ++kk) {{ " + " ".join(body) + " }"

    zw_needed = bool(desc.wei_zps) and any(desc.wei_zps)
    if zw_needed and wzp_const is None:  # per-channel table
        zw = " ".join(f"const int16 zw{j} = (int16)(" + ", ".join(
            f"WZPS[MIN(n0 + {16 * j + l}UL, {n - 1}UL)]" for l in range(16)) + ");" for j in range(nv))
    elif zw_needed:
        zw = " ".join(f"const int16 zw{j} = (int16)({wzp_const});" for j in range(nv))
    else:
        zw = ""
    rows = " ".join(f"const ulong a{i} = off_a + MIN(m0 + {i}UL, {m - 1}UL) * {sa[-2]}UL;" for i in range(tm))
    accs = " ".join(f"int16 c{i}_{j} = (int16)(0);" for i in range(tm) for j in range(nv))
    save = " ".join(f"*(int16*)(sums + {i * tn + 16 * j}) = c{i}_{j};" for i in range(tm) for j in range(nv))
    source = (
        f"typedef {wtype}16 __attribute__((aligned(1))) qm_w16u;\n#define MIN(a, b) ((a) < (b) ? (a) : (b))\n"
        + head
        + f"__kernel void quantized_matmul({params}) {{\n"
        "    const ulong nb = get_global_id(0), mb = get_global_id(1);\n"
        f"    if (nb >= {nt}UL || mb >= {mt}UL || get_global_id(2) >= {lay['nbatch']}UL) return;\n"
        f"    {lay['offsets']}\n"
        f"    const ulong n0 = nb * {tn}UL, m0 = mb * {tm}UL;\n"
        f"    {rows}\n    {zw}\n    {accs}\n"
        f"    if (n0 + {tn}UL <= {n}UL) {{ {k_loop(False)} }} else {{ {k_loop(True)} }}\n"
        f"    int sums[{tm * tn}] __attribute__((aligned(64)));\n    {save}\n"
        f"    for (ulong i = 0; i < {tm}UL && m0 + i < {m}UL; ++i)\n"
        f"        for (ulong j = 0; j < {tn}UL && n0 + j < {n}UL; ++j)\n"
        f"            qm_epilogue({call}m0 + i, n0 + j, sums[i * {tn}UL + j]);\n"
        "}\n"
    )
    return KernelSpec(source=source, name="quantized_matmul", arg_names=args,
                      global_size=(nt, mt, lay["nbatch"]), local_size=(1, 1, 1),
                      impl=f"ocl:int8:regblock:{tm}x{tn}:l1x1")


# The GPU kernels against dequantize + the tiled f32 SGEMM + quantize, measured on an H200 (u8 x
# s8 -> u8, per-channel, ReLU): 8x8x8 0.047 vs 0.078 ms, 128x512x512 (33.5M multiply-adds) 0.056
# vs 0.080, 384x1024x1024 (403M) 0.227 vs 0.110, 2048x4096x4096 5.5 vs 2.1. Fused up to this many
# multiply-adds on a GPU configuration.
GPU_FUSED_MACS = 1 << 26


def fusion_pays(m: int, n: int, k: int, nbatch: int, config: KernelConfig) -> bool:
    """Whether this kind's kernel beats the int8 matmul op by op for these sizes: always on the
    CPU (PoCL, measured: 1.7x at 128x512x512, even at 384x1024x1024), up to GPU_FUSED_MACS on a
    GPU, whose f32 SGEMM is faster than these int32 kernels (``_gpu_tiled``)."""
    return config.vector_width >= 16 or m * n * k * nbatch <= GPU_FUSED_MACS


def reference(desc: QuantizedMatmulDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}``: the int64 sum of the shifted inputs, then
    each float step rounded to f32 in the kernel's order, stored as dst's type (nearest even,
    saturated for s8/u8)."""
    n = desc.dst.dims[-1]
    a = np.asarray(inputs["src"]).astype(np.int64) - desc.src_zp
    wzps = np.asarray(desc.wei_zps or (0,), np.int64)
    w = np.asarray(inputs["weights"]).astype(np.int64) - (wzps if wzps.size == n else wzps[0])
    acc = np.matmul(a, w)
    y = acc.astype(np.float32) * scales(desc)
    if "bias" in inputs and inputs["bias"] is not None:
        y = (y + _dtype_io.widen(inputs["bias"]).astype(np.float32)).astype(np.float32)
    y = _post_ops.reference(desc.post_ops, y, inputs.get("dst"), inputs)
    if desc.dst_scale != 1.0:
        y = (y / np.float32(desc.dst_scale)).astype(np.float32)
    if desc.dst_zp:
        y = (y + np.float32(desc.dst_zp)).astype(np.float32)
    return _dtype_io.store_reference(y, desc.dst.dtype)


def threshold(desc: QuantizedMatmulDesc) -> float:
    """Exact sums; the float epilogue (the post-op chain's own error) for float dst."""
    chain = max((tolerance.eltwise(op[1]) for op in desc.post_ops if op[0] == "eltwise"), default=0.0)
    return max(chain, 1e-6)


register(QuantizedMatmulDesc, generate=generate, reference=reference, tolerance=threshold)
