"""Generation-only grids for tests/kernels/test_impl_coverage.py (``from _impl_grid import ...``, as
this folder's other helpers): per descriptor class, descriptors over many shapes, layouts, storage
types, post-ops and algorithms, from which the meta-test learns which implementation families each
generator can choose. Generating needs no device (a spec is string work, about a millisecond), so
a grid can be far wider than the cases that run; it has to reach every branch of its generator's
selection, and a new branch wants a new grid point as well as a case.
"""

from __future__ import annotations

import itertools

import triodnn
from triodnn import MemoryDesc


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def swapped(dims: tuple[int, ...]) -> str:
    """The format tag of ``dims`` with its last two axes swapped in memory."""
    tag = "abcdef"[:len(dims)]
    return tag[:-2] + tag[-1] + tag[-2]


def chains(dims: tuple[int, ...]) -> list[tuple]:
    """No chain, an eltwise, a binary operand of dst's shape, one per row (broadcast along the
    last axis: no flat kernel expresses it) and a scalar one."""
    nd = len(dims)
    return [(), (("eltwise", "relu"),), (("binary", "add", MemoryDesc(dims)),),
            (("binary", "mul", MemoryDesc(dims[:-1] + (1,))),), (("binary", "add", MemoryDesc((1,) * nd)),)]


ELEMENTWISE_DIMS = [(4, 33), (6, 64), (2, 3, 32), (1024, 1024)]  # the last past GPU_VECTOR_MIN


def eltwise():
    for dims in ELEMENTWISE_DIMS:
        for dst_strides, chain in itertools.product((None, swapped(dims)), chains(dims)):
            yield triodnn.EltwiseDesc("gelu_erf", md(*dims), md(*dims, strides=dst_strides), post_ops=chain)


def eltwise_backward():
    for dims in ELEMENTWISE_DIMS[:3]:
        for strides in (None, swapped(dims)):
            yield triodnn.EltwiseBackwardDesc("gelu_tanh", md(*dims), md(*dims, strides=strides))


def binary():
    for dims in ELEMENTWISE_DIMS:
        nd = len(dims)
        others = [dims, (1,) * nd, (1,) * (nd - 1) + (dims[-1],), dims[:-1] + (1,)]
        for src1, chain in itertools.product(others, chains(dims)):
            yield triodnn.BinaryDesc("add", md(*dims), md(*src1), post_ops=chain)
        for src1, src2 in itertools.product(others, others):
            yield triodnn.BinaryDesc("select", md(*dims), md(*src1), src2=md(*src2, dtype="boolean"))
        yield triodnn.BinaryDesc("add", md(*dims), md(*dims, strides=swapped(dims)))
        yield triodnn.BinaryDesc("add", md(*dims, strides=swapped(dims)), md(*dims))


def sum_():
    for dims in ELEMENTWISE_DIMS[:3]:
        yield triodnn.SumDesc([md(*dims), md(*dims)], scales=[0.5, 2.0])
        yield triodnn.SumDesc([md(*dims), md(*dims, strides=swapped(dims))], scales=[0.5, 2.0])


def concat():
    yield triodnn.ConcatDesc([md(2, 3, 4), md(2, 5, 4)], axis=1)
    yield triodnn.ConcatDesc([md(4, 16), md(4, 16, strides="ba")], axis=0)


def reorder():
    for dims in [(3, 5, 7), (40, 48), (2, 64, 64)]:
        for dst_tag, dtypes in itertools.product((None, swapped(dims)), (("f32", "f32"), ("f32", "bf16"),
                                                                          ("s8", "s8"), ("u8", "f32"), ("f32", "u4"))):
            yield triodnn.ReorderDesc(md(*dims, dtype=dtypes[0]), md(*dims, dtype=dtypes[1], strides=dst_tag))


def gen_index():
    yield triodnn.GenIndexDesc(md(3, 4, dtype="s32"), axis=1)


