"""Cache blobs: primitives re-created from bytes without compiling, and bad blobs refused whole."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import triodnn
from triodnn import BinaryDesc, CacheBlobError, EltwiseDesc, MemoryDesc
from triodnn._values._cache_blob import MAGIC
from triodnn.kernels import eltwise, tolerance


def rewrite_header(blob: bytes, change) -> bytes:
    """``blob`` with its JSON header passed through ``change`` (binaries kept as they were)."""
    (length,) = struct.unpack_from("<I", blob, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(blob[start : start + length])
    change(header)
    new = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(new)) + new + blob[start + length :]


async def run_gelu(engine, primitive, x: np.ndarray) -> np.ndarray:
    stream = await engine.stream()
    src = await engine.from_numpy(x)
    dst = engine.memory(src.desc)
    await stream.execute(primitive, {"src": src, "dst": dst})
    return await dst.to_numpy()


async def test_primitive_blob_loads_on_another_engine_without_compiling(rt):
    first, second = await rt.engine(), await rt.engine()
    desc = EltwiseDesc("gelu_erf", MemoryDesc((1037,)))
    primitive = await first.create_primitive(desc)
    blob = primitive.cache_blob()
    assert blob.startswith(MAGIC)

    loaded = await second.create_primitive_from_cache_blob(blob)
    assert loaded.desc == desc and loaded.impl == primitive.impl
    assert (second.statistics().programs_built, second.statistics().programs_loaded) == (0, 1)
    x = np.linspace(-4, 4, 1037, dtype=np.float32)
    tolerance.check(await run_gelu(second, loaded, x), eltwise.reference("gelu_erf", x), tolerance.eltwise("gelu_erf"))


async def test_engine_blob_lists_the_device_entries(rt, engine):
    descs = [EltwiseDesc("relu", MemoryDesc((3001,))), BinaryDesc("add", MemoryDesc((4, 7)), MemoryDesc((7,)))]
    for desc in descs:
        await engine.create_primitive(desc)
    blob = engine.primitive_cache_blob()
    other = await rt.engine()
    assert await other.load_primitive_cache_blob(blob) == 0  # every entry is in the cache already
    capacity = triodnn.get_primitive_cache_capacity()
    triodnn.set_primitive_cache_capacity(0)  # empty it
    triodnn.set_primitive_cache_capacity(capacity)
    count = await other.load_primitive_cache_blob(blob)
    assert count == triodnn.primitive_cache_statistics().size >= len(descs)
    loaded_before = other.statistics().programs_loaded
    for desc in descs:
        await other.create_primitive(desc)
    stats = other.statistics()
    assert stats.programs_built == 0
    assert stats.programs_loaded == loaded_before  # loaded by load_primitive_cache_blob already


CHILD = textwrap.dedent(
    """
    import sys, numpy as np, trio, triodnn
    from triodnn.kernels import eltwise, tolerance

    DESCS = [triodnn.EltwiseDesc(alg, triodnn.MemoryDesc((2000 + i,))) for i, alg in
             enumerate(["relu", "gelu_tanh", "sigmoid"])]

    async def main(mode, path):
        from triodnn.actors import probe_builds
        async with triodnn.open_runtime() as rt:
            if mode == "open":  # the engine opened with the blob: no probe build either
                with open(path, "rb") as f:
                    engine = await rt.engine(cache_blob=f.read())
            else:
                engine = await rt.engine()
            if mode == "load":
                with open(path, "rb") as f:
                    await engine.load_primitive_cache_blob(f.read())
            prims = [await engine.create_primitive(d) for d in DESCS]
            stream = await engine.stream()
            for desc, prim in zip(DESCS, prims):
                x = np.linspace(-3, 3, desc.src.dims[0], dtype=np.float32)
                src = await engine.from_numpy(x)
                dst = engine.memory(desc.dst)
                await stream.execute(prim, {"src": src, "dst": dst})
                tolerance.check(await dst.to_numpy(), eltwise.reference(desc.alg, x), tolerance.eltwise(desc.alg))
            if mode == "save":
                with open(path, "wb") as f:
                    f.write(engine.primitive_cache_blob())
            stats = engine.statistics()
            print(stats.programs_built, stats.programs_loaded, engine.info.splits_float16_calls,
                  probe_builds())

    trio.run(main, sys.argv[1], sys.argv[2])
    """
)


def test_engine_blob_in_a_new_process_compiles_nothing(tmp_path):
    path = tmp_path / "engine.blob"
    run = lambda mode: subprocess.run(  # noqa: E731
        [sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, timeout=120
    )
    saved = run("save")
    assert saved.returncode == 0, saved.stderr
    built, loaded_count, split, probes = saved.stdout.split()
    assert (built, loaded_count) == ("3", "0")
    loaded = run("load")  # a CPU engine opened plainly runs its probe (probes == "1"), a GPU's none
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["0", "3", split, probes]
    # Opened with the blob: nothing built, the float16 answer taken from the blob, no probe run.
    opened = run("open")
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.split() == ["0", "3", split, "0"]


async def test_an_engine_opened_with_a_blob_of_another_device_is_refused_before_it_opens(rt, good_blob):
    spoiled = rewrite_header(good_blob, lambda h: h["device"].update(driver="other"))
    opened = len(rt._engines)
    with pytest.raises(CacheBlobError, match="not this engine's"):
        await rt.engine(cache_blob=spoiled)
    assert len(rt._engines) == opened


@pytest.fixture
async def good_blob(engine):
    primitive = await engine.create_primitive(EltwiseDesc("tanh", MemoryDesc((777,))))
    return primitive.cache_blob()


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda b: b"not a blob" + b, "bad magic"),
        (lambda b: b[: len(MAGIC) + 2], "bad magic"),
        (lambda b: MAGIC + struct.pack("<I", 5) + b"{oops" + b"rest", "header is corrupt"),
        (lambda b: rewrite_header(b, lambda h: h.update(format=99)), "format 99"),
        (lambda b: rewrite_header(b, lambda h: h.update(triodnn="0.0.1")), "triodnn '0.0.1'"),
        (lambda b: rewrite_header(b, lambda h: h["device"].update(driver="other")), "not this engine's"),
        (lambda b: rewrite_header(b, lambda h: h["entries"][0].update(size=10**9)), "truncated"),
        (lambda b: rewrite_header(b, lambda h: h["entries"][0]["key"].update(kind="conv")), "unknown primitive kind 'conv'"),
        (lambda b: rewrite_header(b, lambda h: h["entries"][0].pop("spec")), "malformed"),
        (lambda b: "a string", "expected bytes"),
    ],
)
async def test_bad_blobs_are_refused_and_load_nothing(engine, good_blob, spoil, message):
    before = triodnn.primitive_cache_statistics().size
    loaded_before = engine.statistics().programs_loaded
    bad = spoil(good_blob)
    with pytest.raises(CacheBlobError, match=message):
        await engine.load_primitive_cache_blob(bad)
    with pytest.raises(CacheBlobError, match=message):
        await engine.create_primitive_from_cache_blob(bad)
    assert triodnn.primitive_cache_statistics().size == before
    assert engine.statistics().programs_loaded == loaded_before
    assert isinstance(CacheBlobError("x"), triodnn.InvalidArgumentError)


async def test_primitive_blob_needs_exactly_one_entry(engine):
    for n in (501, 502):
        await engine.create_primitive(EltwiseDesc("abs", MemoryDesc((n,))))
    with pytest.raises(CacheBlobError, match="expected one"):
        await engine.create_primitive_from_cache_blob(engine.primitive_cache_blob())
