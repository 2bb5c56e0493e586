"""Whole graphs as DAGs (triodnn.graph.compile_graph / GraphRunner) and pipelines (runner.map):
results equal in-order execution bit for bit, handlers run unsupported partitions, buffers are
released after their last consumer and never earlier, pipelines keep order and their
max_in_flight, and cancelling one leaves no buffer, task or pending callback behind."""

from __future__ import annotations

import random

import numpy as np
import pyopencl as cl
import pytest
import trio
import trio.testing
from _shared import GRAPHS, require
from conftest import in_another_trio_run

import triodnn
from triodnn import (
    ArgumentMismatchError,
    InvalidArgumentError,
    MissingArgumentError,
    StreamFlags,
    UnsupportedError,
)
from triodnn.graph import (
    Graph,
    Handler,
    LogicalTensor,
    MissingHandlerError,
    Op,
    Tensor,
    compile_graph,
    load,
)
from triodnn.testing import make_inputs, run_graph

PUBLIC = GRAPHS / "public"
PUBLIC_CASES = sorted(PUBLIC.glob("*.json")) if PUBLIC.is_dir() else []
# Small enough to run op by op (many partitions: a real DAG) in the suite's time budget.
DEBUG_NAMES = {
    "MHA-distill_bert-inf-fp32-bs1.json", "binary_post_ops_chain_fusion.json",
    "conv_bias_relu_depthwise_bias_relu_fusion_cpu.json", "gemma2-bf16-f32.json",
    "matmul_bias_post_ops_chain_fusion.json", "sdpa-plain-implicit-causal-mask-fp32-bs1.json",
    "shuffle_fusion.json", "unary_post_ops_gelu_fusion.json",
}
DEBUG_CASES = [p for p in PUBLIC_CASES if p.name in DEBUG_NAMES]
COMPLETE = cl.command_execution_status.COMPLETE


def f32(i, shape):
    return LogicalTensor(i, "f32", shape, layout_type="strided")


async def settle(predicate, timeout=20.0):
    """Wait until ``predicate()`` holds (device completions arrive from other threads)."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.002)


def live(engine) -> int:
    return engine.statistics().live_buffers


def held(runner) -> int:
    """Device buffers the runner keeps between requests (its recorded requests' buffer sets)."""
    return runner.statistics().request_buffers


def scratch_free(runner) -> bool:
    """No compiled partition allocates temporaries, so the engine's live-buffer count is the
    runner's and the caller's alone."""
    return all(cp.memory_statistics().scratch_buffers == 0 for cp in runner.compiled_partitions)


# -- an independent in-order executor: partitions in topological order, each awaited ---------


async def in_order(graph, engine, arrays, policy, handler=None):
    stream = await engine.stream(StreamFlags.in_order)
    tensors = {}
    for lt in graph.input_tensors():
        tensors[lt.id] = await Tensor.from_numpy(lt, engine, arrays[lt.id])
    for p in graph.get_partitions(policy):
        ins = [tensors[lt.id] for lt in p.input_ports]
        if p.is_supported:
            cp = await p.compile(engine, [t.logical_tensor for t in ins], None)
            outs = [Tensor(lt, engine) for lt in cp.outputs]
            await cp.execute(stream, ins, outs)
        else:
            (op,) = p.ops
            values = handler(p, *[await tensors[lt.id].to_numpy() for lt in op.inputs])
            values = list(values) if isinstance(values, (list, tuple)) else [values]
            outs = [await Tensor.from_numpy(lt, engine, v) for lt, v in zip(p.output_ports, values)]
        for t in outs:
            tensors[t.logical_tensor.id] = t
    return {lt.id: await tensors[lt.id].to_numpy() for lt in graph.output_tensors()}


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for i in want:
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"output {i}")


# -- random DAGs ------------------------------------------------------------------------------

UNARY = ("ReLU", "Tanh", "Sigmoid", "Abs", "Square")
BINARY = ("Add", "Multiply", "Subtract", "Maximum", "Minimum")
WILDCARDS = {  # Wildcard op name -> (inputs, outputs, numpy function)
    "neg": (1, 1, lambda x: -x),
    "half_sum": (2, 1, lambda a, b: (a + b) * np.float32(0.5)),
    "split": (1, 2, lambda x: (x * np.float32(2), x - np.float32(1))),
}


def numpy_wildcard(partition, *arrays):
    (op,) = partition.ops
    return WILDCARDS[op.name][2](*arrays)


