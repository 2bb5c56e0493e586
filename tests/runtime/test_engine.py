"""Engines: discovery, identity, device facts, and the out-of-order strategy rule."""

from __future__ import annotations

import math
import threading

import numpy as np
import pyopencl as cl
import pytest
from conftest import in_another_trio_run, threads_since

import triodnn
from triodnn import EltwiseDesc, EngineNotFoundError, InvalidArgumentError, MemoryDesc, StreamFlags
from triodnn.actors import choose_out_of_order_strategy

_OOO = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


@pytest.fixture
def no_env(monkeypatch):
    """Tests of defaults must not see a developer's TRIODNN_ENGINE / TRIODNN_OOO_STRATEGY."""
    monkeypatch.delenv("TRIODNN_ENGINE", raising=False)
    monkeypatch.delenv("TRIODNN_OOO_STRATEGY", raising=False)


# -- discovery ---------------------------------------------------------------------------------


@pytest.mark.cpu
def test_available_engines_lists_a_cpu_with_indices_per_kind():
    records = triodnn.available_engines()
    assert any(r.kind == "cpu" for r in records)
    for kind in {r.kind for r in records}:
        assert [r.index for r in records if r.kind == kind] == list(range(sum(r.kind == kind for r in records)))
    assert all(r.label == f"{r.kind}:{r.index}" for r in records)


@pytest.mark.cpu
async def test_default_engine_is_cpu0(rt, no_env):
    engine = await rt.engine()
    assert (engine.kind, engine.index) == ("cpu", 0)
    assert engine.info.type == "cpu"
    assert str(engine).startswith("cpu:0 (")
    assert engine.cl_device.type & cl.device_type.CPU
    assert not engine.closed


@pytest.mark.cpu
async def test_engine_env_picks_the_default(rt, monkeypatch):
    monkeypatch.setenv("TRIODNN_ENGINE", "cpu:0")
    engine = await rt.engine()
    assert (engine.kind, engine.index) == ("cpu", 0)
    monkeypatch.setenv("TRIODNN_ENGINE", "cpu:zero")
    with pytest.raises(InvalidArgumentError, match="'cpu:zero'"):
        await rt.engine()


async def test_any_kind_finds_the_first_device(rt):
    engine = await rt.engine("any", 0)
    assert engine.cl_device == triodnn.available_engines()[0].device


async def test_unknown_kind(rt):
    with pytest.raises(InvalidArgumentError, match="'tpu'"):
        await rt.engine("tpu")


@pytest.mark.cpu
async def test_missing_index_lists_what_exists(rt):
    with pytest.raises(EngineNotFoundError, match="index 7") as info:
        await rt.engine("cpu", 7)
    assert "cpu:0" in str(info.value)
    assert isinstance(info.value, LookupError)


@pytest.mark.cpu
@pytest.mark.parametrize("index", [-1, True, 1.0, "0"])
async def test_bad_index(rt, index):
    with pytest.raises(InvalidArgumentError, match=f"engine index {index!r}"):
        await rt.engine("cpu", index)


# -- identity and facts ------------------------------------------------------------------------


@pytest.mark.cpu
async def test_identity_device_shared_context_distinct(rt):
    """Compiled code keys on the device identity; per-context resources on the engine identity."""
    a = await rt.engine("cpu", 0)
    b = await rt.engine("cpu", 0)
    assert a.cl_context.int_ptr != b.cl_context.int_ptr
    assert a.identity.device == b.identity.device
    assert hash(a.identity.device) == hash(b.identity.device)
    assert a.identity != b.identity
    assert a.identity == a.identity and hash(a.identity) == hash(a.identity)
    assert len({a.identity, b.identity, a.identity}) == 2
    assert a.identity.context == a.cl_context.int_ptr


async def test_info_matches_the_device(engine):
    info, device = engine.info, engine.cl_device
    assert info.name == device.name.strip() and info.name
    assert info.vendor == device.vendor.strip()
    assert info.platform == device.platform.name.strip()
    assert info.platform_version == device.platform.version.strip()
    assert info.driver == device.driver_version.strip()
    assert info.version == device.version.strip()
    assert info.type in ("cpu", "gpu", "accelerator")
    assert info.max_compute_units == device.max_compute_units >= 1
    assert info.max_work_group_size == device.max_work_group_size >= 1
    assert info.global_mem_size == device.global_mem_size > 0
    assert info.queue_properties == device.queue_properties
    assert info.extensions == tuple(sorted(device.extensions.split()))
    hash(info)  # frozen facts


