"""Weights-decompression matmul: ``DequantizingMatmulDesc``'s generator and its float64 reference.

One work-item per dst element, work-groups along N, as the int8 matmul's plain kernel:
neighbouring work-items read neighbouring weights (for s4/u4 the two nibbles of one byte) and one
broadcast src value, which PoCL's work-group vectoriser turns into vector code and a GPU
coalesces. K walks group by group: each group's scale and zero point are loaded once per
work-item, then each weight of the group is dequantized in registers, ``(w - zp) * scale`` in
f32 rounded to the graph's dequantized type, and multiplied into an f32 sum. The packed weights
are read once per row of dst; op by op, DynamicDequantize wrote them out as floats (4x the bytes
of s8, 8x those of s4 in f32, half that in f16) and the matmul read those back.
"""

from __future__ import annotations

import numpy as np

from .._values._dequantizing_matmul_desc import DequantizingMatmulDesc
from . import _dtype_io, _post_ops, _quantized_io, tolerance
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global


def generate(desc: DequantizingMatmulDesc, config: KernelConfig) -> KernelSpec:
    desc.check_supported()
    (m, k), n = desc.src.dims, desc.dst.dims[1]
    gk, gn = desc.group_shape
    sa, sw, ss, sd = desc.src.strides, desc.weights.strides, desc.scales.strides, desc.dst.strides
    args = desc.arg_descs
    inputs = [name for name in ("src", "weights", "scales", "zps") if name in args]
    params = (", ".join(_dtype_io.param(args[name].dtype, name, const=True) for name in inputs) + ","
              + _post_ops.params(desc.post_ops) + " " + _dtype_io.param(desc.dst.dtype, "dst", const=False))
    loads = [args[name].dtype for name in inputs] + [desc.dst.dtype]
    od = f"mm * {sd[0]}UL + nn * {sd[1]}UL"
    po_strides = _post_ops.operand_strides(desc.post_ops, 2)
    epilogue = ""
    if desc.post_ops:
        epilogue = _dtype_io.apply_post_ops_scalar(desc.post_ops, "y", od, {
            name: f"mm * {st[0]}UL + nn * {st[1]}UL" for name, st in po_strides.items()}, desc.dst.dtype)
    rounding = {desc.dequantized} - {"f32"}
    head = (_dtype_io.functions(loads=loads, stores=(desc.dst.dtype,)) + _post_ops.functions(desc.post_ops)
            + _quantized_io.rounding_functions(rounding))
    if config.vector_width >= 16 and _blocks_fit(desc):
        return _cpu_generate(desc, head, params, epilogue, od)
    scale = _dtype_io.load(desc.scales.dtype, "scales", f"g0 + kg * {ss[0]}UL")
    zp, zp_offset = "0.0f", ""
    if desc.zps is not None:
        sz = desc.zps.strides
        zp_offset = f" const ulong z0 = (nn / {gn}UL) * {sz[1]}UL;"
        zp = _dtype_io.load(desc.zps.dtype, "zps", f"z0 + kg * {sz[0]}UL")
    weight = _dtype_io.load(desc.weights.dtype, "weights", f"w0 + kk * {sw[0]}UL")
    dequantized = _quantized_io.rounded(desc.dequantized, "(w - z) * s")
    local = min(config.local_size, 256)
    source = (
        head
        + f"__kernel void dequantizing_matmul({params}) {{\n"
        "    const ulong nn = get_global_id(0), mm = get_global_id(1);\n"
        f"    if (nn >= {n}UL || mm >= {m}UL) return;\n"
        f"    const ulong a0 = mm * {sa[0]}UL, w0 = nn * {sw[1]}UL, g0 = (nn / {gn}UL) * {ss[1]}UL;{zp_offset}\n"
        "    float acc = 0.0f;\n"
        f"    for (ulong kg = 0; kg < {k // gk}UL; ++kg) {{\n"
        f"        const float s = {scale};\n"
        f"        const float z = {zp};\n"
        f"        for (ulong kk = kg * {gk}UL; kk < kg * {gk}UL + {gk}UL; ++kk) {{\n"
        f"            const float w = {weight};\n"
        f"            const float d = {dequantized};\n"
        f"            acc += {_dtype_io.load(desc.src.dtype, 'src', f'a0 + kk * {sa[1]}UL')} * d;\n"
        "        }\n"
        "    }\n"
        f"    float y = acc; {epilogue}\n"
        f"    {_dtype_io.store(desc.dst.dtype, 'dst', od, 'y')}\n"
        "}\n"
    )
    return KernelSpec(source=source, name="dequantizing_matmul", arg_names=tuple(args),
                      global_size=(padded_global(n, local), m), local_size=(local, 1),
                      impl=f"ocl:dequantizing:l{local}")


