"""A forward graph and its backward graph sharing saved tensors (examples/train_mlp.py): the
gradients of step 1 equal numpy's, N steps of SGD equal numpy's loop, the saved tensors go from
one graph to the other without a host copy (counted by an instrument), and the runner's part of
it, ``as_tensors`` naming outputs and Tensors of another graph as inputs, with typed errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import triodnn
from triodnn import ArgumentMismatchError, ClosedError, EngineMismatchError, InvalidArgumentError, StreamFlags
from triodnn.graph import Tensor, compile_graph

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
_spec = importlib.util.spec_from_file_location("train_mlp", EXAMPLE)
mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mlp)

TINY = mlp.Sizes(batch=8, features=4, hidden=6, outputs=3)


class HostTraffic(triodnn.Instrument):
    """Every host copy submitted, as (op, bytes): reads and writes, on any stream."""

    def __init__(self) -> None:
        self.copies: list[tuple[str, int]] = []

    def command_submitted(self, stream, command, started_ns):
        if command.op in ("read", "write"):
            self.copies.append((command.op, command.host.nbytes))


async def trainer(engine, lr=0.1):
    params, x, target = mlp.initial_values(TINY)
    stream = await engine.stream(StreamFlags.out_of_order)
    return await mlp.Trainer.create(engine, stream, TINY, params, x, target, lr=lr), (params, x, target)


async def test_step_one_gradients_equal_numpys(engine):
    result = await mlp.train(engine, TINY, steps=1, lr=0.1)
    for name in mlp.PARAMS:
        assert result.gradients[name].shape == result.expected[name].shape
        np.testing.assert_allclose(result.gradients[name], result.expected[name], rtol=1e-5, atol=1e-6)
    assert max(mlp.gradient_errors(result.gradients, result.expected).values()) <= mlp.GRAD_RTOL


async def test_n_steps_of_sgd_equal_numpys_loop(engine):
    steps, lr = 6, 0.1
    result = await mlp.train(engine, TINY, steps=steps, lr=lr)
    params, x, target = mlp.initial_values(TINY)
    losses, final = mlp.numpy_train(params, x, target, steps=steps, lr=lr)
    np.testing.assert_allclose(result.losses, losses, rtol=1e-5)
    assert result.losses[-1] < result.losses[0] / 2
    for name in mlp.PARAMS:
        np.testing.assert_allclose(result.parameters[name], final[name], rtol=1e-5, atol=1e-6)


async def test_saved_tensors_never_reach_the_host(engine):
    train, _ = await trainer(engine)
    try:
        await train.step()                          # kernels built, constants uploaded
        traffic = HostTraffic()
        triodnn.add_instrument(traffic)
        try:
            for _ in range(3):
                await train.step()
        finally:
            triodnn.remove_instrument(traffic)
        # Per step one read, the loss's 4 bytes; no write: activations, gradients and parameters
        # stay on the device from graph to graph.
        assert traffic.copies == [("read", 4)] * 3
        assert train.forward.statistics().uploads == 0
        assert train.backward.statistics().uploads == 2          # set_constants: scale and lr, once
        for runner in (train.forward, train.backward):
            stats = runner.statistics()
            assert stats.runs_finished == 4 and stats.live_buffers == 0
    finally:
        train.release()


async def test_each_step_frees_what_the_step_before_held(engine):
    train, _ = await trainer(engine)
    await train.step(gradients=True)         # the compiled partitions' scratch exists from here
    held = engine.statistics().live_buffers
    for _ in range(2):
        await train.step(gradients=True)
        # The saved tensors, the gradients and the old parameters are freed: only the new
        # parameters replace the old.
        assert engine.statistics().live_buffers == held
    train.release()
    assert engine.statistics().live_buffers == held - len(mlp.PARAMS) - len(train.batch)


async def test_the_example_exits_nonzero_on_a_gradient_mismatch(monkeypatch, capsys):
    args = ["--steps", "2", "--sizes", ",".join(map(str, TINY))]
    assert await mlp.main(args) == 0
    right = mlp.numpy_gradients
    monkeypatch.setattr(mlp, "numpy_gradients",
                        lambda *a: (right(*a)[0], {k: v * 1.01 for k, v in right(*a)[1].items()}))
    assert await mlp.main(args) == 1
    assert "MISMATCH" in capsys.readouterr().err


# -- the runner: chosen outputs as Tensors, Tensors of another graph as inputs ----------------------

async def test_as_tensors_names_the_outputs_that_stay_on_the_device(engine):
    forward = await compile_graph(mlp.forward_graph(TINY), engine)
    params, x, target = mlp.initial_values(TINY)
    arrays = {mlp.X: x, mlp.TARGET: target, **{mlp.PARAM_IDS[n]: params[n] for n in mlp.PARAMS}}
    stream = await engine.stream(StreamFlags.in_order)
    plain = await forward.run(stream, arrays)
    # Runs with Tensor outputs go partition by partition, whose scratch buffers stay from the
    # first such run on: made before counting.
    (await forward.run(stream, arrays, as_tensors=[mlp.H]))[mlp.H].release()
    before = engine.statistics().live_buffers
    out = await forward.run(stream, arrays, as_tensors=[mlp.H, mlp.DIFF])
    assert isinstance(out[mlp.LOSS], np.ndarray) and isinstance(out[mlp.H_PRE], np.ndarray)
    assert isinstance(out[mlp.H], Tensor) and isinstance(out[mlp.DIFF], Tensor)
    assert engine.statistics().live_buffers == before + 2 and forward.statistics().live_buffers == 0
    for i in plain:
        got = await out[i].to_numpy() if isinstance(out[i], Tensor) else out[i]
        np.testing.assert_array_equal(got, plain[i])
    out[mlp.H].release()
    out[mlp.DIFF].release()
    async with forward.map([arrays, arrays], stream=stream, as_tensors={mlp.LOSS}) as results:
        async for res in results:
            assert isinstance(res[mlp.LOSS], Tensor) and isinstance(res[mlp.H], np.ndarray)
            np.testing.assert_array_equal(await res[mlp.LOSS].to_numpy(), plain[mlp.LOSS])
            res[mlp.LOSS].release()
    assert engine.statistics().live_buffers == before


@pytest.mark.parametrize("bad", [[99], [mlp.H, mlp.X], "6", 6])
async def test_as_tensors_must_name_graph_outputs(engine, bad):
    forward = await compile_graph(mlp.forward_graph(TINY), engine)
    stream = await engine.stream(StreamFlags.in_order)
    with pytest.raises(InvalidArgumentError, match="as_tensors"):
        await forward.run(stream, {}, as_tensors=bad)
    with pytest.raises(InvalidArgumentError, match="as_tensors"):
        forward.map([], stream=stream, as_tensors=bad)


async def test_saved_tensors_of_the_wrong_shape_engine_or_released_are_typed_errors(rt, engine):
    train, (params, x, target) = await trainer(engine)
    try:
        weights = {mlp.PARAM_IDS[n]: train.params[n] for n in mlp.PARAMS}
        out = await train.forward.run(train.stream, {mlp.X: train.batch[mlp.X], mlp.TARGET: train.batch[mlp.TARGET],
                                                     **weights}, as_tensors=mlp.SAVED)
        saved = {i: out[i] for i in mlp.SAVED}
        inputs = {mlp.X: train.batch[mlp.X], **weights, **saved}
        # The hidden activations where y - t belongs: shape (8, 6), not (8, 3).
        with pytest.raises(ArgumentMismatchError, match=rf"inputs\[{mlp.DIFF}\] has memory"):
            await train.backward.run(train.stream, {**inputs, mlp.DIFF: saved[mlp.H]})
        other = await rt.engine()                           # the same device, another context
        lt = train.backward.query_logical_tensor(mlp.H)
        foreign = await Tensor.from_numpy(lt, other, np.zeros(lt.shape, np.float32))
        with pytest.raises(EngineMismatchError, match=rf"inputs\[{mlp.H}\] lives on"):
            await train.backward.run(train.stream, {**inputs, mlp.H: foreign})
        foreign.release()
        saved[mlp.H_PRE].release()
        with pytest.raises(ClosedError, match=rf"inputs\[{mlp.H_PRE}\] was released"):
            await train.backward.run(train.stream, inputs)
        assert train.backward.statistics().runs_started == 0
        # relu(h_pre) > 0 where h_pre > 0: h in h_pre's place still gives numpy's gradients.
        back = await train.backward.run(train.stream, {**inputs, mlp.H_PRE: saved[mlp.H]}, as_tensors=True)
        want = mlp.numpy_gradients(params, x, target)[1]
        for name in mlp.PARAMS:
            np.testing.assert_allclose(await back[mlp.GRADS[name]].to_numpy(), want[name], rtol=1e-5, atol=1e-6)
        for tensor in (*back.values(), saved[mlp.H], saved[mlp.DIFF]):
            tensor.release()
    finally:
        train.release()