def random_graph(seed: int, n_ops: int = 14, wildcard_rate: float = 0.0) -> Graph:
    """Eltwise and binary ops over 2 inputs and a broadcast row, each reading recent tensors
    (chains) or older ones (branches, joins); Wildcards at ``wildcard_rate``."""
    rng = random.Random(seed)
    shape = [rng.choice([3, 4]), rng.choice([5, 8])]
    tensors = [f32(0, shape), f32(1, shape)]
    row = f32(2, [1, shape[1]])
    g = Graph("cpu")
    next_id = 10

    def pick():
        recent = tensors[-3:]
        return rng.choice(recent) if rng.random() < 0.6 else rng.choice(tensors)

    for op_id in range(n_ops):
        if rng.random() < wildcard_rate:
            name = rng.choice(sorted(WILDCARDS))
            n_in, n_out, _ = WILDCARDS[name]
            ins = [pick() for _ in range(n_in)]
            outs = [f32(next_id + k, shape) for k in range(n_out)]
            g.add_op(Op(op_id, "Wildcard", ins, outs, name=name))
        elif rng.random() < 0.45:
            outs = [f32(next_id, shape)]
            g.add_op(Op(op_id, rng.choice(UNARY), [pick()], outs))
        else:
            other = row if rng.random() < 0.25 else pick()
            outs = [f32(next_id, shape)]
            g.add_op(Op(op_id, rng.choice(BINARY), [pick(), other], outs))
        tensors.extend(outs)
        next_id += len(outs)
    return g


def random_inputs(graph: Graph, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {lt.id: rng.uniform(-1.5, 1.5, lt.shape).astype(np.float32) for lt in graph.input_tensors()}


# -- DAG results equal in-order execution -------------------------------------------------------


@pytest.mark.parametrize("path", DEBUG_CASES or [None], ids=[p.stem for p in DEBUG_CASES] or ["absent"])
async def test_public_graph_as_a_dag_equals_in_order(engine, path):
    require(PUBLIC)
    graph = load(path)
    arrays = make_inputs(graph, seed=3)
    _, want, _ = await run_graph(graph, engine, await engine.stream(), arrays, "debug")
    runner = await compile_graph(graph, engine, policy="debug")
    assert len(runner.partitions) > 1
    ooo = await engine.stream(StreamFlags.out_of_order)
    assert_same(await runner.run(ooo, arrays), want)
    stats = runner.statistics()
    assert stats.partitions_submitted == len(runner.partitions)
    assert stats.buffers_allocated == stats.buffers_released


async def test_public_graphs_fused_through_the_runner(engine):
    cases = [PUBLIC / name for name in ("conv_bias_sum_fusion.json", "gated-mlp-f32.json", "matmul_select.json",
                                        "sdpa-plain-simplified-f32.json")]
    for path in cases:
        require(path)
    ooo = await engine.stream(StreamFlags.out_of_order)
    for path in cases:
        graph = load(path)
        arrays = make_inputs(graph, seed=5)
        _, want, _ = await run_graph(graph, engine, await engine.stream(), arrays, "fusion")
        runner = await compile_graph(graph, engine)
        assert_same(await runner.run(ooo, arrays), want)


@pytest.mark.parametrize("seed", range(4))
async def test_random_dag_equals_in_order(engine, seed):
    graph = random_graph(seed)
    arrays = random_inputs(graph, seed)
    want = await in_order(graph, engine, arrays, "debug")
    runner = await compile_graph(graph, engine, policy="debug")
    assert len(runner.partitions) == 14
    for flags in (StreamFlags.out_of_order, StreamFlags.in_order):
        assert_same(await runner.run(await engine.stream(flags), arrays), want)
    fused = await compile_graph(random_graph(seed), engine, policy="fusion")
    np.testing.assert_allclose(
        np.concatenate([v.ravel() for v in (await fused.run(await engine.stream(StreamFlags.out_of_order),
                                                             arrays)).values()]),
        np.concatenate([want[i].ravel() for i in sorted(want, key=[lt.id for lt in fused.outputs].index)]),
        rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
async def test_random_dag_with_wildcards_through_numpy_handlers(engine, seed):
    graph = random_graph(100 + seed, n_ops=16, wildcard_rate=0.3)
    arrays = random_inputs(graph, seed)
    want = await in_order(graph, engine, arrays, "debug", numpy_wildcard)
    runner = await compile_graph(graph, engine, policy="debug",
                                 handlers={"Wildcard": Handler(numpy_wildcard, with_partition=True)})
    assert runner.unsupported_partitions
    before = live(engine)
    got = await runner.run(await engine.stream(StreamFlags.out_of_order), arrays)
    assert_same(got, want)
    assert runner.statistics().handler_calls == len(runner.unsupported_partitions)
    assert live(engine) == before
    # Fusion groups the supported ops around the Wildcards; results agree within rounding.
    fused = await compile_graph(random_graph(100 + seed, n_ops=16, wildcard_rate=0.3), engine,
                                handlers={"Wildcard": Handler(numpy_wildcard, with_partition=True)})
    got = await fused.run(await engine.stream(StreamFlags.out_of_order), arrays)
    for i in want:
        np.testing.assert_allclose(got[i], want[i], rtol=1e-5, atol=1e-6)


# -- handlers ---------------------------------------------------------------------------------


def wildcard_graph() -> Graph:
    """x -> ReLU -> Wildcard(2 outputs) -> Tanh, and the second output + x -> Add."""
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4, 8])], [f32(1, [4, 8])]))
    g.add_op(Op(1, "Wildcard", [f32(1, [4, 8])], [f32(2, [4, 8]), f32(3, [4, 8])], {"scale": 3.0}))
    g.add_op(Op(2, "Tanh", [f32(2, [4, 8])], [f32(4, [4, 8])]))
    g.add_op(Op(3, "Add", [f32(3, [4, 8]), f32(0, [4, 8])], [f32(5, [4, 8])]))
    return g


