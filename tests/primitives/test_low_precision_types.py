"""The low-precision storage types: f8_e4m3 and f8_e5m2 (one byte a value), s4 and u4 (two a
byte, the even element in the low nibble).

The f8 rules are checked against a float64 reference written here from oneDNN's definition
(src/common/float8.cpp, the non-saturating f32 conversion): round to nearest even once, f32
subnormals read as zero, e4m3 (largest 448, no infinity) overflows to NaN, e5m2 (largest 57344)
to infinity, NaN stays NaN. Device stores (a reorder from f32) and host copies must agree with it
and with each other bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import EltwiseDesc, MemoryDesc
from triodnn._values import _dtypes, _float8, _int4
from triodnn._values._errors import ArgumentMismatchError, UnsupportedError
from triodnn._values._reorder_desc import ReorderDesc
from triodnn.kernels import reorder

F8 = ("f8_e4m3", "f8_e5m2")
# (mantissa bits, bias, largest finite value, what overflow becomes)
_RULES = {"f8_e4m3": (3, 7, 448.0, np.nan), "f8_e5m2": (2, 15, 57344.0, np.inf)}


def f8_reference(values, dtype: str) -> np.ndarray:
    """float64 values of f32 ``values`` rounded to ``dtype`` by oneDNN's definition."""
    m, bias, largest, overflow = _RULES[dtype]
    with np.errstate(invalid="ignore"):  # random bit patterns hold signalling NaNs
        x = np.asarray(values, dtype=np.float32).astype(np.float64)
    tiny = float(np.finfo(np.float32).tiny)
    out = np.empty_like(x)
    for i, v in enumerate(x.reshape(-1)):
        if np.isnan(v):
            r = np.nan
        elif abs(v) < tiny:  # f32 zeros and subnormals (DAZ)
            r = 0.0
        elif np.isinf(v):
            r = overflow
        else:
            exponent = max(int(np.floor(np.log2(abs(v)))), 1 - bias)
            quantum = 2.0 ** (exponent - m)
            r = float(np.rint(abs(v) / quantum)) * quantum  # exact in float64; rint: half to even
            if r > largest:
                r = overflow
        out.reshape(-1)[i] = np.copysign(r, v)
    return out


def edge_values(dtype: str) -> np.ndarray:
    m, bias, largest, _ = _RULES[dtype]
    sub = 2.0 ** (1 - bias - m)  # smallest subnormal
    ulp_top = 2.0 ** (np.floor(np.log2(largest)) - m)
    values = [
        0.0, -0.0, 1.0, -1.0, 1 + 2.0**-m / 2, 1 + 3 * 2.0**-m / 2, 1 + 2.0**-m / 2 + 2.0**-20,
        largest, -largest, largest + ulp_top / 2, largest + ulp_top / 2 - 1, largest + ulp_top,
        -(largest + ulp_top), 3.4e38, sub, -sub, sub / 2, 3 * sub / 2, sub / 2 + 2.0**-40,
        2.0 ** (1 - bias), 2.0 ** (1 - bias) - sub / 2, 1e-40, -1e-40, np.inf, -np.inf, np.nan,
    ]
    return np.array(values, dtype=np.float32)


def random_f32(rng, n: int) -> np.ndarray:
    """Finite f32 values spread over every f8 binade and beyond, plus random bit patterns."""
    spread = rng.standard_normal(n) * 2.0 ** rng.integers(-20, 18, n)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([spread.astype(np.float32), bits])


def assert_same_values(got, want) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite], want[finite])
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(want[finite]))


@pytest.mark.parametrize("dtype", F8)
def test_host_conversion_follows_onednn_definition(rng, dtype):
    x = np.concatenate([edge_values(dtype), random_f32(rng, 4000)])
    got = _dtypes.from_storage(_dtypes.to_storage(x, dtype), dtype)
    assert got.dtype == np.float32
    assert_same_values(got, f8_reference(x, dtype))


