"""bench_sdpa_training: SDPA backward (dQ, dK, dV) as oneDNN's training graph, triodnn vs torch.

The graph is oneDNN's own ``complex_fusion/mha/sdpa-plain-training-backward-f32.json`` (from
``../shared/graphs/benchdnn``; heads 16, head size 64), its sequence length 384 rewritten to each
``--seq``. It takes Q, K, V, the additive mask, the scale, the forward's output O, its softmax
statistics (the row logsumexp of the scaled, masked scores) and dO, recomputes the probabilities
from the statistics, as FlashAttention does, and writes dQ, dK, dV. The inputs are consistent: O
and the statistics are computed in numpy from Q, K, V and the mask, so torch's autograd, given the
same Q, K, V, mask and dO, must produce the same gradients. torch's kernels sum in other orders
(its fused backward's dQ was 4.7e-4 off in a few elements at 1024 on an H200), so a peer is
checked by its largest error relative to the gradient's largest value, at most 1e-4.

Peers, on a CUDA GPU: torch's fused SDPA backward (``scaled_dot_product_attention`` forward once,
then ``torch.autograd.grad`` of its output, graph retained: backward only, whichever fused kernel
torch picks for fp32 with a mask) and torch eager (the same formula in separate ops, backward
through autograd). TF32 off.

Timing: wall time over N queued runs (submit N backward runs, wait once; per run = total / N),
triodnn and torch alike, median of the interleaved repetitions. Checks: triodnn's dQ, dK, dV
against the numpy reference of the graph, before and after timing (outputs poisoned between);
torch's against the same reference, before and after its timed runs.

    python benchmarks/bench_sdpa_training.py [--engine gpu:0] [--seq 384 --seq 1024]
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import _common as common
import numpy as np
import trio
from bench_graph import TorchQueued, check_outputs, graph_reference, poison_outputs, prepare, run_once

import triodnn
from triodnn.graph import from_dict
from triodnn.kernels import sdpa_backward
from triodnn.testing import make_inputs

try:  # optional peer, compared on a CUDA GPU
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

CASE = (Path(__file__).resolve().parents[2] / "shared" / "graphs" / "benchdnn" / "complex_fusion" / "mha"
        / "sdpa-plain-training-backward-f32.json")
SEQ_IN_FILE = 384
# The graph's inputs and outputs, by logical tensor id (read off the file's ops).
Q, K, SCALE, MASK, STATS, V, DO, O = 100, 101, 102, 103, 8, 104, 105, 10
DQ, DK, DV = 27, 29, 12


def extra_args(parser) -> None:
    parser.add_argument("--seq", type=int, action="append", default=[], help="sequence length (default 384, 1024)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 7)")
    parser.add_argument("--queued", type=int, default=20, metavar="N", help="runs per sample (default 20)")
    parser.add_argument("--unfused", action="store_true",
                        help="also time triodnn with the fused SDPA backward forced off and forced on, interleaved")


def graph_of(seq: int):
    document = json.loads(CASE.read_text())
    for op in document["graph"]:
        for t in (*op["inputs"], *op["outputs"]):
            t["shape"] = [seq if d == SEQ_IN_FILE else d for d in t["shape"]]
            t["stride"] = [int(np.prod(t["shape"][d + 1:])) for d in range(len(t["shape"]))]  # row-major
    return from_dict(document)


def consistent_inputs(graph, seed: int) -> dict:
    """The graph's random inputs, with O and the statistics computed from Q, K, V and the mask
    (float64, then stored as f32) so that torch's autograd sees the same forward."""
    arrays = make_inputs(graph, seed=seed)
    q, k, v, mask = (arrays[i].astype(np.float64) for i in (Q, K, V, MASK))
    scale = float(arrays[SCALE].reshape(-1)[0])
    scores = (q @ np.swapaxes(k, -1, -2)) * scale + mask
    top = scores.max(axis=-1, keepdims=True)
    lse = top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True))
    arrays[STATS] = lse.astype(np.float32)
    arrays[O] = (np.exp(scores - lse) @ v).astype(np.float32)
    return arrays


PEER_RTOL = 1e-4


def peer_error(graph, ref, lt_id: int, got) -> str | None:
    """None when a peer's gradient is within PEER_RTOL of the reference's largest value."""
    want = np.asarray(ref[0][lt_id], dtype=np.float64)
    error = float(np.max(np.abs(np.asarray(got, dtype=np.float64).reshape(want.shape) - want)))
    scale = float(np.max(np.abs(want)))
    return None if error <= PEER_RTOL * scale else f"output {lt_id}: max error {error:.3g} of max {scale:.3g}"


def torch_backward(arrays: dict) -> dict:
    """{peer: fn() -> (dQ, dK, dV)} on CUDA: fused SDPA's and eager autograd backward, forward once."""
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    t = {i: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(dev) for i, a in arrays.items()}
    scale = float(arrays[SCALE].reshape(-1)[0])
    peers = {}
    for name in ("torch fused SDPA", "torch eager"):
        q, k, v = (t[i].clone().requires_grad_(True) for i in (Q, K, V))
        if name == "torch fused SDPA":
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=t[MASK], scale=scale)
        else:
            out = torch.softmax((q @ k.transpose(-1, -2)) * scale + t[MASK], -1) @ v

        def grads(out=out, q=q, k=k, v=v):
            return torch.autograd.grad(out, (q, k, v), t[DO], retain_graph=True)
        peers[name] = grads
    return peers