def wildcard_reference(x):
    r = np.maximum(x, 0)
    return {4: np.tanh(r * 3), 5: (r - 1) + x}


async def test_wildcard_runs_through_a_numpy_handler_keyed_every_way(engine):
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    stream = await engine.stream(StreamFlags.out_of_order)

    async def async_handler(partition, a):
        await trio.sleep(0)
        scale = partition.ops[0].attrs["scale"]
        return [a * np.float32(scale), a - np.float32(1)]

    graph = wildcard_graph()
    wildcard = next(p for p in graph.get_partitions("debug") if not p.is_supported)
    keyed = [
        {"Wildcard": lambda a: (a * np.float32(3), a - np.float32(1))},
        {wildcard.id: Handler(lambda a: [a * np.float32(3), a - np.float32(1)], thread=False)},
        {"Wildcard": Handler(async_handler, with_partition=True)},
    ]
    for handlers in keyed:
        runner = await compile_graph(wildcard_graph(), engine, policy="debug", handlers=handlers)
        got = await runner.run(stream, {0: x})
        for i, want in wildcard_reference(x).items():
            np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-6)
    # A Partition (from any get_partitions call with the same policy) as the key.
    runner = await compile_graph(graph, engine, policy="debug",
                                 handlers={wildcard: lambda a: (a * np.float32(3), a - np.float32(1))})
    assert runner.unsupported_partitions[0].op_kinds == ("Wildcard",)
    got = await runner.run(stream, {0: x})
    np.testing.assert_allclose(got[5], wildcard_reference(x)[5], rtol=1e-6)


async def test_missing_handler_is_a_typed_error_naming_the_op_kind(engine):
    with pytest.raises(MissingHandlerError, match="Wildcard") as info:
        await compile_graph(wildcard_graph(), engine, policy="debug")
    assert isinstance(info.value, UnsupportedError)
    assert "op 1" in str(info.value) and "handlers=" in str(info.value)
    with pytest.raises(MissingHandlerError, match="Wildcard"):
        await compile_graph(wildcard_graph(), engine, handlers={"ReLU": lambda a: a})
    with pytest.raises(InvalidArgumentError, match="partition id"):
        await compile_graph(wildcard_graph(), engine, handlers={99: lambda a: a})


async def test_handler_errors_come_out_named_and_free_every_buffer(engine):
    x = np.ones((4, 8), np.float32)
    stream = await engine.stream(StreamFlags.out_of_order)
    before = live(engine)
    wrong = await compile_graph(wildcard_graph(), engine, policy="debug",
                                handlers={"Wildcard": lambda a: (a, a[:2])})
    with pytest.raises(ArgumentMismatchError, match=r"partition 1 \(op 1 Wildcard\).*output 3"):
        await wrong.run(stream, {0: x})

    def boom(a):
        raise KeyError("user bug")

    failing = await compile_graph(wildcard_graph(), engine, policy="debug", handlers={"Wildcard": boom})
    with pytest.raises(KeyError, match="user bug") as info:
        await failing.run(stream, {0: x})
    assert any("op 1 Wildcard" in note for note in info.value.__notes__)
    await stream.wait()
    assert live(engine) == before
    for runner in (wrong, failing):
        stats = runner.statistics()
        assert stats.buffers_allocated == stats.buffers_released and stats.runs_finished == 0


async def test_inputs_are_checked_by_id_and_shape(engine):
    runner = await compile_graph(wildcard_graph(), engine, policy="debug", handlers={"Wildcard": lambda a: (a, a)})
    stream = await engine.stream(StreamFlags.out_of_order)
    with pytest.raises(MissingArgumentError, match=r"lack graph input ids \[0\]: they give \[\]"):
        await runner.run(stream, {})
    # Keys given as strings (read from JSON, say): the message says what the keys should be.
    with pytest.raises(MissingArgumentError, match=r"they give \['0'\] .*ints: int\(key\)"):
        await runner.run(stream, {"0": np.zeros((4, 8), np.float32)})
    with pytest.raises(InvalidArgumentError, match=r"not graph inputs"):
        await runner.run(stream, {0: np.zeros((4, 8)), 7: np.zeros(1)})
    with pytest.raises(ArgumentMismatchError, match=r"inputs\[0\] has shape \(8, 4\)"):
        await runner.run(stream, {0: np.zeros((8, 4), np.float32)})
    assert [lt.id for lt in runner.inputs] == [0] and [lt.id for lt in runner.outputs] == [4, 5]


# -- buffers ----------------------------------------------------------------------------------


