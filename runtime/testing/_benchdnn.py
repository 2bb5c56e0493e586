"""benchdnn's graph driver language: harness files, their options, and the graph rewrites.

oneDNN's CI runs its graph tests as ``benchdnn --graph --batch=test_graph_ci``: a harness file is
a stream of options (``--reset``, ``--in-shapes=…``, ``--op-attrs=…``, …) where each
``--case=FILE`` runs the graph with the options set so far, and ``--batch=FILE`` reads another
harness in place. A comma in an option's value gives alternatives; a case runs once per element
of the cartesian product of every option's alternatives (benchdnn's order: the first option
varies slowest). This module turns such a stream into frozen ``Run`` records and applies one
run's options to a graph document (``rewrite``); it neither runs graphs nor touches a device.

Syntax errors (an unknown option, a malformed value) are ``InvalidArgumentError`` at parse time:
the command line fails before anything runs. Options that are well formed but do not fit a
particular graph (an id it lacks, an attribute value of the wrong type) fail that run alone, as
benchdnn's INVALID_ARGUMENTS.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import attrs

from .._values._errors import InvalidArgumentError
from .._values._fpmath import FPMATH_MODES

# Options a --reset puts back, with benchdnn's defaults. --mode is a benchdnn-wide knob that
# --reset leaves alone, as benchdnn does.
DEFAULTS: dict[str, str] = {
    "mb": "0",
    "in-shapes": "",
    "op-attrs": "",
    "op-kind": "",
    "dt": "",
    "tensor-property": "",
    "attr-fpmath": "",
    "expected-n-partitions": "1",
}
# benchdnn's modes: check, performance, both, and list (L: each run's line, nothing run).
MODES = ("C", "P", "CP", "L")
PROPERTIES = ("undef", "variable", "constant", "host_scalar")
GLOBAL_DTS = ("undef", "f32", "bf16", "f16")
# Every data type oneDNN Graph names; which of them triodnn runs is the driver's business.
ONEDNN_DTYPES = ("undef", "f32", "f16", "bf16", "f64", "s64", "s32", "s8", "u8", "boolean", "f8_e5m2",
                 "f8_e4m3", "s4", "u4", "f4_e2m1", "f4_e3m0", "e8m0")
# Every op kind oneDNN Graph names: one triodnn lacks is UNIMPLEMENTED, any other kind INVALID.
ONEDNN_OP_KINDS = frozenset((
    "Abs", "AbsBackward", "Add", "AvgPool", "AvgPoolBackward", "BatchNormForwardTraining",
    "BatchNormInference", "BatchNormTrainingBackward", "BiasAdd", "BiasAddBackward", "Clamp",
    "ClampBackward", "Concat", "Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights",
    "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights", "Dequantize",
    "Divide", "Dropout", "DynamicDequantize", "DynamicQuantize", "Elu", "EluBackward", "End", "Exp", "GELU",
    "GELUBackward", "GenIndex", "GreaterEqual", "GroupNorm", "HardSigmoid", "HardSigmoidBackward",
    "HardSwish", "HardSwishBackward", "Interpolate", "InterpolateBackward", "LayerNorm",
    "LayerNormBackward", "LeakyReLU", "Log", "LogSoftmax", "LogSoftmaxBackward", "MatMul", "Maximum",
    "MaxPool", "MaxPoolBackward", "Minimum", "Mish", "MishBackward", "Multiply", "Pow", "PReLU",
    "PReLUBackward", "Quantize", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReLU", "ReLUBackward", "Reorder", "RMSNorm", "Round",
    "Select", "Sigmoid", "SigmoidBackward", "SoftMax", "SoftMaxBackward", "SoftPlus",
    "SoftPlusBackward", "Sqrt", "SqrtBackward", "Square", "SquaredDifference", "StaticReshape",
    "StaticTranspose", "Subtract", "Tanh", "TanhBackward", "TypeCast", "Wildcard",
))
# Options of the command line only (read by argparse), skipped here with their value.
COMMAND_LINE_ONLY = ("engine", "policy", "trace", "verbose", "repeat")
_MAX_DEPTH = 16


@attrs.frozen
class ShapeRewrite:
    """One ``--in-shapes`` entry: a new shape (None keeps it), and a layout given as a tag
    (``acbd``) or explicit strides (None: dense row-major when the shape changes)."""
    shape: tuple[int, ...] | None
    tag: str | None = None
    strides: tuple[int, ...] | None = None


@attrs.frozen
class Run:
    """One test: a graph file and the options it runs with (as written, for the repro line)."""
    case: str                 # as the harness named it
    path: Path                # where it was found
    mode: str = "C"
    mb: str = "0"
    in_shapes: str = ""
    op_attrs: str = ""
    op_kind: str = ""
    dt: str = ""
    tensor_property: str = ""
    attr_fpmath: str = ""
    expected_n_partitions: str = "1"

    def repro(self) -> str:
        """benchdnn's ``__REPRO`` line: the options that differ from the defaults."""
        parts = [f"--mode={self.mode}"]
        for name, default in DEFAULTS.items():
            value = getattr(self, name.replace("-", "_"))
            if value != default:
                parts.append(f"--{name}={value}")
        parts.append(f"--case={self.case}")
        return " ".join(parts)


