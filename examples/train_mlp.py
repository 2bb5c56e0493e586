"""Train a 2-layer MLP with a forward graph and a backward graph sharing saved tensors.

    x (N, D) -> MatMul(W1, b1) -> h_pre -> ReLU -> h -> MatMul(W2, b2) -> y;  loss = mean((y - t)^2)

The forward graph returns the loss as a number and its saved tensors (h_pre, h and y - t) as
device Tensors (``runner.run(..., as_tensors={ids})``); the backward graph takes them as inputs
as they are, computes every gradient (MatMul with transpose_a/transpose_b, ReLUBackward,
ReduceSum for the biases) and the SGD update, and returns the new parameters as Tensors, the
next step's inputs. Nothing but the loss crosses to the host between steps. Step 1's gradients
are checked against numpy in float64; a mismatch exits 1.

Run: python examples/train_mlp.py [--steps 8] [--lr 0.1] [--sizes 64,32,64,10]
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

import numpy as np
import trio

import triodnn
from triodnn.graph import Graph, LogicalTensor, Op, Tensor, compile_graph

PARAMS = ("W1", "b1", "W2", "b2")
# Logical tensor ids. The forward graph's saved outputs keep their ids as backward inputs, so
# a Tensor the forward returns is the backward's input of the same id.
X, W1, B1, W2, B2, TARGET = 0, 1, 2, 3, 4, 5
H_PRE, H, Y, DIFF, SQUARED, LOSS = 6, 7, 8, 9, 10, 11
SAVED = (H_PRE, H, DIFF)
SCALE, LR, DY, DH, DH_PRE = 20, 21, 22, 23, 24
GRADS = {"W1": 30, "b1": 31, "W2": 32, "b2": 33}
STEPS = {"W1": 40, "b1": 41, "W2": 42, "b2": 43}     # lr * grad
UPDATED = {"W1": 50, "b1": 51, "W2": 52, "b2": 53}
PARAM_IDS = {"W1": W1, "b1": B1, "W2": W2, "b2": B2}
# Step 1's gradients must equal numpy's (float64) within this, relative to each gradient's
# largest magnitude: f32 sums of D or N products, a few ulps each.
GRAD_RTOL = 1e-4


class Sizes(NamedTuple):
    batch: int = 64
    features: int = 32
    hidden: int = 64
    outputs: int = 10

    def shapes(self) -> dict[str, tuple[int, ...]]:
        n, d, h, o = self
        return {"x": (n, d), "target": (n, o), "W1": (d, h), "b1": (h,), "W2": (h, o), "b2": (o,)}


def _lt(i: int, shape, property_type: str = "variable") -> LogicalTensor:
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=property_type)


def forward_graph(sizes: Sizes) -> Graph:
    """loss = mean((relu(x W1 + b1) W2 + b2 - t)^2); h_pre, h and y - t are outputs too (End)."""
    s = sizes.shapes()
    n, _, hidden, o = sizes
    x, w1, b1, w2, b2, t = (_lt(i, s[k]) for i, k in zip((X, W1, B1, W2, B2, TARGET), ("x", "W1", "b1", "W2", "b2", "target")))
    h_pre, h, y = _lt(H_PRE, (n, hidden)), _lt(H, (n, hidden)), _lt(Y, (n, o))
    diff, squared, loss = _lt(DIFF, (n, o)), _lt(SQUARED, (n, o)), _lt(LOSS, ())
    graph = Graph("cpu")
    for op in (
        Op(0, "MatMul", [x, w1, b1], [h_pre]),
        Op(1, "ReLU", [h_pre], [h]),
        Op(2, "MatMul", [h, w2, b2], [y]),
        Op(3, "Subtract", [y, t], [diff]),
        Op(4, "Multiply", [diff, diff], [squared]),
        Op(5, "ReduceMean", [squared], [loss], {"axes": [0, 1]}),
        # The saved tensors: consumed inside, and graph outputs through End ops (oneDNN's way).
        *(Op(10 + i, "End", [lt], []) for i, lt in enumerate((h_pre, h, diff))),
    ):
        graph.add_op(op)
    graph.finalize()
    return graph


def backward_graph(sizes: Sizes) -> Graph:
    """Gradients of the forward's loss from its inputs x, W1, b1, W2, b2 and its saved h_pre, h,
    y - t, and the SGD update p - lr * grad; ``scale`` = 2 / (N * outputs) (the mean's and the
    square's factors) and ``lr`` are one-element constants. Outputs: the four gradients (End)
    and the four updated parameters."""
    s = sizes.shapes()
    n, _, hidden, o = sizes
    x = _lt(X, s["x"])
    params = {name: _lt(PARAM_IDS[name], s[name]) for name in PARAMS}
    h_pre, h, diff = _lt(H_PRE, (n, hidden)), _lt(H, (n, hidden)), _lt(DIFF, (n, o))
    scale, lr = _lt(SCALE, (1,), "constant"), _lt(LR, (1,), "constant")
    dy, dh, dh_pre = _lt(DY, (n, o)), _lt(DH, (n, hidden)), _lt(DH_PRE, (n, hidden))
    grads = {name: _lt(GRADS[name], s[name]) for name in PARAMS}
    ops = [
        Op(0, "Multiply", [diff, scale], [dy]),
        Op(1, "MatMul", [h, dy], [grads["W2"]], {"transpose_a": True}),
        Op(2, "ReduceSum", [dy], [grads["b2"]], {"axes": [0]}),
        Op(3, "MatMul", [dy, params["W2"]], [dh], {"transpose_b": True}),
        Op(4, "ReLUBackward", [h_pre, dh], [dh_pre], {"use_dst": False}),
        Op(5, "MatMul", [x, dh_pre], [grads["W1"]], {"transpose_a": True}),
        Op(6, "ReduceSum", [dh_pre], [grads["b1"]], {"axes": [0]}),
    ]
    for i, name in enumerate(PARAMS):
        step = _lt(STEPS[name], s[name])
        ops.append(Op(10 + i, "Multiply", [grads[name], lr], [step]))
        ops.append(Op(20 + i, "Subtract", [params[name], step], [_lt(UPDATED[name], s[name])]))
        ops.append(Op(30 + i, "End", [grads[name]], []))
    graph = Graph("cpu")
    for op in ops:
        graph.add_op(op)
    graph.finalize()
    return graph


# -- numpy, float64 ---------------------------------------------------------------------------

def initial_values(sizes: Sizes, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(parameters, x, target) as f32 arrays: a batch whose targets a linear map of x gives."""
    rng = np.random.default_rng(seed)
    s = sizes.shapes()
    params = {
        "W1": rng.normal(0, 1 / np.sqrt(sizes.features), s["W1"]),
        "b1": rng.normal(0, 0.1, s["b1"]),
        "W2": rng.normal(0, 1 / np.sqrt(sizes.hidden), s["W2"]),
        "b2": rng.normal(0, 0.1, s["b2"]),
    }
    x = rng.normal(0, 1, s["x"])
    target = x @ rng.normal(0, 1 / np.sqrt(sizes.features), (sizes.features, sizes.outputs))
    f32 = {name: value.astype(np.float32) for name, value in params.items()}
    return f32, x.astype(np.float32), target.astype(np.float32)


def numpy_gradients(params, x, target) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, {name: gradient}) of the MLP in float64."""
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    x, target = np.asarray(x, np.float64), np.asarray(target, np.float64)
    h_pre = x @ p["W1"] + p["b1"]
    h = np.maximum(h_pre, 0)
    diff = h @ p["W2"] + p["b2"] - target
    dy = diff * (2 / diff.size)
    dh_pre = (dy @ p["W2"].T) * (h_pre > 0)
    grads = {"W1": x.T @ dh_pre, "b1": dh_pre.sum(0), "W2": h.T @ dy, "b2": dy.sum(0)}
    return float(np.mean(diff**2)), grads


def numpy_train(params, x, target, *, steps: int, lr: float) -> tuple[list[float], dict[str, np.ndarray]]:
    """The same SGD loop in float64: (loss of each step, final parameters)."""
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    losses = []
    for _ in range(steps):
        loss, grads = numpy_gradients(p, x, target)
        losses.append(loss)
        p = {name: p[name] - lr * grads[name] for name in PARAMS}
    return losses, p


def gradient_errors(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> dict[str, float]:
    """Per gradient, the largest difference relative to the gradient's largest magnitude."""
    return {name: float(np.max(np.abs(got[name] - want[name])) / max(np.max(np.abs(want[name])), 1e-30))
            for name in PARAMS}


