"""Every implementation a kernel generator can choose runs at least once, against its kind's float64
reference and tolerance (``kind_of(desc).reference`` / ``.tolerance``).

A kind's own tests pick shapes for what they check (post-ops, dtypes, layouts), so a path its
generator takes only for some other shape can go unexecuted: LayerNorm's rows-per-work-item path
(``ocl:row:v16l16r4`` at (4096, 32)) had no case whose values were compared. Here each path has
one.

Families. An ``impl`` name embeds sizes (vector width, work-group size, tiles, rows per item),
so cases are grouped by family: the name with each run of digits replaced by ``N``, except a
vector width of one (``v1``), kept because generators write scalar code for it apart from their
vector code ("ocl:row:v16l16r4" -> "ocl:row:vNlNrN", "ocl:row:v1l256" -> "ocl:row:v1lN",
"ocl:gemm_tiled:32x64x16:r4x4:l16x8:s2" -> "ocl:gemm_tiled:NxNxN:rNxN:lNxN:sN").

Configurations: the CPU's (``select_config("cpu", ...)``), the same for a CPU of 8-float SIMD
registers (AVX2, where the blocked convolutions take over), and the GPU's
(``select_config("gpu", ...)``), forced on the default engine as test_gpu_shaped_kernels.py
does. A case takes a GPU or AVX2 configuration only where it reaches a family the CPU's does not.

Two meta-tests, generation only (no device), keep the table complete: each kind's grid
(``_impl_grid.py``: many shapes, layouts, types, post-ops, under all three configurations) yields
no family without a case here; and each impl template written in kernels/*.py (the f-string
passed as ``impl``, each branch of a conditional part on its own) fits the family of some case of
a kind whose generator reaches that module. A new implementation fails one of them until it has a
case (and, where the grid misses it, a grid point).
"""

from __future__ import annotations

import ast
import collections
import functools
import itertools
import pathlib
import re

import numpy as np
import pytest
from _impl_grid import GRIDS, md

import triodnn
import triodnn.kernels
from triodnn import MemoryDesc
from triodnn._values import CrossEngineReorderDesc
from triodnn._values._dtypes import from_storage, to_storage
from triodnn._values._errors import UnsupportedError
from triodnn.kernels import KERNELS, _dtype_io, generate, kind_of, select_config, tolerance

CONFIGS = {
    "cpu": select_config("cpu", 4096),
    "cpu_avx2": select_config("cpu", 4096, native_vector_width=8),
    "gpu": select_config("gpu", 256),
    # An NVIDIA GPU with tensor cores: its cases run only on such a device.
    "gpu_sm90": select_config("gpu", 256, 48 * 1024, nvidia_sm=90),
}


def family(impl: str) -> str:
    """``impl`` with its sizes taken out (see the module docstring)."""
    return "v1".join(re.sub(r"\d+", "N", part) for part in re.split(r"v1(?!\d)", impl))


def _sdpa_bwd(part: str, b: int, h: int, sq: int, skv: int, d: int) -> triodnn.SdpaBackwardDesc:
    return triodnn.SdpaBackwardDesc(part, md(b, h, sq, d), md(b, h, skv, d), md(b, h, skv, d), md(b, h, sq, d),
                                    md(b, h, sq, d), md(b, h, sq, 1))


def _conv(src, w, *, groups=1, strides=1, pad=0, post_ops=(), src_tag=None, w_tag=None, dst_tag=None):
    """A convolution of src dims ``src`` and weights dims ``w`` with a bias, in the layouts given."""
    probe = triodnn.ConvolutionDesc(md(*src), md(*w), strides=strides, padding_l=pad, groups=groups)
    return triodnn.ConvolutionDesc(md(*src, strides=src_tag), md(*w, strides=w_tag),
                                   md(*probe.dst.dims, strides=dst_tag), bias=md(w[0]), strides=strides,
                                   padding_l=pad, groups=groups, post_ops=post_ops)


RELU = (("eltwise", "relu"),)

