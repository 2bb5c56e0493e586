"""Fused scaled-dot-product attention: ``dst = softmax(scale_op(Q @ K^T) + mask) @ V`` per batch.

Batch dims (batch, heads, groups …) broadcast as numpy's: K/V heads of size 1 broadcast over Q's
heads (GQA is a grouped layout plus broadcasting). ``scale_op`` multiplies or divides the scores
by a one-element ``scale`` tensor; ``mask`` is an additive float mask broadcasting to
(…, Sq, Skv); ``causal`` adds the implicit causal mask: scores where ``kv > q`` (``"top_left"``)
or ``kv > q + Skv - Sq`` (``"bottom_right"``; the offset read at run time from ``causal_add`` -
``causal_sub`` where given) become -inf, or ``fill``. ``softcap`` caps the scaled scores
(``cap * tanh(s)``); ``select_mask`` with ``fill`` is oneDNN's Select mask. A row whose scores
are all -inf gives 0 (oneDNN's softmax ``inf_as_zero``); ``stats`` (optional) gets each row's
``m + log(l)``, SoftMax's statistics. A causal mask with a fill value visits every key (the
filled ones still count in the softmax), where one filling with -inf stops at the diagonal.

The score matrix never reaches global memory: online softmax (flash attention). Each row keeps
a running maximum ``m``, a running sum ``l`` and an unnormalised output ``O``; each block of keys
raises ``m`` to ``m'``, rescales ``l`` and ``O`` by ``exp(m - m')``, adds ``p = exp(s - m')`` to ``l``
and ``p @ V`` to ``O``; at the end ``dst = O / l``. A row still at ``m = -inf`` shifts by 0 instead
(``exp(-inf - 0) = 0``: no ``-inf - -inf``), so it ends with ``l = 0`` and is stored as 0.

Shapes of the same algorithm:

* CPU (``vector_width >= 16``, PoCL): work-groups of one work-item, no barriers (on PoCL they
  spill the accumulators). A work-item owns 32 query rows (16 where Sq <= 16, or where a float16
  takes two registers: ``CPU_SHAPES_NARROW``) of one batch index,
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
* CPU, short queries (Sq <= 4, decoding; ``ocl:sdpa:rowdot``): one work-item per query row,
  the head dims (or, for a K^T layout, 16 keys) as lanes; see ``_cpu_rowdot_generate``.
* GPU (``vector_width == 1``), plain scores (a scale, an additive mask, a causal mask filling
  with -inf, statistics) on work-groups of 256 with head sizes up to 128: ``sdpa_flash``'s kernel
  (``ocl:sdpa:flash``), both products register-blocked as flash attention 2 tiles them.
* GPU, the other variants (soft-capping, Select masks, fill values, quantized operands or
  probabilities, rounded scores), split kernel (``ocl:sdpa:wgsplit``): one work-group of 256 per
  (batch index, block of 16 query rows), 16 work-items per row. The work-group stages Q, then each
  tile of 64 K and V rows, in ``__local`` memory (rows padded so that float4 reads are free of bank
  conflicts); work-item t of a row takes keys t, t + 16, ... of each tile with its own online
  softmax state, q (scale folded in) and ``O`` as float4 registers, and the 16 states of a row
  merge through ``__local`` memory at the end. Where q and ``O`` would not fit in registers
  (D + Dv > 192) or work-groups must be narrower than 64: one work-group per block of rows, one
  work-item per row (``ocl:sdpa:wg``), K/V tiles in ``__local`` memory.

Storage types of q, k, v, dst, mask and scale: f32, bf16 or f16 (``_dtype_io``); the math is f32.
"""

from __future__ import annotations

import math

import numpy as np

