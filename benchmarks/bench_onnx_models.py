"""bench_onnx_models: ONNX's light models (the ``onnx`` wheel's ``backend/test/data/light``)
through triodnn.onnx against ONNX Runtime's CPU provider on the same machine.

The light models make every weight with ConstantOfShape (one value a tensor), so whatever the
input, their classifier sees equal logits and outputs a uniform 0.001 (eight of the nine shipped
outputs are exactly that): a check that cannot fail. Here each such weight becomes an initializer
of random values first (``randomized``: He-scaled for conv and dense weights, positive BN
variances and scales), so outputs depend on every weight and the input. Each model is then
imported (``from_onnx``), compiled once (``compile_graph`` with its weights as constants) and fed
one input drawn here (normal, seed 0). Its output is checked against ONNX Runtime's on that input
(rtol 1e-3, atol 1e-7 plus 1e-4 of the output's largest magnitude: both sum thousands of f32
products in different orders) before any timing.

Timing, both sides the same way: wall time, median of --reps samples taken in turns.
- "one": one request at a time, each awaited (triodnn ``runner.run``; ONNX Runtime ``session.run``);
- "queued": --queue requests through ``runner.map`` (4 in flight), per request; ONNX Runtime's
  session runs them one after another (its intra-op pool is the parallelism it has).
ONNX Runtime gets ``--threads`` intra-op threads (default: the machine's cores); triodnn runs on
the --engine device. With --torch (a GPU engine, torch and onnx2torch installed), torch eager on
the GPU runs beside them, the model converted by onnx2torch: "one" is a forward and a
``torch.cuda.synchronize()``, "queued" --queue forwards then one synchronize, per request; its
outputs are checked against ONNX Runtime's as triodnn's are.

    python benchmarks/bench_onnx_models.py [--engine cpu:0] [--models squeezenet resnet50 ...]
        [--reps 5] [--queue 8] [--threads N] [--torch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import _common as common
import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference
import onnxruntime as ort
import trio

import triodnn
import triodnn.onnx
from triodnn.graph import compile_graph

try:  # an optional peer on a GPU machine
    import torch
    from onnx2torch import convert as onnx_to_torch
except ImportError as exc:  # pragma: no cover - depends on the machine
    torch = None
    TORCH_MISSING = str(exc)

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ("squeezenet", "shufflenet", "bvlc_alexnet", "zfnet512", "inception_v1", "resnet50", "inception_v2",
          "densenet121", "vgg19")


def randomized(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` with each float ConstantOfShape of a known shape replaced by an initializer of
    random values of that shape, and the input of its final Softmax an output too."""
    rng = np.random.default_rng(seed)
    known = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    role = {}
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            for slot, name in enumerate(node.input[1:5], start=1):
                role[name] = ("scale", "bias", "mean", "var")[slot - 1]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    added = []
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type != "ConstantOfShape" or node.input[0] not in known or (
                value is not None and value.data_type != onnx.TensorProto.FLOAT):
            out.graph.node.append(node)
            continue
        shape = tuple(int(d) for d in known[node.input[0]])
        kind = role.get(node.output[0])
        if kind in ("scale", "var"):
            array = rng.uniform(0.5, 1.5, shape)
        elif len(shape) > 1:  # conv or dense weights: He scaling keeps activations O(1)
            array = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        else:
            array = rng.standard_normal(shape) * 0.1
        added.append(onnx.numpy_helper.from_array(array.astype(np.float32), node.output[0]))
    out.graph.initializer.extend(added)
    # Random weights can saturate a deep net's softmax (one class 1.0, the rest 0), which again
    # checks little: the logits become an output too.
    if out.ir_version < 4:  # before IR 4 every initializer is also a graph input
        out.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in added)
    outputs = {o.name for o in out.graph.output}
    shapes = {v.name: v for v in onnx.shape_inference.infer_shapes(out).graph.value_info}
    for node in out.graph.node:
        if node.op_type == "Softmax" and node.output[0] in outputs and node.input[0] in shapes:
            out.graph.output.append(shapes[node.input[0]])
    return out


