"""The graph-op registry: every oneDNN Graph op kind triodnn knows, declared once.

An op kind is one ``GraphOp``: its schema (arity, attributes, oneDNN's names), its shape rule,
its lowering to primitives and its numpy reference, with the attribute checks oneDNN makes
beyond the schema. Each family module of ``triodnn.graph.ops`` (matmul, convolution,
normalization ...) declares its kinds and calls ``register``; the compiler passes look kinds up
here and keep only their machinery: ``check_op`` and ``infer_output_shapes`` (attributes and
shapes), ``Builder`` (lowering), ``triodnn.testing.reference`` (the references). The primitive
side works the same way (``triodnn.kernels._registry``): a kind is one declaration, so adding one
touches one family file and its tests.

The package ``triodnn.graph`` imports every family when it is imported, before anything can ask
for a kind; this module imports none of them, so the passes can import it without a cycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._values._errors import InvalidGraphError

if TYPE_CHECKING:
    import numpy as np

    from ._lowering import Builder
    from ._op import Op
    from ._op_schema import OpSchema

Shape = tuple[int, ...]

# (kind, normalised attributes, input shapes, number of outputs) -> output shapes; raises
# ShapeInferenceError (``_shape_inference.shape_error``) for shapes oneDNN refuses.
ShapeRule = Callable[[str, dict, list[Shape], int], list[Shape]]
# (builder, op): adds the op's primitive steps to the builder's plan.
Lowering = Callable[["Builder", "Op"], None]
# (kind, normalised attributes, input arrays as given, number of outputs) -> outputs in float64
# (integers where the op computes on integers), before conversion to the output data types.
Reference = Callable[[str, dict, list["np.ndarray"], int], list]
# (kind, normalised attributes): checks across attributes that need no shapes; may fill in
# values oneDNN derives (MaxPool's dilations). Raises InvalidGraphError.
AttrCheck = Callable[[str, dict], None]
# (kind, normalised attributes, number of inputs, number of outputs): oneDNN's pairings of the
# optional arguments. Raises InvalidGraphError.
ArgumentCheck = Callable[[str, dict, int, int], None]
# (normalised attributes, input arrays) -> attributes: what an input's values say that an
# attribute says otherwise (a reduction's axes given as a tensor), for the reference.
AttrsFromInputs = Callable[[dict, list["np.ndarray"]], dict]
# (kind, normalised attributes, input arrays, number of outputs) -> per output, the size of the
# sums behind each element (the same sums over absolute values), or None for an output that is
# no sum: the conformance check measures a summed output's rounding against it, since
# cancellation can leave the result itself far smaller than its terms.
Magnitude = Callable[[str, dict, list["np.ndarray"], int], list]
# (op) -> whether this op can carry a chain of post-ops (``_fusion``): its primitive takes them,
# and its dst is the graph's output tensor (the same dims, or for NXC data a channels-first view).
AnchorRule = Callable[["Op"], bool]

# What a kind's inputs are filled with by the conformance check (``triodnn.testing.fill_input``)
# where the default small integers would go wrong: "positive" (the op's domain), "integer_sum"
# (sums of products stay exact), "divisor" (no zeros), "norm" (a spread the mean and variance
# resolve), "transcendental" (quarters over a range that exercises the curve),
# "softmax_gradient" and "log_softmax_gradient" (values a forward could have given).
FILLINGS = ("positive", "integer_sum", "divisor", "norm", "transcendental", "softmax_gradient",
            "log_softmax_gradient")


def of_absolute_inputs(reference: Reference, max_inputs: int) -> Magnitude:
    """The ``Magnitude`` of a kind whose every output is a sum of products of its inputs (a
    matmul, a convolution, a sum): its reference over the inputs' absolute values, where at most
    ``max_inputs`` inputs are given (more are index tensors, as a reduction's axes)."""
    def magnitude(kind: str, a: dict, inputs: list, num_outputs: int) -> list:
        if len(inputs) > max_inputs:
            return [None] * num_outputs
        return reference(kind, a, [abs(x.astype("float64")) for x in inputs], num_outputs)
    return magnitude


def any_op(op: Op) -> bool:
    """The anchor rule of kinds whose every op can carry post-ops."""
    return True


@attrs.frozen(eq=False)
class GraphOp:
    """One op kind. ``lower`` (and ``shapes``, ``reference``) are None for kinds triodnn
    recognises but does not run (Wildcard, oneDNN ops without a lowering): such an op loads and
    lands in an unsupported partition, and ``not_run`` says why where shapes or a reference are
    asked of it. ``lowers`` refuses some attribute combinations of a kind that otherwise lowers
    (the op then lands in an unsupported partition too)."""

    schema: OpSchema
    shapes: ShapeRule | None = None
    lower: Lowering | None = None
    reference: Reference | None = None
    check_attrs: AttrCheck | None = None
    check_arguments: ArgumentCheck | None = None
    lowers: Callable[[Op], bool] | None = None
    attrs_from_inputs: AttrsFromInputs | None = None
    not_run: str = "triodnn does not run this op"
    # What the conformance check (``triodnn.testing.tolerance``) knows of the kind's numbers:
    # its f32 threshold t against the float64 reference, |got - ref| <= t * max(1, |ref|), 0 for
    # exact; whether it turns the dyadic test filling into arbitrary reals (transcendental,
    # dividing, averaging); whether it sums many elements. Where an inexact op and an accumulating
    # one meet in a partition, the check allows benchdnn's chain tolerance. ``filling`` is one of
    # FILLINGS, or None for the default filling.
    tolerance: float = 0.0
    inexact: bool = False
    accumulates: bool = False
    filling: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.in_(FILLINGS)))
    # Whether an op of the kind anchors a post-op chain (``AnchorRule``); None: none does.
    post_op_anchor: AnchorRule | None = None
    # The sizes of the sums behind its outputs (``Magnitude``); None: compared to their values.
    magnitude: Magnitude | None = None

    @property
    def runs(self) -> bool:
        return self.lower is not None

    @property
    def kind(self) -> str:
        return self.schema.kind