def prelu():
    yield triodnn.PreluDesc(md(2, 5, 3, 3), md(1, 5, 1, 1))
    yield triodnn.PreluDesc(md(4, 33), md(4, 33))


def prelu_backward():
    yield triodnn.PreluBackwardDesc(md(2, 5, 3, 3), md(1, 5, 1, 1), md(2, 5, 3, 3))


def dropout():
    for dims in [(4, 33), (64, 64)]:
        yield triodnn.DropoutDesc(md(*dims), md(1, dtype="s64"), md(1, dtype="s64"), md(1),
                                  mask=md(*dims, dtype="u8"))


def quantize():
    for alg, (src, dst) in [("quantize", ("f32", "s8")), ("quantize", ("bf16", "u4")), ("dequantize", ("u8", "f32"))]:
        yield triodnn.QuantizeDesc(alg, md(2, 5, 3, dtype=src), md(2, 5, 3, dtype=dst), scales=[0.5], zps=[1])
        yield triodnn.QuantizeDesc(alg, md(2, 5, 3, dtype=src), md(2, 5, 3, dtype=dst),
                                   scales=[0.25, 0.5, 1, 2, 4], zps=[0, 1, 2, 3, 4], axis=1)


def dynamic_quantize():
    for alg, (src, dst) in [("quantize", ("f32", "u4")), ("quantize", ("f32", "s8")), ("dequantize", ("s8", "f32"))]:
        yield triodnn.DynamicQuantizeDesc(alg, md(2, 8, 3, dtype=src), md(2, 2, 1), md(2, 8, 3, dtype=dst),
                                          group_shape=(1, 4, 3))
        yield triodnn.DynamicQuantizeDesc(alg, md(2, 8, 3, dtype=src), md(2, 2, 1), md(2, 8, 3, dtype=dst),
                                          group_shape=(1, 4, 3), zps=md(2, 2, 1, dtype="s8"))


def softmax():
    for alg in ("softmax", "logsoftmax"):
        for dims, axis, strides in [((6, 40), -1, None), ((6, 40), 0, None), ((7, 20), -1, None), ((300, 32), -1, None),
                                    ((5, 37), -1, None), ((3, 1000), -1, None), ((2, 9000), -1, None),
                                    ((2, 40, 4096), 1, None), ((2, 48, 3, 5), 1, "acdb"), ((6, 100), -1, (1, 8)),
                                    ((4096, 64), -1, None)]:
            yield triodnn.SoftmaxDesc(alg, md(*dims, strides=strides), axis=axis)


def softmax_backward():
    for dims, axis in [((6, 40), 1), ((6, 40), 0), ((3, 1000), -1)]:
        yield triodnn.SoftmaxBackwardDesc("softmax", md(*dims), md(*dims), axis=axis)


ROWS = [(6, 40), (7, 20), (5, 33), (5, 34), (300, 32), (4096, 32), (4096, 16), (1024, 64), (2048, 32),
        (3, 384), (5, 383), (2, 9000), (2, 8192), (3, 4, 1024), (64, 8)]


def layer_normalization():
    for dims in ROWS:
        c = dims[-1]
        yield triodnn.LayerNormDesc(md(*dims))
        yield triodnn.LayerNormDesc(md(*dims), scale=md(c), shift=md(c), mean=md(*dims[:-1]), variance=md(*dims[:-1]),
                                    post_ops=(("binary", "add", md(*dims[:-1], 1)),), output_scale=0.5)
    yield triodnn.LayerNormDesc(md(3, 50, 4), axis=1)
    yield triodnn.LayerNormDesc(md(40, 3, 2, strides="bac"), axis=0)
    yield triodnn.LayerNormDesc(md(6, 100, strides=(128, 1)), md(6, 100, strides=(1, 6)))


def rms_normalization():
    for dims in ROWS:
        yield triodnn.RMSNormDesc(md(*dims), scale=md(dims[-1]))


def batch_normalization():
    yield triodnn.BatchNormInferenceDesc(md(2, 3, 5, 5), md(3), md(3), scale=md(3), shift=md(3))