# (family, configuration, descriptor): one case per family each kind's generator can choose.
CASES: list[tuple[str, str, object]] = [
    # eltwise
    ("ocl:flat:vNlN", "cpu", triodnn.EltwiseDesc("gelu_erf", md(4, 33))),
    ("ocl:flat:v1lN", "gpu", triodnn.EltwiseDesc("gelu_erf", md(4, 33))),
    ("ocl:strided:lN", "cpu", triodnn.EltwiseDesc("tanh", md(4, 33), md(4, 33, strides="ba"))),
    ("ocl:strided:lN:po_bcast", "cpu", triodnn.EltwiseDesc("relu", md(4, 33), post_ops=(("binary", "mul", md(4, 1)),))),
    ("ocl:strided:lN", "cpu", triodnn.EltwiseBackwardDesc("gelu_tanh", md(4, 33), md(4, 33))),
    # binary: dst-shaped operands flat, one-value operands as scalars (src1 "b", select's src2 "c")
    ("ocl:rows:vNlN", "cpu", triodnn.BinaryDesc("add", md(4, 32), md(1, 32))),
    ("ocl:flat:vNlN", "cpu", triodnn.BinaryDesc("mul", md(4, 33), md(4, 33))),
    ("ocl:flat:v1lN", "gpu", triodnn.BinaryDesc("mul", md(4, 33), md(4, 33))),
    ("ocl:scalar_b:vNlN", "cpu", triodnn.BinaryDesc("sub", md(4, 33), md(1, 1))),
    ("ocl:scalar_b:v1lN", "gpu", triodnn.BinaryDesc("sub", md(4, 33), md(1, 1))),
    ("ocl:scalar_c:vNlN", "cpu", triodnn.BinaryDesc("select", md(4, 33), md(4, 33), src2=md(1, 1, dtype="boolean"))),
    ("ocl:scalar_c:v1lN", "gpu", triodnn.BinaryDesc("select", md(4, 33), md(4, 33), src2=md(1, 1, dtype="boolean"))),
    ("ocl:scalar_bc:vNlN", "cpu", triodnn.BinaryDesc("select", md(4, 33), md(1, 1), src2=md(1, 1, dtype="boolean"))),
    ("ocl:scalar_bc:v1lN", "gpu", triodnn.BinaryDesc("select", md(4, 33), md(1, 1), src2=md(1, 1, dtype="boolean"))),
    ("ocl:broadcast:lN", "cpu", triodnn.BinaryDesc("max", md(4, 33), md(4, 1))),
    ("ocl:broadcast:lN:po_bcast", "cpu",
     triodnn.BinaryDesc("add", md(4, 33), md(4, 33), post_ops=(("binary", "mul", md(4, 1)),))),
    # sum, concat
    ("ocl:flat:vNlN", "cpu", triodnn.SumDesc([md(4, 33), md(4, 33)], scales=[0.5, -2.0])),
    ("ocl:flat:v1lN", "gpu", triodnn.SumDesc([md(4, 33), md(4, 33)], scales=[0.5, -2.0])),
    ("ocl:strided:lN", "cpu", triodnn.SumDesc([md(4, 33), md(4, 33, strides="ba")], scales=[0.5, -2.0])),
    ("ocl:strided:lN", "cpu", triodnn.ConcatDesc([md(2, 3, 4), md(2, 5, 4)], axis=1)),
    # reorder
    ("ocl:copy:vNlN", "cpu", triodnn.ReorderDesc(md(3, 5, 7), md(3, 5, 7))),
    ("ocl:copy:v1lN", "gpu", triodnn.ReorderDesc(md(3, 5, 7), md(3, 5, 7))),
    ("ocl:strided:lN", "cpu", triodnn.ReorderDesc(md(3, 5, 7), md(3, 5, 7, strides="acb"))),
    ("ocl:convert:lN", "cpu", triodnn.ReorderDesc(md(3, 5, 7), md(3, 5, 7, dtype="bf16", strides="acb"))),
    ("ocl:tiled:NxN", "gpu", triodnn.ReorderDesc(md(40, 48), md(40, 48, strides="ba"))),
    # one implementation each
    ("ocl:gen_index:lN", "cpu", triodnn.GenIndexDesc(md(3, 4, dtype="s32"), axis=1)),
    ("ocl:prelu:lN", "cpu", triodnn.PreluDesc(md(2, 5, 3, 3), md(1, 5, 1, 1))),
    ("ocl:prelu_bwd:lN", "cpu", triodnn.PreluBackwardDesc(md(2, 5, 3, 3), md(1, 5, 1, 1), md(2, 5, 3, 3))),
    ("ocl:philox:lN", "cpu", triodnn.DropoutDesc(md(4, 33), md(1, dtype="s64"), md(1, dtype="s64"), md(1),
                                                 mask=md(4, 33, dtype="u8"))),
    ("ocl:quantize:lN", "cpu", triodnn.QuantizeDesc("quantize", md(2, 5, 3), md(2, 5, 3, dtype="s8"),
                                                    scales=[0.25, 0.5, 0.125, 1, 2], zps=[0, 3, -5, 1, 2], axis=1)),
    ("ocl:dequantize:lN", "cpu", triodnn.QuantizeDesc("dequantize", md(2, 5, 3, dtype="u8"), md(2, 5, 3),
                                                      scales=[0.5], zps=[7])),
    ("ocl:dynamic_quantize:lN", "cpu", triodnn.DynamicQuantizeDesc("quantize", md(2, 8, 3), md(2, 2, 1),
                                                                   md(2, 8, 3, dtype="s8"), group_shape=(1, 4, 3))),
    ("ocl:dynamic_dequantize:lN", "cpu", triodnn.DynamicQuantizeDesc(
        "dequantize", md(2, 8, 3, dtype="s8"), md(2, 2, 1), md(2, 8, 3), group_shape=(1, 4, 3),
        zps=md(2, 2, 1, dtype="s8"))),
    # softmax: vector rows and scalar rows on the CPU, a work-group a row (cached or streamed) on GPUs
    ("ocl:row:vNlN", "cpu", triodnn.SoftmaxDesc("softmax", md(6, 32))),
    ("ocl:row:v1lN", "cpu", triodnn.SoftmaxDesc("logsoftmax", md(5, 37))),
    ("ocl:wg_row:lNrN", "gpu", triodnn.SoftmaxDesc("softmax", md(5, 37))),
    ("ocl:wg_row:lN", "gpu", triodnn.SoftmaxDesc("logsoftmax", md(2, 9000))),
    ("ocl:row_bwd:lN", "cpu", triodnn.SoftmaxBackwardDesc("softmax", md(6, 40), md(6, 40), axis=1)),
    # layer and RMS normalization: as softmax, plus several short rows per work-item (r4)
    ("ocl:row:vNlN", "cpu", triodnn.LayerNormDesc(md(6, 32), scale=md(32), shift=md(32))),
    ("ocl:row:vNlNrN", "cpu", triodnn.LayerNormDesc(md(4096, 32), epsilon=1e-3, scale=md(32), shift=md(32))),
    ("ocl:row:v1lN", "cpu", triodnn.LayerNormDesc(md(5, 33), scale=md(33), shift=md(33))),
    ("ocl:wg_row:lNrN", "gpu", triodnn.LayerNormDesc(md(5, 33), scale=md(33), shift=md(33))),
    ("ocl:wg_row:lN", "gpu", triodnn.LayerNormDesc(md(2, 9000))),
    ("ocl:row:vNlN", "cpu", triodnn.RMSNormDesc(md(6, 32), scale=md(32))),
    ("ocl:row:vNlNrN", "cpu", triodnn.RMSNormDesc(md(4096, 16), scale=md(16))),
    ("ocl:row:v1lN", "cpu", triodnn.RMSNormDesc(md(5, 33), scale=md(33))),
    ("ocl:wg_row:lNrN", "gpu", triodnn.RMSNormDesc(md(5, 33), scale=md(33))),
    ("ocl:wg_row:lN", "gpu", triodnn.RMSNormDesc(md(2, 9000))),
    ("ocl:per_element:lN", "cpu", triodnn.BatchNormInferenceDesc(md(2, 3, 5, 5), md(3), md(3), scale=md(3), shift=md(3))),
    ("ocl:per_group:lN", "cpu", triodnn.GroupNormDesc(md(2, 6, 5, 5), groups=3, scale=md(6), shift=md(6))),
    # normalization training and backward: a work-item per job, or a work-group per job on GPUs
    ("ocl:job:lN", "cpu", triodnn.BatchNormTrainingDesc(md(2, 3, 5, 5), scale=md(3), shift=md(3))),
    ("ocl:wg_job:lN", "gpu", triodnn.BatchNormTrainingDesc(md(2, 3, 5, 5), scale=md(3), shift=md(3))),
    ("ocl:job:lN", "cpu", triodnn.BatchNormBackwardDesc(md(2, 3, 5, 5), md(2, 3, 5, 5), md(3), md(3), scale=md(3))),
    ("ocl:wg_job:lN", "gpu", triodnn.BatchNormBackwardDesc(md(2, 3, 5, 5), md(2, 3, 5, 5), md(3), md(3), scale=md(3))),
    ("ocl:job:lN", "cpu", triodnn.LayerNormBackwardDesc(md(6, 40), md(6, 40), md(6), md(6), scale=md(40))),
    ("ocl:wg_job:lN", "gpu", triodnn.LayerNormBackwardDesc(md(6, 40), md(6, 40), md(6), md(6), scale=md(40))),
    # reduction, pooling, resampling
    ("ocl:per_output:lN", "cpu", triodnn.ReductionDesc("mean", md(6, 40), md(6, 1))),
    ("ocl:wg_output:lN", "gpu", triodnn.ReductionDesc("sum", md(6, 40), md(6, 1))),
    ("ocl:per_output:lN", "cpu", triodnn.PoolingDesc("avg_exclude_padding", md(2, 3, 9, 9), kernel=(3, 3),
                                                     strides=(2, 2), padding_l=(1, 1))),
    ("ocl:gather:lN", "cpu", triodnn.PoolingBackwardDesc("max", md(2, 3, 4, 4), md(2, 3, 9, 9), md(2, 3, 9, 9),
                                                         kernel=(3, 3), strides=(2, 2), padding_l=(0, 0))),
    ("ocl:resampling:nearest:lN", "cpu", triodnn.ResamplingDesc("nearest", md(2, 3, 5, 7), md(2, 3, 9, 4))),
    ("ocl:resampling:linear:lN", "cpu", triodnn.ResamplingDesc("linear", md(2, 3, 5, 7), md(2, 3, 9, 4))),
    ("ocl:resampling_bwd:nearest:lN", "cpu",
     triodnn.ResamplingBackwardDesc("nearest", md(2, 3, 9, 4), md(2, 3, 5, 7))),
    ("ocl:resampling_bwd:linear:lN", "cpu", triodnn.ResamplingBackwardDesc("linear", md(2, 3, 9, 4), md(2, 3, 5, 7))),
    # matmul: the CPU's register blocks (f32 row-major weights read in place, "direct"; post-ops
    # in a function of their own, "staged"), on GPUs 4 x 4 blocks, the tiled kernel with and
    # without a K split, and the K split across a work-group
    ("ocl:regblock:NxN:kN:mN:direct:lNxN", "cpu", triodnn.MatmulDesc(md(8, 24), md(24, 32), bias=md(1, 32))),
    ("ocl:regblock:NxN:kN:mN:direct:staged:lNxN", "cpu", triodnn.MatmulDesc(md(8, 24), md(24, 32), post_ops=RELU)),
    ("ocl:regblock:NxN:kN:mN:lNxN", "cpu", triodnn.MatmulDesc(md(2, 5, 24), md(24, 7, strides="ba"), bias=md(1, 7))),
    ("ocl:regblock:NxN:kN:mN:staged:lNxN", "cpu",
     triodnn.MatmulDesc(md(5, 24), md(24, 7, strides="ba"), post_ops=(("eltwise", "tanh"),))),
    ("ocl:regblock:NxN:lNxN", "gpu", triodnn.MatmulDesc(md(2, 5, 24), md(24, 7), bias=md(1, 7))),
    ("ocl:gemm_tiled:NxNxN:rNxN:lNxN:sN", "gpu", triodnn.MatmulDesc(md(128, 64), md(64, 128), post_ops=RELU)),
    ("ocl:gemm_tiled:NxNxN:rNxN:lNxN", "gpu", triodnn.MatmulDesc(md(128, 64), md(64, 1024), bias=md(1, 1024))),
    ("ocl:skinny:NxN:tN:lN", "gpu", triodnn.MatmulDesc(md(16, 200), md(200, 40))),
    ("ocl:gemm_mma:NxNxN:wNxN:pN", "gpu_sm90",
     triodnn.MatmulDesc(md(2, 70, 72, dtype="bf16"), md(72, 136, dtype="bf16"), bias=md(1, 136), post_ops=RELU)),
    # int8 matmul
    ("ocl:intN:dot:NxN:lNxN", "cpu", triodnn.QuantizedMatmulDesc(
        md(5, 24, dtype="u8"), md(24, 7, dtype="s8", strides="ba"), bias=md(1, 7), src_scale=0.01, src_zp=3,
        wei_scales=[0.02], wei_zps=[1], post_ops=RELU)),
    ("ocl:intN:regblock:NxN:lNxN", "cpu", triodnn.QuantizedMatmulDesc(
        md(2, 5, 24, dtype="u8"), md(24, 7, dtype="s8"), bias=md(1, 7), src_scale=0.01, src_zp=3,
        wei_scales=[0.02 * (i + 1) for i in range(7)], wei_zps=[1], post_ops=RELU)),
    ("ocl:intN:lN", "gpu", triodnn.QuantizedMatmulDesc(
        md(5, 24, dtype="u8"), md(24, 7, dtype="s8"), bias=md(1, 7), src_scale=0.01, src_zp=3, wei_scales=[0.02])),
    ("ocl:intN:tiled:NxN:lNxN", "gpu", triodnn.QuantizedMatmulDesc(
        md(512, 32, dtype="u8"), md(32, 512, dtype="s8"), src_scale=0.01, src_zp=3, wei_scales=[0.02], wei_zps=[1])),
    # weights-decompression matmul: one element per work-item (N not in blocks), and the CPU's
    # blocks of 4-bit and of 8-bit weights
    ("ocl:dequantizing:lN", "cpu", triodnn.DequantizingMatmulDesc(
        md(3, 32, dtype="f16"), md(32, 24, dtype="s4"), md(4, 3, dtype="bf16"), md(3, 24, dtype="f16"), (8, 8),
        md(4, 3, dtype="s8"), dequantized="bf16", post_ops=RELU)),
    ("ocl:dequantizing:nibbles:NxN:lNxN", "cpu", triodnn.DequantizingMatmulDesc(
        md(2, 64), md(64, 64, dtype="u4"), md(64, 2, dtype="f16"), md(2, 64), (1, 32), md(64, 2, dtype="u8"),
        dequantized="f16")),
    ("ocl:dequantizing:bytes:NxN:lNxN", "cpu", triodnn.DequantizingMatmulDesc(
        md(3, 32, dtype="bf16"), md(32, 64, dtype="s8"), md(8, 1, dtype="f32"), md(3, 64, dtype="bf16"), (4, 64),
        post_ops=RELU)),
    # convolution: per-position (CPU and GPU, channels fastest on GPUs in NHWC), row vectors on the
    # CPU, 1x1 as the CPU's matmul (its four variants), implicit GEMM on GPUs (K taps-major "ck"
    # or channels-major "kc"), and the AVX2-shaped blocked kernels
    ("ocl:direct:ocN:lN", "cpu", _conv((2, 4, 9, 9), (6, 4, 3, 3), pad=1)),
    ("ocl:direct:ocN:lcNxN", "gpu", _conv((1, 8, 4, 4), (32, 8, 3, 3), pad=1, src_tag="acdb", dst_tag="acdb")),
    ("ocl:direct:rowN:ocN:hN:lN", "cpu", _conv((1, 4, 30), (8, 4, 5), pad=2, post_ops=RELU)),
    ("ocl:pointwise_matmul:regblock:NxN:kN:mN:direct:lNxN", "cpu", _conv((1, 8, 4, 4), (32, 8, 1, 1), w_tag="bcda")),
    ("ocl:pointwise_matmul:regblock:NxN:kN:mN:direct:staged:lNxN", "cpu",
     _conv((1, 8, 4, 4), (32, 8, 1, 1), w_tag="bcda", post_ops=RELU)),
    ("ocl:pointwise_matmul:regblock:NxN:kN:mN:lNxN", "cpu", _conv((1, 8, 4, 4), (32, 8, 1, 1))),
    ("ocl:pointwise_matmul:regblock:NxN:kN:mN:staged:lNxN", "cpu", _conv((1, 8, 4, 4), (32, 8, 1, 1), post_ops=RELU)),
    ("ocl:implicit_gemm:ck:NxNxN:rNxN:lNxN", "gpu", _conv((1, 8, 9, 9), (16, 8, 3, 3), pad=1)),
    ("ocl:implicit_gemm:kc:NxNxN:rNxN:lNxN", "gpu",
     _conv((1, 8, 9, 9), (16, 8, 3, 3), pad=1, src_tag="acdb", dst_tag="acdb", post_ops=RELU)),
    ("ocl:nhwc_blocked:wNxcN:lNxN", "cpu_avx2", _conv((1, 8, 9, 9), (16, 8, 3, 3), pad=1, w_tag="bcda")),
    ("ocl:packed_blocked:wNxcN:lNxN", "cpu_avx2", _conv((1, 8, 9, 9), (16, 8, 3, 3), pad=1)),
    ("ocl:nhwc_blocked:wNxcN:dw:lNxN", "cpu_avx2",
     _conv((1, 16, 9, 9), (16, 1, 3, 3), groups=16, pad=1, src_tag="acdb", w_tag="bcda", dst_tag="acdb")),
    ("ocl:dw_rows:wN:sN:lNxN", "cpu_avx2", _conv((1, 16, 9, 9), (16, 1, 3, 3), groups=16, strides=2, pad=1)),
    ("ocl:conv_bwd_w_direct:lN", "cpu", triodnn.ConvolutionBackwardWeightsDesc(
        md(2, 4, 9, 9), md(2, 6, 4, 4), md(6, 2, 3, 3), strides=2, padding_l=1, padding_r=0, groups=2)),
    ("ocl:deconv_gather:bNlN", "cpu", triodnn.DeconvolutionDesc(md(2, 4, 5, 5), md(4, 3, 3, 3), bias=md(6), strides=2,
                                                                groups=2)),
    # SDPA: the CPU's short-query kernel and rows-as-lanes kernel; on GPUs flash attention, the
    # keys split across a work-group, and one row per work-item (soft-capping, head size 128)
    ("ocl:sdpa:rowdot:lNxN", "cpu", triodnn.SdpaDesc(md(1, 2, 3, 16), md(1, 2, 12, 16), md(1, 2, 12, 16))),
    ("ocl:sdpa:rowlanes:qNxN:eN:lNxN", "cpu",
     triodnn.SdpaDesc(md(1, 2, 8, 12), md(1, 2, 12, 12), md(1, 2, 12, 12), causal="top_left")),
    ("ocl:sdpa:flash:qN:kN:lN", "gpu",
     triodnn.SdpaDesc(md(1, 2, 8, 16), md(1, 2, 12, 16), md(1, 2, 12, 16), causal="top_left")),
    ("ocl:sdpa:wgsplit:qNxN:kN:lN", "gpu",
     triodnn.SdpaDesc(md(1, 2, 8, 16), md(1, 2, 12, 16), md(1, 2, 12, 16), softcap=md(1))),
    ("ocl:sdpa:wg:kN:lN", "gpu", triodnn.SdpaDesc(md(1, 1, 3, 128), md(1, 1, 5, 128), md(1, 1, 5, 128), softcap=md(1))),
    ("ocl:sdpa_bwd:dq:lanesN:lN", "cpu", _sdpa_bwd("dq", 1, 2, 8, 12, 4)),
    ("ocl:sdpa_bwd:dkdv:lanesN:lN", "cpu", _sdpa_bwd("dkdv", 1, 2, 8, 12, 4)),
    ("ocl:sdpa_bwd:dq:rowsN:lN", "gpu", _sdpa_bwd("dq", 1, 2, 8, 12, 4)),
    ("ocl:sdpa_bwd:dkdv:rowsN:lN", "gpu", _sdpa_bwd("dkdv", 1, 2, 8, 12, 4)),
]