def test_f8_bit_patterns():
    codes = _dtypes.to_storage(np.array([448, 464, 465, -np.inf, np.nan, -np.nan, 2.0**-9, 2.0**-10]), "f8_e4m3")
    assert codes.tolist() == [0x7E, 0x7E, 0x7F, 0xFF, 0x7F, 0xFF, 0x01, 0x00]
    codes = _dtypes.to_storage(np.array([57344, 61439, 61440, -np.inf, np.nan, 2.0**-16, 1.0]), "f8_e5m2")
    assert codes.tolist() == [0x7B, 0x7B, 0x7C, 0xFC, 0x7E, 0x01, 0x3C]
    # Every code decodes to a value that encodes back to it (NaNs to the canonical NaN).
    for dtype in F8:
        all_codes = np.arange(256, dtype=np.uint8)
        values = _float8.decode(all_codes, dtype)
        again = _float8.encode(values, dtype)
        keep = ~np.isnan(values)
        np.testing.assert_array_equal(again[keep], all_codes[keep])
        assert np.isnan(_float8.decode(again[~keep], dtype)).all()


def test_f8_values_in_bytes():
    assert _dtypes.data_type("f8_e4m3").itemsize == 1
    assert MemoryDesc((3, 4), "f8_e5m2").nbytes == 12
    # uint8 input is values, not bit patterns: 200 rounds to 192 in e4m3.
    assert _dtypes.from_storage(_dtypes.convert_input(np.array([200], np.uint8), "f8_e4m3"), "f8_e4m3")[0] == 192


@pytest.mark.parametrize("dtype", F8)
async def test_device_store_and_load_match_host(engine, rng, dtype):
    x = np.concatenate([edge_values(dtype), random_f32(rng, 1000)]).reshape(2, -1)
    stream = await engine.stream()
    to_f8 = await engine.create_primitive(ReorderDesc(MemoryDesc(x.shape, "f32"), MemoryDesc(x.shape, dtype)))
    back = await engine.create_primitive(ReorderDesc(MemoryDesc(x.shape, dtype), MemoryDesc(x.shape, "f32")))
    src = await engine.from_numpy(x, MemoryDesc(x.shape, "f32"))
    mid, dst = engine.memory(MemoryDesc(x.shape, dtype)), engine.memory(MemoryDesc(x.shape, "f32"))
    await stream.execute(to_f8, {"src": src, "dst": mid})
    await stream.execute(back, {"src": mid, "dst": dst})
    stored = await mid.to_numpy()
    assert stored.dtype == np.float32
    assert_same_values(stored, f8_reference(x, dtype))
    assert_same_values(await dst.to_numpy(), stored)
    # Host upload, strided: the same values as the device store.
    strided = MemoryDesc(x.shape, dtype, "ba")
    memory = await engine.from_numpy(x, strided)
    assert_same_values(await memory.to_numpy(), stored)


@pytest.mark.parametrize(("src", "dst"), [("f8_e4m3", "f8_e5m2"), ("f8_e5m2", "f8_e4m3"), ("f8_e4m3", "s8"),
                                          ("bf16", "f8_e4m3"), ("f8_e5m2", "f16"), ("u8", "f8_e5m2")])
async def test_reorder_between_f8_and_other_types(engine, rng, src, dst):
    x = (rng.standard_normal((4, 9)) * 40).astype(np.float32)
    if src == "u8":
        x = np.abs(np.rint(x)).clip(0, 255).astype(np.uint8)
    memory = await engine.from_numpy(x, MemoryDesc(x.shape, src))
    held = await memory.to_numpy()
    desc = ReorderDesc(MemoryDesc(x.shape, src), MemoryDesc(x.shape, dst, "ba"))
    out = engine.memory(desc.dst)
    await (await engine.stream()).execute(await engine.create_primitive(desc), {"src": memory, "dst": out})
    want = reorder.reference(held, src, dst)
    got = await out.to_numpy()
    assert got.dtype == want.dtype
    assert_same_values(got, want)


# -- s4 / u4 ---------------------------------------------------------------------------------------


