"""Random DAGs of eltwise/binary commands on an out-of-order stream match sequential numpy.

Each DAG is submitted whole before anything is awaited, ordered by event dependencies only, so a
dependency the stream fails to honour shows up as a node computed from stale or uninitialised
memory. Every node is checked twice:

* against its reference applied to the values the device produced for its inputs, with the op's
  own threshold from ``triodnn.kernels.tolerance``: no error compounding, so this is tight;
* against a sequential numpy evaluation of the whole DAG from the source data, with 1e-4: errors
  of a few ulp per op compound along a path (through exp, square, div ...), so the op thresholds
  do not apply to chains; value ranges are bounded (below) so 1e-4 is still far from any
  ordering error, which produces O(1) differences.

Value ranges are tracked as intervals while generating, and an op is only chosen when its result
stays within ±12 and its input is valid (log of >= 1e-3, sqrt of >= 0, div by |x| >= 0.25).
Discontinuous ops (round, comparisons) restart the sequential chain from the device's value: an
ulp of difference in their input may flip the result by 1.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
import trio

from triodnn import BinaryDesc, EltwiseDesc, MemoryDesc, StreamFlags
from triodnn.kernels import binary, eltwise, tolerance

SHAPE = (64, 33)  # 2112 elements: vector part and tail
DESC = MemoryDesc(SHAPE)
LIMIT = 12.0
CHAIN_TOLERANCE = 1e-4
PARAMS = {
    "relu": dict(alpha=0.125),
    "leaky_relu": dict(alpha=0.125),
    "clip": dict(alpha=-0.5, beta=0.75),
    "elu": dict(alpha=0.75),
    "swish": dict(alpha=1.0),
    "hardsigmoid": dict(alpha=0.2, beta=0.5),
    "linear": dict(alpha=-1.5, beta=0.75),
    "pow": dict(alpha=1.0, beta=3.0),
}
BINARY_ALGS = tuple(a for a in binary.ALGORITHMS if a not in binary.TERNARY)  # two inputs
DISCONTINUOUS = {"round", *(f"binary:{a}" for a in binary.COMPARISONS)}
DAGS_AT_ONCE = 4  # DAGs submitted together, sharing the stream and the primitives


@attrs.frozen
class Node:
    op: str  # "src", an eltwise alg, or "binary:<alg>"
    inputs: tuple[int, ...]
    lo: float
    hi: float
    data: np.ndarray | None = attrs.field(default=None, eq=False)


def _mono(f, lo, hi):
    return f(lo), f(hi)


def eltwise_interval(alg, lo, hi):
    """The range of ``alg`` over [lo, hi], or None when the op is not valid there."""
    a = PARAMS.get(alg, {})
    if alg in ("relu", "leaky_relu"):
        return _mono(lambda v: v if v > 0 else v * a["alpha"], lo, hi)
    if alg == "elu":
        return _mono(lambda v: v if v > 0 else a["alpha"] * math.expm1(v), lo, hi)
    if alg in ("swish", "mish", "hardswish"):
        return -0.4, max(hi, 0.0)  # minima -0.28, -0.31, -0.375; below max(x, 0)
    if alg == "hardsigmoid":
        return _mono(lambda v: min(max(a["alpha"] * v + a["beta"], 0.0), 1.0), lo, hi)
    if alg == "round":
        return float(np.rint(lo)), float(np.rint(hi))
    if alg == "linear":
        return tuple(sorted(_mono(lambda v: a["alpha"] * v + a["beta"], lo, hi)))
    if alg == "pow":
        return _mono(lambda v: a["alpha"] * v ** a["beta"], lo, hi)
    if alg == "soft_relu":
        return _mono(lambda v: math.log1p(math.exp(v)), lo, hi)
    if alg == "reciprocal":
        return None if lo <= 0.25 and hi >= -0.25 else (1 / hi, 1 / lo)
    if alg in ("gelu_erf", "gelu_tanh"):
        return -0.2, max(hi, 0.0)  # gelu(x) >= -0.17 and <= max(x, 0)
    if alg == "tanh":
        return _mono(math.tanh, lo, hi)
    if alg == "sigmoid":
        return _mono(lambda v: 1 / (1 + math.exp(-v)), lo, hi)
    if alg == "exp":
        return _mono(math.exp, lo, hi) if hi < math.log(LIMIT) else None
    if alg == "log":
        return _mono(math.log, lo, hi) if lo >= 1e-3 else None
    if alg == "sqrt":
        return _mono(math.sqrt, lo, hi) if lo >= 0 else None
    if alg in ("abs", "square"):
        small = 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
        big = max(abs(lo), abs(hi))
        return (small, big) if alg == "abs" else (small * small, big * big)
    if alg == "clip":
        return _mono(lambda v: min(max(v, a["alpha"]), a["beta"]), lo, hi)
    raise AssertionError(alg)


def binary_interval(alg, lo0, hi0, lo1, hi1):
    if alg == "add":
        return lo0 + lo1, hi0 + hi1
    if alg == "sub":
        return lo0 - hi1, hi0 - lo1
    if alg in ("mul", "div"):
        if alg == "div":
            if -0.25 < lo1 <= hi1 < 0.25 or lo1 <= 0 <= hi1 or min(abs(lo1), abs(hi1)) < 0.25:
                return None
            lo1, hi1 = 1 / hi1, 1 / lo1
        products = [lo0 * lo1, lo0 * hi1, hi0 * lo1, hi0 * hi1]
        return min(products), max(products)
    if alg == "min":
        return min(lo0, lo1), min(hi0, hi1)
    if alg == "max":
        return max(lo0, lo1), max(hi0, hi1)
    if alg in binary.COMPARISONS:
        return 0.0, 1.0
    raise AssertionError(alg)


def random_dag(seed: int) -> list[Node]:
    r = np.random.default_rng(seed)
    nodes = []
    for _ in range(r.integers(1, 4)):
        scale = float(r.choice([0.5, 2.0]))
        data = r.uniform(-scale, scale, SHAPE).astype(np.float32)
        nodes.append(Node("src", (), -scale, scale, data))

    def pick():
        # Prefer recent nodes for depth, sometimes reach back for wide fan-out.
        if r.random() < 0.6:
            return int(r.integers(max(0, len(nodes) - 3), len(nodes)))
        return int(r.integers(0, len(nodes)))

    for _ in range(r.integers(4, 11)):
        while True:
            if r.random() < 0.55:
                alg = str(r.choice(eltwise.ALGORITHMS))
                i = pick()
                bounds = eltwise_interval(alg, nodes[i].lo, nodes[i].hi)
                candidate = (alg, (i,))
            else:
                alg = str(r.choice(BINARY_ALGS))
                i, j = pick(), pick()  # i == j is allowed: one memory as both sources
                bounds = binary_interval(alg, nodes[i].lo, nodes[i].hi, nodes[j].lo, nodes[j].hi)
                candidate = (f"binary:{alg}", (i, j))
            if bounds is not None and max(abs(bounds[0]), abs(bounds[1])) <= LIMIT:
                nodes.append(Node(candidate[0], candidate[1], *bounds))
                break
    return nodes


def apply(node: Node, inputs: list[np.ndarray]) -> np.ndarray:
    if node.op.startswith("binary:"):
        return binary.reference(node.op[7:], inputs[0], inputs[1])
    return eltwise.reference(node.op, inputs[0], **PARAMS.get(node.op, {}))


def threshold(node: Node) -> float:
    return tolerance.binary(node.op[7:]) if node.op.startswith("binary:") else tolerance.eltwise(node.op)


def test_generator_covers_every_algorithm_and_shape_of_dag():
    """The DAGs exercise every op, fan-in/fan-out, and aliasing of one memory as src0 and src1."""
    dags = [random_dag(seed) for seed in range(200)]
    ops = {node.op for dag in dags for node in dag}
    assert ops == {"src", *eltwise.ALGORITHMS, *(f"binary:{a}" for a in BINARY_ALGS)}
    assert all(5 <= len(dag) <= 13 for dag in dags)
    assert any(len({n.inputs[0] for n in dag if n.inputs}) < len([n for n in dag if n.inputs]) for dag in dags)
    assert any(n.op.startswith("binary:") and n.inputs[0] == n.inputs[1] for dag in dags for n in dag)


def submit_dag(engine, stream, prims, dag):
    """Everything in, nothing awaited: writes, kernels and reads ordered by deps alone."""
    memories = [engine.memory(DESC) for _ in dag]
    events = []
    for node, memory in zip(dag, memories):
        if node.op == "src":
            events.append(stream.write(memory, node.data))
            continue
        args = ({"src0": memories[node.inputs[0]], "src1": memories[node.inputs[1]], "dst": memory}
                if node.op.startswith("binary:") else {"src": memories[node.inputs[0]], "dst": memory})
        events.append(stream.execute(prims[node.op], args, deps=[events[i] for i in node.inputs]))
    outs = [np.empty(SHAPE, np.float32) for _ in dag]
    reads = [stream.read(m, out, deps=[e]) for m, out, e in zip(memories, outs, events)]
    return memories, events, reads, outs


def check_dag(seed, dag, outs):
    chain: list[np.ndarray] = []
    for index, (node, got) in enumerate(zip(dag, outs)):
        where = f"seed {seed}, node {index} {node.op}{list(node.inputs)}"
        if node.op == "src":
            np.testing.assert_array_equal(got, node.data, err_msg=where)
            chain.append(node.data)
            continue
        try:
            tolerance.check(got, apply(node, [outs[i] for i in node.inputs]), threshold(node))
            if node.op in DISCONTINUOUS:
                expected = got
            else:
                expected = apply(node, [chain[i] for i in node.inputs])
                tolerance.check(got, expected, CHAIN_TOLERANCE)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None
        chain.append(expected)


async def run_dags(engine, prims, seeds):
    stream = await engine.stream(StreamFlags.out_of_order)
    for start in range(0, len(seeds), DAGS_AT_ONCE):
        batch = [(seed, random_dag(seed)) for seed in seeds[start:start + DAGS_AT_ONCE]]
        submitted = [submit_dag(engine, stream, prims, dag) for _, dag in batch]
        with trio.fail_after(30):
            for _, _events, reads, _ in submitted:
                for event in reads:
                    await event
        for (seed, dag), (memories, events, _, outs) in zip(batch, submitted):
            assert all(e.done for e in events)
            check_dag(seed, dag, outs)
            for memory in memories:
                memory.release()
    return stream


def all_descs():
    descs = {alg: EltwiseDesc(alg, DESC, **PARAMS.get(alg, {})) for alg in eltwise.ALGORITHMS}
    descs.update({f"binary:{alg}": BinaryDesc(alg, DESC, DESC) for alg in BINARY_ALGS})
    return descs


@pytest.mark.parametrize("strategy, count", [(None, 200), ("lanes:4", 50)], ids=["default", "lanes4"])
async def test_random_dags(rt, strategy, count, monkeypatch, build_on):
    if strategy is None:
        monkeypatch.delenv("TRIODNN_OOO_STRATEGY", raising=False)
    else:
        monkeypatch.setenv("TRIODNN_OOO_STRATEGY", strategy)
    engine = await rt.engine()
    prims = await build_on(engine, all_descs())
    live = engine.statistics().live_buffers
    stream = await run_dags(engine, prims, list(range(count)))
    assert stream.strategy == ("lanes" if strategy else engine.out_of_order_strategy.kind)
    assert engine.statistics().live_buffers == live