# Templates a generator writes but no input reaches, with why.
UNREACHABLE = {
    ("convolution_cpu", "ocl:packed_blocked:w{}xc{}:dw:l1x1"):
        "depthwise needs the weights' channels contiguous, and packing is for weights whose channels are not",
    ("matmul_wgmma", "ocl:gemm_wgmma:{}"):
        "matmul.generate does not choose it while mma.sync is faster; test_matmul_wgmma.py runs every tile",
    ("matmul_mma", "ocl:gemm_mma:{}:tf32"):
        "matmul_mma.applies takes TF32 only once it has run on a GPU (TF32_CHOSEN); "
        "test_tensor_core_emulation.py and test_matmul_mma.py run it",
    ("sdpa_mma", "ocl:sdpa:mma:q{}:k{}:l{}"):
        "sdpa.generate chooses it by itself only once it has run on a GPU (CHOSEN); "
        "test_tensor_core_emulation.py and test_sdpa_mma.py run it",
    ("quantized_matmul_mma", "ocl:int8:mma:{}"):
        "quantized_matmul.generate chooses it by itself only once it has run on a GPU (CHOSEN); "
        "test_quantized_matmul_mma.py runs every tile",
}


def case_id(family_name: str, config: str, desc) -> str:
    return f"{type(desc).__name__}-{family_name}-{config}"


