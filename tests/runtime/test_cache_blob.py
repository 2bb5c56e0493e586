"""Cache blobs: primitives re-created from bytes without compiling, and bad blobs refused whole."""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pyopencl as cl
import pytest

import triodnn
from triodnn import BinaryDesc, CacheBlobError, EltwiseDesc, MemoryDesc
from triodnn._values._cache_blob import FORMAT_VERSION, MAGIC, frame, unframe
from triodnn.actors._compiler import BinaryReader
from triodnn.kernels import eltwise, tolerance


def rewrite_header(blob: bytes, change) -> bytes:
    """``blob`` with its JSON header passed through ``change`` (binaries kept as they were), and
    its header checksum made anew, so the load gets past it to what ``change`` did."""
    header, binaries = unframe(blob)
    parsed = json.loads(header)
    change(parsed)
    return frame(json.dumps(parsed).encode(), bytes(binaries))


def with_format(blob: bytes, number: int) -> bytes:
    return MAGIC + struct.pack("<I", number) + blob[len(MAGIC) + 4 :]


def format_1(blob: bytes) -> bytes:
    """``blob`` as an older triodnn wrote it: the header length, the JSON header naming format 1
    (no checksums), the binaries."""
    header, binaries = unframe(blob)
    old = json.dumps({"format": 1, **json.loads(header)}).encode()
    return MAGIC + struct.pack("<I", len(old)) + old + bytes(binaries)


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


async def test_an_entry_whose_program_no_engine_holds_is_built_again_and_blobs_again(rt):
    """A cache entry reads its binary from a kernel some engine holds, weakly: once the runtime
    that built it has closed, the entry (global, it stays) has nothing to read, so another
    engine builds it from source, and a blob of it then reads that engine's kernel."""
    desc = EltwiseDesc("gelu_erf", MemoryDesc((1049,)))
    async with triodnn.open_runtime() as first_runtime:
        first = await first_runtime.engine()
        built_first = await first.create_primitive(desc)
        assert first.statistics().programs_built == 1
    del built_first, first, first_runtime
    gc.collect()
    second = await rt.engine()
    primitive = await second.create_primitive(desc)
    assert (second.statistics().programs_built, second.statistics().programs_loaded) == (1, 0)
    x = np.linspace(-4, 4, 1049, dtype=np.float32)
    tolerance.check(await run_gelu(second, primitive, x), eltwise.reference("gelu_erf", x), tolerance.eltwise("gelu_erf"))
    third = await rt.engine()
    loaded = await third.create_primitive_from_cache_blob(primitive.cache_blob())
    assert (third.statistics().programs_built, third.statistics().programs_loaded) == (0, 1)
    tolerance.check(await run_gelu(third, loaded, x), eltwise.reference("gelu_erf", x), tolerance.eltwise("gelu_erf"))


def test_a_kernel_whose_device_cannot_give_its_binary_reads_as_none():
    """A context that fails clGetProgramInfo (a lost device) is skipped: the reader gives None,
    so the next engine builds from source and a blob leaves the entry out, instead of the
    OpenCL error reaching a requester that only wanted a cache hit."""

    class LostContextKernel:
        def binary(self) -> bytes:
            raise cl.LogicError("clGetProgramInfo failed: INVALID_PROGRAM")

    lost = LostContextKernel()
    reader = BinaryReader()
    reader.also_from(lost)
    assert reader() is None


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
    # A blob recording no answer whose entries disagree (a test process's cache) leaves the
    # answer to the device's probe: it once vouched False, and built again what it held.
    path.write_bytes(with_a_foreign_entry(path.read_bytes(), None))
    mixed = run("open")
    assert mixed.returncode == 0, mixed.stderr
    assert mixed.stdout.split() == ["0", "4", split, probes]


async def test_a_blob_of_chosen_primitives_holds_theirs_only(engine):
    """``primitive_cache_blob(primitives)``: a graph's programs, not the whole process cache."""
    first = await engine.create_primitive(EltwiseDesc("tanh", MemoryDesc((611,))))
    second = await engine.create_primitive(EltwiseDesc("relu", MemoryDesc((612,))))
    await engine.create_primitive(EltwiseDesc("sigmoid", MemoryDesc((613,))))
    header = json.loads(unframe(engine.primitive_cache_blob([first, second, first]))[0])
    dims = sorted(entry["key"]["desc"]["src"]["memory_desc"]["dims"][0] for entry in header["entries"])
    assert dims == [611, 612]
    whole = json.loads(unframe(engine.primitive_cache_blob())[0])
    assert len(whole["entries"]) >= 3