def group_normalization():
    yield triodnn.GroupNormDesc(md(2, 6, 5, 5), groups=3, scale=md(6), shift=md(6))


def batch_normalization_training():
    for dims in [(2, 3, 5, 5), (4, 8, 32, 32), (2, 3, 2, 2)]:
        c = dims[1]
        yield triodnn.BatchNormTrainingDesc(md(*dims), scale=md(c), shift=md(c))


def batch_normalization_backward():
    for dims in [(2, 3, 5, 5), (4, 8, 32, 32), (2, 3, 2, 2)]:
        c = dims[1]
        yield triodnn.BatchNormBackwardDesc(md(*dims), md(*dims), md(c), md(c), scale=md(c))


def layer_normalization_backward():
    for dims in [(6, 40), (6, 1000), (512, 8), (2, 9000)]:
        r, c = dims
        yield triodnn.LayerNormBackwardDesc(md(r, c), md(r, c), md(r), md(r), scale=md(c))
        yield triodnn.LayerNormBackwardDesc(md(r, c), md(r, c), md(r), md(r), scale=md(c), diff_scale=md(c),
                                            diff_shift=md(c))


def reduction():
    for alg in ("sum", "max", "mean"):
        for src, dst in [((6, 40), (6, 1)), ((6, 40), (1, 40)), ((4, 5000), (4, 1)), ((5000, 4), (1, 4)),
                         ((3, 4, 5), (1, 1, 1)), ((64, 3000), (64, 1))]:
            yield triodnn.ReductionDesc(alg, md(*src), md(*dst))


def pooling():
    for alg in ("max", "avg_include_padding", "avg_exclude_padding"):
        yield triodnn.PoolingDesc(alg, md(2, 3, 9, 9), kernel=(3, 3), strides=(2, 2), padding_l=(1, 1))


def pooling_backward():
    for alg in ("max", "avg_exclude_padding"):
        yield triodnn.PoolingBackwardDesc(alg, md(2, 3, 4, 4), md(2, 3, 9, 9),
                                          md(2, 3, 9, 9) if alg == "max" else None,
                                          kernel=(3, 3), strides=(2, 2), padding_l=(0, 0))


def resampling():
    for alg in ("nearest", "linear"):
        yield triodnn.ResamplingDesc(alg, md(2, 3, 5, 7), md(2, 3, 9, 4))
        yield triodnn.ResamplingDesc(alg, md(2, 3, 5), md(2, 3, 9))


def resampling_backward():
    for alg in ("nearest", "linear"):
        yield triodnn.ResamplingBackwardDesc(alg, md(2, 3, 9, 4), md(2, 3, 5, 7))


MATMUL_SHAPES = [  # (batch, M, K, N)
    ((), 1, 16, 16), ((2,), 5, 24, 7), ((), 4, 64, 64), ((), 8, 33, 48), ((), 16, 200, 40), ((), 64, 64, 1024),
    ((), 64, 1024, 64), ((), 128, 64, 128), ((), 256, 256, 64), ((3,), 1, 4096, 8), ((), 1, 8, 4096),
    ((), 96, 4096, 64), ((), 512, 512, 512), ((2,), 128, 128, 128), ((), 33, 5000, 17), ((), 64, 8192, 64),
    ((), 2048, 64, 2048),
]


def matmul():
    for (batch, m, k, n), transposed, bias, chain, dtype in itertools.product(
            MATMUL_SHAPES, (False, True), (False, True), ((), (("eltwise", "relu"),)), ("f32", "bf16")):
        w = batch + (k, n)
        yield triodnn.MatmulDesc(md(*batch, m, k), md(*w, dtype=dtype, strides=swapped(w) if transposed else None),
                                 bias=md(1, n) if bias else None, post_ops=chain)
    # Both operands of a type the tensor cores multiply.
    for (batch, m, k, n), transposed, dtype in itertools.product(MATMUL_SHAPES, (False, True), ("bf16", "f16")):
        w = batch + (k, n)
        yield triodnn.MatmulDesc(md(*batch, m, k, dtype=dtype), md(*w, dtype=dtype, strides=swapped(w) if transposed else None))


