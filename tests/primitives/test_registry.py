"""The op registry's references and tolerances: every registered kind, through the registry only.

Each case is created and executed like any primitive and its dst compared with
``kind_of(desc).reference(desc, inputs)`` under ``kind_of(desc).tolerance(desc)``, so a kind whose
registered reference or threshold drifts from its kernel fails here, whatever its own test file
checks. The cases must cover every kind of ``OP_KINDS``: a new kind gets a case.
"""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values import OP_KINDS
from triodnn.kernels import kind_of, tolerance


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


CASES = {
    "eltwise": triodnn.EltwiseDesc("gelu_erf", md(4, 33)),
    "eltwise_backward": triodnn.EltwiseBackwardDesc("gelu_tanh", md(4, 33), md(4, 33)),
    "binary": triodnn.BinaryDesc("mul", md(4, 33), md(1, 33)),
    "matmul": triodnn.MatmulDesc(md(2, 5, 24), md(24, 7), bias=md(1, 7), post_ops=(("eltwise", "relu"),)),
    "softmax": triodnn.SoftmaxDesc("logsoftmax", md(6, 40), axis=1),
    "reduction": triodnn.ReductionDesc("mean", md(6, 40), md(6, 1)),
    "sum": triodnn.SumDesc([md(4, 33), md(4, 33), md(4, 33)], scales=[0.5, 2.0, -1.0]),
    "concat": triodnn.ConcatDesc([md(2, 3, 4), md(2, 5, 4)], axis=1),
    "reorder": triodnn.ReorderDesc(md(3, 5, 7), md(3, 5, 7, strides="acb")),
    "convolution": triodnn.ConvolutionDesc(md(2, 4, 9, 9), md(6, 4, 3, 3), bias=md(6), padding_l=(1, 1)),
    "pooling": triodnn.PoolingDesc("avg_exclude_padding", md(2, 3, 9, 9), kernel=(3, 3), strides=(2, 2),
                                   padding_l=(1, 1)),
    "pooling_backward": triodnn.PoolingBackwardDesc("max", md(2, 3, 4, 4), md(2, 3, 9, 9), md(2, 3, 9, 9),
                                                    kernel=(3, 3), strides=(2, 2), padding_l=(0, 0)),
    "layer_normalization": triodnn.LayerNormDesc(md(6, 40), scale=md(40), shift=md(40)),
    "rms_normalization": triodnn.RMSNormDesc(md(6, 40), scale=md(40)),
    "batch_normalization": triodnn.BatchNormInferenceDesc(md(2, 3, 5, 5), md(3), md(3), scale=md(3), shift=md(3)),
    "group_normalization": triodnn.GroupNormDesc(md(2, 6, 5, 5), groups=3, scale=md(6), shift=md(6)),
    # normalization training
    "batch_normalization_training": triodnn.BatchNormTrainingDesc(md(2, 3, 5, 5), scale=md(3), shift=md(3)),
    "batch_normalization_backward": triodnn.BatchNormBackwardDesc(md(2, 3, 5, 5), md(2, 3, 5, 5), md(3), md(3),
                                                                  scale=md(3)),
    "layer_normalization_backward": triodnn.LayerNormBackwardDesc(md(6, 40), md(6, 40), md(6), md(6), scale=md(40)),
    "sdpa": triodnn.SdpaDesc(md(1, 2, 8, 16), md(1, 2, 12, 16), md(1, 2, 12, 16), causal="top_left"),
    "gen_index": triodnn.GenIndexDesc(md(3, 4, dtype="s32"), axis=1),
    "prelu": triodnn.PreluDesc(md(2, 5, 3, 3), md(1, 5, 1, 1)),
    "quantize": triodnn.QuantizeDesc("quantize", md(2, 5, 3), md(2, 5, 3, dtype="s8"), scales=[0.25, 0.5, 0.125, 1, 2],
                                     zps=[0, 3, -5, 1, 2], axis=1),
    "dynamic_quantize": triodnn.DynamicQuantizeDesc("quantize", md(2, 8, 3), md(2, 2, 1), md(2, 8, 3, dtype="u4"),
                                                    group_shape=(1, 4, 3)),
    "deconvolution": triodnn.DeconvolutionDesc(md(2, 4, 5, 5), md(4, 3, 3, 3), bias=md(6), strides=2, groups=2),
    "convolution_backward_weights": triodnn.ConvolutionBackwardWeightsDesc(
        md(2, 4, 9, 9), md(2, 6, 4, 4), md(6, 2, 3, 3), strides=2, padding_l=1, padding_r=0, groups=2),
    "resampling": triodnn.ResamplingDesc("linear", md(2, 3, 5, 7), md(2, 3, 9, 4)),
    # softmax, PReLU and resampling backward
    "softmax_backward": triodnn.SoftmaxBackwardDesc("softmax", md(6, 40), md(6, 40), axis=1),
    "prelu_backward": triodnn.PreluBackwardDesc(md(2, 5, 3, 3), md(1, 5, 1, 1), md(2, 5, 3, 3)),
    "resampling_backward": triodnn.ResamplingBackwardDesc("linear", md(2, 3, 9, 4), md(2, 3, 5, 7)),
    # Dropout
    "dropout": triodnn.DropoutDesc(md(4, 33), md(1, dtype="s64"), md(1, dtype="s64"), md(1), mask=md(4, 33, dtype="u8")),
    # int8 matmul
    "quantized_matmul": triodnn.QuantizedMatmulDesc(md(2, 5, 24, dtype="u8"), md(24, 7, dtype="s8"), bias=md(1, 7),
                                                    src_scale=0.01, src_zp=3, wei_scales=[0.02 * (i + 1) for i in range(7)],
                                                    wei_zps=[1], post_ops=(("eltwise", "relu"),)),
    # weights decompression: 8-bit weights in groups of 4 x 32 (the 4-bit ones: test_dequantizing_matmul.py)
    "dequantizing_matmul": triodnn.DequantizingMatmulDesc(md(3, 32), md(32, 64, dtype="s8"), md(8, 2), md(3, 64),
                                                          (4, 32), post_ops=(("eltwise", "relu"),)),
    # fused SDPA backward
    "sdpa_backward": triodnn.SdpaBackwardDesc("dq", md(1, 2, 8, 4), md(1, 2, 12, 4), md(1, 2, 12, 4), md(1, 2, 8, 4),
                                              md(1, 2, 8, 4), md(1, 2, 8, 1)),
}


