"""Shared fixtures: a runtime per test, its default engine, seeded data, device-memory helpers.

Every triodnn object lives inside one ``open_runtime()`` block, so the runtime is a per-test async
fixture (pytest-trio runs it in the test's trio run) and nothing crosses tests.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing

import triodnn
from triodnn._runtime import default_engine_spec, find_device, parse_engine_spec

COMPLETE = cl.command_execution_status.COMPLETE


def has_kind(kind: str) -> bool:
    return any(record.kind == kind for record in triodnn.available_engines())


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip cleanly where no GPU OpenCL device is registered (CI); tests
    marked ``cpu`` where no CPU device is (a GPU machine whose ICD list holds the GPU only)."""
    for kind in ("gpu", "cpu"):
        if has_kind(kind):
            continue
        skip = pytest.mark.skip(reason=f"no OpenCL {kind.upper()} device (triodnn.available_engines() has no {kind!r})")
        for item in items:
            if kind in item.keywords:
                item.add_marker(skip)


def engine_report() -> str:
    try:
        record = default_record()
    except triodnn.TriodnnError as exc:
        return f"triodnn default engine: none ({exc})"
    return (f"triodnn default engine: {record.label}: {record.device.name.strip()} "
            f"({record.platform.name.strip()})")


def pytest_report_header(config):
    """The engine the suite runs on: which CPU runtime (or GPU) the counts are of."""
    return engine_report()


def pytest_terminal_summary(terminalreporter):
    # Again beside the counts: ``-q`` (the README's command) leaves the header out.
    terminalreporter.write_line(engine_report())


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """A skip inside a trio test keeps its reason and line. pytest-trio (0.8) catches the exception
    group trio wraps the test's ``Skipped`` in and calls ``pytest.skip()`` afresh, without the
    reason: a skip naming what is missing (tests/_shared.py) would report a bare "Skipped" at
    pytest's own line. The test's own ``Skipped``, the group's one leaf, is raised instead."""
    try:
        return (yield)
    except pytest.skip.Exception as skip:
        inner = skip.__context__
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if isinstance(inner, pytest.skip.Exception) and inner is not skip:
            raise inner from None
        raise


@pytest.fixture
async def rt():
    async with triodnn.open_runtime() as runtime:
        yield runtime


def default_record():
    """The device record the runtime's default engine opens (``rt.engine()``): $TRIODNN_ENGINE,
    else the first working CPU device, else the first GPU. Not ``available_engines()[0]``: a
    simulator such as Oclgrind may be listed before the CPU runtimes."""
    kind, index = parse_engine_spec(default_engine_spec())
    return find_device(kind, index)


@pytest.fixture
async def engine(rt):
    """The default engine: cpu:0 (the first working CPU runtime), or whatever ``$TRIODNN_ENGINE`` names."""
    return await rt.engine()


@pytest.fixture
async def gpu_engine(rt):
    if not has_kind("gpu"):
        pytest.skip("no OpenCL GPU device (triodnn.available_engines() has no 'gpu')")
    return await rt.engine("gpu", 0)


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture
def upload(engine):
    """``await upload(array, strides=None)``: a Memory on ``engine`` holding ``array``.

    ``strides`` (tuple or format tag) gives a non-row-major layout; the values are the same.
    """

    async def _upload(array, strides=None) -> triodnn.Memory:
        array = np.asarray(array, dtype=np.float32)
        desc = None if strides is None else triodnn.MemoryDesc(array.shape, "f32", strides)
        return await engine.from_numpy(array, desc)

    return _upload


def eltwise_input(rng: np.random.Generator, alg: str, shape) -> np.ndarray:
    """Random f32 data valid for ``alg``: positive for log/sqrt, moderate for exp."""
    if alg in ("log", "sqrt"):
        return rng.uniform(0.05, 8.0, shape).astype(np.float32)
    if alg == "exp":
        return rng.uniform(-6.0, 6.0, shape).astype(np.float32)
    return rng.uniform(-5.0, 5.0, shape).astype(np.float32)


@pytest.fixture
def make_input(rng):
    """``make_input(alg, shape)``: see ``eltwise_input``."""
    return lambda alg, shape: eltwise_input(rng, alg, shape)


async def create_all(engine: triodnn.Engine, descs: dict) -> dict:
    """Compile a dict of name -> op descriptor concurrently (the engine builds on 2 threads)."""
    prims: dict = {}

    async def one(name, desc):
        prims[name] = await engine.create_primitive(desc)

    async with trio.open_nursery() as nursery:
        for name, desc in descs.items():
            nursery.start_soon(one, name, desc)
    return prims


@pytest.fixture
def build_on():
    """``await build_on(engine, {name: desc, ...})``: for engines a test opens itself."""
    return create_all


@pytest.fixture
def build(engine):
    """``await build({name: desc, ...})`` -> {name: Primitive}, built concurrently on ``engine``."""
    return lambda descs: create_all(engine, descs)


@contextlib.contextmanager
def user_gate(context: cl.Context):
    """A pyopencl UserEvent that is always completed on exit.

    Tests hold commands back with it; completing it in ``finally`` means a failing assertion can
    never leave a queue waiting forever, which would hang the runtime's shutdown.
    """
    gate = cl.UserEvent(context)
    try:
        yield gate
    finally:
        if gate.command_execution_status > COMPLETE:
            gate.set_status(COMPLETE)


@pytest.fixture
def gate():
    return user_gate


def threads_since(before: set[threading.Thread]) -> set[threading.Thread]:
    """Threads alive now that ``before`` (a ``set(threading.enumerate())``) lacked, less trio's
    idle worker threads: trio keeps finished ``to_thread`` workers, process-wide, for reuse."""
    return {t for t in threading.enumerate() if t not in before and not t.name.startswith("Trio thread ")}


def in_a_thread(fn, *args):
    """``fn(*args)`` in a new thread, joined before this returns: ``("returned", value)`` or
    ``("raised", exception)``. The calling thread (a trio run's, too) waits meanwhile, so ``fn``
    must not need it."""
    outcome = []

    def target():
        try:
            outcome.append(("returned", fn(*args)))
        except BaseException as exc:  # handed to the test, which asserts on it
            outcome.append(("raised", exc))

    thread = threading.Thread(target=target, name="triodnn-test-other-thread")
    thread.start()
    thread.join()
    return outcome[0]


def in_another_trio_run(async_fn, *args):
    """``await async_fn(*args)`` in a trio run of its own in a new thread, joined before this
    returns: ``("returned", value)``, ``("raised", exception)``, or ``("blocked", None)`` when it
    waited with every task of that run blocked, which would be forever, as nothing in that run
    could wake it (then it is cancelled, so such a failure ends the test instead of hanging it)."""

    async def main():
        outcome = None
        with trio.CancelScope() as blocked:
            async with trio.open_nursery() as nursery:

                async def unblock():
                    await trio.testing.wait_all_tasks_blocked()
                    blocked.cancel()

                nursery.start_soon(unblock)
                try:
                    outcome = ("returned", await async_fn(*args))
                except Exception as exc:  # handed to the test, which asserts on it
                    outcome = ("raised", exc)
                nursery.cancel_scope.cancel()
        return outcome or ("blocked", None)

    how, result = in_a_thread(trio.run, main)
    return result if how == "returned" else (how, result)
