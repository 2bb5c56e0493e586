"""Fused SDPA backward (FlashAttention-style): the generator of ``SdpaBackwardDesc``, its float64
reference, tolerance and ``fusion_pays``.

The probabilities are recomputed from the forward's saved row statistics, ``P = exp(s - stats)``,
so no (Sq, Skv) matrix reaches memory. Two kernels, one per part:

- ``dq``: per query row i, q_i, dO_i and the dQ_i accumulator stay private, ``D_i = dO_i . O_i``
  is computed once, then a loop over the keys: ``s``, ``p``, ``dp = dO_i . V_j``,
  ``ds = p (dp - D_i) scale``, ``dQ_i += ds K_j``;
- ``dkdv``: per key row j, k_j, v_j and both accumulators private, a loop over the query rows:
  ``dV_j += p dO_i``, ``dK_j += ds Q_i``, with ``D_i`` read from ``delta`` (the dq kernel's
  ``delta_out``, as the graph lowering wires them) or recomputed inline without it.

On the CPU device (``vector_width`` > 1) one work-item takes ``vector_width`` rows as the lanes
of float vectors (the forward's CPU layout): every multiply-add is a vector one, the other side's
row is loaded once per step as scalars and broadcast, and no horizontal sums are needed. GPUs
take one row per work-item, the work-group's rows reading the same other-side row at once.
Storage f32, bf16, f16; f32 math, each intermediate rounded to f32 as the graph's ops round
them (D's products are rounded before they are summed, as the graph's Multiply does).
"""

from __future__ import annotations

import math
import os

import numpy as np

from .._values._sdpa_backward_desc import SdpaBackwardDesc
from . import _dtype_io
from ._registry import register
from ._spec import KernelConfig, KernelSpec, padded_global

# FORCE overrides the rule (True: always fuse, False: never), for measurements and tests
# (benchmarks/bench_sdpa_training.py --unfused flips it); TRIODNN_SDPA_BWD_FUSION=1/0 sets it.
FORCE: bool | None = {"1": True, "0": False}.get(os.environ.get("TRIODNN_SDPA_BWD_FUSION", ""))


def fusion_pays(sq: int, skv: int, d: int, dv: int, config: KernelConfig) -> bool:
    """Whether the fused backward beats the ops one by one for these sizes on ``config``.

    Off until measured faster: on PoCL (2 cores, heads 16, D 64; bench_sdpa_training.py
    --unfused) the fused pair took 1.43x the op-by-op time at Sq = Skv = 128 and 1.14x at 384 (it
    does 448 multiply-adds per score where the five matmuls do 320); GPUs not measured yet.
    """
    if FORCE is not None:
        return FORCE
    return False


# Rows summed into a private block sum before the running total (the CPU kernels): two-level
# sums, whose rounding error grows with S / _BLOCK + _BLOCK rather than S: dQ and dK are sums of
# large terms of both signs, compared with the graph's f64 reference of the f32 dS.
_BLOCK = 16

_SHORT = {"query": "q", "key": "k", "value": "v", "dst": "o", "diff_dst": "do", "stats": "st",
          "mask": "m", "diff_query": "dq", "diff_key": "dk", "diff_value": "dv", "delta": "dl", "delta_out": "dlo"}


def _batch_offsets(batch: tuple[int, ...], strides: dict[str, tuple[int, ...]], linear: str) -> str:
    """Statements setting ``ulong base_<name>`` from batch index ``linear``."""
    lines = [f"ulong base_{n} = 0;" for n in strides]
    if batch:
        lines.append(f"ulong rem = {linear};")
        for axis in reversed(range(len(batch))):
            lines.append(f"{{ const ulong idx = rem % {batch[axis]}UL; rem /= {batch[axis]}UL;")
            lines.extend(f"  base_{n} += idx * {s[axis]}UL;" for n, s in strides.items() if s[axis])
            lines.append("}")
    return "\n    ".join(lines)