async def test_identity_is_made_of_info(engine):
    ident = engine.identity.device
    info = engine.info
    assert (ident.platform, ident.device, ident.vendor, ident.driver, ident.type) == (
        info.platform, info.name, info.vendor, info.driver, info.type
    )


# -- the out-of-order strategy rule ------------------------------------------------------------

POCL = dict(vendor="GenuineIntel", platform="Portable Computing Language")
NVIDIA = dict(vendor="NVIDIA Corporation", platform="NVIDIA CUDA")


@pytest.mark.parametrize(
    "facts, kind, lanes",
    [
        (POCL, "lanes", 2),
        (dict(POCL, vendor="AuthenticAMD", compute_units=16), "lanes", 8),
        (dict(vendor="Intel(R) Corporation", platform="Intel(R) OpenCL Graphics",
              compute_units=4), "lanes", 4),
        (NVIDIA, "lanes", 8),
        (dict(vendor="nvidia", platform="some ICD"), "lanes", 8),
        (dict(vendor="Acme", platform="NVIDIA CUDA"), "lanes", 8),
        (dict(POCL, compute_units=1), "lanes", 2),  # at least two lanes
        (dict(POCL, compute_units=64), "lanes", 8),  # at most eight
    ],
    ids=["pocl", "amd-cpu", "intel-gpu", "nvidia", "nvidia-lowercase", "nvidia-platform",
         "one-unit", "many-units"],
)
def test_strategy_rule(facts, kind, lanes):
    strategy = choose_out_of_order_strategy(**facts)
    assert (strategy.kind, strategy.lanes) == (kind, lanes)
    assert strategy.reason


@pytest.mark.parametrize(
    "override, kind, lanes",
    [("native", "native", 1), ("lanes", "lanes", 8), ("lanes:4", "lanes", 4), ("lanes:1", "lanes", 1),
     (" lanes:2 ", "lanes", 2)],
)
@pytest.mark.parametrize("facts", [POCL, NVIDIA, dict(POCL, compute_units=64)],
                         ids=["pocl", "nvidia", "many-units"])
def test_strategy_override_wins(facts, override, kind, lanes):
    strategy = choose_out_of_order_strategy(**facts, override=override)
    assert (strategy.kind, strategy.lanes) == (kind, lanes)
    assert strategy.reason == "TRIODNN_OOO_STRATEGY"


def test_spread_override():
    strategy = choose_out_of_order_strategy(**POCL, override="lanes:3:spread")
    assert (strategy.kind, strategy.lanes, strategy.spread) == ("lanes", 3, True)
    assert not choose_out_of_order_strategy(**POCL, override="lanes:3").spread


def test_empty_override_means_no_override():
    assert choose_out_of_order_strategy(**NVIDIA, override="").kind == "lanes"
    assert choose_out_of_order_strategy(**POCL, override=None).kind == "lanes"


@pytest.mark.parametrize("override", ["lanes:0", "lanes:-2", "lanes:x", "native:2", "fast", "LANES",
                                      "lanes:2:fast", "native:spread"])
def test_invalid_override(override):
    with pytest.raises(ValueError, match=f"TRIODNN_OOO_STRATEGY={override!r}"):
        choose_out_of_order_strategy(**POCL, override=override)


async def test_engine_applies_the_rule_to_its_device(rt, no_env):
    engine = await rt.engine()
    info = engine.info
    expected = choose_out_of_order_strategy(
        vendor=info.vendor, platform=info.platform,
        compute_units=info.max_compute_units,
    )
    assert engine.out_of_order_strategy == expected


