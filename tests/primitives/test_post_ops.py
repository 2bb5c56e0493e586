"""Post-op chains (eltwise, sum, binary) on matmul, eltwise and binary primitives.

Matmul inputs are small integers, so the product (and bias, binary add, sum) are exact in f32;
transcendental post-ops are then compared within their eltwise tolerance.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from _sweeps import CPU, add_sum_eltwise, execute, execute_in_place, normal
from _sweeps import ints as _ints

import triodnn
from triodnn import BinaryDesc, EltwiseDesc, MemoryDesc
from triodnn._values._matmul_desc import MatmulDesc
from triodnn.kernels import _post_ops, binary, eltwise, matmul, tolerance

ints = functools.partial(_ints, bound=4)  # [-4, 4]


async def test_matmul_bias_relu(engine, rng):
    a, w, b = ints(rng, (33, 20)), ints(rng, (20, 40)), ints(rng, (40,))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), bias=MemoryDesc(b.shape),
                      post_ops=(("eltwise", "relu"),))
    got = await execute(engine, desc, {"src": a, "weights": w, "bias": b})
    np.testing.assert_array_equal(got, np.maximum(matmul.reference(a, w, b), 0))


@pytest.mark.parametrize("m, k, n", [(32, 16, 48), (17, 9, 23), (5, 3, 7)])
async def test_matmul_binary_add_sum_gelu(engine, rng, m, k, n):
    """Full 16x16 blocks and edge blocks: row-broadcast add, sum(0.5) with the old dst, gelu_tanh."""
    a, w, row = ints(rng, (m, k)), ints(rng, (k, n)), ints(rng, (1, n))
    old = ints(rng, (m, n))
    chain = add_sum_eltwise((1, n), "gelu_tanh")
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), post_ops=chain)
    assert desc.arg_descs["post_op_0_src1"] == MemoryDesc((1, n))
    got = await execute(engine, desc, {"src": a, "weights": w, "post_op_0_src1": row}, dst_init=old)
    exact = matmul.reference(a, w) + row + 0.5 * old  # small integers and halves: exact
    np.testing.assert_array_equal(
        _post_ops.reference(chain[:2], matmul.reference(a, w), old, {0: row}), exact
    )
    ref = _post_ops.reference(desc.post_ops, matmul.reference(a, w), old, {"post_op_0_src1": row})
    tolerance.check(got, ref, tolerance.eltwise("gelu_tanh"))


@pytest.mark.parametrize("m, n", [(16, 16), (18, 35), (40, 3)])
async def test_matmul_edge_blocks_column_operand_and_clip(engine, rng, m, n):
    a, w = ints(rng, (m, 7)), ints(rng, (7, n))
    col = ints(rng, (m, 1))
    chain = (("binary", "mul", MemoryDesc((m, 1))), ("eltwise", "clip", -10.0, 12.0), ("sum", 1.0))
    old = ints(rng, (m, n))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), post_ops=chain)
    got = await execute(engine, desc, {"src": a, "weights": w, "post_op_0_src1": col}, dst_init=old)
    ref = _post_ops.reference(chain, matmul.reference(a, w), old, {0: col})
    np.testing.assert_array_equal(got, ref)


async def test_batched_matmul_with_batch_broadcast_operand(engine, rng):
    a, w = ints(rng, (3, 9, 5)), ints(rng, (5, 20))
    op = ints(rng, (3, 1, 20))
    chain = (("binary", "sub", MemoryDesc(op.shape)), ("eltwise", "abs"))
    desc = MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape), post_ops=chain)
    got = await execute(engine, desc, {"src": a, "weights": w, "post_op_0_src1": op})
    np.testing.assert_array_equal(got, np.abs(matmul.reference(a, w) - op))


@pytest.mark.parametrize("n", [4099, 64, 7])
async def test_eltwise_binary_mul_scalar_operand_stays_flat(engine, rng, n):
    x = normal(rng, n)
    s = np.array([2.5], np.float32)
    chain = (("binary", "mul", MemoryDesc((1,))),)
    desc = EltwiseDesc("tanh", MemoryDesc((n,)), post_ops=chain)
    assert triodnn.kernels.generate(desc, CPU).impl.startswith("ocl:flat")
    got = await execute(engine, desc, {"src": x, "post_op_0_src1": s})
    ref = _post_ops.reference(chain, eltwise.reference("tanh", x), None, {0: s})
    tolerance.check(got, ref, tolerance.eltwise("tanh"))


async def test_eltwise_broadcast_operand_takes_the_strided_path(engine, rng):
    x = normal(rng, (37, 20))
    row = normal(rng, (20,))
    chain = (("binary", "add", MemoryDesc((20,))), ("eltwise", "sigmoid"))
    desc = EltwiseDesc("relu", MemoryDesc(x.shape), post_ops=chain)
    spec = triodnn.kernels.generate(desc, CPU)
    assert spec.impl.endswith(":po_bcast")
    assert spec.arg_names == ("src", "post_op_0_src1", "dst")
    got = await execute(engine, desc, {"src": x, "post_op_0_src1": row})
    ref = _post_ops.reference(chain, eltwise.reference("relu", x), None, {0: row})
    tolerance.check(got, ref, tolerance.eltwise("sigmoid"))


async def test_binary_then_eltwise_clip(engine, rng):
    a = normal(rng, (5, 33))
    b = normal(rng, (5, 33))
    chain = (("eltwise", "clip", -0.5, 0.75),)
    desc = BinaryDesc("add", MemoryDesc(a.shape), MemoryDesc(b.shape), post_ops=chain)
    got = await execute(engine, desc, {"src0": a, "src1": b})
    tolerance.check(got, _post_ops.reference(chain, binary.reference("add", a, b)), tolerance.BINARY)


async def test_broadcast_binary_with_operand_and_sum(engine, rng):
    a = ints(rng, (4, 1, 6))
    b = ints(rng, (3, 6))
    op = ints(rng, (4, 3, 1))
    old = ints(rng, (4, 3, 6))
    chain = (("binary", "max", MemoryDesc(op.shape)), ("sum", -2.0))
    desc = BinaryDesc("mul", MemoryDesc(a.shape), MemoryDesc(b.shape), post_ops=chain)
    got = await execute(engine, desc, {"src0": a, "src1": b, "post_op_0_src1": op}, dst_init=old)
    np.testing.assert_array_equal(got, _post_ops.reference(chain, a * b, old, {0: op}))


async def test_in_place_eltwise_with_sum_reads_src_as_old_dst(engine, rng):
    """The documented corner: src and dst one buffer, so sum's "previous dst" is src itself; each
    element is read before its own store, so the result is f(x) + scale * x."""
    x = normal(rng, 1000)
    chain = (("sum", 2.0),)
    got = await execute_in_place(engine, EltwiseDesc("square", MemoryDesc(x.shape), post_ops=chain), x)
    ref = _post_ops.reference(chain, eltwise.reference("square", x), old_dst=x)
    tolerance.check(got, ref, tolerance.ELTWISE)


async def test_different_post_ops_are_different_cache_entries(engine):
    md = MemoryDesc((64,))
    plain = EltwiseDesc("relu", md)
    with_relu = EltwiseDesc("relu", md, post_ops=(("eltwise", "relu"),))
    with_sum = EltwiseDesc("relu", md, post_ops=(("sum", 1.0),))
    assert len({plain, with_relu, with_sum}) == 3
    # normalised: omitted parameters resolve, so these are one descriptor
    assert with_relu == EltwiseDesc("relu", md, post_ops=[("eltwise", "relu", 0.0, 0.0)])
    assert EltwiseDesc("relu", md, post_ops=(("sum", 0.0),)) != EltwiseDesc("relu", md, post_ops=(("sum", -0.0),))
    before = triodnn.primitive_cache_statistics()
    prims = [await engine.create_primitive(d) for d in (plain, with_relu, with_sum, with_relu)]
    after = triodnn.primitive_cache_statistics()
    assert after.misses - before.misses == 3
    assert prims[1].spec.source == prims[3].spec.source
    assert prims[0].spec.source != prims[1].spec.source


async def test_cache_blob_round_trips_post_ops(engine, rng):
    row = MemoryDesc((1, 24), "f32", (24, 1))
    chain = (("binary", "add", row), ("sum", 0.25), ("eltwise", "linear", 2.0, -1.0))
    desc = MatmulDesc(MemoryDesc((9, 4)), MemoryDesc((4, 24)), post_ops=chain)
    primitive = await engine.create_primitive(desc)
    blob = primitive.cache_blob()
    loaded = await engine.create_primitive_from_cache_blob(blob)
    assert loaded.desc == desc
    assert loaded.desc.post_ops[0][2] == row and isinstance(loaded.desc.post_ops[0][2], MemoryDesc)
    assert loaded.spec == primitive.spec
    a, w, r, old = ints(rng, (9, 4)), ints(rng, (4, 24)), ints(rng, (1, 24)), ints(rng, (9, 24))
    got = await execute(engine, loaded.desc, {"src": a, "weights": w, "post_op_0_src1": r}, dst_init=old)
    np.testing.assert_array_equal(got, _post_ops.reference(chain, a @ w, old, {0: r}))


async def test_verbose_line_lists_the_chain_without_commas(rt, monkeypatch, capsys):
    monkeypatch.setenv("TRIODNN_VERBOSE", "1")
    engine = await rt.engine()
    chain = (("eltwise", "clip", -1.0, 1.0), ("binary", "add", MemoryDesc((1, 8))), ("sum", 0.5))
    await engine.create_primitive(EltwiseDesc("relu", MemoryDesc((4, 8)), post_ops=chain))
    monkeypatch.setenv("TRIODNN_VERBOSE", "0")
    (line,) = [l for l in capsys.readouterr().out.splitlines() if l.startswith("triodnn_verbose")]
    fields = line.split(",")
    assert len(fields) == 9
    assert "post_op_1_src1:f32:1x8:s8:1" in fields[6]
    assert "post_ops:eltwise:clip:-1:1+binary:add:f32:1x8:s8:1+sum:0.5" in fields[7]


@pytest.mark.parametrize(
    "chain, error, match",
    [
        ((("conv", "x"),), triodnn.InvalidArgumentError, r"post_ops\[0\]: unknown post-op kind"),
        ((("sum", 1.0), ("eltwise", "nope")), triodnn.InvalidArgumentError, r"post_ops\[1\].*eltwise algorithm"),
        ((("binary", "select", MemoryDesc((8,))),), triodnn.InvalidArgumentError, r"post_ops\[0\].*binary post-op"),
        ((("binary", "add", MemoryDesc((3,))),), triodnn.ArgumentMismatchError, r"post_ops\[0\].*broadcast"),
        ((("binary", "add", MemoryDesc((1, 4, 8))),), triodnn.ArgumentMismatchError, r"post_ops\[0\].*broadcast"),
        ((("binary", "add", (8,)),), triodnn.InvalidArgumentError, r"post_ops\[0\].*MemoryDesc"),
        ((("sum", float("nan")),), triodnn.InvalidArgumentError, r"post_ops\[0\].*finite"),
        ((("eltwise", "relu", float("inf")),), triodnn.InvalidArgumentError, r"post_ops\[0\].*finite"),
        ((("eltwise", "clip", 2.0, 1.0),), triodnn.InvalidArgumentError, r"post_ops\[0\].*clip"),
        ((("sum", 1.0), "relu"), triodnn.InvalidArgumentError, r"post_ops\[1\]"),
        ("relu", triodnn.InvalidArgumentError, "post_ops is str"),
    ],
)
@pytest.mark.parametrize("make", ["eltwise", "binary", "matmul"])
def test_bad_chains_raise_typed_errors(chain, error, match, make):
    md = MemoryDesc((4, 8))
    with pytest.raises(error, match=match):
        if make == "eltwise":
            EltwiseDesc("relu", md, post_ops=chain)
        elif make == "binary":
            BinaryDesc("add", md, md, post_ops=chain)
        else:
            MatmulDesc(MemoryDesc((4, 2)), MemoryDesc((2, 8)), post_ops=chain)


async def test_non_f32_operand_is_unsupported(engine):
    desc = EltwiseDesc("relu", MemoryDesc((8,)), post_ops=(("binary", "add", MemoryDesc((8,), "f16")),))
    with pytest.raises(triodnn.UnsupportedError, match="post_op_0_src1"):
        await engine.create_primitive(desc)