def check(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference; raises when an element is outside the tolerance."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    bound = 1e-7 + 1e-3 * np.abs(want) + 1e-4 * np.abs(want).max()
    if got.shape != want.shape or (diff > bound).any():
        raise AssertionError(f"output differs from ONNX Runtime's: max difference {diff.max():.3g}")
    return float(diff.max())


async def bench_model(name: str, engine, args) -> dict:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    model = randomized(onnx.load(path))
    started = time.perf_counter()
    onnx_graph = triodnn.onnx.from_onnx(model)
    runner = await compile_graph(onnx_graph.graph, engine, constants=onnx_graph.constants,
                                 handlers=onnx_graph.handlers())
    compile_s = time.perf_counter() - started
    (info,) = [i for i in model.graph.input if i.name in onnx_graph.inputs]
    dims = [d.dim_value for d in info.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    feeds = onnx_graph.feeds({info.name: x})
    stream = await engine.stream()

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wants = session.run(None, {info.name: x})
    gots = onnx_graph.ordered_outputs(await runner.run(stream, feeds))
    error = max(check(got, want) for got, want in zip(gots, wants, strict=True))

    async def triodnn_runs(n):
        if n == 1:
            await runner.run(stream, feeds)
            return
        async with runner.map([feeds] * n, stream=stream, max_in_flight=4) as results:
            async for _ in results:
                pass

    async def ort_runs(n):
        for _ in range(n):
            session.run(None, {info.name: x})

    runs = {"triodnn": triodnn_runs, "ort": ort_runs}  # each side: n requests, done when they are
    module = None
    if args.torch:
        # Strict f32 on both sides (triodnn computes f32 products in f32; torch's convolutions
        # would use TF32 by default), and inference Dropout as Identity (onnx2torch has no
        # converter for Dropout-7).
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        for_torch = onnx.ModelProto()
        for_torch.CopyFrom(model)
        for node in for_torch.graph.node:
            if node.op_type == "Dropout":
                del node.output[1:], node.attribute[:]
                node.op_type = "Identity"
        try:
            module = onnx_to_torch(for_torch).eval().cuda()
            xt = torch.from_numpy(x).cuda()
            with torch.inference_mode():
                outs = module(xt)
            outs = outs if isinstance(outs, tuple | list) else (outs,)
            error = max(error, *(check(o.float().cpu().numpy(), w) for o, w in zip(outs, wants, strict=True)))
        except Exception as exc:  # onnx2torch's converters do not cover every old opset
            print(f"|   torch eager, {name}: {type(exc).__name__}: {str(exc)[:200]} |", flush=True)
            module = None
    if module is not None:

        async def torch_runs(n):
            with torch.inference_mode():
                for _ in range(n):
                    module(xt)
            torch.cuda.synchronize()

        runs["torch"] = torch_runs
    sides = list(runs)
    samples: dict[str, list[float]] = {f"{side} {mode}": [] for side in sides for mode in ("one", "queued")}
    for rep in range(args.reps):
        for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
            for mode, n in (("one", 1), ("queued", args.queue)):
                t0 = time.perf_counter()
                await runs[side](n)
                samples[f"{side} {mode}"].append((time.perf_counter() - t0) / n)
    ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    return {"model": name, "compile_s": compile_s, "error": error, "wildcards": len(onnx_graph.wildcard_nodes), **ms}


async def main(args) -> None:
    async with triodnn.open_runtime() as rt:
        engine = await common.engine_named(rt, args.engine)
        print(f"{engine.kind}:{engine.index} {engine.info.name}; ONNX Runtime {ort.__version__} with "
              f"{args.threads} intra-op threads; median of {args.reps}, queued = {args.queue} requests", flush=True)
        print("| model | compile s | triodnn one ms | ORT one ms | ORT ÷ triodnn (one) | triodnn queued ms/req "
              "| ORT queued ms/req | ORT ÷ triodnn (queued) | max diff vs ORT |", flush=True)
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        for name in args.models:
            r = await bench_model(name, engine, args)
            print(f"| {name} | {r['compile_s']:.1f} | {r['triodnn one']:.2f} | {r['ort one']:.2f} | "
                  f"{r['ort one'] / r['triodnn one']:.2f}x | {r['triodnn queued']:.2f} | {r['ort queued']:.2f} | "
                  f"{r['ort queued'] / r['triodnn queued']:.2f}x | {r['error']:.2g} |", flush=True)
            if "torch one" in r:
                print(f"|   torch eager | | {r['torch one']:.2f} | | {r['torch one'] / r['triodnn one']:.2f}x "
                      f"(torch ÷ triodnn) | | {r['torch queued']:.2f} | {r['torch queued'] / r['triodnn queued']:.2f}x "
                      "(torch ÷ triodnn) | |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default=None)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--queue", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--torch", action="store_true", help="torch eager on the GPU beside (needs onnx2torch)")
    arguments = parser.parse_args()
    if arguments.torch and torch is None:
        parser.error(f"--torch needs torch and onnx2torch: {TORCH_MISSING}")
    trio.run(main, arguments)