def branchy_graph() -> Graph:
    """x -> ReLU -> Tanh -+-> Add -> out 4;  x -> Abs -> 3 -+-> Sigmoid -> out 5."""
    g = Graph("cpu")
    s = [4, 8]
    g.add_op(Op(0, "ReLU", [f32(0, s)], [f32(1, s)]))
    g.add_op(Op(1, "Tanh", [f32(1, s)], [f32(2, s)]))
    g.add_op(Op(2, "Abs", [f32(0, s)], [f32(3, s)]))
    g.add_op(Op(3, "Add", [f32(2, s), f32(3, s)], [f32(4, s)]))
    g.add_op(Op(4, "Sigmoid", [f32(3, s)], [f32(5, s)]))
    return g


async def test_buffers_are_released_after_their_last_consumer_and_never_earlier(engine, gate):
    # A stream a trace watches: requests go command by command, with buffers of their own.
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    assert scratch_free(runner)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    src = await Tensor.from_numpy(runner.inputs[0], engine, x)
    before = live(engine)
    result = {}
    with triodnn.trace.record(), gate(engine.cl_context) as user_event:
        stream = await engine.stream(StreamFlags.out_of_order)
        async with trio.open_nursery() as nursery:
            async def run():
                result.update(await runner.run(stream, {0: src}, deps=[user_event]))
            nursery.start_soon(run)
            await trio.testing.wait_all_tasks_blocked()
            # Every partition is submitted, none may run: intermediates 1, 2, 3 and outputs 4, 5
            # are allocated and nothing is released, whatever has been submitted after them.
            stats = runner.statistics()
            assert stats.partitions_submitted == 5
            assert (stats.buffers_allocated, stats.buffers_released) == (5, 0)
            assert live(engine) == before + 5
            user_event.set_status(COMPLETE)
    np.testing.assert_allclose(result[4], np.tanh(np.maximum(x, 0)) + np.abs(x), rtol=1e-6)
    stats = runner.statistics()
    assert stats.buffers_allocated == stats.buffers_released == 5
    assert live(engine) == before and held(runner) == 0


@pytest.mark.parametrize("flags", [StreamFlags.in_order, StreamFlags.out_of_order])
async def test_recorded_requests_reuse_one_buffer_set_until_requests_overlap(engine, gate, flags, copies):
    # Unwatched streams: a request is one command into buffers the runner keeps. Requests one
    # after another share one set; a request submitted while another holds a set gets a new one
    # (out of order) or the same one (in order: the queue runs them one after the other).
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    assert scratch_free(runner)
    stream = await engine.stream(flags)
    before = live(engine)
    xs = [request_value(i) for i in range(3)]
    want = [{4: np.tanh(np.maximum(x, 0)) + np.abs(x), 5: 1 / (1 + np.exp(-np.abs(x)))} for x in xs]
    for x, ref in zip(xs, want):
        got = await runner.run(stream, {0: x})
        for k in (4, 5):
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-6)
    stats = runner.statistics()
    # One set: the uploaded input, intermediates 1, 2, 3 and outputs 4, 5.
    assert (stats.request_buffer_sets, stats.request_buffers) == (1, 6)
    assert stats.buffers_allocated == 0 and stats.partitions_submitted == 3 * 5 and stats.uploads == 3
    assert live(engine) == before + 6
    results = [None] * 3
    with gate(engine.cl_context) as user_event:
        async with trio.open_nursery() as nursery:
            async def run(i):
                results[i] = await runner.run(stream, {0: xs[i]}, deps=[user_event])
            for i in range(3):
                nursery.start_soon(run, i)
            await trio.testing.wait_all_tasks_blocked()
            # In order, the queue runs them one after the other, so one set serves all three,
            # unless uploads are staged: their pinned arrays are written at submission.
            sets = 1 if flags == StreamFlags.in_order and not engine.stages_copies else 3
            assert runner.statistics().request_buffer_sets == sets
            user_event.set_status(COMPLETE)
    for got, ref in zip(results, want):
        for k in (4, 5):
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-6)
    assert live(engine) == before + held(runner)
    runner.release_request_buffers()
    assert held(runner) == 0 and live(engine) == before


def two_input_graph() -> Graph:
    """a -> ReLU -+-> Multiply(·, b) -> out 4;  a, b -> Add -> out 5 (3 partitions with debug)."""
    g = Graph("cpu")
    s = [4, 8]
    g.add_op(Op(0, "ReLU", [f32(0, s)], [f32(2, s)]))
    g.add_op(Op(1, "Multiply", [f32(2, s), f32(1, s)], [f32(4, s)]))
    g.add_op(Op(2, "Add", [f32(0, s), f32(1, s)], [f32(5, s)]))
    return g


def chain_graph() -> Graph:
    """a, b -> Add -> ReLU -> Multiply(·, b) -> out 4: 3 partitions with debug, each step
    waiting for the one before (a request goes in line: one lane, or chained waits)."""
    g = Graph("cpu")
    s = [4, 8]
    g.add_op(Op(0, "Add", [f32(0, s), f32(1, s)], [f32(2, s)]))
    g.add_op(Op(1, "ReLU", [f32(2, s)], [f32(3, s)]))
    g.add_op(Op(2, "Multiply", [f32(3, s), f32(1, s)], [f32(4, s)]))
    return g