def with_a_foreign_entry(blob: bytes, recorded: bool | None) -> bytes:
    """``blob`` with its first entry once more at the end, the copy under the other float16
    answer's configuration (what a process that ran GPU-shaped kernels on a CPU device holds),
    and the writer's recorded answer replaced by ``recorded`` (None: none recorded, as blobs
    before the record)."""
    header, binaries = unframe(blob)
    first = json.loads(header)["entries"][0]

    def change(header):
        foreign = json.loads(json.dumps(first))
        config = foreign["key"]["config"]
        config["split_float16_calls"] = not config["split_float16_calls"]
        foreign["offset"] = len(binaries)
        header["entries"].append(foreign)
        header.pop("splits_float16_calls", None)
        if recorded is not None:
            header["splits_float16_calls"] = recorded

    copy = bytes(binaries[first["offset"]:first["offset"] + first["size"]])
    return rewrite_header(frame(header, bytes(binaries) + copy), change)


async def test_an_engine_takes_the_float16_answer_its_blob_records_not_its_entries_guess(rt, engine, good_blob):
    """A blob records the writing engine's float16 answer: entries of both answers (a test
    process's cache, once GPU-shaped kernels ran on the CPU) once made a warm worker guess
    False, and build again what the blob held under True."""
    own = json.loads(unframe(good_blob)[0])
    assert own["splits_float16_calls"] is engine.info.splits_float16_calls
    for recorded in (True, False):
        opened = await rt.engine(engine.info.type, cache_blob=with_a_foreign_entry(good_blob, recorded))
        assert opened.info.splits_float16_calls is recorded
    # Nothing recorded and the entries disagree: the device's own answer (its probe), never a guess.
    opened = await rt.engine(engine.info.type, cache_blob=with_a_foreign_entry(good_blob, None))
    assert opened.info.splits_float16_calls is engine.info.splits_float16_calls


async def test_an_engine_opened_with_a_blob_of_another_device_is_refused_before_it_opens(rt, good_blob):
    spoiled = rewrite_header(good_blob, lambda h: h["device"].update(driver="other"))
    opened = len(rt._actors.engines)
    with pytest.raises(CacheBlobError, match="not this engine's"):
        await rt.engine(cache_blob=spoiled)
    assert len(rt._actors.engines) == opened


@pytest.fixture
async def good_blob(engine):
    primitive = await engine.create_primitive(EltwiseDesc("tanh", MemoryDesc((777,))))
    return primitive.cache_blob()


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda b: b"not a blob" + b, "bad magic"),
        (lambda b: b[: len(MAGIC) - 1], "bad magic"),
        (lambda b: b[: len(MAGIC) + 2], "truncated"),
        (lambda b: frame(b"{oops", b"rest"), "header is corrupt"),
        (lambda b: with_format(b, 99), f"format 99; this triodnn reads {FORMAT_VERSION}"),
        (lambda b: format_1(b), f"format 1; this triodnn reads {FORMAT_VERSION}"),
        (lambda b: rewrite_header(b, lambda h: h["entries"][0].update(blake2b="00" * 32)), "entry 0 .* is damaged"),
        (lambda b: b + b"\0", "1 bytes past its last entry"),
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


DAMAGED_CHILD = textwrap.dedent(
    """
    import json, sys, trio, triodnn

    DESCS = [triodnn.EltwiseDesc("relu", triodnn.MemoryDesc((1001,))),
             triodnn.BinaryDesc("add", triodnn.MemoryDesc((3, 5)), triodnn.MemoryDesc((5,)))]

    def damaged(blob, change):
        kind, at, mask = change
        if kind == "flip":
            return blob[:at] + bytes([blob[at] ^ mask]) + blob[at + 1 :]
        if kind == "cut":
            return blob[:at]
        return blob + bytes(at)  # "append"

    async def refused(call):
        try:
            await call()
        except triodnn.CacheBlobError as exc:  # anything else ends the process: the test fails
            return type(exc).__name__, str(exc)
        return "nothing", ""

    async def main(path, changes):
        async with triodnn.open_runtime() as rt:
            engine = await rt.engine()
            if changes == "save":
                for desc in DESCS:
                    await engine.create_primitive(desc)
                with open(path, "wb") as f:
                    f.write(engine.primitive_cache_blob())
                return
            with open(path, "rb") as f:
                blob = f.read()

            def counts():
                return triodnn.primitive_cache_statistics().size, engine.statistics().programs_loaded

            before = counts()
            for change in json.loads(changes):
                bad = damaged(blob, change)
                calls = {
                    "load": lambda: engine.load_primitive_cache_blob(bad),
                    "create": lambda: engine.create_primitive_from_cache_blob(bad),
                    "open": lambda: rt.engine(cache_blob=bad),
                }
                for api, call in calls.items():
                    print(json.dumps([change, api, *await refused(call)]))
            after = counts()
            loaded = await engine.load_primitive_cache_blob(blob)
            print(json.dumps({"before": before, "after": after, "loaded": loaded, "then": counts()}))

    trio.run(main, sys.argv[1], sys.argv[2])
    """
)