# -- meta-tests (generation only) ------------------------------------------------------------------


def test_cases_generate_their_family():
    """Each case's family is the one it names, and no family of a kind has two cases (each is a
    build)."""
    impls = [(case_id(fam, config, desc), fam, generate(desc, CONFIGS[config]).impl) for fam, config, desc in CASES]
    wrong = {case: impl for case, fam, impl in impls if family(impl) != fam}
    assert not wrong, wrong
    twice = collections.Counter((type(desc), fam) for fam, _, desc in CASES)
    assert max(twice.values()) == 1, [key for key, n in twice.items() if n > 1]


def test_family_grouping():
    assert family("ocl:row:v16l16r4") == "ocl:row:vNlNrN"
    assert family("ocl:row:v1l256") == "ocl:row:v1lN"
    assert family("ocl:flat:v16l16") == "ocl:flat:vNlN"
    assert family("ocl:gemm_tiled:32x64x16:r4x4:l16x8:s2") == "ocl:gemm_tiled:NxNxN:rNxN:lNxN:sN"
    assert family("ocl:sdpa_bwd:dq:rows1:l128") == "ocl:sdpa_bwd:dq:rowsN:lN"


def test_every_kind_has_a_grid_and_cases():
    """Every registered kind but the cross-engine reorder, whose generator is the reorder's (its
    primitive adds the copies between engines, no kernel of its own)."""
    # triodnn's own kinds: other test modules register kinds of their own (failing builds, gates),
    # and pytest-xdist may run them in this worker first.
    kinds = {kind for kind in KERNELS if kind.__module__.startswith("triodnn.")} - {CrossEngineReorderDesc}
    assert set(GRIDS) == kinds
    assert {type(desc) for _, _, desc in CASES} == kinds