@pytest.mark.parametrize("strategy", ["in_order", "lanes:3", "lanes:3:spread", "native"])
@pytest.mark.parametrize("shape", ["branches", "chain"])
async def test_recorded_requests_on_every_stream_kind(rt, monkeypatch, strategy, copies, shape):
    # Two uploads, kernels that may overlap, two read-backs, several requests in flight: the
    # recorded command on an in-order queue, on lanes (spread or not) and on one native
    # out-of-order queue. A Tensor given for both inputs (aliased buffers) goes the same way.
    if strategy != "in_order":
        monkeypatch.setenv("TRIODNN_OOO_STRATEGY", strategy)
    engine = await rt.engine()
    flags = StreamFlags.in_order if strategy == "in_order" else StreamFlags.out_of_order
    stream = await engine.stream(flags)
    graph = two_input_graph() if shape == "branches" else chain_graph()
    runner = await compile_graph(graph, engine, policy="debug")
    assert len(runner.compiled_partitions) == 3

    def want(a, b):
        if shape == "branches":
            return {4: np.maximum(a, 0) * b, 5: a + b}
        return {4: np.maximum(a + b, 0) * b}

    rng = np.random.default_rng(5)
    requests = [{0: rng.standard_normal((4, 8), dtype=np.float32), 1: rng.standard_normal((4, 8), dtype=np.float32)}
                for _ in range(12)]
    async with runner.map(requests, stream=stream, max_in_flight=4) as results:
        outs = [out async for out in results]
    for request, out in zip(requests, outs, strict=True):
        for k, ref in want(request[0], request[1]).items():
            np.testing.assert_allclose(out[k], ref, rtol=1e-6)
    stats = runner.statistics()
    assert stats.runs_finished == 12 and stats.uploads == 24 and stats.buffers_allocated == 0
    assert 1 <= stats.request_buffer_sets <= 4
    both = await Tensor.from_numpy(runner.inputs[0], engine, requests[0][0])
    out = await runner.run(stream, {0: both, 1: both})
    for k, ref in want(requests[0][0], requests[0][0]).items():
        np.testing.assert_allclose(out[k], ref, rtol=1e-6)


@pytest.fixture(params=["direct", "staged"])
def copies(request, monkeypatch):
    """Recorded requests copying straight from and into the caller's arrays (a device sharing
    the host's memory, PoCL), or through pinned host arrays (a GPU): forced here either way."""
    if request.param == "staged":
        monkeypatch.setattr(triodnn.Engine, "stages_copies", property(lambda self: True))
    return request.param


async def test_recorded_requests_copy_inputs_as_submitted_and_outputs_as_taken(engine, copies):
    # map over arrays the caller overwrites as soon as each is pulled: staged requests copied
    # them at submission, direct ones got a copy from map; results taken late (sets held until
    # then) are each their own request's.
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream(StreamFlags.out_of_order)
    buffer = np.zeros((4, 8), np.float32)
    xs = [request_value(i) for i in range(10)]

    def reused():
        for x in xs:
            buffer[...] = x
            yield {0: buffer}
            buffer[...] = np.nan       # the next pull overwrites it; a request reading it late fails

    async with runner.map(reused(), stream=stream, max_in_flight=4) as results:
        outs = []
        async for out in results:
            outs.append(out)
            await trio.testing.wait_all_tasks_blocked()   # the requests behind it run meanwhile
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out[4], np.tanh(np.maximum(x, 0)) + np.abs(x), rtol=1e-6)
        np.testing.assert_allclose(out[5], 1 / (1 + np.exp(-np.abs(x))), rtol=1e-6)
    stats = runner.statistics()
    assert stats.runs_finished == 10 and stats.buffers_allocated == 0
    assert 1 <= stats.request_buffer_sets <= 4
    runner.release_request_buffers()
    assert runner.statistics().request_buffers == 0


async def test_a_recorded_request_from_another_thread_is_refused_and_takes_nothing(engine):
    # Refused before a buffer set is taken or made: the runner's sets and the engine's buffers
    # are as they were, and the runner serves its own run afterwards.
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream()
    x = request_value(0)
    before = (live(engine), stream.statistics().submitted)
    how, error = in_another_trio_run(runner.run, stream, {0: x})   # its first request: no set yet
    assert how == "raised" and isinstance(error, triodnn.WrongThreadError), (how, error)
    assert "submitted to a stream of" in str(error)
    assert runner.statistics().request_buffer_sets == 0
    assert (live(engine), stream.statistics().submitted) == before
    got = await runner.run(stream, {0: x})
    np.testing.assert_allclose(got[4], np.tanh(np.maximum(x, 0)) + np.abs(x), rtol=1e-6)


