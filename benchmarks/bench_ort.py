"""bench_ort: triodnn's fused graphs against ONNX Runtime's CPU provider on the same machine.

The MLP (batch 64, 1024 features, 3 dense layers with bias and ReLU) and SDPA 1x8x128x64
(softmax(Q @ K^T * scale + mask) @ V) of bench_graph.py, built once as triodnn graphs (policy
fusion) and once as ONNX models (MatMul/Add/Relu; MatMul/Mul/Add/Softmax/MatMul), fed the same
inputs; outputs compared first. Each variant: median of timed runs, the two interleaved.
ONNX Runtime gets every core (its default intra-op pool); triodnn runs on the --engine device.

    pip install onnxruntime onnx    # optional peers, not triodnn dependencies
    python benchmarks/bench_ort.py
"""

from __future__ import annotations

import time

import _common as common
import bench_graph
import numpy as np
import trio

import triodnn
from triodnn.testing import make_inputs

try:  # optional peers
    import onnxruntime as ort
    from onnx import TensorProto, helper
except ImportError:  # pragma: no cover - depends on the machine
    ort = None


def extra_args(parser) -> None:
    parser.add_argument("--reps", type=int, default=None, help="timed runs per variant (default 50)")


def mlp_model(batch=64, features=1024, layers=3):
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]),
                  helper.make_node("Add", [f"h{i}", f"b{i}"], [f"hb{i}"]),
                  helper.make_node("Relu", [f"hb{i}"], [f"y{i}"])]
        x = f"y{i}"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])]
    for i in range(layers):
        inputs += [helper.make_tensor_value_info(f"w{i}", TensorProto.FLOAT, [features, features]),
                   helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT, [features])]
    out = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, features])]
    return _model(helper.make_graph(nodes, "mlp", inputs, out, inits))


def sdpa_model(b=1, h=8, s=128, d=64):
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["sc"]),
             helper.make_node("Add", ["sc", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["out"])]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [b, h, s, d]), helper.make_tensor_value_info("k", f, [b, h, s, d]),
              helper.make_tensor_value_info("v", f, [b, h, s, d]), helper.make_tensor_value_info("scale", f, [1]),
              helper.make_tensor_value_info("mask", f, [b, 1, s, s])]
    out = [helper.make_tensor_value_info("out", f, [b, h, s, d])]
    return _model(helper.make_graph(nodes, "sdpa", inputs, out))


def _model(graph):
    # IR version 9 (onnx 1.15+): readable by every onnxruntime since 1.16, whatever onnx writes by default.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


async def run(args):
    if ort is None:
        raise SystemExit("bench_ort needs onnxruntime and onnx: pip install onnxruntime onnx")
    reps = args.reps or (5 if args.quick else 50)
    rows, results = [], {}
    cases = [
        ("MLP 64x1024 x3", bench_graph.mlp, mlp_model,
         lambda a: {"x": a[0], **{f"w{i}": a[1 + 5 * i] for i in range(3)}, **{f"b{i}": a[2 + 5 * i] for i in range(3)}}),
        ("SDPA 1x8x128x64", bench_graph.sdpa, sdpa_model,
         lambda a: {"q": a[0], "k": a[1], "v": a[2], "scale": a[3], "mask": a[4]}),
    ]
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream()
        common.print_header("bench_ort: triodnn fused graphs vs ONNX Runtime CPU", engine, args,
                            [f"{reps} timed runs per variant, interleaved; median; onnxruntime {ort.__version__}"])
        for name, build, model, feeds in cases:
            arrays = make_inputs(build(), seed=1)
            runs, tensors, out_ids, prims = await bench_graph.prepare(build, engine, "fusion", arrays)
            session = ort.InferenceSession(model().SerializeToString(), providers=["CPUExecutionProvider"])
            feed = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feeds(arrays).items()}
            await bench_graph.run_once(stream, runs)
            ours = await tensors[out_ids[0]].to_numpy()
            (theirs,) = session.run(None, feed)
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-3 * max(1.0, float(np.abs(theirs).max())))
            samples = {"triodnn": [], "ort": []}
            for rep in range(reps):
                for variant in common.rotated(["triodnn", "ort"], rep):
                    t0 = time.perf_counter()
                    if variant == "triodnn":
                        await bench_graph.run_once(stream, runs)
                    else:
                        session.run(None, feed)
                    samples[variant].append(time.perf_counter() - t0)
            t_ours, t_ort = common.median(samples["triodnn"]), common.median(samples["ort"])
            rows.append([name, prims, t_ours * 1e6, t_ort * 1e6, t_ort / t_ours])
            results[name] = {"triodnn_us": t_ours * 1e6, "ort_us": t_ort * 1e6}
        common.print_table(["graph", "triodnn primitives", "triodnn µs", "ONNX Runtime µs", "triodnn speedup"], rows)
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_ort", engine, args, results)


if __name__ == "__main__":
    main()