def test_damaged_blobs_are_refused_before_opencl_and_the_process_lives_on(tmp_path):
    """A flipped byte in any region of a blob, a cut anywhere, or bytes appended: a
    CacheBlobError naming the region or entry, from each of the three ways in, in one process
    that outlives them all, and nothing cached."""
    path = tmp_path / "good.blob"
    # PoCL's kernel cache off in both children: with it on, PoCL may take a program it has on disk
    # instead of the binary it is given, so a damaged binary that got that far could go unseen;
    # with it off, one aborts the process. (The blob is made with it off too: a binary PoCL
    # returned with its cache on does not always load in a process with it off, damaged or not.)
    run = lambda changes: subprocess.run(  # noqa: E731
        [sys.executable, "-c", DAMAGED_CHILD, str(path), changes],
        capture_output=True, text=True, timeout=300, env={**os.environ, "POCL_KERNEL_CACHE": "0"},
    )
    saved = run("save")
    assert saved.returncode == 0, saved.stderr
    blob = path.read_bytes()
    header, binaries = unframe(blob)
    entries = json.loads(header)["entries"]
    assert len(entries) == 2
    base = len(blob) - len(binaries)  # where the binaries begin
    start = base - len(header)  # where the JSON header begins
    regions = [
        (0, len(MAGIC), "bad magic"),
        (len(MAGIC), len(MAGIC) + 4, "blob format"),
        (len(MAGIC) + 4, len(MAGIC) + 8, "blob header"),  # the length: damaged, or past the end
        (len(MAGIC) + 8, start, "blob header is damaged"),  # its digest
        (start, base, "blob header is damaged"),
    ] + [
        (base + e["offset"], base + e["offset"] + e["size"], f"blob entry {i} (kernel {e['spec']['name']!r}) is damaged")
        for i, e in enumerate(entries)
    ]
    assert regions[-1][1] == len(blob) and all(a[1] == b[0] for a, b in zip(regions, regions[1:]))

    def flip_expected(at: int) -> str:
        return next(message for lo, hi, message in regions if lo <= at < hi)

    def cut_expected(length: int) -> str:
        if length < len(MAGIC):
            return "bad magic"
        if length < start:
            return "blob is truncated"
        if length < base:
            return "blob header runs past the blob's end"
        i = next(i for i, e in enumerate(entries) if base + e["offset"] + e["size"] > length)
        return f"blob entry {i} (kernel {entries[i]['spec']['name']!r}) runs past the blob's end"

    offsets = set(range(0, len(blob), len(blob) // 32))
    offsets |= {at for lo, hi, _ in regions for at in (lo, hi - 1)}
    expected = {}
    for at in sorted(offsets):
        for mask in (0x01, 0xFF):
            expected[("flip", at, mask)] = flip_expected(at)
    cuts = {0, len(MAGIC) - 1, len(MAGIC), start - 1, start, (start + base) // 2, base - 1, base, len(blob) - 1}
    cuts |= {base + e["offset"] + e["size"] // 2 for e in entries} | {base + entries[1]["offset"]}
    for length in sorted(cuts):
        expected[("cut", length, 0)] = cut_expected(length)
    expected[("append", 3, 0)] = "3 bytes past its last entry"

    tried = run(json.dumps(list(expected)))
    assert tried.returncode == 0, tried.stderr
    *attempts, last = [json.loads(line) for line in tried.stdout.splitlines()]
    assert len(attempts) == 3 * len(expected) > 3 * 80
    for change, api, error, message in attempts:
        assert error == "CacheBlobError", (change, api, message)
        assert expected[tuple(change)] in message, (change, api, message)
    # Nothing entered the cache or was loaded; the intact blob then loads both entries.
    assert last["before"] == last["after"]
    assert last["loaded"] == 2
    assert last["then"] == [last["before"][0] + 2, last["before"][1] + 2]