async def test_a_cancelled_recorded_request_keeps_its_set_until_the_command_ends(engine, gate, copies):
    # OpenCL cannot recall the command: the set it runs on is not handed to the next request
    # before it ends, and the result it would have had is dropped.
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream(StreamFlags.out_of_order)
    x = request_value(0)
    await runner.run(stream, {0: x})
    assert runner.statistics().request_buffer_sets == 1
    with gate(engine.cl_context) as user_event:
        with trio.CancelScope() as scope:
            async def doomed():
                await runner.run(stream, {0: x}, deps=[user_event])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(doomed)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
        assert scope.cancelled_caught
        got = {}
        async with trio.open_nursery() as nursery:
            async def next_request():
                got.update(await runner.run(stream, {0: request_value(1)}))
            nursery.start_soon(next_request)
            await trio.testing.wait_all_tasks_blocked()
            # The set of the cancelled request is still held by its command: a second set.
            assert runner.statistics().request_buffer_sets == 2
            user_event.set_status(COMPLETE)
    want = np.tanh(np.maximum(request_value(1), 0)) + np.abs(request_value(1))
    np.testing.assert_allclose(got[4], want, rtol=1e-6)
    stats = runner.statistics()
    assert (stats.runs_started, stats.runs_finished, stats.runs_cancelled) == (3, 2, 1)


async def test_buffers_upstream_of_a_waiting_handler_are_released_while_it_waits(engine):
    g = Graph("cpu")
    s = [4, 8]
    g.add_op(Op(0, "ReLU", [f32(0, s)], [f32(1, s)]))
    g.add_op(Op(1, "Wildcard", [f32(1, s)], [f32(2, s)]))
    g.add_op(Op(2, "Tanh", [f32(2, s)], [f32(3, s)]))
    g.add_op(Op(3, "Abs", [f32(0, s)], [f32(4, s)]))
    g.add_op(Op(4, "Add", [f32(3, s), f32(4, s)], [f32(5, s)]))
    go = trio.Event()

    async def slow_double(a):
        await go.wait()
        return a * np.float32(2)

    runner = await compile_graph(g, engine, policy="debug", handlers={"Wildcard": slow_double})
    assert scratch_free(runner)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    stream = await engine.stream(StreamFlags.out_of_order)
    before = live(engine)
    result = {}
    async with trio.open_nursery() as nursery:
        async def run():
            result.update(await runner.run(stream, {0: x}))
        nursery.start_soon(run)
        # The upload of x (read by ReLU and Abs) and ReLU's output (read back for the handler)
        # go as soon as their consumers are done; Abs's output waits for Add.
        await settle(lambda: runner.statistics().live_buffers == 1)
        assert runner.statistics().buffers_allocated == 3   # x, 1 and 4; not yet 2, 3, 5
        assert live(engine) == before + 1
        go.set()
    np.testing.assert_allclose(result[5], np.tanh(np.maximum(x, 0) * 2) + np.abs(x), rtol=1e-6)
    assert runner.statistics().live_buffers == 0 and live(engine) == before


async def test_outputs_as_tensors_belong_to_the_caller(engine):
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    stream = await engine.stream(StreamFlags.out_of_order)
    before = live(engine)
    outs = await runner.run(stream, {0: x}, as_tensors=True)
    assert set(outs) == {4, 5} and all(isinstance(t, Tensor) for t in outs.values())
    assert live(engine) == before + 2 and runner.statistics().live_buffers == 0
    np.testing.assert_allclose(await outs[5].to_numpy(), 1 / (1 + np.exp(-np.abs(x))), rtol=1e-6)
    numpy_out = await runner.run(stream, {0: x})
    np.testing.assert_array_equal(await outs[4].to_numpy(), numpy_out[4])
    # Caller-given output tensors are written in place.
    mine = Tensor(runner.outputs[0], engine)
    again = await runner.run(stream, {0: x}, outputs={4: mine})
    np.testing.assert_array_equal(await mine.to_numpy(), numpy_out[4])
    np.testing.assert_array_equal(again[4], numpy_out[4])
    for t in (*outs.values(), mine):
        assert not t.released
        t.release()                          # Tensor.release: its memory goes now
        assert t.released and t.memory.released
    assert live(engine) == before + held(runner)
    runner.release_request_buffers()
    with Tensor(runner.outputs[0], engine) as scoped:
        assert live(engine) == before + 1
    assert scoped.released and live(engine) == before


@pytest.mark.parametrize("path", ["recorded", "general"])
async def test_a_cancelled_run_is_counted_as_cancelled(engine, path):
    """``runs_cancelled`` counts runs that ended by cancellation, on the straight-line path
    (every step compiled) and the general one (``as_tensors`` takes it)."""
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    assert runner.recordable()
    stream = await engine.stream(StreamFlags.out_of_order)
    x = np.ones((4, 8), np.float32)
    with trio.CancelScope() as scope:
        scope.cancel()
        await runner.run(stream, {0: x}, as_tensors=path == "general")
    assert scope.cancelled_caught
    await runner.run(stream, {0: x})
    stats = runner.statistics()
    assert (stats.runs_started, stats.runs_finished, stats.runs_cancelled) == (2, 1, 1)
    await stream.wait()
    assert stats.live_buffers == 0


# -- pipelines --------------------------------------------------------------------------------


def request_value(i: int) -> np.ndarray:
    return (np.arange(32, dtype=np.float32).reshape(4, 8) - 16 + i) / np.float32(8)