# -- the device loop ----------------------------------------------------------------------------

class Trainer:
    """The two compiled graphs, the parameters and the batch as device Tensors. ``step()`` runs
    one forward and one backward on ``stream``; the parameters it leaves are the backward's
    outputs. Create with ``await Trainer.create(...)``; ``release()`` frees its Tensors."""

    def __init__(self, forward, backward, stream, params: dict[str, Tensor], batch: dict[int, Tensor]) -> None:
        self.forward, self.backward, self.stream = forward, backward, stream
        self.params = params
        self.batch = batch

    @classmethod
    async def create(cls, engine, stream, sizes: Sizes, params, x, target, *, lr: float) -> Trainer:
        forward = await compile_graph(forward_graph(sizes), engine)
        backward = await compile_graph(backward_graph(sizes), engine)
        await backward.set_constants({SCALE: np.float32([2 / (sizes.batch * sizes.outputs)]),
                                      LR: np.float32([lr])})
        ins = {lt.id: lt for lt in forward.inputs}
        tensors = {name: await Tensor.from_numpy(ins[PARAM_IDS[name]], engine, params[name]) for name in PARAMS}
        batch = {X: await Tensor.from_numpy(ins[X], engine, x), TARGET: await Tensor.from_numpy(ins[TARGET], engine, target)}
        return cls(forward, backward, stream, tensors, batch)

    async def step(self, *, gradients: bool = False) -> tuple[float, dict[str, np.ndarray] | None]:
        """(loss before the update, the gradients read back when asked, else None)."""
        weights = {PARAM_IDS[name]: self.params[name] for name in PARAMS}
        out = await self.forward.run(self.stream, {X: self.batch[X], TARGET: self.batch[TARGET], **weights},
                                     as_tensors=SAVED)
        saved = {i: out[i] for i in SAVED}
        try:
            back = await self.backward.run(self.stream, {X: self.batch[X], **weights, **saved}, as_tensors=True)
        finally:
            for tensor in saved.values():
                tensor.release()
        grads = None
        if gradients:
            grads = {name: await back[GRADS[name]].to_numpy() for name in PARAMS}
        for name in PARAMS:
            back[GRADS[name]].release()
            self.params[name].release()
            self.params[name] = back[UPDATED[name]]
        return float(out[LOSS]), grads

    async def parameters(self) -> dict[str, np.ndarray]:
        return {name: await self.params[name].to_numpy() for name in PARAMS}

    def release(self) -> None:
        for tensor in (*self.params.values(), *self.batch.values()):
            tensor.release()


