"""The dtype and post-op sweeps of tests/primitives and the helpers they share: storage data types
and how a stored result is compared, random data per data type, the post-op chains, running a
primitive on numpy arrays.

Test files of this folder import it as ``from _sweeps import ...``: the folder has no
``__init__.py``, so pytest (rootdir-based, "prepend" import mode) puts it on ``sys.path`` before
importing a test file of it, whichever folder pytest runs from and in each xdist worker. The name
starts with ``_``, so pytest never collects it.
"""

from __future__ import annotations

import numpy as np
import pytest

import triodnn
from triodnn import MemoryDesc
from triodnn._values._dtypes import from_storage, to_storage
from triodnn.kernels import _dtype_io, _post_ops, select_config, tolerance

CPU = select_config("cpu", 4096)

# -- storage data types ----------------------------------------------------------------------------

FLOATS = ("f32", "f16", "bf16")
INTEGERS = ("s32", "s8", "u8")
# (src, dst) storage pairs of the floating-point sweeps: each 16-bit type into itself, and both
# directions between bf16 and f32.
FLOAT_PAIRS = [("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32"), ("f32", "bf16")]


def dtype_pairs(pairs: list[tuple[str, str]]):
    """Parametrise ``src_dtype, dst_dtype`` over ``pairs``, with ids ``src->dst``."""
    return pytest.mark.parametrize("src_dtype, dst_dtype", pairs, ids=[f"{s}->{d}" for s, d in pairs])


def check_stored(got: np.ndarray, ref_f32: np.ndarray, threshold: float, dtype: str) -> None:
    """``got`` (user-facing values of ``dtype``) against the f32 reference: ``threshold`` on the
    f32 result plus one rounding step of dst's storage (``_dtype_io.EPSILON``, 0 for the integer
    types and boolean, whose stores must equal the reference's)."""
    assert got.dtype == _dtype_io.USER_NUMPY[dtype], (got.dtype, dtype)
    stored = _dtype_io.store_reference(ref_f32, dtype)
    if dtype in INTEGERS or dtype == "boolean":
        np.testing.assert_array_equal(got, stored)
    else:
        tolerance.check(got, stored, threshold + _dtype_io.EPSILON[dtype])


def check_stored_bounded(got: np.ndarray, ref_f32: np.ndarray, threshold: float, dtype: str) -> None:
    """``check_stored`` for results that may fall on an integer rounding tie (transcendentals and
    random floats stored as integers): an integer result must lie between the stores of the
    reference's tolerance bounds (rounding is monotone), so only a tie may go either way. A float
    result is compared with the larger of ``threshold`` and one rounding step of dst's storage;
    booleans exactly."""
    assert got.dtype == _dtype_io.USER_NUMPY[dtype], (got.dtype, dtype)
    if dtype in INTEGERS:
        ref = np.asarray(ref_f32, np.float64)
        slack = threshold * np.maximum(1.0, np.abs(ref))
        low = _dtype_io.store_reference(ref - slack, dtype)
        high = _dtype_io.store_reference(ref + slack, dtype)
        outside = (got < low) | (got > high)
        assert not outside.any(), f"got {got[outside][:5]}, expected between {low[outside][:5]} and {high[outside][:5]}"
    elif dtype == "boolean":
        np.testing.assert_array_equal(got, _dtype_io.store_reference(ref_f32, dtype))
    else:
        tolerance.check(got, _dtype_io.store_reference(ref_f32, dtype), max(threshold, _dtype_io.EPSILON[dtype]))


# -- data ------------------------------------------------------------------------------------------


def values(rng, dtype: str, shape, low: float = -5.0, high: float = 5.0) -> np.ndarray:
    """Random user-facing values of ``dtype`` in [low, high) (clipped to an integer type's range),
    exactly representable in its storage, so the upload changes nothing."""
    if dtype == "boolean":
        return rng.random(shape) < 0.5
    if dtype in INTEGERS:
        info = np.iinfo(_dtype_io.USER_NUMPY[dtype])
        return rng.integers(max(low, info.min), min(high, info.max + 1), shape).astype(info.dtype)
    x = rng.uniform(low, high, shape).astype(np.float32)
    if dtype == "f16":
        return x.astype(np.float16)
    return from_storage(to_storage(x, dtype), dtype)