def quantized_matmul():
    for (batch, m, k, n), transposed in itertools.product(MATMUL_SHAPES[:14], (False, True)):
        w = batch + (k, n)
        yield triodnn.QuantizedMatmulDesc(
            md(*batch, m, k, dtype="u8"), md(*w, dtype="s8", strides=swapped(w) if transposed else None),
            bias=md(1, n), src_scale=0.01, src_zp=3, wei_scales=[0.02], wei_zps=[1], post_ops=(("eltwise", "relu"),))


def dequantizing_matmul():
    for (m, k, n), wdt, group, zps, deq in itertools.product(
            ((1, 64, 64), (3, 32, 24), (5, 128, 96)), ("u4", "s4", "u8", "s8"), ((1, 32), (8, 1), (4, 8)),
            (False, True), ("f32", "f16")):
        if k % group[0] or n % group[1]:
            continue
        placed = (k // group[0], n // group[1])
        yield triodnn.DequantizingMatmulDesc(
            md(m, k, dtype="f16"), md(k, n, dtype=wdt), md(*placed, dtype="f16"), md(m, n), group,
            md(*placed, dtype="u8") if zps else None, dequantized=deq)


CONV_SHAPES = [  # (N, IC, spatial, OC, kernel, groups, strides, padding)
    (2, 4, (9, 9), 6, (3, 3), 1, (1, 1), (1, 1)),
    (1, 8, (20, 20), 16, (3, 3), 1, (1, 1), (1, 1)),
    (1, 8, (20, 20), 16, (1, 1), 1, (1, 1), (0, 0)),
    (1, 8, (4, 4), 32, (1, 1), 1, (1, 1), (0, 0)),
    (2, 64, (7, 7), 128, (1, 1), 1, (1, 1), (0, 0)),
    (1, 16, (20, 20), 16, (3, 3), 16, (1, 1), (1, 1)),
    (1, 16, (20, 20), 16, (3, 3), 16, (2, 2), (1, 1)),
    (1, 16, (9, 9), 16, (3, 3), 16, (1, 1), (1, 1)),
    (2, 8, (9, 9), 32, (3, 3), 2, (2, 2), (0, 0)),
    (2, 32, (16, 16), 64, (3, 3), 1, (1, 1), (1, 1)),
    (1, 4, (30,), 8, (5,), 1, (1,), (2,)),
    (1, 4, (4, 6, 6), 8, (3, 3, 3), 1, (1, 1, 1), (1, 1, 1)),
]


def _channels_last(nd: int) -> str:
    return "a" + "abcdef"[2:nd] + "b"


def convolution():
    for (n, ic, sp, oc, k, groups, strides, pad), nhwc, w_tag in itertools.product(
            CONV_SHAPES, (False, True), (None, "last_oc")):
        nd = 2 + len(sp)
        w_dims = (oc, ic // groups, *k)
        w_strides = "abcdef"[1:nd] + "a" if w_tag else None  # output channels innermost
        src = md(n, ic, *sp, strides=_channels_last(nd) if nhwc else None)
        probe = triodnn.ConvolutionDesc(src, md(*w_dims), strides=strides, padding_l=pad, groups=groups)
        dst = md(*probe.dst.dims, strides=_channels_last(nd) if nhwc else None)
        for chain in ((), (("eltwise", "relu"), ("binary", "add", md(1, oc, *(1,) * len(sp))))):
            yield triodnn.ConvolutionDesc(src, md(*w_dims, strides=w_strides), dst, bias=md(oc), strides=strides,
                                          padding_l=pad, groups=groups, post_ops=chain)


def convolution_backward_weights():
    yield triodnn.ConvolutionBackwardWeightsDesc(md(2, 4, 9, 9), md(2, 6, 4, 4), md(6, 2, 3, 3), strides=2,
                                                 padding_l=1, padding_r=0, groups=2)


def deconvolution():
    yield triodnn.DeconvolutionDesc(md(2, 4, 5, 5), md(4, 3, 3, 3), bias=md(6), strides=2, groups=2)
    yield triodnn.DeconvolutionDesc(md(1, 16, 5, 5), md(16, 32, 3, 3), strides=1, padding_l=1, padding_r=1)


SDPA_SHAPES = [(1, 2, 1, 12, 16), (1, 2, 8, 12, 16), (1, 2, 40, 24, 16), (1, 2, 8, 12, 20), (2, 2, 64, 64, 64),
               (1, 2, 128, 128, 128), (1, 1, 300, 300, 256), (1, 2, 17, 33, 8)]  # (B, H, Sq, Skv, D)


def sdpa():
    for (b, h, sq, skv, d), causal, kt in itertools.product(SDPA_SHAPES, (None, "top_left"), (False, True)):
        k_dims = (b, h, skv, d)
        base = (md(b, h, sq, d), md(*k_dims, strides=swapped(k_dims) if kt else None), md(b, h, skv, d))
        yield triodnn.SdpaDesc(*base, causal=causal)
        yield triodnn.SdpaDesc(*base, causal=causal, softcap=md(1))
        yield triodnn.SdpaDesc(*base, causal=causal, probs_quant=triodnn.Quantization("u8", 1 / 255, 0))


def sdpa_backward():
    for (b, h, sq, skv, d), part in itertools.product(SDPA_SHAPES[:5], ("dq", "dkdv")):
        yield triodnn.SdpaBackwardDesc(part, md(b, h, sq, d), md(b, h, skv, d), md(b, h, skv, d), md(b, h, sq, d),
                                       md(b, h, sq, d), md(b, h, sq, 1))


GRIDS = {
    triodnn.EltwiseDesc: eltwise,
    triodnn.EltwiseBackwardDesc: eltwise_backward,
    triodnn.BinaryDesc: binary,
    triodnn.SumDesc: sum_,
    triodnn.ConcatDesc: concat,
    triodnn.ReorderDesc: reorder,
    triodnn.GenIndexDesc: gen_index,
    triodnn.PreluDesc: prelu,
    triodnn.PreluBackwardDesc: prelu_backward,
    triodnn.DropoutDesc: dropout,
    triodnn.QuantizeDesc: quantize,
    triodnn.DynamicQuantizeDesc: dynamic_quantize,
    triodnn.SoftmaxDesc: softmax,
    triodnn.SoftmaxBackwardDesc: softmax_backward,
    triodnn.LayerNormDesc: layer_normalization,
    triodnn.RMSNormDesc: rms_normalization,
    triodnn.BatchNormInferenceDesc: batch_normalization,
    triodnn.GroupNormDesc: group_normalization,
    triodnn.BatchNormTrainingDesc: batch_normalization_training,
    triodnn.BatchNormBackwardDesc: batch_normalization_backward,
    triodnn.LayerNormBackwardDesc: layer_normalization_backward,
    triodnn.ReductionDesc: reduction,
    triodnn.PoolingDesc: pooling,
    triodnn.PoolingBackwardDesc: pooling_backward,
    triodnn.ResamplingDesc: resampling,
    triodnn.ResamplingBackwardDesc: resampling_backward,
    triodnn.MatmulDesc: matmul,
    triodnn.QuantizedMatmulDesc: quantized_matmul,
    triodnn.DequantizingMatmulDesc: dequantizing_matmul,
    triodnn.ConvolutionDesc: convolution,
    triodnn.ConvolutionBackwardWeightsDesc: convolution_backward_weights,
    triodnn.DeconvolutionDesc: deconvolution,
    triodnn.SdpaDesc: sdpa,
    triodnn.SdpaBackwardDesc: sdpa_backward,
}