@pytest.mark.cpu
async def test_pocl_out_of_order_stream_has_a_lane_per_core(rt, no_env):
    engine = await rt.engine("cpu", 0)
    if "Portable Computing Language" not in engine.info.platform:
        pytest.skip("cpu:0 is not PoCL here")
    stream = await engine.stream(StreamFlags.out_of_order)
    assert stream.strategy == "lanes"
    assert engine.out_of_order_strategy.lanes == max(2, min(8, engine.info.max_compute_units))
    # Lane 0 only, until a kernel that may overlap takes another.
    assert len(stream.cl_queues) == 1 == stream.statistics().queues
    assert not any(queue.properties & _OOO for queue in stream.cl_queues)

    in_order = await engine.stream()
    assert in_order.strategy == "in_order"
    assert in_order.flags == StreamFlags.in_order
    assert not in_order.cl_queues[0].properties & _OOO


async def test_lanes_from_environment(rt, monkeypatch):
    """The env override is read when the engine opens; out-of-order streams then get N in-order queues."""
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:3")
    engine = await rt.engine()
    assert (engine.out_of_order_strategy.kind, engine.out_of_order_strategy.lanes) == ("lanes", 3)
    stream = await engine.stream(StreamFlags.out_of_order)
    assert stream.strategy == "lanes"
    assert len(stream.cl_queues) == 1  # the other lanes open when a kernel first takes one
    assert not any(q.properties & _OOO for q in stream.cl_queues)
    # An in-order stream of the same engine keeps one queue.
    assert len((await engine.stream()).cl_queues) == 1


async def test_spread_lanes_open_one_by_one(rt, monkeypatch, rng):
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:3:spread")
    engine = await rt.engine()
    desc = triodnn.MemoryDesc((67,))  # a size no other test's primitive has (the cache is global)
    relu = await engine.create_primitive(triodnn.EltwiseDesc("relu", desc))
    assert not relu.overlaps
    x = rng.standard_normal(67).astype(np.float32)
    src = await engine.from_numpy(x)
    dsts = [engine.memory(desc) for _ in range(4)]
    stream = await engine.stream(StreamFlags.out_of_order)
    events = [stream.execute(relu, {"src": src, "dst": dst}) for dst in dsts]
    assert [e._submission.lane for e in events] == [0, 1, 2, 0]  # spread: every kernel in turn
    assert len({q.int_ptr for q in stream.cl_queues}) == 3 == stream.statistics().queues
    await stream.wait()
    for dst in dsts:
        np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))