_OPS: dict[str, GraphOp] = {}


@attrs.frozen
class Numbers:
    """``GraphOp``'s numeric facts for one kind (see there), as a family module tabulates them."""

    tolerance: float = 0.0
    inexact: bool = False
    accumulates: bool = False
    filling: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.in_(FILLINGS)))


def numbered(ops, numbers: Mapping[str, Numbers]) -> list[GraphOp]:
    """``ops`` with the numeric facts ``numbers`` gives for their kinds (the others exact)."""
    return [attrs.evolve(op, **attrs.asdict(numbers[op.kind])) if op.kind in numbers else op for op in ops]


def register(*ops: GraphOp) -> None:
    """Add ``ops`` to the registry; a kind declared twice is a programming error."""
    for op in ops:
        if op.kind in _OPS:
            raise ValueError(f"graph op kind {op.kind!r} is registered twice")
        _OPS[op.kind] = op


@contextlib.contextmanager
def registered(*ops: GraphOp) -> Iterator[None]:
    """``ops`` registered for the length of a ``with`` block: a kind declared by a test (or a
    notebook trying one out) without a family module, gone again afterwards."""
    register(*ops)
    try:
        yield
    finally:
        for op in ops:
            _OPS.pop(op.kind, None)


def graph_op(kind: str) -> GraphOp:
    """The declaration of ``kind``, or InvalidGraphError listing the known kinds."""
    try:
        return _OPS[kind]
    except (KeyError, TypeError):
        raise InvalidGraphError(f"unknown op kind {kind!r}; known kinds: {', '.join(sorted(_OPS))}") from None


def is_registered(kind: Any) -> bool:
    try:
        return kind in _OPS
    except TypeError:  # an unhashable "kind"
        return False


def graph_ops() -> Mapping[str, GraphOp]:
    """Every registered kind, by name (a read-only view)."""
    return _RegistryView(lambda op: op)


class _RegistryView(Mapping):
    """A live, read-only view of the registry through ``project`` (the schemas, say)."""

    def __init__(self, project: Callable[[GraphOp], Any]) -> None:
        self._project = project

    def __getitem__(self, kind: str) -> Any:
        return self._project(_OPS[kind])

    def __iter__(self) -> Iterator[str]:
        return iter(_OPS)

    def __len__(self) -> int:
        return len(_OPS)


def schema_view() -> Mapping[str, OpSchema]:
    """Every registered kind's schema, by name (a live, read-only view)."""
    return _RegistryView(lambda op: op.schema)