class _Source:
    """What both kernel shapes share: argument lists, strides, element addresses and constants."""

    def __init__(self, desc: SdpaBackwardDesc):
        q = desc.query
        self.sq, self.d = q.dims[-2:]
        self.skv, self.dv = desc.key.dims[-2], desc.value.dims[-1]
        self.batch = q.dims[:-2]
        self.outs = {"dq": ("diff_query",), "dkdv": ("diff_key", "diff_value")}[desc.part]
        self.outs += ("delta_out",) if desc.delta_out is not None else ()
        self.ins = ["query", "key", "value", "dst", "diff_dst", "stats"]
        self.ins += [n for n in ("scale", "mask", "delta") if getattr(desc, n) is not None]
        self.mds = {n: getattr(desc, n) for n in (*self.ins, *self.outs)}
        self.strides = {n: md.strides for n, md in self.mds.items() if n not in ("scale", "mask")}
        if desc.mask is not None:
            m = desc.mask
            dims = (1,) * (q.ndims - m.ndims) + m.dims
            full = (0,) * (q.ndims - m.ndims) + m.strides
            self.strides["mask"] = tuple(0 if n == 1 else s for n, s in zip(dims, full))
        self.has_mask = desc.mask is not None
        scale = "1.0f"
        if desc.scale is not None:
            scale = _dtype_io.load(desc.scale.dtype, "scale", "0")
        self.factor = f"1.0f / {scale}" if desc.scale_mode == "divide" else scale
        # masked where kv > q + offset
        self.offset = None if desc.causal is None else (0 if desc.causal == "top_left" else self.skv - self.sq)

    def bases(self, linear: str) -> str:
        return _batch_offsets(self.batch, {_SHORT[n]: s[:-2] for n, s in self.strides.items()}, linear)

    def row(self, name: str, r: str) -> str:
        return f"base_{_SHORT[name]} + (ulong)({r}) * {self.strides[name][-2]}UL"

    def load(self, name: str, base: str, c: str) -> str:
        return _dtype_io.load(self.mds[name].dtype, name, f"{base} + (ulong)({c}) * {self.strides[name][-1]}UL")

    def store(self, name: str, base: str, c: str, value: str) -> str:
        return _dtype_io.store(self.mds[name].dtype, name, f"{base} + (ulong)({c}) * {self.strides[name][-1]}UL",
                               value)

    def mask(self, i: str, j: str) -> str:
        return self.load("mask", f"base_m + (ulong)({i}) * {self.strides['mask'][-2]}UL", j)

    def stat(self, i: str, name: str = "stats") -> str:
        return _dtype_io.load("f32", name, self.row(name, i))

    def row_dot(self, target: str, doi: str, oi: str, extra: str = "") -> str:
        """``target = D_i``, the row's dO . O: products rounded to f32 (the graph's Multiply),
        summed with Kahan's compensation, near the graph's reference's single rounding (dP - D
        cancels, and dQ/dK's sums amplify any difference in dS). ``extra`` runs with ``g`` = dO."""
        return f"""{{
        float dsum = 0.0f, comp = 0.0f;
        for (int c = 0; c < {self.dv}; ++c) {{
            const float g = {self.load('diff_dst', doi, 'c')};
            const float prod = g * {self.load('dst', oi, 'c')};
            const float y = prod - comp;
            const float t = dsum + y;
            comp = (t - dsum) - y;
            dsum = t;{extra}
        }}
        {target} = dsum;
    }}"""

    def header(self) -> str:
        return _dtype_io.functions(loads=[self.mds[n].dtype for n in self.ins],
                                   stores=[self.mds[n].dtype for n in self.outs])

    def params(self) -> str:
        return ", ".join([_dtype_io.param(self.mds[n].dtype, n, const=True) for n in self.ins]
                         + [_dtype_io.param(self.mds[n].dtype, n, const=False) for n in self.outs])