from .._values._algorithms import broadcast_dims as broadcast_batch
from .._values._errors import UnsupportedError
from .._values._quantization import RANGES
from .._values._sdpa_desc import CAUSAL as CAUSAL
from .._values._sdpa_desc import FLOAT_DTYPES as FLOAT_DTYPES
from .._values._sdpa_desc import SCALE_MODES as SCALE_MODES
from .._values._sdpa_desc import SdpaDesc
from . import _dtype_io, sdpa_flash
from ._quantized_io import quantized_value, rounded, rounding_functions, table, table_load, tabled
from ._registry import register
from ._spec import VECTOR_TYPES, KernelConfig, KernelSpec, c_float, index_code, up4

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


# GPU shape: keys per tile, and the most floats the K and V tiles may take in __local memory.
GPU_BK, GPU_TILE_FLOATS = 32, 8192


def _aligned(dims: tuple[int, ...], strides: tuple[int, ...], ndims: int) -> tuple[int, ...]:
    """Strides right-aligned to ``ndims`` dims, 0 where the dim is 1 (broadcast) or absent."""
    pad = ndims - len(dims)
    return (0,) * pad + tuple(0 if d == 1 else s for d, s in zip(dims, strides))


def _causal_offset(causal: str | None, sq: int, skv: int) -> int | None:
    if causal is None:
        return None
    if causal == "top_left":
        return 0
    if causal == "bottom_right":
        return skv - sq
    raise ValueError(f"causal {causal!r} is not one of None, {', '.join(map(repr, CAUSAL))}")


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


# -- quantized operands and rounding to the graph's float types ------------------------------------