async def _check_forced(graph, ref, prepared, who: str) -> None:
    """A forced variant's check, reported rather than fatal: the fused kernels sum dQ and dK in
    another order than the op-by-op matmuls, and at Sq = 384 a few small elements of dK (sums of
    large terms of both signs) land 1.5x past the graph's elementwise f32 tolerance of its
    op-by-op reference; the timing is still worth having."""
    try:
        await check_outputs(graph, ref, prepared[1], prepared[2], who)
    except AssertionError as error:
        print(f"   note: {error}")


async def run(args):
    reps = args.reps or (3 if args.quick else 7)
    n = 3 if args.quick else args.queued
    seqs = args.seq or ([128] if args.quick else [384, 1024])
    cuda = torch is not None and torch.cuda.is_available()
    results, rows = {}, []
    async with triodnn.open_runtime() as rt:
        engine = await common.open_engine(rt, args)
        stream = await engine.stream()
        common.print_header("bench_sdpa_training: SDPA backward, oneDNN's training graph vs torch", engine, args, [
            f"timing: wall time over {n} queued runs (submit {n}, wait once; per run = total / {n}), "
            f"median of {reps} interleaved samples; torch likewise (N calls, synchronize once)",
            "dQ, dK, dV of every variant checked against the numpy reference of the graph, before and after timing",
        ])
        for seq in seqs:
            name = f"SDPA bwd 1x16x{seq}x64"
            graph = graph_of(seq)
            arrays = consistent_inputs(graph, seed=1)
            ref = graph_reference(graph, arrays)
            runs, tensors, out_ids, primitives = await prepare(lambda: graph_of(seq), engine, "fusion", arrays)
            await run_once(stream, runs)
            await check_outputs(graph, ref, tensors, out_ids, f"{name}, triodnn")
            await poison_outputs(tensors, out_ids)
            forced = {}
            if args.unfused:
                # Each variant compiled with the rule forced, the partition cache off so that
                # neither reuses the other's plan.
                capacity = triodnn.get_compiled_partition_cache_capacity()
                triodnn.set_compiled_partition_cache_capacity(0)
                try:
                    for label, force in (("triodnn op by op", False), ("triodnn fused", True)):
                        sdpa_backward.FORCE = force
                        got = await prepare(lambda: graph_of(seq), engine, "fusion", arrays)
                        await run_once(stream, got[0])
                        await _check_forced(graph, ref, got, f"{name}, {label}")
                        await poison_outputs(got[1], got[2])
                        forced[label] = got
                        print(f"   {name}, {label}: {got[3]} primitives")
                finally:
                    sdpa_backward.FORCE = None
                    triodnn.set_compiled_partition_cache_capacity(capacity)

            async def ours(runs=runs):
                await stream.wait()
                t0 = time.perf_counter()
                event = None
                for _ in range(n):
                    for cp, ins, outs in runs:
                        event = cp.execute(stream, ins, outs)
                await event
                return (time.perf_counter() - t0) / n

            variants = {"triodnn": ours}
            for label, got in forced.items():
                variants[label] = functools.partial(ours, got[0])
            peers = {}
            if cuda:
                for peer, fn in torch_backward(arrays).items():
                    got = fn()
                    problems = [peer_error(graph, ref, i, g.cpu().numpy()) for i, g in zip((DQ, DK, DV), got)]
                    if any(problems):
                        print(f"   {name}, {peer}: left out, its result is off: {[p for p in problems if p]}")
                        continue
                    peers[peer] = TorchQueued(fn, n)
                    variants[peer] = peers[peer].sample
            samples = await common.interleaved(variants, reps)
            await check_outputs(graph, ref, tensors, out_ids, f"{name}, triodnn, timed runs")
            for label, got in forced.items():
                await _check_forced(graph, ref, got, f"{name}, {label}, timed runs")
                print(f"   {name}, {label}: {common.median(samples[label]) * 1e6:.0f} µs/run")
            t = {k: common.median(v) for k, v in samples.items()}
            for peer, timed in peers.items():
                problems = [peer_error(graph, ref, i, g.cpu().numpy()) for i, g in zip((DQ, DK, DV), timed.last)]
                if any(problems):
                    print(f"   {name}, {peer}: left out, its timed result is off")
                    t[peer] = float("nan")
            nan = float("nan")
            fused, eager = t.get("torch fused SDPA", nan), t.get("torch eager", nan)
            rows.append([name, len(runs), primitives, t["triodnn"] * 1e6, fused * 1e6, eager * 1e6,
                         fused / t["triodnn"], eager / t["triodnn"]])
            results[name] = {"triodnn_us": t["triodnn"] * 1e6, "torch_fused_sdpa_us": fused * 1e6,
                             "torch_eager_us": eager * 1e6, "partitions": len(runs), "primitives": primitives,
                             "samples_s": samples}
        common.print_table(["graph", "partitions", "primitives", "triodnn µs/run", "torch fused SDPA µs",
                            "torch eager µs", "speed ÷ torch fused", "speed ÷ torch eager"], rows,
                           f"SDPA backward: wall time over {n} queued runs, median of {reps} interleaved samples")
        return results, engine


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0], extra_args)
    results, engine = trio.run(run, args)
    common.write_json(args.json, "bench_sdpa_training", engine, args, results)


if __name__ == "__main__":
    main()
