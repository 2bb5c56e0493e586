"""The operand side of fused attention: what each SDPA kernel generator (``sdpa_cpu``,
``sdpa_gpu``) writes to load query, key and value elements and to store dst, so that a fused
kernel computes what the op-by-op graph does. ``_Operands`` gives the float expression of an
element (a plain load of a float operand, or a load that dequantizes and rounds as the graph's
TypeCast), a score rounded to the graph's float type, a probability through the graph's
Quantize -> Dequantize, the float that dst's quantized store takes, and the OpenCL helpers
those expressions call. ``sdpa.generate`` builds one per descriptor and hands it to the generator it
picks (``ops``). The pieces shared with other quantized kernels (rounding, byte tables, quantized
stores) are ``_quantized_io``'s.
"""

from __future__ import annotations

from .._values._quantization import RANGES
from .._values._sdpa_desc import SdpaDesc
from . import _dtype_io
from ._quantized_io import quantized_value, rounded, rounding_functions, table, table_load, tabled
from ._spec import c_float


class _Operands:
    """Float expressions of query, key and value elements: a plain load of a float operand, or a
    load that dequantizes (``Quantization``: static scale and zero point in the source, or a
    group's run-time scale and zero point read beside the element) and rounds as the graph's
    TypeCast does. ``value(name, index, row, col)``: ``index`` the element's offset in its buffer,
    ``row``/``col`` its coordinates in the kernel's (…, rows, cols) view of the operand (a grouped
    scale's offset is computed from them and the batch offset ``off_ks``/``off_vs``...)."""

    TAGS = {"query": "q", "key": "k", "value": "v"}

    def __init__(self, desc: SdpaDesc, dtypes: dict[str, str], sa: dict[str, tuple[int, ...]]) -> None:
        self.desc, self.dtypes, self.sa = desc, dtypes, sa
        self.rounding = {q.round_out for q in self.quants.values()} - {"f32"}
        for quant in (desc.probs_quant, desc.dst_quant):
            if quant is not None:
                self.rounding |= {quant.round_in, quant.round_out} - {"f32"}
        if desc.score_rounding != "f32":
            self.rounding.add(desc.score_rounding)

    @property
    def quants(self):
        return {name: q for name in self.TAGS if (q := getattr(self.desc, f"{name}_quant")) is not None}

    @property
    def quantized(self) -> bool:
        return bool(self.quants)

    def functions(self) -> str:
        return rounding_functions(self.rounding) + "".join(
            table(name, quant) for name, quant in self.quants.items() if tabled(quant))

    def value(self, name: str, index: str, row: str, col: str) -> str:
        raw = _dtype_io.load(self.dtypes[name], name, index)
        quant = getattr(self.desc, f"{name}_quant")
        if quant is None:
            return raw
        if tabled(quant):
            return table_load(name, index)
        if not quant.grouped:
            zp = f" - {c_float(quant.zp)}" if quant.zp else ""
            return rounded(quant.round_out, f"(({raw}){zp}) * {c_float(quant.static_scale)}")
        tag = self.TAGS[name]
        gr, gc = quant.group

        def at(part: str) -> str:
            s_row, s_col = self.sa[f"{tag}{part[0]}"][-2:]
            r = f"({row})" if gr == 1 else f"(({row}) / {gr}UL)"
            c = f"({col})" if gc == 1 else f"(({col}) / {gc}UL)"
            return _dtype_io.load(self.dtypes[f"{name}_{part}"], f"{name}_{part}",
                                  f"off_{tag}{part[0]} + {r} * {s_row}UL + {c} * {s_col}UL")
        zp = f" - {at('zps')}" if getattr(self.desc, f"{name}_zps") is not None else ""
        return rounded(quant.round_out, f"(({raw}){zp}) * {at('scales')}")

    def score(self, expr: str, vector: bool = False) -> str:
        """A score op's result as the graph rounds it (bf16 scores of the int8 bf16 graphs)."""
        return rounded(self.desc.score_rounding, expr, vector)

    def probability(self, expr: str, vector: bool = False) -> str:
        """A normalised probability through the graph's Quantize -> Dequantize (``probs_quant``)."""
        quant = self.desc.probs_quant
        if quant is None:
            return expr
        t = "float16" if vector else "float"
        if quant.dtype not in RANGES:  # f8: through the type's store and load, lane by lane
            scale = f"({t})({c_float(quant.static_scale)})"
            through = f"sd_f8{'_v' if vector else ''}({rounded(quant.round_in, expr, vector)} / {scale})"
            return rounded(quant.round_out, f"{through} * {scale}", vector)
        zp = c_float(quant.zp)
        # Quantize divides by the scale, as oneDNN's src / scale (a product by the rounded
        # reciprocal would land on the other integer at some ties).
        # Round half to even by adding and taking away 1.5 * 2^23 (|x| < 2^22 here: a quantized
        # probability); rint() stays a call on PoCL.
        magic = f"({t})({c_float(12582912.0)})"
        scale = f"({t})({c_float(quant.static_scale)})"
        q = f"(({rounded(quant.round_in, expr, vector)} / {scale} + ({t})({zp}) + {magic}) - {magic})"
        clamped = f"sd_clampq{'_v' if vector else ''}({q})"  # clamp() is a call on PoCL; selects are not
        back = f"(({clamped}) - ({t})({zp})) * {scale}"
        return rounded(quant.round_out, back, vector)

    def probability_functions(self) -> str:
        quant = self.desc.probs_quant
        if quant is None:
            return ""
        if quant.dtype not in RANGES:
            lanes = ", ".join(f"round_{quant.dtype}(x.s{k:x})" for k in range(16))
            return (_dtype_io.f8_round_function(quant.dtype)
                    + f"static inline float sd_f8(const float x) {{ return round_{quant.dtype}(x); }}\n"
                    + f"static inline float16 sd_f8_v(const float16 x) {{ return (float16)({lanes}); }}\n")
        low, high = RANGES[quant.dtype]
        return "".join(
            f"static inline {t} sd_clampq{sfx}(const {t} x) {{ return x < ({t})({c_float(low)}) ? ({t})({c_float(low)})"
            f" : (x > ({t})({c_float(high)}) ? ({t})({c_float(high)}) : x); }}\n"
            for t, sfx in (("float", ""), ("float16", "_v")))

    def dst(self, expr: str) -> str:
        """The float ``store`` of dst's type takes: quantized (its store rounds and saturates)."""
        quant = self.desc.dst_quant
        if quant is None:
            return expr
        return quantized_value(quant, expr)