def generate(desc: SdpaBackwardDesc, config: KernelConfig) -> KernelSpec:
    """OpenCL source of ``desc.part``'s kernel: rows as vector lanes on the CPU configuration,
    one row per work-item otherwise."""
    desc.check_supported()
    src = _Source(desc)
    lanes = config.vector_width
    body = (_dq_lanes if desc.part == "dq" else _dkdv_lanes)(src, lanes) if lanes > 1 else \
        (_dq_rows if desc.part == "dq" else _dkdv_rows)(src)
    rows = src.sq if desc.part == "dq" else src.skv
    groups = -(-rows // lanes)
    n = math.prod(src.batch) * groups
    # A CPU work-item already holds `lanes` rows: one per work-group, so that the few there are
    # (heads x rows / lanes) spread over every core; GPUs take a warp-friendly group of rows.
    local = 1 if lanes > 1 else min(config.local_size, 128)
    name = f"sdpa_bwd_{desc.part}"
    source = (src.header() + f"__kernel void {name}({src.params()}) {{\n"
              + f"    const ulong gid = get_global_id(0);\n    if (gid >= {n}UL) return;\n"
              + f"    const ulong b = gid / {groups}UL;\n    const int r0 = (int)(gid % {groups}UL) * {lanes};\n"
              + f"    {src.bases('b')}\n    const float factor = {src.factor};\n" + body + "}\n")
    return KernelSpec(source=source, name=name, arg_names=(*src.ins, *src.outs),
                      global_size=(padded_global(n, local),), local_size=(local,),
                      impl=f"ocl:sdpa_bwd:{desc.part}:{'lanes' if lanes > 1 else 'rows'}{lanes}:l{local}")


def _dq_rows(s: _Source) -> str:
    limit = s.skv if s.offset is None else f"min({s.skv}, i + {s.offset} + 1)"
    delta_out = f"\n    delta_out[{s.row('delta_out', 'i')}] = di;" if "delta_out" in s.outs else ""
    mask = f" + {s.mask('i', 'j')}" if s.has_mask else ""
    return f"""
    const int i = r0;
    const ulong qi = {s.row('query', 'i')}, oi = {s.row('dst', 'i')}, doi = {s.row('diff_dst', 'i')};
    float q_r[{s.d}], do_r[{s.dv}], acc[{s.d}];
    float di;
    {s.row_dot('di', 'doi', 'oi', ' do_r[c] = g;')}
    for (int c = 0; c < {s.d}; ++c) {{ q_r[c] = {s.load('query', 'qi', 'c')}; acc[c] = 0.0f; }}
    const float stat = {s.stat('i')};
    for (int j = 0; j < {limit}; ++j) {{
        const ulong kj = {s.row('key', 'j')}, vj = {s.row('value', 'j')};
        float sc = 0.0f;
        for (int c = 0; c < {s.d}; ++c) sc += q_r[c] * {s.load('key', 'kj', 'c')};
        const float x = sc * factor{mask};
        const float p = exp(x - stat);
        float dp = 0.0f;
        for (int c = 0; c < {s.dv}; ++c) dp += do_r[c] * {s.load('value', 'vj', 'c')};
        const float ds = p * (dp - di) * factor;
        for (int c = 0; c < {s.d}; ++c) acc[c] += ds * {s.load('key', 'kj', 'c')};
    }}
    const ulong dqi = {s.row('diff_query', 'i')};
    for (int c = 0; c < {s.d}; ++c) {{ {s.store('diff_query', 'dqi', 'c', 'acc[c]')} }}{delta_out}
"""


def _dkdv_rows(s: _Source) -> str:
    start = "0" if s.offset is None else f"max(0, j - {s.offset})"
    mask = f" + {s.mask('i', 'j')}" if s.has_mask else ""
    return f"""
    const int j = r0;
    const ulong kj = {s.row('key', 'j')}, vj = {s.row('value', 'j')};
    float k_r[{s.d}], v_r[{s.dv}], dk[{s.d}], dv[{s.dv}];
    for (int c = 0; c < {s.d}; ++c) {{ k_r[c] = {s.load('key', 'kj', 'c')}; dk[c] = 0.0f; }}
    for (int c = 0; c < {s.dv}; ++c) {{ v_r[c] = {s.load('value', 'vj', 'c')}; dv[c] = 0.0f; }}
    for (int i = {start}; i < {s.sq}; ++i) {{
        const ulong qi = {s.row('query', 'i')}, oi = {s.row('dst', 'i')}, doi = {s.row('diff_dst', 'i')};
        float sc = 0.0f;
        for (int c = 0; c < {s.d}; ++c) sc += {s.load('query', 'qi', 'c')} * k_r[c];
        const float x = sc * factor{mask};
        const float p = exp(x - {s.stat('i')});
        float di, dp = 0.0f;
        {s.row_dot('di', 'doi', 'oi') if 'delta' not in s.ins else f'di = {s.stat("i", "delta")};'}
        for (int c = 0; c < {s.dv}; ++c) {{
            const float g = {s.load('diff_dst', 'doi', 'c')};
            dp += g * v_r[c];
            dv[c] += p * g;
        }}
        const float ds = p * (dp - di) * factor;
        for (int c = 0; c < {s.d}; ++c) dk[c] += ds * {s.load('query', 'qi', 'c')};
    }}
    const ulong dkj = {s.row('diff_key', 'j')}, dvj = {s.row('diff_value', 'j')};
    for (int c = 0; c < {s.d}; ++c) {{ {s.store('diff_key', 'dkj', 'c', 'dk[c]')} }}
    for (int c = 0; c < {s.dv}; ++c) {{ {s.store('diff_value', 'dvj', 'c', 'dv[c]')} }}
"""


def _lane_ids(lanes: int) -> str:
    return ", ".join(str(k) for k in range(lanes))


def _dq_lanes(s: _Source, lanes: int) -> str:
    vt, it = f"float{lanes}", f"int{lanes}"

    def delta_out(k: int) -> str:
        if "delta_out" not in s.outs:
            return ""
        return f"\n        delta_out[{s.row('delta_out', f'r0 + {k}')}] = di.s{k:x};"
    per_lane = []
    for k in range(lanes):
        lane = f"s{k:x}"
        per_lane.append(f"""    {{
        const int i = min(r0 + {k}, {s.sq - 1});
        const ulong qi = {s.row('query', 'i')}, oi = {s.row('dst', 'i')}, doi = {s.row('diff_dst', 'i')};
        for (int c = 0; c < {s.d}; ++c) q_r[c].{lane} = {s.load('query', 'qi', 'c')};
        {s.row_dot(f'di.{lane}', 'doi', 'oi', f' do_r[c].{lane} = g;')}
        stat.{lane} = {s.stat('i')};
    }}""")
    masks = "".join(f"\n        sc.s{k:x} += {s.mask(f'min(r0 + {k}, {s.sq - 1})', 'j')};" for k in range(lanes)) \
        if s.has_mask else ""
    limit: int | str = s.skv
    causal = ""
    if s.offset is not None:
        limit = f"min({s.skv}, r0 + {lanes - 1 + s.offset + 1})"
        causal = f"\n        p = select(p, ({vt})(0.0f), ({it})(j) > rows + {s.offset});"
    stores = "".join(f"""
    if (r0 + {k} < {s.sq}) {{
        const ulong dqi = {s.row('diff_query', f'r0 + {k}')};
        for (int c = 0; c < {s.d}; ++c) {{ {s.store('diff_query', 'dqi', 'c', f'acc[c].s{k:x}')} }}{delta_out(k)}
    }}""" for k in range(lanes))
    return f"""
    {vt} q_r[{s.d}], do_r[{s.dv}], acc[{s.d}], blk[{s.d}];
    float k_s[{s.d}];
    {vt} di, stat;
    const {it} rows = ({it})(r0) + ({it})({_lane_ids(lanes)});
""" + "\n".join(per_lane) + f"""
    for (int c = 0; c < {s.d}; ++c) acc[c] = blk[c] = 0.0f;
    for (int j = 0; j < {limit}; ++j) {{
        const ulong kj = {s.row('key', 'j')}, vj = {s.row('value', 'j')};
        {vt} sc = 0.0f;
        for (int c = 0; c < {s.d}; ++c) {{ k_s[c] = {s.load('key', 'kj', 'c')}; sc += q_r[c] * k_s[c]; }}
        sc = sc * factor;{masks}
        {vt} p = exp(sc - stat);{causal}
        {vt} dp = 0.0f;
        for (int c = 0; c < {s.dv}; ++c) dp += do_r[c] * {s.load('value', 'vj', 'c')};
        const {vt} ds = p * (dp - di) * factor;
        for (int c = 0; c < {s.d}; ++c) blk[c] += ds * k_s[c];
        if ((j & {_BLOCK - 1}) == {_BLOCK - 1}) {{
            for (int c = 0; c < {s.d}; ++c) {{ acc[c] += blk[c]; blk[c] = 0.0f; }}
        }}
    }}
    for (int c = 0; c < {s.d}; ++c) acc[c] += blk[c];""" + stores + "\n"


def _dkdv_lanes(s: _Source, lanes: int) -> str:
    vt, it = f"float{lanes}", f"int{lanes}"
    per_lane = "\n".join(f"""    {{
        const int j = min(r0 + {k}, {s.skv - 1});
        const ulong kj = {s.row('key', 'j')}, vj = {s.row('value', 'j')};
        for (int c = 0; c < {s.d}; ++c) k_r[c].s{k:x} = {s.load('key', 'kj', 'c')};
        for (int c = 0; c < {s.dv}; ++c) v_r[c].s{k:x} = {s.load('value', 'vj', 'c')};
    }}""" for k in range(lanes))
    masks = "".join(f"\n        sc.s{k:x} += {s.mask('i', f'min(r0 + {k}, {s.skv - 1})')};" for k in range(lanes)) \
        if s.has_mask else ""
    start, causal = "0", ""
    if s.offset is not None:
        start = f"max(0, r0 - {s.offset})"
        causal = f"\n        p = select(p, ({vt})(0.0f), cols > ({it})(i + {s.offset}));"
    stores = "".join(f"""
    if (r0 + {k} < {s.skv}) {{
        const ulong dkj = {s.row('diff_key', f'r0 + {k}')}, dvj = {s.row('diff_value', f'r0 + {k}')};
        for (int c = 0; c < {s.d}; ++c) {{ {s.store('diff_key', 'dkj', 'c', f'dk[c].s{k:x}')} }}
        for (int c = 0; c < {s.dv}; ++c) {{ {s.store('diff_value', 'dvj', 'c', f'dv[c].s{k:x}')} }}
    }}""" for k in range(lanes))
    return f"""
    {vt} k_r[{s.d}], v_r[{s.dv}], dk[{s.d}], dv[{s.dv}], bk[{s.d}], bv[{s.dv}];
    float q_s[{s.d}];
    const {it} cols = ({it})(r0) + ({it})({_lane_ids(lanes)});
""" + per_lane + f"""
    for (int c = 0; c < {s.d}; ++c) dk[c] = bk[c] = 0.0f;
    for (int c = 0; c < {s.dv}; ++c) dv[c] = bv[c] = 0.0f;
    for (int i = {start}; i < {s.sq}; ++i) {{
        const ulong qi = {s.row('query', 'i')}, oi = {s.row('dst', 'i')}, doi = {s.row('diff_dst', 'i')};
        {vt} sc = 0.0f;
        for (int c = 0; c < {s.d}; ++c) {{ q_s[c] = {s.load('query', 'qi', 'c')}; sc += q_s[c] * k_r[c]; }}
        sc = sc * factor;{masks}
        {vt} p = exp(sc - {s.stat('i')});{causal}
        float di;
        {s.row_dot('di', 'doi', 'oi') if 'delta' not in s.ins else f'di = {s.stat("i", "delta")};'}
        {vt} dp = 0.0f;
        for (int c = 0; c < {s.dv}; ++c) {{
            const float g = {s.load('diff_dst', 'doi', 'c')};
            dp += g * v_r[c];
            bv[c] += p * g;
        }}
        const {vt} ds = p * (dp - di) * factor;
        for (int c = 0; c < {s.d}; ++c) bk[c] += ds * q_s[c];
        if ((i & {_BLOCK - 1}) == {_BLOCK - 1}) {{
            for (int c = 0; c < {s.d}; ++c) {{ dk[c] += bk[c]; bk[c] = 0.0f; }}
            for (int c = 0; c < {s.dv}; ++c) {{ dv[c] += bv[c]; bv[c] = 0.0f; }}
        }}
    }}
    for (int c = 0; c < {s.d}; ++c) dk[c] += bk[c];
    for (int c = 0; c < {s.dv}; ++c) dv[c] += bv[c];""" + stores + "\n"


# -- reference -------------------------------------------------------------------------------------


def reference(query, key, value, dst, diff_dst, stats, *, scale=None, scale_mode: str = "multiply",
              mask=None, causal: str | None = None) -> dict[str, np.ndarray]:
    """``{"diff_query", "diff_key", "diff_value", "delta"}`` in float64 from user-facing values (bf16 as
    float32), computed as the graph does: P from ``stats``, dS = P (dO V^T - rowsum(dO O))."""
    q, k, v, o, do, st = (_dtype_io.widen(x) for x in (query, key, value, dst, diff_dst, stats))
    factor = 1.0
    if scale is not None:
        factor = float(_dtype_io.widen(scale).reshape(-1)[0])
        if scale_mode == "divide":
            factor = 1.0 / factor
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * factor
    if mask is not None:
        s = s + _dtype_io.widen(mask)
    sq, skv = s.shape[-2:]
    if causal is not None:
        offset = 0 if causal == "top_left" else skv - sq
        s = np.where(np.arange(skv)[None, :] > np.arange(sq)[:, None] + offset, -np.inf, s)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - st)
    dp = np.matmul(do, np.swapaxes(v, -1, -2))
    delta = np.sum(do * o, axis=-1, keepdims=True)
    ds = p * (dp - delta) * factor
    return {"diff_query": np.matmul(ds, k), "diff_key": np.matmul(np.swapaxes(ds, -1, -2), q),
            "diff_value": np.matmul(np.swapaxes(p, -1, -2), do), "delta": delta}


