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

This module is the kind's: the descriptor turned into the generators' common arguments (strides
right-aligned over the broadcast batch, the one-element arguments read once, the causal offset),
the choice of generator (``generate``; ``fusion_pays`` for the graph lowering), the float64
reference and the tolerance. The generators, one module per shape of the same algorithm:

* CPU (``vector_width >= 16``, PoCL): ``sdpa_cpu``, query rows as vector lanes
  (``ocl:sdpa:rowlanes``), or for short queries (Sq <= 4, decoding) one work-item per query row
  (``ocl:sdpa:rowdot``).
* GPU (``vector_width == 1``), plain scores (a scale, an additive mask, a causal mask filling
  with -inf, statistics) on work-groups of 256 with head sizes up to 128: ``sdpa_flash``'s kernel
  (``ocl:sdpa:flash``), both products register-blocked as flash attention 2 tiles them; bf16
  and f16 operands on NVIDIA sm_80+ may take ``sdpa_mma``'s (``ocl:sdpa:mma``), both products
  on the tensor cores, once ``sdpa_mma.CHOSEN``.
* GPU, the other variants (soft-capping, Select masks, fill values, quantized operands or
  probabilities, rounded scores): ``sdpa_gpu``'s split kernel (``ocl:sdpa:wgsplit``), or its one
  work-item per row kernel (``ocl:sdpa:wg``) where q and ``O`` would not fit in registers or
  work-groups must be narrower than 64.

Every generator loads its operands and stores dst through ``_sdpa_quantized_io``'s ``_Operands``
(dequantized operands, rounded scores, quantized probabilities and dst, as the op-by-op graph).

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
from . import _dtype_io, sdpa_flash, sdpa_mma
from ._post_ops import aligned_strides
from ._registry import register
from ._sdpa_quantized_io import _Operands
from ._spec import KernelConfig, KernelSpec, index_code
from .sdpa_cpu import CPU_SHAPES, CPU_SHAPES_NARROW, _cpu_generate, _cpu_rowdot_generate, cpu_row_vectors, rowdot_applies
from .sdpa_gpu import _gpu_generate, _gpu_split_generate, gpu_split_shape


def _causal_offset(causal: str | None, sq: int, skv: int) -> int | None:
    if causal is None:
        return None
    if causal == "top_left":
        return 0
    if causal == "bottom_right":
        return skv - sq
    raise ValueError(f"causal {causal!r} is not one of None, {', '.join(map(repr, CAUSAL))}")


def generate(desc: SdpaDesc, config: KernelConfig, *, tensor_cores: bool | None = None) -> KernelSpec:
    """Source for the fused attention of ``desc`` (any strides; broadcast batch dims; dst dims are
    the broadcast batch + (Sq, Dv)). Kernel arguments, in order: query, key, value, [scale],
    [mask], dst. ``tensor_cores``: True builds ``sdpa_mma``'s kernel where it applies, False
    never; None leaves it to ``sdpa_mma.CHOSEN``."""
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
        "q": aligned_strides(q_dims, q_strides, nd),
        "k": aligned_strides(k_dims, k_strides, nd),
        "v": aligned_strides(v_dims, v_strides, nd),
        "d": dst_strides,
    }
    if has_mask:
        sa["m"] = aligned_strides(mask_dims, mask_strides, nd)
    if has_select:
        sa["c"] = aligned_strides(cond_dims, cond_strides, nd)
    if desc.stats is not None:
        sa["s"] = aligned_strides(desc.stats.dims, desc.stats.strides, nd)
    for name, tag in (("key_scales", "ks"), ("key_zps", "kz"), ("value_scales", "vs"), ("value_zps", "vz")):
        md = getattr(desc, name)
        if md is not None:
            sa[tag] = aligned_strides(md.dims, md.strides, nd)
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
    if (sdpa_mma.CHOSEN if tensor_cores is None else tensor_cores) and sdpa_mma.applies(desc, config):
        return sdpa_mma.generate(**common)
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
