"""DropoutDesc: the numpy Philox against Random123's published known answers, the kernel's mask
bit for bit against the reference (s64 seed/offset, the legacy offset-0 form, thresholds at the
edges), dst against the reference in each storage type, and each error type."""

from __future__ import annotations

import numpy as np
import pytest

from triodnn import ArgumentMismatchError, DropoutDesc, InvalidArgumentError, MemoryDesc, UnsupportedError
from triodnn.kernels import dropout, kind_of, tolerance


def md(*dims, dtype="f32", strides=None) -> MemoryDesc:
    return MemoryDesc(tuple(dims), dtype, strides)


def desc_of(*dims, dtype="f32", mask=True, **kw) -> DropoutDesc:
    return DropoutDesc(md(*dims, dtype=dtype), md(1, dtype="s64"), md(1, dtype="s64"), md(1),
                       mask=md(*dims, dtype="u8") if mask else None, **kw)


async def _run(engine, desc: DropoutDesc, src, seed: int, offset: int, p: float):
    primitive = await engine.create_primitive(desc)
    args = {"src": await engine.from_numpy(src, desc.src),
            "seed": await engine.from_numpy(np.array([seed], np.int64), desc.seed),
            "offset": await engine.from_numpy(np.array([offset], np.int64), desc.offset),
            "probability": await engine.from_numpy(np.array([p], np.float32), desc.probability),
            "dst": engine.memory(desc.dst)}
    if desc.mask is not None:
        args["mask"] = engine.memory(desc.mask)
    await (await engine.stream()).execute(primitive, args)
    dst = await args["dst"].to_numpy()
    return dst, (await args["mask"].to_numpy() if desc.mask is not None else None)


def test_philox_matches_random123_known_answers():
    # Random123's kat_vectors for philox4x32_10 (oneDNN's round and key schedule are the same).
    assert [int(w) for w in dropout.philox4x32_10((0, 0, 0, 0), (0, 0))] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert [int(w) for w in dropout.philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2)] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert [int(w) for w in dropout.philox4x32_10(
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0))] == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_words_follow_onednns_counter_layout():
    # s64 form: element i reads word i & 3 of the block at counter (offset, i & ~3), key seed.
    seed, offset = 0x1234_5678_9ABC_DEF0, 0x0F0E_0D0C_0B0A_0908
    words = dropout.philox_words(np.arange(8), seed, offset)
    block = dropout.philox4x32_10((0x0B0A0908, 0x0F0E0D0C, 4, 0), (0x9ABCDEF0, 0x12345678))
    assert [int(w) for w in words[4:]] == [int(w) for w in block]
    # Legacy (offset 0): counter (x, x+1, x+2, x+3), key (seed, seed) in 32 bits.
    legacy = dropout.philox_words(np.arange(4), 7, 0)
    assert [int(w) for w in legacy] == [int(w) for w in dropout.philox4x32_10((0, 1, 2, 3), (7, 7))]


@pytest.mark.parametrize(("seed", "offset", "p"), [
    (42, 3, 0.5), (-5, 2**40 + 3, 0.3), (7, 0, 0.25), (2**62 + 11, -1, 0.9), (1, 1, 0.0), (1, 1, 1.0),
])
async def test_mask_is_bit_identical_and_dst_matches(engine, rng, seed, offset, p):
    desc = desc_of(3, 5, 37)
    src = rng.uniform(-3, 3, (3, 5, 37)).astype(np.float32)
    dst, mask = await _run(engine, desc, src, seed, offset, p)
    want_dst, want_mask = dropout.reference(src, seed, offset, p)
    np.testing.assert_array_equal(mask, want_mask)
    tolerance.check(dst, want_dst, kind_of(desc).tolerance(desc))
    if p == 0.0:
        np.testing.assert_array_equal(dst, src)  # every word above 0 keeps, 1/(1-0) is 1
    if p == 1.0:
        assert not mask.any() and not dst.any()


async def test_threshold_edges_round_as_onednns_double(engine):
    """A probability whose product with 2**32 - 1 takes more than double's 53 bits: the kernel
    rounds it as the double does (checked across many words)."""
    desc = desc_of(4096)
    src = np.ones(4096, np.float32)
    for p in (np.nextafter(np.float32(1), np.float32(0)), np.float32(0.7), np.float32(1e-30),
              np.float32(3e-10)):
        _, mask = await _run(engine, desc, src, 3, 9, float(p))
        np.testing.assert_array_equal(mask, dropout.keep_mask((4096,), 3, 9, float(p)))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
async def test_narrow_storage_and_no_mask(engine, rng, dtype):
    desc = desc_of(6, 33, dtype=dtype, mask=False)
    src = rng.integers(-4, 5, (6, 33)).astype(np.float32)
    dst, _ = await _run(engine, desc, src, 11, 5, 0.5)
    want, _ = dropout.reference(src, 11, 5, 0.5, dst_dtype=dtype)
    np.testing.assert_array_equal(dst.astype(np.float64), want)  # integers times 2: exact


async def test_strided_dst_uses_the_logical_index(engine, rng):
    desc = DropoutDesc(md(4, 6), md(1, dtype="s64"), md(1, dtype="s64"), md(1), md(4, 6, strides=(1, 4)),
                       mask=md(4, 6, dtype="u8"))
    src = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    dst, mask = await _run(engine, desc, src, 8, 8, 0.5)
    want, want_mask = dropout.reference(src, 8, 8, 0.5)
    np.testing.assert_array_equal(mask, want_mask)
    tolerance.check(dst, want, tolerance.ELTWISE)


def test_errors_name_the_culprit():
    with pytest.raises(ArgumentMismatchError, match="seed holds one value"):
        DropoutDesc(md(4), md(2, dtype="s64"), md(1, dtype="s64"), md(1))
    with pytest.raises(ArgumentMismatchError, match="mask dims"):
        DropoutDesc(md(4), md(1, dtype="s64"), md(1, dtype="s64"), md(1), mask=md(5, dtype="u8"))
    with pytest.raises(ArgumentMismatchError, match="dst dims"):
        DropoutDesc(md(4), md(1, dtype="s64"), md(1, dtype="s64"), md(1), md(3))
    with pytest.raises(InvalidArgumentError, match="seed and offset must be s64"):
        DropoutDesc(md(4), md(1, dtype="s32"), md(1, dtype="s64"), md(1))
    with pytest.raises(InvalidArgumentError, match="probability must be f32"):
        DropoutDesc(md(4), md(1, dtype="s64"), md(1, dtype="s64"), md(1, dtype="f16"))
    with pytest.raises(InvalidArgumentError, match="mask must be u8"):
        DropoutDesc(md(4), md(1, dtype="s64"), md(1, dtype="s64"), md(1), mask=md(4))
    with pytest.raises(InvalidArgumentError, match="expected triodnn.MemoryDesc"):
        DropoutDesc(md(4), 3, md(1, dtype="s64"), md(1))
    desc = DropoutDesc(md(4), md(1, dtype="s64"), md(1, dtype="s64"), md(1))
    assert desc.dst == desc.src and desc.mask is None
    assert UnsupportedError  # the typed errors of check_supported come before these checks