class _Operands:
    """Float expressions of query, key and value elements: a plain load of a float operand, or a
    load that dequantizes (``Quantization``: static scale and zero point in the source, or a
    group's run-time scale and zero point read beside the element) and rounds as the graph's
    TypeCast does. ``value(name, index, row, col)``: ``index`` the element's offset in its buffer,
    ``row``/``col`` its coordinates in the kernel's (…, rows, cols) view of the operand (a grouped
    scale's offset is computed from them and the batch offset ``off_ks``/``off_vs``...)."""

    TAGS = {"query": "q", "key": "k", "value": "v"}

    def __init__(self, desc: SdpaDesc, dtypes: dict[str, str], sa: dict[str, tuple[int, ...]]) -> None:
        self.desc, self.dtypes, self.sa = desc, dtypes, sa
        self.rounding = {q.round_out for q in self.quants.values()} - {"f32"}
        for quant in (desc.probs_quant, desc.dst_quant):
            if quant is not None:
                self.rounding |= {quant.round_in, quant.round_out} - {"f32"}
        if desc.score_rounding != "f32":
            self.rounding.add(desc.score_rounding)

    @property
    def quants(self):
        return {name: q for name in self.TAGS if (q := getattr(self.desc, f"{name}_quant")) is not None}

    @property
    def quantized(self) -> bool:
        return bool(self.quants)

    def functions(self) -> str:
        return rounding_functions(self.rounding) + "".join(
            table(name, quant) for name, quant in self.quants.items() if tabled(quant))

    def value(self, name: str, index: str, row: str, col: str) -> str:
        raw = _dtype_io.load(self.dtypes[name], name, index)
        quant = getattr(self.desc, f"{name}_quant")
        if quant is None:
            return raw
        if tabled(quant):
            return table_load(name, index)
        if not quant.grouped:
            zp = f" - {c_float(quant.zp)}" if quant.zp else ""
            return rounded(quant.round_out, f"(({raw}){zp}) * {c_float(quant.static_scale)}")
        tag = self.TAGS[name]
        gr, gc = quant.group

        def at(part: str) -> str:
            s_row, s_col = self.sa[f"{tag}{part[0]}"][-2:]
            r = f"({row})" if gr == 1 else f"(({row}) / {gr}UL)"
            c = f"({col})" if gc == 1 else f"(({col}) / {gc}UL)"
            return _dtype_io.load(self.dtypes[f"{name}_{part}"], f"{name}_{part}",
                                  f"off_{tag}{part[0]} + {r} * {s_row}UL + {c} * {s_col}UL")
        zp = f" - {at('zps')}" if getattr(self.desc, f"{name}_zps") is not None else ""
        return rounded(quant.round_out, f"(({raw}){zp}) * {at('scales')}")

    def score(self, expr: str, vector: bool = False) -> str:
        """A score op's result as the graph rounds it (bf16 scores of the int8 bf16 graphs)."""
        return rounded(self.desc.score_rounding, expr, vector)

    def probability(self, expr: str, vector: bool = False) -> str:
        """A normalised probability through the graph's Quantize -> Dequantize (``probs_quant``)."""
        quant = self.desc.probs_quant
        if quant is None:
            return expr
        t = "float16" if vector else "float"
        if quant.dtype not in RANGES:  # f8: through the type's store and load, lane by lane
            scale = f"({t})({c_float(quant.static_scale)})"
            through = f"sd_f8{'_v' if vector else ''}({rounded(quant.round_in, expr, vector)} / {scale})"
            return rounded(quant.round_out, f"{through} * {scale}", vector)
        zp = c_float(quant.zp)
        # Quantize divides by the scale, as oneDNN's src / scale (a product by the rounded
        # reciprocal would land on the other integer at some ties).
        # Round half to even by adding and taking away 1.5 * 2^23 (|x| < 2^22 here: a quantized
        # probability); rint() stays a call on PoCL.
        magic = f"({t})({c_float(12582912.0)})"
        scale = f"({t})({c_float(quant.static_scale)})"
        q = f"(({rounded(quant.round_in, expr, vector)} / {scale} + ({t})({zp}) + {magic}) - {magic})"
        clamped = f"sd_clampq{'_v' if vector else ''}({q})"  # clamp() is a call on PoCL; selects are not
        back = f"(({clamped}) - ({t})({zp})) * {scale}"
        return rounded(quant.round_out, back, vector)

    def probability_functions(self) -> str:
        quant = self.desc.probs_quant
        if quant is None:
            return ""
        if quant.dtype not in RANGES:
            lanes = ", ".join(f"round_{quant.dtype}(x.s{k:x})" for k in range(16))
            return (_dtype_io.f8_round_function(quant.dtype)
                    + f"static inline float sd_f8(const float x) {{ return round_{quant.dtype}(x); }}\n"
                    + f"static inline float16 sd_f8_v(const float16 x) {{ return (float16)({lanes}); }}\n")
        low, high = RANGES[quant.dtype]
        return "".join(
            f"static inline {t} sd_clampq{sfx}(const {t} x) {{ return x < ({t})({c_float(low)}) ? ({t})({c_float(low)})"
            f" : (x > ({t})({c_float(high)}) ? ({t})({c_float(high)}) : x); }}\n"
            for t, sfx in (("float", ""), ("float16", "_v")))

    def dst(self, expr: str) -> str:
        """The float ``store`` of dst's type takes: quantized (its store rounds and saturates)."""
        quant = self.desc.dst_quant
        if quant is None:
            return expr
        return quantized_value(quant, expr)



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