def ints(rng, shape, dtype: str = "f32", bound: int = 8) -> np.ndarray:
    """Integers in [-bound, bound] ([0, bound] for u8) as user-facing values of ``dtype``: up to 8
    exact in every storage type, and sums of their products exact in f32."""
    x = rng.integers(0 if dtype == "u8" else -bound, bound + 1, shape)
    return x.astype(_dtype_io.USER_NUMPY[dtype])


def normal(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# -- post-op chains --------------------------------------------------------------------------------

# output_scale alone, a chain alone, both: ``post_op_variant`` picks one.
VARIANTS = ["chain", "scale", "scale+chain"]


def post_op_variant(variant: str, chain: tuple, scale: float, scaled: tuple[float, tuple]) -> tuple[float, tuple]:
    """(output_scale, post_ops) of ``variant``: ``chain`` with output_scale 1, ``scale`` with no
    chain, or ``scaled``, a scale and a chain together."""
    return {"chain": (1.0, chain), "scale": (scale, ()), "scale+chain": scaled}[variant]


def add_sum_eltwise(operand_dims: tuple[int, ...], alg: str) -> tuple:
    """The sweeps' chain: a binary add of an operand of ``operand_dims`` (broadcast where smaller
    than dst), a sum of the old dst scaled by 0.5, then eltwise ``alg``."""
    return (("binary", "add", MemoryDesc(operand_dims)), ("sum", 0.5), ("eltwise", alg))


def relu_sum_mul(operand_dims: tuple[int, ...]) -> tuple:
    """A chain exact on small integers and power-of-two factors: relu, a sum of the old dst scaled
    by 0.5, a binary mul by an operand of ``operand_dims``."""
    return (("eltwise", "relu"), ("sum", 0.5), ("binary", "mul", MemoryDesc(operand_dims)))


def threshold(base: float, chain: tuple) -> float:
    """The kind's threshold, or the loosest of the chain's eltwise post-ops where that is looser."""
    return max([base] + [tolerance.eltwise(op[1]) for op in chain if op[0] == "eltwise"])


def post_op_inputs(rng, desc, make=normal) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Random inputs for ``desc``'s chain, from ``make(rng, dims)``: {argument name: array} for its
    binary operands, then dst's old values (which a sum post-op reads)."""
    operands = {name: make(rng, md.dims) for name, md in _post_ops.operands(desc.post_ops).items()}
    return operands, make(rng, desc.dst.dims)


# -- running a primitive ---------------------------------------------------------------------------


async def execute(engine, desc, arrays: dict, dst_init=None, outputs=("dst",), primitive=None):
    """Run ``desc`` (or the given ``primitive`` of it): inputs from ``arrays``, every other argument
    allocated, dst filled with ``dst_init`` when given. Returns dst, or a dict of ``outputs`` when
    more than dst."""
    unknown = set(arrays) - set(desc.arg_descs)
    assert not unknown, f"{sorted(unknown)} are not arguments of {desc.kind} ({list(desc.arg_descs)})"
    if primitive is None:
        primitive = await engine.create_primitive(desc)
    memories = {}
    for name, md in desc.arg_descs.items():
        if name in arrays:
            memories[name] = await engine.from_numpy(arrays[name], md)
        elif name == "dst" and dst_init is not None:
            memories[name] = await engine.from_numpy(dst_init, md)
        else:
            memories[name] = engine.memory(md)
    await (await engine.stream()).execute(primitive, memories)
    got = {name: await memories[name].to_numpy() for name in outputs}
    return got["dst"] if tuple(outputs) == ("dst",) else got


async def execute_in_place(engine, desc, x: np.ndarray) -> np.ndarray:
    """Run ``desc`` with src and dst one buffer holding ``x`` (so a sum post-op's old dst is src);
    returns the buffer afterwards."""
    primitive = await engine.create_primitive(desc)
    memory = await engine.from_numpy(x, desc.src)
    await (await engine.stream()).execute(primitive, {"src": memory, "dst": memory})
    return await memory.to_numpy()


async def assert_refused_caching_nothing(engine, desc, match: str) -> None:
    """``create_primitive(desc)`` raises UnsupportedError matching ``match`` and leaves the
    primitive cache and the engine's programs and buffers as they were."""
    before_cache, before_engine = triodnn.primitive_cache_statistics(), engine.statistics()
    with pytest.raises(triodnn.UnsupportedError, match=match):
        await engine.create_primitive(desc)
    assert triodnn.primitive_cache_statistics() == before_cache
    after = engine.statistics()
    assert after.programs_built == before_engine.programs_built and after.builds_in_flight == 0
    assert after.live_buffers == before_engine.live_buffers
