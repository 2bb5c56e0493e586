"""Matmul on the CPU path's blocks: 6x64 micro-tiles (8x32 when N < 64 or M <= 8, 16x16 when
N <= 16), rows split over work-items, K in chunks of 256 with partial sums between chunks, weights
copied per chunk whatever their layout (or read in place with one micro-tile per work-item).

Shapes put full micro-tiles, edge micro-tiles (M or N not a multiple) and several K chunks (K not a
multiple of 256 too) in one kernel. Inputs are small integers: every sum is exact in f32, so results
are compared with ``array_equal``.
"""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values._matmul_desc import MatmulDesc
from triodnn.kernels import _post_ops, matmul


def ints(rng, shape) -> np.ndarray:
    return rng.integers(-4, 5, shape).astype(np.float32)


async def run(engine, desc: MatmulDesc, arrays: dict, dst_init: np.ndarray | None = None) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    stream = await engine.stream()
    args = {name: await engine.from_numpy(arrays[name], desc.arg_descs[name]) for name in arrays}
    args["dst"] = engine.memory(desc.dst) if dst_init is None else await engine.from_numpy(dst_init, desc.dst)
    await stream.execute(primitive, args)
    return await args["dst"].to_numpy()


@pytest.mark.parametrize(
    "m, k, n",
    [
        (64, 512, 64),    # full tiles, two whole K chunks
        (37, 600, 70),    # M and N edges, K chunks 256 + 256 + 88
        (40, 256, 96),    # one chunk exactly
        (1, 300, 33),     # one row: clamped src rows in the only micro-tile
        (24, 1, 40),      # K = 1
        (50, 70, 16),     # N <= 16: 16x16 micro-tiles
        (19, 260, 5),     # N <= 16 with edges and two chunks
        (300, 20, 130),   # several micro-tiles per work-item, N edge
        (5, 300, 130),    # M <= 8: one micro-tile per work-item, weights read in place
        (8, 520, 64),     # the same, N exactly one 64-wide panel
        (12, 64, 200),    # M = 12: two micro-tiles of 6 rows
    ],
)
async def test_shapes(engine, rng, m, k, n):
    a, w = ints(rng, (m, k)), ints(rng, (k, n))
    got = await run(engine, MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape)), {"src": a, "weights": w})
    np.testing.assert_array_equal(got, matmul.reference(a, w))


# Every pair of layouts of two arguments (src and weights all nine, dst alternating): each
# argument's addressing is generated on its own, and every combination is a cold PoCL build.
LAYOUT_RUNS = [(s, w, ("ab", "ba")[(i + j) % 2]) for i, s in enumerate(("ab", "ba", "padded"))
               for j, w in enumerate(("ab", "ba", "padded"))]


@pytest.mark.parametrize("src_layout, wei_layout, dst_layout", LAYOUT_RUNS)
async def test_layouts(engine, rng, src_layout, wei_layout, dst_layout):
    m, k, n = 41, 300, 70

    def md(dims, layout):
        if layout == "padded":
            return MemoryDesc(dims, "f32", (dims[1] + 3, 1))
        return MemoryDesc(dims, "f32", layout)

    a, w = ints(rng, (m, k)), ints(rng, (k, n))
    desc = MatmulDesc(md((m, k), src_layout), md((k, n), wei_layout), md((m, n), dst_layout))
    got = await run(engine, desc, {"src": a, "weights": w})
    np.testing.assert_array_equal(got, a @ w)


@pytest.mark.parametrize("bias_dims", [(70,), (41, 1), (41, 70)])
async def test_bias_and_post_ops_over_chunks(engine, rng, bias_dims):
    """Bias, a column-broadcast binary operand, sum with the old dst and relu, on full and edge
    micro-tiles after several K chunks (the sum must read dst as it was before the kernel)."""
    m, k, n = 41, 520, 70
    a, w, b = ints(rng, (m, k)), ints(rng, (k, n)), ints(rng, bias_dims)
    col, old = ints(rng, (m, 1)), ints(rng, (m, n))
    chain = (("binary", "sub", MemoryDesc((m, 1))), ("sum", 0.5), ("eltwise", "relu"))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), bias=MemoryDesc(bias_dims), post_ops=chain)
    got = await run(engine, desc, {"src": a, "weights": w, "bias": b, "post_op_0_src1": col}, dst_init=old)
    want = _post_ops.reference(desc.post_ops, matmul.reference(a, w, b), old, {"post_op_0_src1": col})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, np.maximum(matmul.reference(a, w, b) - col + 0.5 * old, 0))


async def test_batch_broadcast_with_transposed_weights(engine, rng):
    a, w = ints(rng, (2, 1, 40, 300)), ints(rng, (3, 300, 50))
    wei = MemoryDesc(w.shape, "f32", (300 * 50, 1, 300))  # each matrix column-major
    desc = MatmulDesc(MemoryDesc(a.shape), wei, bias=MemoryDesc((1, 50)))
    b = ints(rng, (1, 50))
    got = await run(engine, desc, {"src": a, "weights": w, "bias": b})
    np.testing.assert_array_equal(got, matmul.reference(a, w, b))


@pytest.mark.parametrize("m, n, batch", [(1024, 1024, 1), (64, 64, 1), (8, 1024, 1), (64, 64, 16), (3, 3, 1)])
def test_work_split_keeps_both_cores_busy(m, n, batch):
    """Rows per work-item shrink (down to one micro-tile) until there are 8 work-items."""
    spec = matmul.generate(MatmulDesc(MemoryDesc((batch, m, 128)), MemoryDesc((batch, 128, n))),
                           triodnn.kernels.select_config("cpu", 4096))
    items = spec.global_size[0] * spec.global_size[1] * spec.global_size[2]
    tm = int(spec.impl.split(":")[2].split("x")[0])
    rows = int(spec.impl.split(":m")[1].split(":")[0])
    assert rows % tm == 0 and (items >= 8 or rows == tm)
    assert spec.local_size == (1, 1, 1)