async def test_int4_nibble_order_and_size(engine):
    """Element 2k is byte k's low nibble (oneDNN's int4.hpp); buffers are whole 32-bit words."""
    assert MemoryDesc((5,), "s4").nbytes == 4 and MemoryDesc((9,), "u4").nbytes == 8
    memory = await engine.from_numpy(np.array([1, -2, 3, -8, 7], np.int8), MemoryDesc((5,), "s4"))
    raw = await memory.view(MemoryDesc((4,), "u8")).to_numpy()
    assert raw.tolist() == [0xE1, 0x83, 0x07, 0x00]
    assert (await memory.to_numpy()).tolist() == [1, -2, 3, -8, 7]
    u4 = await engine.from_numpy(np.array([[15, 0, 9]]), MemoryDesc((1, 3), "u4"))
    assert (await u4.view(MemoryDesc((2,), "u8")).to_numpy()).tolist() == [0x0F, 0x09]
    assert _int4.unpack(_int4.pack(np.arange(-8, 8, dtype=np.int8), 8), 16, "s4").tolist() == list(range(-8, 8))


@pytest.mark.parametrize("dtype", ["s4", "u4"])
async def test_int4_host_round_trip_strided(engine, rng, dtype):
    low, high = _int4.PACKED[dtype]
    values = rng.integers(low, high, (3, 5, 7), endpoint=True)
    for layout in ("abc", "cba", "bca"):
        memory = await engine.from_numpy(values, MemoryDesc(values.shape, dtype, layout))
        got = await memory.to_numpy()
        assert got.dtype == (np.int8 if dtype == "s4" else np.uint8)
        np.testing.assert_array_equal(got, values)


@pytest.mark.parametrize("dtype", ["s4", "u4"])
def test_int4_input_policy(dtype):
    low, high = _int4.PACKED[dtype]
    for bad in ([high + 1], [low - 1], [0.5]):
        with pytest.raises(ArgumentMismatchError, match=rf"integers in \[{low}, {high}\]"):
            _dtypes.convert_input(np.array(bad), dtype, "x")
    # Even an array of the host type is checked: int8 holds values s4 does not.
    with pytest.raises(ArgumentMismatchError, match="does not convert exactly to"):
        _dtypes.convert_input(np.array([100], np.int8 if dtype == "s4" else np.uint8), dtype)


@pytest.mark.parametrize(("src", "dst"), [("f32", "s4"), ("f32", "u4"), ("s4", "u4"), ("u4", "s4"),
                                          ("s4", "s4"), ("u4", "f16"), ("s4", "f8_e4m3"), ("bf16", "u4")])
async def test_int4_reorder_saturates_and_keeps_neighbours(engine, rng, src, dst):
    """Odd dims and a transposition on the int4 side: two work-items store the two nibbles of
    most bytes; rounding is to nearest even, saturation to the type, NaN to 0."""
    shape = (5, 7)
    if src in ("s4", "u4"):
        low, high = _int4.PACKED[src]
        x = rng.integers(low, high, shape, endpoint=True)
    else:
        x = (rng.standard_normal(shape) * 6).astype(np.float32)
        x.reshape(-1)[:8] = [0.5, 1.5, -2.5, 7.5, -8.5, 100, np.nan, -np.inf]
    memory = await engine.from_numpy(x, MemoryDesc(shape, src))
    held = await memory.to_numpy()
    desc = ReorderDesc(MemoryDesc(shape, src), MemoryDesc(shape, dst, "ba"))
    out = engine.memory(desc.dst)
    await (await engine.stream()).execute(await engine.create_primitive(desc), {"src": memory, "dst": out})
    want = reorder.reference(held, src, dst)
    if dst in ("s4", "u4") and src == "f32":
        low, high = _int4.PACKED[dst]
        if dst == "s4":  # ties to even, saturation, NaN -> 0
            assert want.reshape(-1)[:8].tolist() == [0, 2, -2, 7, -8, 7, 0, -8]
        np.testing.assert_array_equal(want, np.where(np.isnan(held), 0, np.clip(np.rint(held), low, high)))
    got = await out.to_numpy()
    assert got.dtype == want.dtype
    assert_same_values(got, want)


async def test_int4_refused_by_kinds_not_written_for_it(engine):
    desc = EltwiseDesc("relu", MemoryDesc((4,), "s4"), MemoryDesc((4,), "f32"))
    with pytest.raises(UnsupportedError, match="eltwise: src has dtype 's4'"):
        await engine.create_primitive(desc)
