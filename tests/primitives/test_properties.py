"""Property tests: hypothesis draws shapes, layouts and broadcast patterns; every result is checked
against the numpy reference of its kernel module, with the tolerance of ``kernels.tolerance``.

Layouts are any permutation of the dimensions (transposed, nhwc-like …) with optional padding
between them, built as explicit strides for ``MemoryDesc(dims, dtype, strides)``.

One runtime and engine serve all the examples of a test: the async test runs hypothesis in a
worker thread, and each example goes back to the trio loop with ``trio.from_thread.run``. Opening
a runtime costs little (about 2 ms); what costs is compiling a kernel for every new shape (about
0.2 s on PoCL, several times that on a cold cache under load), so the example counts below keep
the file near half a minute. Dims stay small (1 to 7, fewer for high ranks) for the same reason and
so that failures shrink to readable cases.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triodnn import BinaryDesc, EltwiseDesc, MatmulDesc, MemoryDesc, ReductionDesc, ReorderDesc, SoftmaxDesc
from triodnn._values._algorithms import broadcast_dims
from triodnn.kernels import binary, eltwise, matmul, reduction, reorder, softmax, tolerance


async def explore(check, strategy, max_examples: int) -> None:
    """Run the async ``check(case)`` on ``max_examples`` cases that hypothesis draws from
    ``strategy`` (and shrinks, on a failure): hypothesis in a worker thread, every ``check`` back
    on the caller's trio loop, where the test's runtime lives."""

    def property_(case):
        trio.from_thread.run(check, case)

    property_.__name__ = check.__qualname__.partition(".")[0]  # test_x: part of hypothesis's database key: one per test
    test = settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )(given(strategy)(property_))
    await trio.to_thread.run_sync(test)


@pytest.fixture
async def env(rt):
    engine = await rt.engine()
    return engine, await engine.stream()


# -- strategies ---------------------------------------------------------------------------------


def small_dims(ndims: int, largest: int = 7) -> st.SearchStrategy[tuple[int, ...]]:
    """``ndims`` dims of 1..``largest``, smaller for high ranks (at most a few thousand elements)."""
    top = largest if ndims <= 3 else 3
    return st.tuples(*[st.integers(1, top)] * ndims)


@st.composite
def strides_for(draw, dims: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides of a random permutation of ``dims``, each step padded by 0..3 elements at
    random: transposed, nhwc-like and padded layouts alike."""
    order = draw(st.permutations(range(len(dims))))  # outermost first
    pads = draw(st.lists(st.sampled_from([0, 0, 0, 1, 3]), min_size=len(dims), max_size=len(dims)))
    strides = [0] * len(dims)
    step = 1
    for axis, pad in zip(reversed(order), pads):
        strides[axis] = step
        step = step * dims[axis] + pad
    return tuple(strides)


@st.composite
def memory_desc(draw, dims: tuple[int, ...], dtype: str = "f32") -> MemoryDesc:
    return MemoryDesc(dims, dtype, draw(strides_for(dims)))