# --- values --------------------------------------------------------------------------------

def _fail(option: str, value: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"--{option}={value}: {why}")


def _id(option: str, value: str, text: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise _fail(option, value, f"{text!r} is not a non-negative integer id")
    return int(text)


def _entries(option: str, value: str) -> list[tuple[int, str]]:
    """``ID:REST+ID:REST`` as (id, rest) pairs; an empty value has none."""
    if not value:
        return []
    out = []
    for item in value.split("+"):
        key, sep, rest = item.partition(":")
        if not sep:
            raise _fail(option, value, f"entry {item!r} is not ID:VALUE")
        out.append((_id(option, value, key), rest))
    return out


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split("x"))


def parse_in_shapes(value: str) -> dict[int, ShapeRewrite]:
    """``ID:SHAPE[*TAG|*STRIDES]+…``; ``ID:-`` or ``ID:scalar`` is 0-D, ``ID:*TAG`` keeps the
    shape, ``ID:TAG`` (benchdnn's older form) too."""
    out = {}
    for lt_id, rest in _entries("in-shapes", value):
        shape_text, star, layout = rest.partition("*")
        if not star and re.fullmatch(r"[a-z]+", shape_text) and shape_text != "scalar":
            shape_text, layout = "", shape_text
        shape: tuple[int, ...] | None
        try:
            if shape_text in ("-", "scalar"):
                shape = ()
            elif shape_text == "":
                shape = None
            else:
                shape = _int_list(shape_text)
        except ValueError:
            raise _fail("in-shapes", value, f"shape {shape_text!r} of tensor {lt_id} is not AxBxC") from None
        if shape is not None and any(d < 0 for d in shape):
            raise _fail("in-shapes", value, f"shape {shape_text!r} of tensor {lt_id} has a negative dim")
        tag: str | None = None
        strides: tuple[int, ...] | None = None
        if layout:
            if re.fullmatch(r"[a-z]+", layout):
                if sorted(layout) != [chr(ord("a") + i) for i in range(len(layout))]:
                    raise _fail("in-shapes", value, f"tag {layout!r} of tensor {lt_id} is not a permutation of "
                                                    f"{''.join(chr(ord('a') + i) for i in range(len(layout)))}")
                tag = layout
            else:
                try:
                    strides = _int_list(layout)
                except ValueError:
                    raise _fail("in-shapes", value, f"layout {layout!r} of tensor {lt_id} is neither a tag "
                                                    "(abcd) nor strides (AxBxC)") from None
            rank = len(layout) if tag is not None or strides is None else len(strides)
            if shape is not None and rank != len(shape):
                raise _fail("in-shapes", value, f"layout {layout!r} of tensor {lt_id} has rank {rank}, "
                                                f"its shape {len(shape)}")
        elif star or shape is None:
            raise _fail("in-shapes", value, f"tensor {lt_id} has no shape and no layout")
        out[lt_id] = ShapeRewrite(shape, tag, strides)
    return out


