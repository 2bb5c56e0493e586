"""Writes the example graphs of this folder with triodnn's Graph API (run it to regenerate them).

    python examples/graphs/make_examples.py

- ``sdpa.json``: scaled dot-product attention, batch 1, 4 heads, 128 tokens, head size 32:
  ``softmax(Q @ K^T * scale + mask) @ V``, the pattern oneDNN fuses into one partition.
- ``mlp.json``: two dense layers with bias and ReLU between, a batch of 64 by 256 features.
"""

from __future__ import annotations

from pathlib import Path

from triodnn.graph import Graph, LogicalTensor, Op, save

HERE = Path(__file__).resolve().parent


def lt(i, shape, prop="variable"):
    return LogicalTensor(i, "f32", shape, layout_type="strided", property_type=prop)


def sdpa() -> Graph:
    b, h, s, d = 1, 4, 128, 32
    q, k, v = lt(0, [b, h, s, d]), lt(1, [b, h, s, d]), lt(2, [b, h, s, d])
    scale, mask = lt(3, [1], "constant"), lt(4, [b, 1, s, s])
    scores, scaled, masked, probs, out = (lt(i, [b, h, s, s]) for i in (10, 11, 12, 13, 14))
    out = lt(14, [b, h, s, d])
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [q, k], [scores], {"transpose_b": True}, "qk"))
    g.add_op(Op(1, "Multiply", [scores, scale], [scaled], {}, "scale"))
    g.add_op(Op(2, "Add", [scaled, mask], [masked], {}, "mask"))
    g.add_op(Op(3, "SoftMax", [masked], [probs], {"axis": -1}, "softmax"))
    g.add_op(Op(4, "MatMul", [probs, v], [out], {}, "pv"))
    return g


def mlp() -> Graph:
    n, c, hidden, o = 64, 256, 512, 128
    x = lt(0, [n, c])
    w1, b1 = lt(1, [c, hidden], "constant"), lt(2, [hidden], "constant")
    w2, b2 = lt(3, [hidden, o], "constant"), lt(4, [o], "constant")
    h1, h2, h3, y1, y = lt(10, [n, hidden]), lt(11, [n, hidden]), lt(12, [n, hidden]), lt(13, [n, o]), lt(14, [n, o])
    g = Graph("cpu")
    g.add_op(Op(0, "MatMul", [x, w1], [h1], {}, "fc1"))
    g.add_op(Op(1, "BiasAdd", [h1, b1], [h2], {}, "bias1"))
    g.add_op(Op(2, "ReLU", [h2], [h3], {}, "relu"))
    g.add_op(Op(3, "MatMul", [h3, w2], [y1], {}, "fc2"))
    g.add_op(Op(4, "BiasAdd", [y1, b2], [y], {}, "bias2"))
    return g


if __name__ == "__main__":
    for name, build in (("sdpa", sdpa), ("mlp", mlp)):
        save(build(), HERE / f"{name}.json")
        print("wrote", HERE / f"{name}.json")