# CPU (``vector_width`` 16, PoCL): each work-item a row of CPU_TN columns, whose weights of one k
# are one vector load (16 bytes: 32 4-bit or 16 8-bit weights; 4-bit ones split into the even
# and the odd columns' nibbles), dequantized as float16 vectors with one scale and zero point per
# group (a block never straddles a group along N). Measured on PoCL (2 shared cores), M = 1,
# K = 4096, N = 14336, u4 in groups of 1 x 128, f16 scales, u8 zero points, dequantized to f16:
# the one-element-per-work-item kernel 845-999 ms against 590-892 ms op by op (DynamicDequantize
# to f16, then the f16 register-block matmul); this kernel 77-83 ms (3 runs each, a scratch script
# timing both in turns). With one scale and zero point per column in groups of 128 along K (two
# vectors of 16 loaded per group): 93-120 ms against 946-1158 ms op by op, the same script. The
# whole int4 gated MLP: BENCHMARKS.md, section 19.
CPU_TN = 32


def _columns_fit(n: int, group_n: int) -> bool:
    """N a multiple of the block, and groups along N that are multiples of the block (one scale
    a block) or single columns (a vector of scales a block)."""
    return n % CPU_TN == 0 and (group_n % CPU_TN == 0 or group_n == 1)


def _blocks_fit(desc: DequantizingMatmulDesc) -> bool:
    """Whether the CPU blocks apply: ``_columns_fit``, and weights dense along N (with an even
    row stride), so every block's weights of one k are one aligned-enough vector."""
    return _columns_fit(desc.dst.dims[1], desc.group_shape[1]) and desc.weights.strides[1] == 1 \
        and desc.weights.strides[0] % 2 == 0


def fusion_pays(n: int, group: tuple[int, int], config: KernelConfig) -> bool:
    """Whether DynamicDequantize -> MatMul should run as this kind for N columns in groups of
    ``group`` (along K, along N): where the CPU's blocks apply (measured 9x op by op with one
    scale a block; a vector of scales a block, per column, loaded once per group of at least 32
    k); not on a GPU configuration, where the one-element-per-work-item kernel ran oneDNN's int4
    gated MLP (M = 1, K = 4096) 3.5x slower than the ops one by one on an H200 (BENCHMARKS.md
    §19): each work-item walks all of K alone."""
    gk, gn = group
    return config.vector_width >= 16 and _columns_fit(n, gn) and (gn != 1 or gk >= CPU_TN)