@st.composite
def broadcast_source(draw, dims: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that numpy broadcasts to ``dims``: some dims 1, maybe fewer leading dims."""
    drop = draw(st.integers(0, len(dims) - 1))
    return tuple(1 if draw(st.booleans()) else d for d in dims[drop:])


seeds = st.integers(0, 2**32 - 1)


async def upload(engine, array: np.ndarray, desc: MemoryDesc):
    return await engine.from_numpy(array, desc)


async def run(engine, stream, desc, arrays: dict) -> np.ndarray:
    """``desc`` executed on ``arrays`` (name -> values), dst read back."""
    prim = await engine.create_primitive(desc)
    descs = desc.arg_descs
    args = {name: await upload(engine, arrays[name], descs[name]) for name in arrays}
    args["dst"] = engine.memory(descs["dst"])
    await stream.execute(prim, args)
    return await args["dst"].to_numpy()


# -- binary -------------------------------------------------------------------------------------

BINARY_ALGS = [alg for alg in binary.ALGORITHMS if alg not in binary.TERNARY]


@st.composite
def binary_cases(draw):
    dims = draw(st.integers(1, 6).flatmap(small_dims))
    shape0, shape1 = draw(broadcast_source(dims)), draw(broadcast_source(dims))
    out = binary.broadcast_dims(shape0, shape1)
    return {
        "alg": draw(st.sampled_from(BINARY_ALGS)),
        "src0": draw(memory_desc(shape0)),
        "src1": draw(memory_desc(shape1)),
        "dst": draw(memory_desc(out)),
        "seed": draw(seeds),
    }


async def test_binary(env):
    engine, stream = env

    async def check(case):
        rng = np.random.default_rng(case["seed"])
        # Small integers and halves: ties for the comparisons, zeros for div (inf and NaN).
        a = (rng.integers(-4, 5, case["src0"].dims) / 2).astype(np.float32)
        b = (rng.integers(-4, 5, case["src1"].dims) / 2).astype(np.float32)
        desc = BinaryDesc(case["alg"], case["src0"], case["src1"], case["dst"])
        got = await run(engine, stream, desc, {"src0": a, "src1": b})
        tolerance.check(got, binary.reference(case["alg"], a, b), tolerance.binary(case["alg"]))

    await explore(check, binary_cases(), max_examples=20)


# -- eltwise ------------------------------------------------------------------------------------

ELTWISE = {  # alg: (alpha, beta, input range)
    "relu": (0.0, 0.0, 5.0),
    "leaky_relu": (0.1, 0.0, 5.0),
    "linear": (0.5, -1.0, 5.0),
    "clip": (-1.0, 2.0, 5.0),
    "square": (0.0, 0.0, 5.0),
    "abs": (0.0, 0.0, 5.0),
    "tanh": (0.0, 0.0, 5.0),
    "sigmoid": (0.0, 0.0, 5.0),
    "exp": (0.0, 0.0, 6.0),
    "gelu_erf": (0.0, 0.0, 5.0),
}


@st.composite
def eltwise_cases(draw):
    dims = draw(st.integers(1, 5).flatmap(small_dims))
    return {
        "alg": draw(st.sampled_from(sorted(ELTWISE))),
        "src": draw(memory_desc(dims)),
        "dst": draw(memory_desc(dims)),
        "seed": draw(seeds),
    }


async def test_eltwise(env):
    engine, stream = env

    async def check(case):
        alg = case["alg"]
        alpha, beta, span = ELTWISE[alg]
        x = np.random.default_rng(case["seed"]).uniform(-span, span, case["src"].dims).astype(np.float32)
        desc = EltwiseDesc(alg, case["src"], case["dst"], alpha=alpha, beta=beta)
        got = await run(engine, stream, desc, {"src": x})
        ref = eltwise.reference(alg, x, alpha=alpha, beta=beta)
        tolerance.check(got, ref, tolerance.eltwise(alg))

    await explore(check, eltwise_cases(), max_examples=10)


# -- reorder ------------------------------------------------------------------------------------


@st.composite
def reorder_cases(draw):
    dims = draw(st.integers(1, 6).flatmap(small_dims))
    dtypes = st.sampled_from(["f32", "bf16", "s8"])
    return {
        "src": draw(memory_desc(dims, draw(dtypes))),
        "dst": draw(memory_desc(dims, draw(dtypes))),
        "seed": draw(seeds),
    }


def reorder_input(rng, dtype: str, dims) -> np.ndarray:
    if dtype == "s8":
        return rng.integers(-128, 128, dims).astype(np.int8)
    # Wide enough to saturate s8, halves for its rounding ties, and bf16 rounding in between.
    x = rng.standard_normal(dims) * 100
    return np.where(rng.random(dims) < 0.2, np.round(x) + 0.5, x).astype(np.float32)


async def test_reorder(env):
    engine, stream = env

    async def check(case):
        src_desc, dst_desc = case["src"], case["dst"]
        x = reorder_input(np.random.default_rng(case["seed"]), src_desc.dtype, src_desc.dims)
        prim = await engine.create_primitive(ReorderDesc(src_desc, dst_desc))
        src, dst = await upload(engine, x, src_desc), engine.memory(dst_desc)
        await stream.execute(prim, {"src": src, "dst": dst})
        stored = await src.to_numpy()  # bf16 sources hold x rounded
        want = reorder.reference(stored, src_desc.dtype, dst_desc.dtype)
        got = await dst.to_numpy()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)

    await explore(check, reorder_cases(), max_examples=16)


# -- softmax ------------------------------------------------------------------------------------


@st.composite
def softmax_cases(draw):
    dims = draw(st.integers(1, 4).flatmap(small_dims))
    return {
        "alg": draw(st.sampled_from(softmax.ALGORITHMS)),
        "axis": draw(st.integers(-len(dims), len(dims) - 1)),
        "src": draw(memory_desc(dims)),
        "dst": draw(memory_desc(dims)),
        "seed": draw(seeds),
    }


async def test_softmax(env):
    engine, stream = env

    async def check(case):
        x = np.random.default_rng(case["seed"]).uniform(-10, 10, case["src"].dims).astype(np.float32)
        desc = SoftmaxDesc(case["alg"], case["src"], case["dst"], axis=case["axis"])
        got = await run(engine, stream, desc, {"src": x})
        ref = softmax.reference(case["alg"], x, axis=case["axis"])
        tolerance.check(got, ref, tolerance.softmax(case["alg"]))

    await explore(check, softmax_cases(), max_examples=10)


# -- reduction ----------------------------------------------------------------------------------


@st.composite
def reduction_cases(draw):
    dims = draw(st.integers(1, 4).flatmap(small_dims))
    reduced = draw(st.sets(st.integers(0, len(dims) - 1)))
    out = tuple(1 if axis in reduced else d for axis, d in enumerate(dims))
    return {
        "alg": draw(st.sampled_from(reduction.ALGORITHMS)),
        "src": draw(memory_desc(dims)),
        "dst": draw(memory_desc(out)),
        "seed": draw(seeds),
    }


async def test_reduction(env):
    engine, stream = env

    async def check(case):
        alg, src_desc, dst_desc = case["alg"], case["src"], case["dst"]
        rng = np.random.default_rng(case["seed"])
        if alg == "mul":  # factors near 1 keep the product in range
            x = np.where(rng.random(src_desc.dims) < 0.5, -1.0, 1.0) * rng.uniform(0.8, 1.25, src_desc.dims)
        else:
            x = rng.uniform(-5, 5, src_desc.dims)
        x = x.astype(np.float32)
        got = await run(engine, stream, ReductionDesc(alg, src_desc, dst_desc), {"src": x})
        count = src_desc.nelems // dst_desc.nelems
        tolerance.check(got, reduction.reference(alg, x, dst_desc.dims), tolerance.reduction(alg, count))

    await explore(check, reduction_cases(), max_examples=10)


# -- matmul -------------------------------------------------------------------------------------


@st.composite
def matmul_cases(draw):
    m, k, n = draw(st.tuples(*[st.integers(1, 7)] * 3))
    batch = draw(st.integers(0, 2).flatmap(lambda nb: small_dims(nb, 3)))
    src_batch = draw(broadcast_source(batch)) if batch and draw(st.booleans()) else batch
    wei_batch = draw(broadcast_source(batch)) if batch and draw(st.booleans()) else batch
    out = broadcast_dims(src_batch, wei_batch) + (m, n)
    bias = draw(st.sampled_from([None, (n,), (m, 1), (1, n), out]))
    return {
        # Strides of a random permutation: swapping the last two is the transposed matrix.
        "src": draw(memory_desc(src_batch + (m, k))),
        "weights": draw(memory_desc(wei_batch + (k, n))),
        "bias": None if bias is None else draw(memory_desc(bias)),
        "dst": draw(memory_desc(out)),
        "seed": draw(seeds),
    }


async def test_matmul(env):
    engine, stream = env

    async def check(case):
        rng = np.random.default_rng(case["seed"])
        # Small integers: every product and sum is exact in f32, so the result must be too.
        arrays = {
            name: rng.integers(-4, 5, case[name].dims).astype(np.float32)
            for name in ("src", "weights", "bias") if case[name] is not None
        }
        desc = MatmulDesc(case["src"], case["weights"], case["dst"], bias=case["bias"])
        got = await run(engine, stream, desc, arrays)
        want = matmul.reference(arrays["src"], arrays["weights"], arrays.get("bias"))
        assert got.shape == want.shape and math.prod(got.shape) == desc.dst.nelems
        np.testing.assert_array_equal(got, want)

    await explore(check, matmul_cases(), max_examples=12)
