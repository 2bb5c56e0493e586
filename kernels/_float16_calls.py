"""Float16 arguments to OpenCL built-ins, passed as two float8 halves where the device needs it.

The CPU kernels hand whole float16 vectors to built-ins (``exp``, ``log``, ...) because PoCL keeps
them as calls and one call per 16 lanes amortises it. PoCL 3.0 (LLVM 14) on an AMD Zen 4 compiles
kernels for "znver3", which has no AVX-512, yet links its AVX-512 built-in library: a float16
argument leaves the kernel in two 256-bit registers and the library reads one 512-bit register,
so the call computes garbage or crashes the process. Where the device says so
(``KernelConfig.split_float16_calls``), ``program_source`` puts overloads in front of the kernel
that call the built-in on each float8 half (a width whose ABI both sides agree on) and route the
built-in's name to them. Functions defined in the program itself are compiled for one target and
need nothing.
"""

from __future__ import annotations

import re

from ._spec import KernelConfig, KernelSpec

# Built-ins the generators call with float vectors: one float argument, two, and the relational
# ones that answer with an int vector.
UNARY = (
    "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "cbrt", "tanh", "sinh", "cosh",
    "erf", "erfc", "sin", "cos", "tan", "atan", "rint", "round", "floor", "ceil", "trunc", "fabs",
)
BINARY = ("pow", "powr", "copysign", "fmax", "fmin", "fmod", "atan2", "hypot", "fdim")
PREDICATES = ("isnan", "isinf", "isfinite", "signbit")
_WIDTHS = ("float", "float2", "float4", "float8")
_INTS = {"float": "int", "float2": "int2", "float4": "int4", "float8": "int8"}
_CALLED = re.compile(r"\b(" + "|".join(UNARY + BINARY + PREDICATES) + r")\s*\(")


def _overloads(name: str) -> str:
    wrapper = f"tdnn_h_{name}"
    attr = "static __attribute__((overloadable))"
    lines = []
    if name in UNARY:
        lines += [f"{attr} {t} {wrapper}({t} x) {{ return {name}(x); }}" for t in _WIDTHS]
        lines.append(f"{attr} float16 {wrapper}(float16 x) {{ return (float16)({name}(x.lo), {name}(x.hi)); }}")
        macro = f"#define {name}(x) {wrapper}(x)"
    elif name in BINARY:
        lines += [f"{attr} {t} {wrapper}({t} x, {t} y) {{ return {name}(x, y); }}" for t in _WIDTHS]
        lines.append(f"{attr} float16 {wrapper}(float16 x, float16 y) "
                     f"{{ return (float16)({name}(x.lo, y.lo), {name}(x.hi, y.hi)); }}")
        macro = f"#define {name}(x, y) {wrapper}(x, y)"
    else:
        lines += [f"{attr} {_INTS[t]} {wrapper}({t} x) {{ return {name}(x); }}" for t in _WIDTHS]
        lines.append(f"{attr} int16 {wrapper}(float16 x) {{ return (int16)({name}(x.lo), {name}(x.hi)); }}")
        macro = f"#define {name}(x) {wrapper}(x)"
    # PoCL renames built-ins with object-like macros (exp -> _cl_exp): the overloads above use
    # that name; from here on the built-in's name means the overload.
    return "\n".join(lines + [f"#undef {name}", macro])


def split_float16_calls(source: str) -> str:
    """``source`` with every built-in it calls (of those listed) routed through overloads that
    split float16 arguments into float8 halves."""
    called = sorted(set(_CALLED.findall(source)))
    if not called:
        return source
    return "\n".join(_overloads(name) for name in called) + "\n" + source


def program_source(spec: KernelSpec, config: KernelConfig) -> str:
    """The OpenCL C the device compiles for ``spec`` under ``config``."""
    return split_float16_calls(spec.source) if config.split_float16_calls else spec.source