def desc_reference(desc: SdpaBackwardDesc, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The part's outputs, stored as their data types."""
    got = reference(inputs["query"], inputs["key"], inputs["value"], inputs["dst"], inputs["diff_dst"],
                    inputs["stats"], scale=inputs.get("scale"), scale_mode=desc.scale_mode,
                    mask=inputs.get("mask"), causal=desc.causal)
    names = ("diff_query",) if desc.part == "dq" else ("diff_key", "diff_value")
    out = {n: _dtype_io.store_reference(got[n].astype(np.float32), getattr(desc, n).dtype) for n in names}
    if desc.delta_out is not None:
        out["delta_out"] = got["delta"].astype(np.float32)
    return out


def tolerance_of(desc: SdpaBackwardDesc) -> float:
    # Sums of Skv (or Sq) products of head-size dot products in f32, as the forward's figure
    # (kernels/sdpa.py) grows with the head size, plus one rounding step of the stored type.
    d = desc.query.dims[-1]
    out = desc.diff_query if desc.part == "dq" else desc.diff_key
    dtype = out.dtype if out is not None else desc.query.dtype
    return 1e-5 * max(1.0, d / 64) + _dtype_io.EPSILON[dtype]


register(SdpaBackwardDesc, generate=generate, reference=desc_reference, tolerance=tolerance_of)