def test_grid_families_have_cases():
    """Each kind's grid under each configuration: every family it generates has a case."""
    cased = {(type(desc), fam) for fam, _, desc in CASES}
    missing = collections.defaultdict(set)
    for kind, grid in GRIDS.items():
        for desc, (config_name, config) in itertools.product(grid(), CONFIGS.items()):
            try:
                impl = generate(desc, config).impl
            except UnsupportedError:  # a refusal (quantized probabilities on some GPU shapes) is no implementation
                continue
            if (kind, family(impl)) not in cased:
                missing[kind.__name__, family(impl)].add(f"{config_name}: {desc!r}"[:300])
    assert not missing, "families without a case in CASES:\n" + "\n".join(
        f"{kind} {fam}, e.g. {sorted(examples)[0]}" for (kind, fam), examples in sorted(missing.items()))


KERNELS_DIR = pathlib.Path(triodnn.kernels.__file__).parent
_HOLE = "\0"  # a computed part of a template


def _texts(node: ast.expr) -> set[str]:
    """The strings ``node`` can evaluate to: literal text kept, every computed part a hole, each
    branch of a conditional expression on its own."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.JoinedStr):
        return {"".join(parts) for parts in itertools.product(*(_texts(v) for v in node.values))}
    if isinstance(node, ast.FormattedValue):
        return _texts(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return {a + b for a in _texts(node.left) for b in _texts(node.right)}
    if isinstance(node, ast.IfExp):
        return _texts(node.body) | _texts(node.orelse)
    return {_HOLE}


def _impl_expressions(tree: ast.Module):
    """Expressions passed as ``impl=`` or assigned to a name ``impl`` (alone or in a tuple)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "impl":
            yield node.value
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "impl":
                    yield node.value
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    yield from (v for t, v in zip(target.elts, node.value.elts)
                                if isinstance(t, ast.Name) and t.id == "impl")