class TrainResult(NamedTuple):
    losses: list[float]                     # each step's, before its update
    gradients: dict[str, np.ndarray]        # step 1's, read back from the device
    expected: dict[str, np.ndarray]         # step 1's, numpy's in float64
    parameters: dict[str, np.ndarray]       # after the last step


async def train(engine, sizes: Sizes, *, steps: int, lr: float, seed: int = 0) -> TrainResult:
    """Train ``steps`` (at least 1) steps of SGD on one batch."""
    params, x, target = initial_values(sizes, seed)
    stream = await engine.stream(triodnn.StreamFlags.out_of_order)
    trainer = await Trainer.create(engine, stream, sizes, params, x, target, lr=lr)
    try:
        loss, first = await trainer.step(gradients=True)
        losses = [loss]
        for _ in range(steps - 1):
            losses.append((await trainer.step())[0])
        final = await trainer.parameters()
    finally:
        trainer.release()
    assert first is not None, "step(gradients=True) reads them"
    return TrainResult(losses, first, numpy_gradients(params, x, target)[1], final)


async def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--sizes", default=",".join(map(str, Sizes())), help="batch,features,hidden,outputs")
    args = parser.parse_args(argv)
    sizes = Sizes(*(int(v) for v in args.sizes.split(",")))
    async with triodnn.open_runtime() as rt:
        engine = await rt.engine()
        result = await train(engine, sizes, steps=args.steps, lr=args.lr)
    for i, loss in enumerate(result.losses, 1):
        print(f"step {i}: loss {loss:.6f}")
    errors = gradient_errors(result.gradients, result.expected)
    print("step 1 gradients vs numpy (max |diff| / max |grad|):",
          ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))
    bad = [name for name, err in errors.items() if not err <= GRAD_RTOL]
    if bad:
        print(f"MISMATCH: {bad} beyond {GRAD_RTOL}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
