"""Matmul: batched with broadcast batch dims, transposed and strided inputs, optional bias.

Inputs are small integers, as benchdnn fills them, so f32 results are exact and compared with
``array_equal``; one case uses random floats with a K-scaled tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values._matmul_desc import MatmulDesc
from triodnn.kernels import matmul, tolerance


def ints(rng, shape) -> np.ndarray:
    return rng.integers(-4, 5, shape).astype(np.float32)


async def run(engine, desc: MatmulDesc, arrays: dict) -> np.ndarray:
    primitive = await engine.create_primitive(desc)
    stream = await engine.stream()
    args = {name: await engine.from_numpy(arrays[name], desc.arg_descs[name]) for name in arrays}
    args["dst"] = engine.memory(desc.dst)
    await stream.execute(primitive, args)
    return await args["dst"].to_numpy()


@pytest.mark.parametrize(
    "src, wei, bias",
    [
        ((1, 1), (1, 1), None),
        ((5, 7), (7, 3), None),
        ((17, 33), (33, 40), (40,)),           # edge blocks in both directions
        ((32, 16), (16, 32), (32, 1)),         # full blocks only; bias per row
        ((2, 33, 17), (17, 45), (1, 45)),      # batch on src only
        ((3, 1, 8, 9), (4, 9, 20), None),      # batch dims broadcast both ways
        ((2, 3, 2, 5, 6), (6, 7), (2, 3, 2, 5, 7)),  # 5-D, full bias
    ],
)
async def test_matches_numpy_exactly(engine, rng, src, wei, bias):
    arrays = {"src": ints(rng, src), "weights": ints(rng, wei)}
    if bias is not None:
        arrays["bias"] = ints(rng, bias)
    desc = MatmulDesc(MemoryDesc(src), MemoryDesc(wei), bias=None if bias is None else MemoryDesc(bias))
    got = await run(engine, desc, arrays)
    np.testing.assert_array_equal(got, matmul.reference(arrays["src"], arrays["weights"], arrays.get("bias")))


async def test_transposed_and_strided_inputs(engine, rng):
    """Weights stored N x K (transposed through strides), src with padded rows."""
    a, w = ints(rng, (13, 9)), ints(rng, (9, 20))
    src = MemoryDesc((13, 9), "f32", (12, 1))      # rows padded to 12
    wei = MemoryDesc((9, 20), "f32", "ba")          # column-major
    dst = MemoryDesc((13, 20), "f32", "ba")
    desc = MatmulDesc(src, wei, dst)
    got = await run(engine, desc, {"src": a, "weights": w})
    np.testing.assert_array_equal(got, a @ w)


async def test_random_floats_within_k_scaled_tolerance(engine, rng):
    k = 300
    a = rng.standard_normal((40, k)).astype(np.float32)
    w = rng.standard_normal((k, 50)).astype(np.float32)
    got = await run(engine, MatmulDesc(MemoryDesc(a.shape), MemoryDesc(w.shape)), {"src": a, "weights": w})
    tolerance.check(got, matmul.reference(a, w), 1e-6 * k)


def test_impl_names_the_register_block():
    desc = MatmulDesc(MemoryDesc((64, 64)), MemoryDesc((64, 64)))
    spec = matmul.generate(desc, triodnn.kernels.select_config("cpu", 4096))
    assert spec.impl.startswith("ocl:regblock:6x64")
    assert spec.arg_names == ("src", "weights", "dst")


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: MatmulDesc(MemoryDesc((4, 5)), MemoryDesc((6, 3))), triodnn.ArgumentMismatchError, "K=5"),
        (lambda: MatmulDesc(MemoryDesc((5,)), MemoryDesc((5, 3))), triodnn.InvalidArgumentError, "src dims"),
        (lambda: MatmulDesc(MemoryDesc((2, 4, 5)), MemoryDesc((3, 5, 6))), triodnn.ArgumentMismatchError, "batch dims"),
        (lambda: MatmulDesc(MemoryDesc((4, 5)), MemoryDesc((5, 3)), MemoryDesc((4, 4))), triodnn.ArgumentMismatchError,
         "dst dims"),
        (lambda: MatmulDesc(MemoryDesc((4, 5)), MemoryDesc((5, 3)), bias=MemoryDesc((2,))), triodnn.ArgumentMismatchError,
         "bias dims"),
        (lambda: MatmulDesc("src", MemoryDesc((5, 3))), triodnn.InvalidArgumentError, "src is str"),
    ],
)
def test_bad_shapes_name_the_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


async def test_non_f32_is_unsupported_and_caches_nothing(engine):
    """f16 src and weights are fine (tests/primitives/test_dtypes_more.py); a post-op operand must be f32."""
    before = triodnn.primitive_cache_statistics()
    desc = MatmulDesc(MemoryDesc((4, 5), "f16"), MemoryDesc((5, 3), "f16"),
                      post_ops=(("binary", "add", MemoryDesc((4, 3), "f16")),))
    with pytest.raises(triodnn.UnsupportedError, match="post_op_0_src1 has dtype 'f16'"):
        await engine.create_primitive(desc)
    after = triodnn.primitive_cache_statistics()
    assert (after.size, after.misses, after.in_flight_builds) == (before.size, before.misses, 0)