@functools.cache
def impl_templates() -> dict[str, set[str]]:
    """Per kernel module, its impl templates with ``{}`` for each hole. An expression that is a
    hole alone (``impl=impl``) hands on another template and is none itself."""
    templates = {}
    for path in sorted(KERNELS_DIR.glob("*.py")):
        texts = set()
        for expr in _impl_expressions(ast.parse(path.read_text())):
            texts |= {t.replace(_HOLE, "{}") for t in _texts(expr) if t != _HOLE}
        templates[path.stem] = texts
    return templates


@functools.cache
def _imports(module: str) -> set[str]:
    """The kernel modules ``module`` imports, less ``tolerance``: it imports normalization and
    pooling for their thresholds, not their generators."""
    names = set()
    for node in ast.walk(ast.parse((KERNELS_DIR / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names |= {node.module} if node.module else {alias.name for alias in node.names}
    return {n for n in names if (KERNELS_DIR / f"{n}.py").exists()} - {"tolerance"}


def reachable_modules(desc_class: type) -> set[str]:
    """The kernel module of ``desc_class``'s generator and those it imports, transitively."""
    todo = [KERNELS[desc_class].generate.__module__.rsplit(".", 1)[1]]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imports(module))
    return seen


def _pattern(template: str) -> re.Pattern:
    """A regex over families that fits the impls of ``template``."""
    return re.compile(".+".join(re.escape(family(part)) for part in template.split("{}")))


def test_every_impl_template_has_a_case():
    """Each template in kernels/*.py, a conditional part's branches apart, fits the family of a
    case whose generator reaches its module; UNREACHABLE lists those no input reaches. Fitting is
    loose (a hole matches any text, so ``ocl:strided:l{}`` fits ``ocl:strided:lN:po_bcast``):
    which families exist is test_grid_families_have_cases's to say; this one catches a template
    written where no grid reaches."""
    templates = impl_templates()
    covered = set()
    for fam, config, desc in CASES:
        fits = {(module, t) for module in reachable_modules(type(desc)) for t in templates[module]
                if _pattern(t).fullmatch(fam)}
        assert fits, f"{case_id(fam, config, desc)} fits no impl template of its kernel modules"
        covered |= fits
    every = {(module, t) for module, texts in templates.items() for t in texts}
    assert set(UNREACHABLE) <= every, "UNREACHABLE names a template the kernels no longer write"
    missing = every - covered - set(UNREACHABLE)
    assert not missing, f"impl templates without a case in CASES: {sorted(missing)}"


def test_templates_are_read():
    """The scan sees the shapes it must: a conditional part's branches, a literal v1, a passed-on
    name left out."""
    templates = impl_templates()
    assert {"ocl:row:v1l{}", "ocl:row:v{}l{}", "ocl:row:v{}l{}r{}", "ocl:wg_row:l{}", "ocl:wg_row:l{}r{}"} \
        <= templates["normalization"]
    assert {"ocl:flat:{}", "ocl:scalar_{}:{}", "ocl:broadcast:l{}:po_bcast"} <= templates["binary"]
    assert "{}" not in templates["matmul_gpu"]
    assert {"matmul", "matmul_gpu", "matmul_skinny", "convolution_gemm"} <= reachable_modules(triodnn.ConvolutionDesc)


# -- running each case -----------------------------------------------------------------------------


def _input(rng: np.random.Generator, name: str, desc: MemoryDesc) -> np.ndarray:
    """Random values valid for argument ``name``, exactly representable in its storage type."""
    if name == "variance":
        return rng.uniform(0.5, 2.0, desc.dims).astype(np.float32)
    if name == "scales":  # dynamic quantization divides by them
        return rng.uniform(0.5, 2.0, desc.dims).astype(np.float32)
    if name == "probability":
        return rng.uniform(0.0, 1.0, desc.dims).astype(np.float32)
    if desc.dtype == "boolean":
        return rng.random(desc.dims) < 0.5
    numpy_type = _dtype_io.USER_NUMPY[desc.dtype]
    if np.issubdtype(numpy_type, np.integer):
        lo, hi = {"s4": (-8, 7), "u4": (0, 15)}.get(desc.dtype, (np.iinfo(numpy_type).min, np.iinfo(numpy_type).max))
        return rng.integers(lo, hi, desc.dims, endpoint=True).astype(numpy_type)
    x = rng.uniform(-2.0, 2.0, desc.dims).astype(np.float32)
    return x if desc.dtype == "f32" else from_storage(to_storage(x, desc.dtype), desc.dtype)


@pytest.mark.parametrize("fam, config, desc", CASES, ids=[case_id(*case) for case in CASES])
async def test_case_matches_the_reference(engine, rng, fam, config, desc):
    if CONFIGS[config].nvidia_sm > engine.info.nvidia_sm:
        pytest.skip(f"{fam} needs an NVIDIA device of sm_{CONFIGS[config].nvidia_sm}; this is {engine}")
    engine._config = CONFIGS[config]
    primitive = await engine.create_primitive(desc)
    assert family(primitive.impl) == fam
    outputs = [arg.name for arg in desc.ARGS if arg.output and arg.name in desc.arg_descs]
    inputs = {name: _input(rng, name, m) for name, m in desc.arg_descs.items() if name not in outputs}
    memories = {name: await engine.from_numpy(array, desc.arg_descs[name]) for name, array in inputs.items()}
    memories.update({name: engine.memory(desc.arg_descs[name]) for name in outputs})
    await (await engine.stream()).execute(primitive, memories)
    registered = kind_of(desc)
    want = registered.reference(desc, inputs)
    if not isinstance(want, dict):  # the reference of dst, or of the first gradient where there is no dst
        want = {next(n for n in ("dst", "diff_src", "diff_weights") if n in outputs): want}
    for name, ref in want.items():
        tolerance.check(await memories[name].to_numpy(), ref, registered.tolerance(desc))