async def test_long_underfilling_kernels_take_lanes_of_their_own(rt, no_env, rng):
    """The default rule: a kernel that leaves compute units idle and runs long goes to a lane in
    turn (two such matmuls overlap); a kernel that fills the device or ends soon stays on lane 0."""
    engine = await rt.engine()
    m, k, n = 8, 32768, 32
    matmul = await engine.create_primitive(triodnn.MatmulDesc(
        triodnn.MemoryDesc((m, k)), triodnn.MemoryDesc((k, n)), triodnn.MemoryDesc((m, n))))
    spec = matmul.spec
    groups = math.prod(spec.global_size) // math.prod(spec.local_size)
    items = math.prod(spec.global_size)
    touched = sum(d.nbytes for d in matmul.desc.arg_descs.values())
    assert matmul.overlaps == (groups < engine.info.max_compute_units and touched >= 64 * 1024 * items)
    if not matmul.overlaps:  # a GPU splits K over a work-group: short, nothing to overlap
        pytest.skip(f"this device's matmul ({matmul.impl}: {groups} work-groups, "
                    f"{touched // items} bytes per work-item) does not leave the device idle for long")
    relu = await engine.create_primitive(triodnn.EltwiseDesc("relu", triodnn.MemoryDesc((m, n))))
    assert not relu.overlaps
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    src, wei = await engine.from_numpy(a), await engine.from_numpy(w)
    outs = [engine.memory(triodnn.MemoryDesc((m, n))) for _ in range(3)]
    stream = await engine.stream(StreamFlags.out_of_order)
    first = stream.execute(matmul, {"src": src, "weights": wei, "dst": outs[0]})
    second = stream.execute(matmul, {"src": src, "weights": wei, "dst": outs[1]})
    after = stream.execute(relu, {"src": outs[1], "dst": outs[2]}, deps=[second])
    assert (first._submission.lane, second._submission.lane) == (0, 1)
    assert after._submission.lane == 1  # follows the lane of what it waits for
    await stream.wait()
    expected = a.astype(np.float64) @ w
    for out in outs[:2]:
        np.testing.assert_allclose(await out.to_numpy(), expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(await outs[2].to_numpy(), np.maximum(expected, 0), rtol=1e-4, atol=1e-3)


async def test_invalid_strategy_environment_fails_engine_open(rt, monkeypatch):
    monkeypatch.setenv("TRIODNN_OOO_STRATEGY", "lanes:0")
    with pytest.raises(ValueError, match="TRIODNN_OOO_STRATEGY='lanes:0'"):
        await rt.engine()


# -- GPU (skipped without one) -----------------------------------------------------------------


@pytest.mark.gpu
async def test_gpu_engine_runs_relu(gpu_engine, rng):
    x = rng.standard_normal((37,)).astype(np.float32)
    relu = await gpu_engine.create_primitive(triodnn.EltwiseDesc("relu", triodnn.MemoryDesc((37,))))
    src = await gpu_engine.from_numpy(x)
    dst = gpu_engine.memory(src.desc)
    stream = await gpu_engine.stream()
    await stream.execute(relu, {"src": src, "dst": dst})
    np.testing.assert_array_equal(await dst.to_numpy(), np.maximum(x, 0))


# -- calls from outside the runtime's trio run ---------------------------------------------------------


async def test_engine_calls_from_another_trio_run_are_refused_and_the_runtime_lives_on(rt, engine):
    """create_primitive from another thread's trio.run used to hand its build to the runtime's
    cache actor from there: trio's check failed in that run after taking the actor's task off
    its channel, and the runtime never built anything again. Opening engines and streams, and
    loading cache blobs, reach the runtime's actors too; each is refused first now."""
    desc = EltwiseDesc("relu", MemoryDesc((8,)))
    relu = await engine.create_primitive(desc)
    blob = relu.cache_blob()
    calls = {
        "runtime.engine": (rt.engine,),
        "engine.stream": (engine.stream,),
        "engine.create_primitive": (engine.create_primitive, EltwiseDesc("tanh", MemoryDesc((8,)))),
        # One primitive's blob: the whole cache of a test process took a minute to write.
        "engine.load_primitive_cache_blob": (engine.load_primitive_cache_blob, blob),
        "engine.create_primitive_from_cache_blob": (engine.create_primitive_from_cache_blob, blob),
    }
    threads = set(threading.enumerate())
    for name, call in calls.items():
        how, error = in_another_trio_run(*call)
        assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (name, how, error)
        assert "from thread 'triodnn-test-other-thread'" in str(error), error
    assert threads_since(threads) == set()
    # The runtime goes on building, opening and running.
    tanh = await engine.create_primitive(EltwiseDesc("tanh", MemoryDesc((8,))))
    stream = await engine.stream()
    x = np.linspace(-2.0, 2.0, 8, dtype=np.float32)
    src, dst = await engine.from_numpy(x), engine.memory(MemoryDesc((8,)))
    await stream.execute(tanh, {"src": src, "dst": dst})
    np.testing.assert_allclose(await dst.to_numpy(), np.tanh(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nbytes", [0, -4, 2.5, "64", True])
async def test_pinned_host_array_takes_a_positive_byte_count(engine, nbytes):
    with pytest.raises(InvalidArgumentError, match="nbytes must be a positive int"):
        engine.pinned_host_array(nbytes)


async def test_pinned_host_array_round_trips_through_a_stream(engine):
    # Host memory the device copies fastest (page-locked where the driver does that), used as
    # the host side of a write and a read; not counted with the device's buffers.
    desc = MemoryDesc((64,))
    before = engine.statistics().live_buffers
    host = engine.pinned_host_array(desc.nbytes).view(np.float32)
    assert host.shape == (64,) and engine.statistics().live_buffers == before
    host[...] = np.arange(64, dtype=np.float32)
    stream = await engine.stream()
    memory = engine.memory(desc)
    await stream.write(memory, host)
    back = engine.pinned_host_array(desc.nbytes).view(np.float32)
    await stream.read(memory, back)
    np.testing.assert_array_equal(back, np.arange(64, dtype=np.float32))
    how, error = in_another_trio_run(_async, engine.pinned_host_array, 64)
    assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)


async def _async(fn, *args):
    return fn(*args)