def parse_op_attrs(value: str) -> dict[int, dict[str, str]]:
    """``ID:NAME:VALUE[*NAME:VALUE]+…`` as {op id: {name: value text}}; values are typed later,
    by the attribute's type in the graph."""
    out: dict[int, dict[str, str]] = {}
    for op_id, rest in _entries("op-attrs", value):
        attrs_ = out.setdefault(op_id, {})
        for pair in rest.split("*"):
            name, sep, text = pair.partition(":")
            if not sep or not re.fullmatch(r"[a-z_0-9]+", name) or text == "":
                raise _fail("op-attrs", value, f"{pair!r} of op {op_id} is not NAME:VALUE")
            attrs_[name] = text
    return out


def parse_op_kind(value: str) -> dict[int, str]:
    out = {}
    for op_id, kind in _entries("op-kind", value):
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", kind):
            raise _fail("op-kind", value, f"{kind!r} of op {op_id} is not an op kind")
        out[op_id] = kind
    return out


def parse_dt(value: str) -> tuple[str | None, dict[int, str]]:
    """``DT`` (every floating tensor) or ``ID:DT+…`` (those tensors), never both."""
    if not value or value == "undef":
        return None, {}
    if ":" not in value:
        if value not in GLOBAL_DTS:
            raise _fail("dt", value, f"a graph-wide data type is one of {', '.join(GLOBAL_DTS)}")
        return value, {}
    out = {}
    for lt_id, dt in _entries("dt", value):
        if dt not in ONEDNN_DTYPES:
            raise _fail("dt", value, f"{dt!r} of tensor {lt_id} is not one of {', '.join(ONEDNN_DTYPES)}")
        out[lt_id] = dt
    return None, out


def parse_tensor_property(value: str) -> dict[int, str]:
    out = {}
    for lt_id, prop in _entries("tensor-property", value):
        if prop not in PROPERTIES:
            raise _fail("tensor-property", value, f"{prop!r} of tensor {lt_id} is not one of {', '.join(PROPERTIES)}")
        out[lt_id] = prop
    return out


_TRUE, _FALSE = ("1", "true"), ("0", "false")


def parse_attr_fpmath(value: str) -> tuple[str, bool] | None:
    if not value:
        return None
    mode, sep, to_int = value.partition(":")
    if mode not in FPMATH_MODES:
        raise _fail("attr-fpmath", value, f"mode {mode!r} is not one of {', '.join(FPMATH_MODES)}")
    if sep and to_int.lower() not in _TRUE + _FALSE:
        raise _fail("attr-fpmath", value, f"apply-to-int {to_int!r} is not a bool (0, 1, true, false)")
    return mode, to_int.lower() in _TRUE