async def test_pipeline_yields_in_input_order(engine):
    rng = random.Random(7)

    async def jittery(a):                     # later requests often finish first
        await trio.sleep(rng.uniform(0, 0.01))
        return a * np.float32(2)

    runner = await compile_graph(wildcard_graph(), engine, policy="debug",
                                 handlers={"Wildcard": Handler(lambda a: (a * np.float32(3), a - np.float32(1)))})
    slow = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream(StreamFlags.out_of_order)
    n = 12
    async with runner.map(({0: request_value(i)} for i in range(n)), stream=stream) as results:
        got = [out async for out in results]
    for i, out in enumerate(got):
        for k, want in wildcard_reference(request_value(i)).items():
            np.testing.assert_allclose(out[k], want, rtol=1e-6, atol=1e-6)

    async def source():
        buffer = np.empty((4, 8), np.float32)
        for i in range(n):
            buffer[...] = request_value(i)    # reused: the pipeline copies what it takes
            yield {0: buffer}

    want = [await slow.run(stream, {0: request_value(i)}) for i in range(n)]
    async with slow.map(source(), stream=stream, max_in_flight=3) as results:
        got = [out async for out in results]
    assert len(got) == n
    for out, ref in zip(got, want):
        assert_same(out, ref)
    # Requests that finish out of order still come out in order.
    g2 = Graph("cpu")
    g2.add_op(Op(0, "Wildcard", [f32(0, [4, 8])], [f32(1, [4, 8])]))
    g2.add_op(Op(1, "ReLU", [f32(1, [4, 8])], [f32(2, [4, 8])]))
    jitter = await compile_graph(g2, engine, policy="debug", handlers={"Wildcard": jittery})
    async with jitter.map([{0: request_value(i)} for i in range(n)], stream=stream,
                          max_in_flight=6) as results:
        outs = [o async for o in results]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out[2], np.maximum(request_value(i) * 2, 0))


@pytest.mark.parametrize("max_in_flight", [1, 3])
async def test_pipeline_never_has_more_than_max_in_flight(engine, max_in_flight):
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream(StreamFlags.out_of_order)
    delivered = 0
    seen = []

    async def source():
        for i in range(10):
            # Requests 0..i-1 started; this one starts next: i + 1 - delivered in flight then.
            seen.append(i + 1 - delivered)
            yield {0: request_value(i)}

    pipeline = runner.map(source(), stream=stream, max_in_flight=max_in_flight)
    async with pipeline:
        async for _out in pipeline:
            delivered += 1
            await trio.sleep(0.01)             # a slow consumer: requests pile up to the limit
    assert delivered == 10
    assert max(seen) == max_in_flight
    stats = pipeline.statistics()
    assert stats.peak_in_flight == max_in_flight and stats.started == stats.delivered == 10


async def test_pipeline_error_comes_in_order_and_frees_everything(engine):
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream(StreamFlags.out_of_order)
    before = live(engine)
    inputs = [{0: request_value(i)} for i in range(3)] + [{0: np.zeros((2, 2), np.float32)}]
    got = []
    with pytest.raises(ArgumentMismatchError, match=r"inputs\[0\] has shape \(2, 2\)"):
        async with runner.map(inputs + inputs, stream=stream, max_in_flight=2) as results:
            async for out in results:
                got.append(out)
    assert len(got) == 3
    await stream.wait()
    assert live(engine) == before + held(runner) and runner.statistics().live_buffers == 0


async def test_pipeline_tensor_outputs_are_distinct_and_freed_when_undelivered(engine):
    runner = await compile_graph(branchy_graph(), engine, policy="debug")
    stream = await engine.stream(StreamFlags.out_of_order)
    before = live(engine)
    async with runner.map(({0: request_value(i)} for i in range(8)), stream=stream,
                          max_in_flight=4, as_tensors=True) as results:
        first = await results.__anext__()
        second = await results.__anext__()
        await trio.sleep(0.05)                 # the rest complete and wait in the channel
    assert first[4].memory.cl_buffer.int_ptr != second[4].memory.cl_buffer.int_ptr
    want = await runner.run(stream, {0: request_value(1)})
    np.testing.assert_array_equal(await second[4].to_numpy(), want[4])
    # The two delivered results' outputs, and the buffers of the recorded request of ``want``.
    assert live(engine) == before + 4 + held(runner)
    for out in (first, second):
        for t in out.values():
            t.memory.release()
    assert live(engine) == before + held(runner)


def blocking_graph() -> Graph:
    g = Graph("cpu")
    g.add_op(Op(0, "ReLU", [f32(0, [4, 8])], [f32(1, [4, 8])]))
    g.add_op(Op(1, "Wildcard", [f32(1, [4, 8])], [f32(2, [4, 8])]))
    g.add_op(Op(2, "Tanh", [f32(2, [4, 8])], [f32(3, [4, 8])]))
    g.add_op(Op(3, "Add", [f32(3, [4, 8]), f32(0, [4, 8])], [f32(4, [4, 8])]))
    return g