def _cpu_generate(desc: DequantizingMatmulDesc, head: str, params: str, epilogue: str, od: str) -> KernelSpec:
    (m, k), n = desc.src.dims, desc.dst.dims[1]
    gk, gn = desc.group_shape
    sa, sw = desc.src.strides, desc.weights.strides
    packed = desc.weights.dtype in _dtype_io.PACKED
    signed = desc.weights.dtype in ("s4", "s8")
    vec = "char16" if desc.weights.dtype == "s8" else "uchar16"
    def column(h: int, j: int) -> str:
        """Column of lane ``j`` of half ``h``: 4-bit halves are the even and the odd columns."""
        return f"n0 + {2 * j + h}UL" if packed else f"n0 + {16 * h + j}UL"

    def group_values(name: str, md, h: int | None) -> str:
        """This k group's scale or zero point: one for the block (``h`` None) or a vector of one
        per column of half ``h`` (groups of one column along N)."""
        st = md.strides
        if h is None:
            return _dtype_io.load(md.dtype, name, f"kg * {st[0]}UL + (n0 / {gn}UL) * {st[1]}UL")
        return "(float16)(" + ", ".join(
            _dtype_io.load(md.dtype, name, f"kg * {st[0]}UL + ({column(h, j)}) * {st[1]}UL") for j in range(16)) + ")"

    if gn % CPU_TN == 0:
        per_group = (f"const float s = {group_values('scales', desc.scales, None)};"
                     f" const float z = {group_values('zps', desc.zps, None) if desc.zps is not None else '0.0f'};")
        scale_of = zp_of = None
    else:  # one scale (and zero point) per column: two vectors of 16 per k group
        per_group = " ".join(f"const float16 s{h} = {group_values('scales', desc.scales, h)};" for h in range(2))
        if desc.zps is not None:
            per_group += " " + " ".join(f"const float16 z{h} = {group_values('zps', desc.zps, h)};" for h in range(2))
        scale_of, zp_of = "s", ("z" if desc.zps is not None else None)

    def dequantized(values: str, h: int) -> str:
        s_ = f"s{h}" if scale_of else "(float16)(s)"
        z_ = f"z{h}" if zp_of else ("(float16)(z)" if scale_of is None else "(float16)(0.0f)")
        return _quantized_io.rounded(desc.dequantized, f"({values} - {z_}) * {s_}", vector=True)

    if packed:
        nibbles = ("const int16 lo = __builtin_convertvector(b & (uchar16)(15), int16);"
                   " const int16 hi = __builtin_convertvector(b >> (uchar16)(4), int16);")
        if signed:
            nibbles += " const int16 lo_s = (lo ^ (int16)(8)) - (int16)(8), hi_s = (hi ^ (int16)(8)) - (int16)(8);"
        lo, hi = ("lo_s", "hi_s") if signed else ("lo", "hi")
        body = (f"const dq_w16u b = *(__global const dq_w16u*)(weights + (kk * {sw[0]}UL + n0) / 2UL); {nibbles}"
                f" acc0 += a * {dequantized(f'__builtin_convertvector({lo}, float16)', 0)};"
                f" acc1 += a * {dequantized(f'__builtin_convertvector({hi}, float16)', 1)};")
        # acc0 holds columns n0 + 2j, acc1 columns n0 + 2j + 1.
        store_column = ("n0 + 2UL * j", "n0 + 2UL * j + 1UL")
    else:
        body = "".join(
            f" {{ const {vec} b = *(__global const dq_w16u*)(weights + kk * {sw[0]}UL + n0 + {16 * h}UL);"
            f" acc{h} += a * {dequantized('__builtin_convertvector(b, float16)', h)}; }}" for h in range(2))
        store_column = ("n0 + j", "n0 + 16UL + j")
    stores = "".join(
        f"    *(float16*)(ys) = acc{h};\n"
        f"    for (ulong j = 0; j < 16UL; ++j) {{ const ulong nn = {store_column[h]}; float y = ys[j]; {epilogue}"
        f" {_dtype_io.store(desc.dst.dtype, 'dst', od, 'y')} }}\n" for h in range(2))
    source = (
        f"typedef {vec} __attribute__((aligned(1))) dq_w16u;\n"
        + head
        + f"__kernel void dequantizing_matmul({params}) {{\n"
        "    const ulong nb = get_global_id(0), mm = get_global_id(1);\n"
        f"    if (nb >= {n // CPU_TN}UL || mm >= {m}UL) return;\n"
        f"    const ulong n0 = nb * {CPU_TN}UL, a0 = mm * {sa[0]}UL;\n"
        "    float16 acc0 = (float16)(0.0f), acc1 = (float16)(0.0f);\n"
        f"    for (ulong kg = 0; kg < {k // gk}UL; ++kg) {{\n"
        f"        {per_group}\n"
        f"        for (ulong kk = kg * {gk}UL; kk < kg * {gk}UL + {gk}UL; ++kk) {{\n"
        f"            const float16 a = (float16)({_dtype_io.load(desc.src.dtype, 'src', f'a0 + kk * {sa[1]}UL')});\n"
        f"            {body}\n"
        "        }\n"
        "    }\n"
        "    float ys[16] __attribute__((aligned(64)));\n"
        + stores
        + "}\n"
    )
    return KernelSpec(source=source, name="dequantizing_matmul", arg_names=tuple(desc.arg_descs),
                      global_size=(n // CPU_TN, m), local_size=(1, 1),
                      impl=f"ocl:dequantizing:{'nibbles' if packed else 'bytes'}:1x{CPU_TN}:l1x1")


def dequantized_weights(desc: DequantizingMatmulDesc, weights, scales, zps) -> np.ndarray:
    """The weights as the kernel dequantizes them: ``(w - zp) * scale`` in f32, rounded to
    ``desc.dequantized``; float64 values."""
    gk, gn = desc.group_shape

    def expand(t) -> np.ndarray:
        return np.repeat(np.repeat(_dtype_io.widen(t).astype(np.float32), gk, axis=0), gn, axis=1)

    w = _dtype_io.widen(weights).astype(np.float32)
    zp = expand(zps) if zps is not None else np.float32(0.0)
    # The scales as their memory holds them (an f32 value given for f16 scales is stored rounded).
    stored = _dtype_io.store_reference(_dtype_io.widen(scales).astype(np.float32), desc.scales.dtype)
    d = ((w - zp).astype(np.float32) * expand(stored)).astype(np.float32)
    return _dtype_io.widen(_dtype_io.store_reference(d, desc.dequantized))


def reference(desc: DequantizingMatmulDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """dst of ``desc`` from ``{argument name: array}``: src times the dequantized weights in
    float64, then the post-ops, stored as dst's type."""
    w = dequantized_weights(desc, inputs["weights"], inputs["scales"], inputs.get("zps"))
    y = np.matmul(_dtype_io.widen(inputs["src"]), w).astype(np.float32)
    y = _post_ops.reference(desc.post_ops, y, inputs.get("dst"), inputs)
    return _dtype_io.store_reference(y, desc.dst.dtype)


def threshold(desc: DequantizingMatmulDesc) -> float:
    """A matmul's f32 sum over K, plus one ulp of dst's type and the chain's own error."""
    chain = max((tolerance.eltwise(op[1]) for op in desc.post_ops if op[0] == "eltwise"), default=0.0)
    return tolerance.matmul(desc.src.dims[1]) + _dtype_io.EPSILON[desc.dst.dtype] + chain


register(DequantizingMatmulDesc, generate=generate, reference=reference, tolerance=threshold)