def generate(desc: SdpaDesc, config: KernelConfig) -> KernelSpec:
    """Source for the fused attention of ``desc`` (any strides; broadcast batch dims; dst dims are
    the broadcast batch + (Sq, Dv)). Kernel arguments, in order: query, key, value, [scale],
    [mask], dst."""
    desc.check_supported()
    q_dims, q_strides = desc.query.dims, desc.query.strides
    k_dims, k_strides = desc.key.dims, desc.key.strides
    v_dims, v_strides = desc.value.dims, desc.value.strides
    dst_strides = desc.dst.strides
    has_scale, scale_mode, causal = desc.scale is not None, desc.scale_mode, desc.causal
    # An absent argument is never loaded; f32 only names a type for the helpers below.
    dtypes = {"mask": "f32", "scale": "f32", "softcap": "f32", "fill": "f32", "select_mask": "boolean",
              "causal_add": "s32", "causal_sub": "s32",
              **{name: md.dtype for name, md in desc.arg_descs.items()}}
    sq, d = q_dims[-2:]
    skv = k_dims[-2]
    dv = v_dims[-1]

    def score_shaped(md):
        """dims and strides of a (…, Sq, Skv)-broadcasting tensor, at least 2-D."""
        pad = max(0, 2 - md.ndims)
        return (1,) * pad + md.dims, (0,) * pad + md.strides

    mask, cond = desc.mask, desc.select_mask
    has_mask, has_select = mask is not None, cond is not None
    batches = [q_dims[:-2], k_dims[:-2], v_dims[:-2]]
    if has_mask:
        mask_dims, mask_strides = score_shaped(mask)
        batches.append(mask_dims[:-2])
    if has_select:
        cond_dims, cond_strides = score_shaped(cond)
        batches.append(cond_dims[:-2])
    batch = broadcast_batch(*batches)
    nd = len(batch) + 2
    sa = {
        "q": _aligned(q_dims, q_strides, nd),
        "k": _aligned(k_dims, k_strides, nd),
        "v": _aligned(v_dims, v_strides, nd),
        "d": dst_strides,
    }
    if has_mask:
        sa["m"] = _aligned(mask_dims, mask_strides, nd)
    if has_select:
        sa["c"] = _aligned(cond_dims, cond_strides, nd)
    if desc.stats is not None:
        sa["s"] = _aligned(desc.stats.dims, desc.stats.strides, nd)
    for name, tag in (("key_scales", "ks"), ("key_zps", "kz"), ("value_scales", "vs"), ("value_zps", "vz")):
        md = getattr(desc, name)
        if md is not None:
            sa[tag] = _aligned(md.dims, md.strides, nd)
    nbatch = math.prod(batch)
    offsets = index_code(batch, {name: s[:-2] for name, s in sa.items()}, "bi") if batch else (
        " ".join(f"const ulong off_{name} = 0;" for name in sa)
    )
    offsets += "".join(f" const ulong off_{name} = 0;" for name in ("m", "c", "s") if name not in sa)
    # The causal offset as a C expression of type long: the diagonal's shift, or its runtime value
    # (graphs with host-scalar Add/Subtract on the row index).
    diagonal = _causal_offset(causal, sq, skv)
    runtime_offset = desc.causal_add is not None or desc.causal_sub is not None
    offset = None if diagonal is None else "coff" if runtime_offset else f"{diagonal}L"
    args = tuple(desc.arg_descs)  # inputs in SdpaDesc.ARGS order, then dst, [stats]
    params = [_dtype_io.param(dtypes[name], name, const=name not in ("dst", "stats")) for name in args]
    loads = [dtypes[n] for n in args if n not in ("dst", "stats")]
    operands = _Operands(desc, dtypes, sa)
    functions = _dtype_io.functions(loads=loads, stores=(dtypes["dst"],)) + operands.functions() \
        + operands.probability_functions()
    # One-element arguments, read once: sc (1/scale for "divide"), cap, fl (the fill value,
    # scaled where the graph's Select came before the scale: the same math as the graph).
    scale_code = ""
    if has_scale:
        scale_code = f"float sc = {_dtype_io.load(dtypes['scale'], 'scale', '0')};"
        if scale_mode == "divide":
            scale_code += " sc = 1.0f / sc;"
    if runtime_offset:
        parts = [f"(long)({_dtype_io.load(dtypes[n], n, '0')})" for n in ("causal_add", "causal_sub")
                 if getattr(desc, n) is not None]
        sign = "" if desc.causal_add is not None else "-"
        scale_code += f" const long coff = {sign}{' - '.join(parts)};"
    if desc.softcap is not None:
        scale_code += f" const float cap = {_dtype_io.load(dtypes['softcap'], 'softcap', '0')};"
    if desc.fill is not None:
        scale_code += f" const float fl = {_dtype_io.load(dtypes['fill'], 'fill', '0')}"
        scale_code += " * sc;" if desc.fill_before_scale and has_scale else ";"
    common = dict(
        sq=sq, skv=skv, d=d, dv=dv, nbatch=nbatch, offsets=offsets, sa=sa, has_mask=has_mask,
        has_scale=has_scale, scale_code=scale_code, offset=offset, dtypes=dtypes,
        signature=f"__kernel void sdpa_fwd({', '.join(params)})", functions=functions, args=args,
        softcap=desc.softcap is not None, select=(desc.fill_if if has_select else None),
        causal_fill=desc.fill is not None and causal is not None, stats=desc.stats is not None,
        ops=operands,
    )
    # The short-query kernel's vector loads take float operands only, and it has no second pass.
    plain = not operands.quantized and desc.probs_quant is None and desc.dst_quant is None \
        and desc.score_rounding == "f32"
    if config.vector_width >= 16 and plain and rowdot_applies(sq, d, dv, sa):
        return _cpu_rowdot_generate(**common)
    if config.vector_width >= 16:
        rv = cpu_row_vectors(sq, d, dv, config.local_memory, config.native_vector_width)
        if rv:
            blocks = (CPU_SHAPES_NARROW if config.native_vector_width < 16 else CPU_SHAPES)[rv]
            return _cpu_generate(rv=rv, shape=blocks, local_memory=config.local_memory, **common)
    flash = sdpa_flash.flash_shape(desc, config)
    if flash is not None:
        return sdpa_flash.generate(shape=flash, **common)
    shape = gpu_split_shape(sq, skv, d, dv, config)
    if shape is not None:
        return _gpu_split_generate(shape=shape, **common)
    if desc.probs_quant is not None:
        raise UnsupportedError(
            f"sdpa: quantized probabilities (probs_quant) need the split GPU kernel or the CPU kernel; "
            f"Sq={sq}, D={d}, Dv={dv} on this device take the one-row-per-work-item kernel")
    return _gpu_generate(config=config, **common)