@pytest.mark.parametrize("how", ["break", "raise", "cancel-inside", "cancel-outside", "aclose",
                                 "bare-async-for"])
async def test_cancelling_a_pipeline_leaves_nothing_behind(how):
    """However the ``async with`` block ends, the pipeline's nursery is closed when it exits:
    no input is pulled afterwards, no request, task or buffer is left, and an error raised in
    the block comes out as itself."""
    async def stuck_after_two(a):             # requests 2.. never finish on their own
        if a.max() > 3.5:         # request_value(8 * i) peaks at (15 + 8 i) / 8
            await trio.sleep_forever()
        return a

    def tasks() -> int:
        return trio.lowlevel.current_statistics().tasks_living

    class Stop(Exception):
        pass

    with trio.fail_after(60):
        async with triodnn.open_runtime() as rt:
            engine = await rt.engine()
            runner = await compile_graph(blocking_graph(), engine, policy="debug",
                                         handlers={"Wildcard": stuck_after_two})
            assert scratch_free(runner)
            stream = await engine.stream(StreamFlags.out_of_order)
            await runner.run(stream, {0: request_value(0)})
            baseline_buffers, baseline_tasks = live(engine), tasks()
            pulled = []

            async def source():
                for i in range(100):
                    pulled.append(i)
                    yield {0: request_value(8 * i)}

            got = []
            pipeline = runner.map(source(), stream=stream, max_in_flight=4)
            if how == "break":
                async with pipeline as results:
                    async for out in results:
                        got.append(out)
                        if len(got) == 1:
                            await settle(lambda: len(pulled) == 5)   # 1 delivered + 4 in flight
                            assert runner.statistics().live_buffers > 0
                        if len(got) == 2:
                            break
            elif how == "raise":
                with pytest.raises(Stop):                 # itself, not in an exception group
                    async with pipeline as results:
                        async for out in results:
                            got.append(out)
                            if len(got) == 2:
                                await settle(lambda: len(pulled) == 6)
                                raise Stop
            elif how == "cancel-inside":
                # A deadline passes while the consumer waits for request 2, which never ends. Set
                # once two results are in, not up front: a slow first request (a GPU's first
                # launches) reached a fixed 0.5 s deadline before then.
                with trio.CancelScope() as scope:
                    async with pipeline as results:
                        async for out in results:
                            got.append(out)
                            if len(got) == 2:
                                await settle(lambda: len(pulled) == 6)
                                scope.deadline = trio.current_time() + 0.05
                assert scope.cancelled_caught
            elif how == "cancel-outside":
                # Another task cancels the consumer's scope while it waits for request 2.
                async with trio.open_nursery() as nursery:
                    scope = trio.CancelScope()

                    async def consume():
                        with scope:
                            async with pipeline as results:
                                async for out in results:
                                    got.append(out)

                    nursery.start_soon(consume)
                    await settle(lambda: len(got) == 2 and len(pulled) == 6)
                    scope.cancel()
                assert scope.cancelled_caught
            elif how == "aclose":
                async with pipeline as results:
                    got.append(await results.__anext__())
                    got.append(await results.__anext__())
                    await settle(lambda: len(pulled) == 6)
                    await results.aclose()
                    # Closed inside the block: everything is gone already.
                    assert runner.statistics().live_buffers == 0 and tasks() == baseline_tasks
                    with pytest.raises(StopAsyncIteration):
                        await results.__anext__()
            else:
                # No bare iteration: work that an abandoned loop started would go on unowned.
                with pytest.raises(TypeError, match="async with runner.map"):
                    async for out in pipeline:
                        got.append(out)
                assert pulled == [] and tasks() == baseline_tasks
                got = [None, None]
            assert len(got) == 2
            assert len(pulled) <= 2 + 4
            # Nothing left the moment the block exits: buffers (the runner's and the engine's
            # count), tasks; and once the device has finished what was submitted, pending
            # completion callbacks.
            assert runner.statistics().live_buffers == 0
            assert live(engine) == baseline_buffers
            assert tasks() == baseline_tasks
            # Every request started ended delivered (the first run, two of the map's) or
            # cancelled in flight; none failed.
            stats = runner.statistics()
            if how == "bare-async-for":
                assert (stats.runs_started, stats.runs_finished, stats.runs_cancelled) == (1, 1, 0)
            else:
                assert stats.runs_finished == 3 and stats.runs_cancelled >= 1
                assert stats.runs_started == stats.runs_finished + stats.runs_cancelled
            stopped_at = len(pulled)
            await trio.sleep(0.05)
            assert len(pulled) == stopped_at          # the producer is stopped, not paused
            if how != "bare-async-for":
                with pytest.raises(StopAsyncIteration):
                    await pipeline.__anext__()        # a closed pipeline ends at once
                with pytest.raises(InvalidArgumentError, match="entered already"):
                    async with pipeline:
                        pass
            await stream.wait()
            await settle(lambda: rt.statistics().pending == 0)
        # ...and the runtime has closed cleanly (inside fail_after).
    assert rt.closed