def test_every_kind_has_a_case_a_reference_and_a_tolerance():
    assert set(CASES) == set(OP_KINDS)
    for kind, desc in CASES.items():
        assert type(desc) is OP_KINDS[kind]
        registered = kind_of(desc)
        assert registered.reference is not None and registered.tolerance is not None, kind


def _input(rng: np.random.Generator, name: str, desc: MemoryDesc) -> np.ndarray:
    if name == "variance":
        return rng.uniform(0.5, 2.0, desc.dims).astype(np.float32)  # a variance is positive
    if desc.dtype == "s64":  # Dropout's seed and offset
        return rng.integers(-(2**62), 2**62, desc.dims, dtype=np.int64)
    if name == "probability":  # Dropout's p
        return rng.uniform(0.0, 1.0, desc.dims).astype(np.float32)
    if desc.dtype in ("s8", "u8"):  # the int8 matmul's src and weights
        return rng.integers(-128 if desc.dtype == "s8" else 0, 128 if desc.dtype == "s8" else 256, desc.dims).astype(
            np.int8 if desc.dtype == "s8" else np.uint8)
    return rng.uniform(-2.0, 2.0, desc.dims).astype(np.float32)


@pytest.mark.parametrize("kind", sorted(CASES))
async def test_registered_reference_matches_the_kernel(engine, rng, kind):
    desc = CASES[kind]
    registered = kind_of(desc)
    primitive = await engine.create_primitive(desc)
    outputs = {arg.name for arg in desc.ARGS if arg.output}
    inputs = {name: _input(rng, name, md) for name, md in desc.arg_descs.items() if name not in outputs}
    args = {name: await engine.from_numpy(array, desc.arg_descs[name]) for name, array in inputs.items()}
    # eltwise_backward's output is diff_src, convolution_backward_weights' diff_weights
    output = "dst" if "dst" in outputs else "diff_src" if "diff_src" in outputs else "diff_weights"
    output = "diff_query" if desc.kind == "sdpa_backward" else output  # fused SDPA backward: its dq pass
    args[output] = engine.memory(desc.arg_descs[output])
    for name in outputs - {output}:  # prelu_backward's diff_weights: every output needs memory
        if name in desc.arg_descs:
            args[name] = engine.memory(desc.arg_descs[name])
    stream = await engine.stream()
    await stream.execute(primitive, args)
    got = await args[output].to_numpy()
    want = registered.reference(desc, inputs)
    want = want[output] if isinstance(want, dict) else want  # sdpa_backward's {output: array}
    tolerance.check(got, want, registered.tolerance(desc))