# -- CPU (PoCL) path -------------------------------------------------------------------------------


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


# -- GPU path --------------------------------------------------------------------------------------


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
    if offset is not None and not causal_fill:
        kv_end = (f"const long kv_lim = (long)(g * {local}UL + {local - 1}UL) + {offset} + 1L; "
                  f"const ulong kv_end = kv_lim <= 0L ? 0UL : ((ulong)kv_lim < {skv}UL ? (ulong)kv_lim : {skv}UL);")
    else:
        kv_end = f"const ulong kv_end = {skv}UL;"
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


def fusion_pays(sq: int, skv: int, d: int, dv: int, config: KernelConfig, *, probs_quantized: bool = False) -> bool:
    """Whether this kernel is the faster way to run an attention of these sizes on ``config``
    (the graph lowering runs the ops one by one where it is not).

    On CPUs it always is (PoCL, ``benchmarks/bench_graph.py``: 1.2-3.2x the op-by-op path on
    the CI set's attention graphs). On the GPU configuration only the split kernel is: the one
    row per work-item kernel that takes D + Dv > 192 keeps q and O in private arrays that spill,
    and leaves most of the device idle on short queries. H100, ``bench_graph.py --engine
    gpu:0``, wall time per run fused / op by op at D = 256: gemma2 3458 / 228 µs, codegemma
    2818 / 257, MHA-GPT 706 / 231; with the split kernel (D = 64) 1.2-3.0x faster fused."""
    if config.vector_width != 1 and not (
            probs_quantized and not cpu_row_vectors(sq, d, dv, config.local_memory, config.native_vector_width)):
        return True
    # Quantized probabilities take the two-pass kernels only: the CPU one (above) or the split one.
    return gpu_split_shape(sq, skv, d, dv, config) is not None


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
    if offset is not None and not causal_fill:
        kv_end = (f"const long kv_lim = (long)(g * {rows}UL + {rows - 1}UL) + {offset} + 1L; "
                  f"const ulong kv_end = kv_lim <= 0L ? 0UL : ((ulong)kv_lim < {skv}UL ? (ulong)kv_lim : {skv}UL);")
    else:
        kv_end = f"const ulong kv_end = {skv}UL;"

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


