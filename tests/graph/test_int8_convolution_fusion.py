"""Int8 convolution fusion (graph/_int8_convolution.py): Dequantize(src) +
Dequantize(weights) -> Convolution (+ bias, post-ops) [-> Quantize] compiles to one convolution
primitive reading the int8 tensors, whose outputs match the op-by-op graph reference; patterns it
does not take (per-channel weights with several zero points) keep their op-by-op primitives. The kernel's own paths
(row vectors, per position, the GPU configuration) are checked in
tests/primitives/test_convolution_int8.py."""

from __future__ import annotations

import numpy as np
import pytest
from _graph_helpers import deq, graph_of, int8_inputs, lt, primitive_kinds, run

from triodnn.graph import Op
from triodnn.testing._driver import reference_outputs


def conv_graph(*, quantize=True, per_channel=False, nxc=False, weight_zps=None):
    """u8 src (zero point 3), s8 weights, a bias, ReLU, Quantize to s8: oneDNN's int8 conv pattern."""
    n, c, hw, oc = 2, 8, 18, 4  # few output channels: small unrolled kernels, quick cold builds
    src_shape = (n, hw, hw, c) if nxc else (n, c, hw, hw)
    dst_shape = (n, hw, hw, oc) if nxc else (n, oc, hw, hw)
    wscales = [0.01 * (i + 1) for i in range(oc)] if per_channel else [0.02]
    ops = [deq(0, 0, 10, src_shape, "u8", [0.05], [3]),
           deq(1, 1, 11, (oc, c, 3, 3), "s8", wscales, weight_zps or [0] * len(wscales),
               axis=0 if per_channel else None),
           Op(2, "Convolution", [lt(10, src_shape), lt(11, (oc, c, 3, 3)), lt(2, (oc,))], [lt(20, dst_shape)],
              {"strides": [1, 1], "pads_begin": [1, 1], "pads_end": [1, 1], "dilations": [1, 1], "groups": 1,
               "data_format": "NXC" if nxc else "NCX", "weights_format": "OIX"}),
           Op(3, "ReLU", [lt(20, dst_shape)], [lt(21, dst_shape)])]
    if quantize:
        ops.append(Op(4, "Quantize", [lt(21, dst_shape)], [lt(30, dst_shape, "s8")], {"scales": [0.25], "zps": [-4]}))
    return graph_of(*ops)


# Per-channel weights: the channel scales become the chain's first post-op.
@pytest.mark.parametrize("options", [
    {}, {"nxc": True, "quantize": False},
    {"per_channel": True}, {"per_channel": True, "nxc": True}, {"per_channel": True, "nxc": True, "quantize": False},
], ids=["ncx_s8", "nxc_f32_dst", "per_channel_ncx_s8", "per_channel_nxc_s8", "per_channel_nxc_f32_dst"])
async def test_fuses_to_one_convolution_and_matches_the_reference(engine, rng, options):
    graph = conv_graph(**options)
    assert await primitive_kinds(engine, graph) == ["convolution"]
    arrays = int8_inputs(rng, graph)
    got = await run(engine, graph, arrays)
    want, _ = reference_outputs(graph, arrays)
    (out,) = [t.id for t in graph.output_tensors()]
    if options.get("quantize", True):
        # The exact integer sum times the scales against op by op's f32 dequantized inputs: ties may round apart.
        diff = np.abs(got[out].astype(np.int64) - want[out].astype(np.int64))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99, diff
        assert len(np.unique(got[out])) > 20
    else:
        np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-5 * np.abs(want[out]).max())


async def test_per_channel_weights_with_several_zero_points_run_op_by_op(engine, rng):
    graph = conv_graph(per_channel=True, weight_zps=[0, 1, 0, 2])
    kinds = await primitive_kinds(engine, graph)
    assert kinds.count("quantize") == 3 and "convolution" in kinds
    arrays = int8_inputs(rng, graph)
    got = await run(engine, graph, arrays)
    want, _ = reference_outputs(graph, arrays)
    assert np.array_equal(got[30], want[30])