def _non_negative(option: str, value: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise _fail(option, value, "not a non-negative integer")
    return int(value)


def parse_mode(value: str) -> str:
    mode = value.upper()
    if mode not in MODES:
        raise _fail("mode", value, f"not one of {', '.join(MODES)} (either case)")
    return mode


_VALIDATORS = {
    "mb": lambda v: _non_negative("mb", v),
    "in-shapes": parse_in_shapes,
    "op-attrs": parse_op_attrs,
    "op-kind": parse_op_kind,
    "dt": parse_dt,
    "tensor-property": parse_tensor_property,
    "attr-fpmath": parse_attr_fpmath,
    "expected-n-partitions": lambda v: _non_negative("expected-n-partitions", v),
}


# --- harness files -------------------------------------------------------------------------

def tokens(text: str) -> list[str]:
    """benchdnn reads words, not lines: an option may sit anywhere; ``#`` starts a comment."""
    words = []
    for line in text.splitlines():
        words += line.split("#", 1)[0].split()
    return words


@attrs.define
class _State:
    options: dict[str, tuple[str, ...]]
    mode: tuple[str, ...] = ("C",)
    runs: list[Run] = attrs.field(factory=list)


def resolve(name: str, base: Path) -> Path:
    """A harness's file name: as given if absolute, else relative to ``base`` (the harness's
    directory) or one of its ancestors, as benchdnn finds CI files relative to its inputs root,
    or else to the current directory."""
    path = Path(name)
    if path.is_absolute():
        if path.exists():
            return path
    else:
        for folder in (base, *base.parents, Path.cwd()):
            if (folder / path).exists():
                return folder / path
    raise InvalidArgumentError(f"{name!r} is not found in {base}, its parent folders or {Path.cwd()}")


def parse(words: list[str], *, base: Path, defaults: dict[str, str] | None = None,
          mode: str = "C", state: _State | None = None, depth: int = 0) -> list[Run]:
    """The runs a token stream asks for; ``base`` resolves its relative file names."""
    if state is None:
        options: dict[str, tuple[str, ...]] = {k: (v,) for k, v in DEFAULTS.items()}
        for name, value in (defaults or {}).items():
            options[name] = _alternatives(name, value)
        state = _State(options, _alternatives("mode", mode))
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise InvalidArgumentError(f"{word!r} is not an option (--NAME=VALUE)")
        name, sep, value = word[2:].partition("=")
        takes_value = name != "reset"
        if takes_value and not sep:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise InvalidArgumentError(f"--{name} needs a value")
            value, i = words[i + 1], i + 1
        i += 1
        if name == "reset":
            if sep:
                raise InvalidArgumentError(f"--reset takes no value, got {word!r}")
            state.options = {k: (v,) for k, v in DEFAULTS.items()}
        elif name == "case":
            _add_runs(state, value, resolve(value, base))
        elif name == "batch":
            _batch(state, value, resolve(value, base), depth)
        elif name == "mode":
            state.mode = _alternatives(name, value)
        elif name in DEFAULTS:
            state.options[name] = _alternatives(name, value)
        elif name in COMMAND_LINE_ONLY and depth == 0:
            pass
        else:
            raise InvalidArgumentError(f"unknown option --{name} (in {word!r})")
    return state.runs


def trailing_options(words: list[str]) -> list[str]:
    """The options of ``words`` that come after its last ``--case`` or ``--batch``: benchdnn
    applies an option to the cases after it, so these apply to none (the command-line-only ones,
    which apply to the whole run wherever they stand, excepted)."""
    last, i, trailing = None, 0, []
    spans = []
    while i < len(words):
        name, sep, _ = words[i].removeprefix("--").partition("=")
        takes_next = not sep and name != "reset" and i + 1 < len(words) and not words[i + 1].startswith("--")
        spans.append((name, i, i + 2 if takes_next else i + 1))
        i = spans[-1][2]
    for index, (name, _, _) in enumerate(spans):
        if name in ("case", "batch"):
            last = index
    if last is None:
        return []
    for name, start, end in spans[last + 1:]:
        if name not in COMMAND_LINE_ONLY:
            trailing.append(" ".join(words[start:end]))
    return trailing


def _alternatives(name: str, value: str) -> tuple[str, ...]:
    """A value's comma alternatives, each checked now so a typo fails before anything runs."""
    values = tuple(value.split(","))
    for v in values:
        if name == "mode":
            parse_mode(v)
        elif v:
            _VALIDATORS[name](v)
    if name == "mode":
        return tuple(parse_mode(v) for v in values)
    return values


def _batch(state: _State, name: str, path: Path, depth: int) -> None:
    if path.is_dir():
        # triodnn's own form: every graph of a folder, each a case with the current options.
        for case in sorted(path.glob("*.json")):
            _add_runs(state, str(case), case)
        return
    if depth >= _MAX_DEPTH:
        raise InvalidArgumentError(f"--batch={name}: harness files nest deeper than {_MAX_DEPTH} (a cycle?)")
    parse(tokens(path.read_text()), base=path.parent, state=state, depth=depth + 1)


def _add_runs(state: _State, name: str, path: Path) -> None:
    names = list(DEFAULTS)
    for mode, *values in itertools.product(state.mode, *(state.options[n] for n in names)):
        fields = {n.replace("-", "_"): v for n, v in zip(names, values)}
        state.runs.append(Run(name, path, mode, **fields))


def parse_file(path, *, defaults: dict[str, str] | None = None, mode: str = "C") -> list[Run]:
    """The runs of one harness file."""
    path = Path(path)
    return parse(tokens(path.read_text()), base=path.parent, defaults=defaults, mode=mode, depth=1)


# --- rewriting a graph document ------------------------------------------------------------

_FLOATING = ("f32", "bf16", "f16")
# Normalization parameters (gamma, beta, mean, variance) stay f32 under a graph-wide --dt, as
# benchdnn leaves them: only the data tensors change.
_NORMS = ("BatchNormInference", "BatchNormForwardTraining", "LayerNorm", "GroupNorm", "RMSNorm",
          "BatchNormTrainingBackward", "LayerNormBackward")


def _tensors(document: dict):
    for op in document["graph"]:
        yield from op.get("inputs", [])
        yield from op.get("outputs", [])


def _dense(shape, order: str | None = None) -> list[int]:
    """Strides of ``shape`` laid out in ``order`` (a tag: its first letter the outermost dim)."""
    rank = len(shape)
    order = order or "".join(chr(ord("a") + i) for i in range(rank))
    strides = [0] * rank
    step = 1
    for letter in reversed(order):
        d = ord(letter) - ord("a")
        strides[d] = step
        step *= max(shape[d], 1)
    return strides


def _order(strides) -> str | None:
    """The tag of existing strides (None when they are unknown), to keep a layout under --mb."""
    if not strides or any(s < 0 for s in strides):
        return None
    dims = sorted(range(len(strides)), key=lambda d: -strides[d])  # stable: ties keep dim order
    return "".join(chr(ord("a") + d) for d in dims)


def _integer(text: str) -> int:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return int(value)


def _typed(op_id: int, name: str, text: str, kind: str | None):
    """An --op-attrs value as the attribute's JSON type (guessed when the graph lacks it)."""
    if kind is None:
        number = r"-?[\d.]+(e-?\d+)?"
        if re.fullmatch(r"-?\d+", text):
            kind = "s64"
        elif re.fullmatch(r"-?\d+(x-?\d+)+", text):
            kind = "s64[]"
        elif re.fullmatch(number, text):
            kind = "f32"
        elif re.fullmatch(f"{number}(x{number})+", text):
            kind = "f32[]"
        else:
            kind = "string"
    try:
        if kind == "bool":
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return kind, text.lower() in _TRUE
        # Integers read as benchdnn's string_to_shape reads them (atof, then truncation toward
        # zero): "6.5x12.2" is sizes 6x12 there, so it is here.
        if kind == "s64":
            return kind, _integer(text)
        if kind == "f32":
            return kind, float(text)
        if kind == "s64[]":
            return kind, [] if text == "-" else [_integer(v) for v in text.split("x")]
        if kind == "f32[]":
            return kind, [] if text == "-" else [float(v) for v in text.split("x")]
        return kind, text
    except ValueError:
        raise InvalidArgumentError(f"--op-attrs: {name}:{text} of op {op_id} is not a {kind}") from None


def rewrite(document: dict, run: Run) -> dict:
    """``document`` (a parsed graph JSON, left untouched) with ``run``'s options applied. Shapes
    of produced tensors become unknown whenever an option may change them: triodnn infers them
    again at compile time, as benchdnn's driver does before it builds the graph."""
    document = json.loads(json.dumps(document))
    ops = document.get("graph")
    if not isinstance(ops, list):
        return document  # from_dict names what is wrong
    by_op = {op.get("id"): op for op in ops}
    ids = {t.get("id") for t in _tensors(document)}
    reshaped = False

    for op_id, kind in parse_op_kind(run.op_kind).items():
        if op_id not in by_op:
            raise InvalidArgumentError(f"--op-kind names op {op_id}, not in the graph")
        if kind == "undef":
            _remove_op(document, by_op.pop(op_id))
            reshaped = True
        else:
            by_op[op_id]["kind"] = kind

    for op_id, changes in parse_op_attrs(run.op_attrs).items():
        if op_id not in by_op:
            raise InvalidArgumentError(f"--op-attrs names op {op_id}, not in the graph")
        op_attrs = by_op[op_id].setdefault("attrs", {})
        for name, text in changes.items():
            if text == "undef":
                op_attrs.pop(name, None)
            else:
                kind, value = _typed(op_id, name, text, op_attrs.get(name, {}).get("type"))
                op_attrs[name] = {"type": kind, "value": value}
        reshaped = True

    produced = {t["id"] for op in document["graph"] for t in op.get("outputs", [])}
    consumed = {t["id"] for op in document["graph"] for t in op.get("inputs", [])}
    inputs = consumed - produced
    # benchdnn rewrites the tensors it meets among the graph's ops: an id the graph lacks is never
    # met, so it is left out silently (a harness line shared by graphs of different ids runs).
    shapes = {i: rw for i, rw in parse_in_shapes(run.in_shapes).items() if i in ids}
    internal = sorted(i for i in shapes if i in produced and i in consumed)
    if internal:
        raise InvalidArgumentError(f"--in-shapes names internal tensors {internal}; only graph inputs "
                                   "and outputs may be rewritten")
    mb = int(run.mb)
    batch = _batch_inputs(document, inputs) if mb else set()
    new_shapes: dict[int, tuple[list, list]] = {}
    for t in _tensors(document):
        lt_id = t["id"]
        if lt_id in new_shapes or lt_id not in inputs and lt_id not in shapes:
            continue
        shape = list(t.get("shape") or [])
        strides = list(t.get("stride") or [])
        if lt_id in shapes:
            rw = shapes[lt_id]
            if rw.shape is not None:
                shape, strides = list(rw.shape), _dense(rw.shape)
            if rw.tag is not None or rw.strides is not None:
                rank = len(rw.tag) if rw.tag else len(rw.strides or ())
                if rank != len(shape):
                    raise InvalidArgumentError(f"--in-shapes: layout of tensor {lt_id} has rank {rank}, "
                                               f"its shape {shape} rank {len(shape)}")
                strides = _dense(shape, rw.tag) if rw.tag else list(rw.strides or ())
        if lt_id in batch and shape:
            order = _order(strides)
            shape[0] = mb
            strides = _dense(shape, order)
        new_shapes[lt_id] = (shape, strides)
    reshaped = reshaped or bool(new_shapes and (shapes or mb))
    outputs_named = {i for i in shapes if i not in inputs}
    for t in _tensors(document):
        if t["id"] in new_shapes and (t["id"] in shapes or mb):
            t["shape"], t["stride"] = (list(x) for x in new_shapes[t["id"]])
            t["layout_type"] = "strided"
        elif reshaped and t["id"] in produced and t["id"] not in outputs_named:
            t["shape"], t["stride"] = None, None

    dt_all, dt_by_id = parse_dt(run.dt)
    missing = sorted(set(dt_by_id) - ids)
    if missing:
        raise InvalidArgumentError(f"--dt names logical tensors {missing}, not in the graph")
    if dt_all:
        kept = set()
        for op in document["graph"]:
            if op.get("kind") in _NORMS:
                data = {0, 1} if op["kind"].endswith("Backward") else {0}
                kept |= {t["id"] for j, t in enumerate(op.get("inputs", [])) if j not in data}
                kept |= {t["id"] for j, t in enumerate(op.get("outputs", [])) if j != 0}
        for t in _tensors(document):
            if t.get("dtype") in _FLOATING and t["id"] not in kept:
                t["dtype"] = dt_all
    for t in _tensors(document):
        if t["id"] in dt_by_id:
            t["dtype"] = dt_by_id[t["id"]]

    props = parse_tensor_property(run.tensor_property)
    missing = sorted(set(props) - ids)
    if missing:
        raise InvalidArgumentError(f"--tensor-property names logical tensors {missing}, not in the graph")
    for t in _tensors(document):
        if t["id"] in props:
            t["property_type"] = props[t["id"]]

    fpmath = parse_attr_fpmath(run.attr_fpmath)
    if fpmath:
        document["fpmath_mode"], document["fpmath_mode_apply_to_int"] = fpmath[0], fpmath[1]
    return document


# benchdnn's --mb rules (deserialize.cpp, check_tensor_with_mb): binary ops pass the minibatch
# through either input of the larger rank, backward ops through their first two inputs, ops
# whose attributes fix a shape take none, any other op through its input 0 (Concat all).
_MB_BINARY = frozenset({"Add", "Divide", "Maximum", "Minimum", "Multiply", "Pow", "SquaredDifference",
                        "Subtract"})
_MB_FIXED_SHAPE = frozenset({"AvgPoolBackward", "ConvolutionBackwardData", "ConvolutionBackwardWeights",
                             "ConvTransposeBackwardWeights", "Interpolate", "InterpolateBackward",
                             "StaticReshape"})


def _batch_inputs(document: dict, inputs: set[int]) -> set[int]:
    """The graph inputs whose dim 0 is the minibatch, found as benchdnn does: following each
    input through its consumers. Judged on the shapes the graph was written with, so
    --in-shapes then --mb changes the new shape's dim 0."""
    consumers: dict[int, list[dict]] = {}
    for op in document["graph"]:
        for t in op.get("inputs", []):
            consumers.setdefault(t["id"], []).append(op)

    def rank(t) -> int:
        return len(t.get("shape") or [])

    def has_mb(lt_id: int, depth: int = 0) -> bool:
        if depth > len(document["graph"]):
            return False  # a cycle: from_dict reports it
        for op in consumers.get(lt_id, []):
            ins, kind = op.get("inputs", []), op.get("kind", "")
            ids = [t["id"] for t in ins]
            outs = op.get("outputs", [])
            if kind in _MB_FIXED_SHAPE:
                return False
            if kind.endswith("Backward"):
                if lt_id in ids[:2]:
                    continue
                if kind == "LayerNormBackward" and lt_id in ids[2:4] and rank(ins[0]) and \
                        (ins[ids.index(lt_id)].get("shape") or [None])[0] == ins[0]["shape"][0]:
                    continue
                return False
            if kind in _MB_BINARY and len(ins) == 2:
                largest = ids[0] if rank(ins[0]) >= rank(ins[1]) else ids[1]
                if (rank(ins[0]) == rank(ins[1]) and rank(ins[1]) and ins[1]["shape"][0] != 1) or lt_id == largest:
                    continue
                return False
            if kind == "PReLU" and len(ids) > 1 and lt_id == ids[1]:
                if rank(ins[0]) == rank(ins[1]):
                    continue
                return False
            if kind != "Concat" and lt_id != ids[0]:
                return False
            if kind == "End" or not outs:
                return True
            return has_mb(outs[0]["id"], depth + 1)
        return True

    ranked = {t["id"] for t in _tensors(document) if t["id"] in inputs and rank(t)}
    return {lt_id for lt_id in ranked if has_mb(lt_id)}


def _remove_op(document: dict, op: dict) -> None:
    """``--op-kind=ID:undef``: bypass the op. A unary op's input takes its output's place; a
    binary op keeps the input another op produces (its other input, a graph input, goes)."""
    ops = document["graph"]
    produced = {t["id"] for o in ops for t in o.get("outputs", [])}
    ins, outs = op.get("inputs", []), op.get("outputs", [])
    if len(outs) != 1 or not ins:
        raise InvalidArgumentError(f"--op-kind={op['id']}:undef: op {op['id']} ({op.get('kind')}) has "
                                   f"{len(ins)} inputs and {len(outs)} outputs; only ops with one output bypass")
    if len(ins) == 1:
        keep = ins[0]
    else:
        made = [t for t in ins if t["id"] in produced]
        if len(made) != 1:
            raise InvalidArgumentError(f"--op-kind={op['id']}:undef: op {op['id']} ({op.get('kind')}) has "
                                       f"{len(made)} inputs made by other ops; which to keep is ambiguous")
        keep = made[0]
    out_id = outs[0]["id"]
    ops.remove(op)
    for o in ops:
        o["inputs"] = [dict(keep) if t["id"] == out_id else t for t in o.get("inputs", [])]
    for key in ("input_ports", "output_ports"):
        if isinstance(document.get(key), list):
            document[key] = [keep["id"] if i == out_id else i for i in document[key]
                             if i in {t["id"] for t in _tensors(document)} or i == out_id]