# -- reference -------------------------------------------------------------------------------------


def reference(
    query,
    key,
    value,
    *,
    mask=None,
    scale=None,
    scale_mode: str = "multiply",
    causal: str | None = None,
    softcap=None,
    select_mask=None,
    fill=None,
    fill_if: bool = False,
    fill_before_scale: bool = False,
    causal_add=None,
    causal_sub=None,
    dst_dtype: str = "f32",
    with_stats: bool = False,
    query_quant=None,
    key_quant=None,
    value_quant=None,
    key_scales=None,
    key_zps=None,
    value_scales=None,
    value_zps=None,
    probs_quant=None,
    dst_quant=None,
    score_rounding: str = "f32",
):
    """``softmax(scores) @ V`` of user-facing values (bf16 as float32) in float64, K in its natural
    (…, Skv, D) layout, the scores made as ``SdpaDesc`` says: Q @ K^T, [Select before the scale],
    scale, softcap, [Select], + mask, causal (-inf, or ``fill`` where given); rows with every
    score -inf give 0 (``inf_as_zero``). Rounded to float32 and stored as ``dst_dtype``; with
    ``with_stats``, ``(dst, stats)``, stats the rows' max + log(sum(exp(s - max))) as float32.

    Quantized attention (``SdpaDesc``'s ``*_quant``, grouped scales and zero points, and
    ``score_rounding``) as the op-by-op graph computes it: dequantized operands rounded to the
    TypeCast's type, every score op's result rounded to ``score_rounding``, the probabilities
    through Quantize -> Dequantize, dst quantized."""
    q = _dequantized(query, query_quant, None, None)
    k = _dequantized(key, key_quant, key_scales, key_zps)
    v = _dequantized(value, value_quant, value_scales, value_zps)

    def r(x):
        return x if score_rounding == "f32" else _dtype_io.store_reference(x, score_rounding).astype(np.float64)

    s = r(np.matmul(q, np.swapaxes(k, -1, -2)))

    def one(x) -> float:
        return float(_dtype_io.widen(x).reshape(-1)[0])

    def select(s, fill_value):
        cond = np.asarray(select_mask).astype(bool)
        return np.where(cond == bool(fill_if), fill_value, s)

    if select_mask is not None and fill_before_scale:
        s = select(s, one(fill))
    if scale is not None:
        factor = one(scale)
        if scale_mode == "multiply":
            s = r(s * factor)
        elif scale_mode == "divide":
            s = r(s / factor)
        else:
            raise ValueError(f"scale_mode {scale_mode!r} is not one of {', '.join(SCALE_MODES)}")
    if softcap is not None:
        s = r(one(softcap) * np.tanh(s))
    if select_mask is not None and not fill_before_scale:
        s = select(s, one(fill))
    if mask is not None:
        s = r(s + _dtype_io.widen(mask))
    sq, skv = s.shape[-2:]
    offset = _causal_offset(causal, sq, skv)
    if offset is not None and (causal_add is not None or causal_sub is not None):
        offset = int(np.asarray(causal_add if causal_add is not None else 0).reshape(-1)[0]) - int(
            np.asarray(causal_sub if causal_sub is not None else 0).reshape(-1)[0])
    if offset is not None:
        rows = np.arange(sq)[:, None]
        cols = np.arange(skv)[None, :]
        s = np.where(cols > rows + offset, -np.inf if fill is None else one(fill), s)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m)
        e = np.exp(s - m)
        total = np.sum(e, axis=-1, keepdims=True)
        p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
        stats = np.where(total > 0, m + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    if probs_quant is not None:
        p = _through(p, probs_quant)
    out = np.matmul(p, v).astype(np.float32)
    if dst_quant is not None:
        rounded = _dtype_io.store_reference(out, dst_quant.round_in).astype(np.float32)
        out = rounded / np.float32(dst_quant.static_scale) + np.float32(dst_quant.zp)
    out = _dtype_io.store_reference(out, dst_dtype)
    if with_stats:
        return out, stats.astype(np.float32)
    return out


def _dequantized(x, quant, scales, zps) -> np.ndarray:
    """float64 values of an operand, dequantized (and rounded to ``round_out``) where ``quant``."""
    if quant is None:
        return _dtype_io.widen(x)
    x = np.asarray(x, dtype=np.float64)
    if quant.grouped:
        gr, gc = quant.group

        def spread(t):
            return np.repeat(np.repeat(np.asarray(t, dtype=np.float64), gr, axis=-2), gc, axis=-1)
        scale, zp = spread(scales), (spread(zps) if zps is not None else 0.0)
    else:
        scale, zp = np.float64(np.float32(quant.static_scale)), float(quant.zp)
    y = ((x - zp) * scale).astype(np.float32)
    return _dtype_io.store_reference(y, quant.round_out).astype(np.float64)


def _through(p: np.ndarray, quant) -> np.ndarray:
    """Probabilities through the graph's Quantize -> Dequantize (rounded on the way in and out)."""
    p32 = _dtype_io.store_reference(p.astype(np.float32), quant.round_in).astype(np.float32)
    scale = np.float32(quant.static_scale)
    if quant.dtype not in RANGES:  # f8: zero point 0, the type's own rounding and saturation
        back = (_dtype_io.store_reference(p32 / scale, quant.dtype).astype(np.float32) * scale).astype(np.float32)
        return _dtype_io.store_reference(back, quant.round_out).astype(np.float64)
    low, high = RANGES[quant.dtype]
    stored = np.clip(np.rint(p32 / scale + np.float32(quant.zp)), low, high)
    back = ((stored - quant.zp) * scale).astype(np.float32)
    return _dtype_io.store_reference(back, quant.round_out).astype(np.float64)


def _reference(desc: SdpaDesc, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return reference(
        inputs["query"], inputs["key"], inputs["value"], mask=inputs.get("mask"), scale=inputs.get("scale"),
        scale_mode=desc.scale_mode, causal=desc.causal, softcap=inputs.get("softcap"),
        select_mask=inputs.get("select_mask"), fill=inputs.get("fill"), fill_if=desc.fill_if,
        fill_before_scale=desc.fill_before_scale, causal_add=inputs.get("causal_add"),
        causal_sub=inputs.get("causal_sub"), dst_dtype=desc.dst.dtype,
        query_quant=desc.query_quant, key_quant=desc.key_quant, value_quant=desc.value_quant,
        key_scales=inputs.get("key_scales"), key_zps=inputs.get("key_zps"), value_scales=inputs.get("value_scales"),
        value_zps=inputs.get("value_zps"), probs_quant=desc.probs_quant, dst_quant=desc.dst_quant,
        score_rounding=desc.score_rounding,
    )


def _tolerance(desc: SdpaDesc) -> float:
    # The tests' figures (kernels/tolerance.py has no SDPA entry): 1e-5 for values in [-2, 2] at
    # D = 64 (tests/primitives/test_sdpa.py), growing with D (tests/kernels/test_local_memory.py),
    # plus one rounding step of dst's storage type.
    d = desc.query.dims[-1]
    if desc.dst_quant is not None:  # a quantized dst: one step of its type where f32 sums land across a tie
        return 1.0
    return 1e-5 * max(1.0, d / 64) + _dtype_io.EPSILON[desc.dst.dtype]


register(SdpaDesc, generate=generate, reference=_reference, tolerance=_tolerance)
