"""How an out-of-order stream gets real concurrency on a given device, and never loses by it.

Measured here: PoCL's native out-of-order queue overlaps independent kernels (1.76x on 2 cores,
the same as 2 in-order queues); NVIDIA's OpenCL accepts an out-of-order queue but runs its
commands one at a time (1.00x), while 8 in-order queues run 8 independent *long, under-filling*
kernels 6.2-7.5x faster. But spreading ordinary kernels over queues loses: eight independent
gelu_erf primitives of 256 to 1M elements ran 0.75-0.82x as fast on 8 NVIDIA queues as on one
(raw pyopencl 0.70-0.79x), and PoCL's native queue ran the demo 0.85-0.88x as fast as in order.
A kernel that fills the device has nothing to overlap with, and a short one costs more to
enqueue (2-5 µs PoCL, ~10 µs NVIDIA) than it runs.

So an out-of-order stream is a pool of in-order *lanes* (the stream actor places commands):
lane 0 carries everything by default, in submission order, exactly like an in-order queue; a
kernel goes to another lane only when ``may_overlap`` says it leaves the device mostly idle for
long (``Primitive.overlaps``); a command that depends on a lane's last command stays on that lane.
The strategy rule:

1. ``TRIODNN_OOO_STRATEGY`` (``native``, ``lanes``, ``lanes:N`` or ``lanes:N:spread``) wins when set;
2. NVIDIA devices get 8 lanes;
3. every other device gets one lane per compute unit, 2 to 8 (PoCL: one per core).
"""

from __future__ import annotations

import math

import attrs

from .._values._errors import InvalidArgumentError

DEFAULT_LANES = 8

# Bytes a work-item touches (its share of the arguments: a lower bound) from which a kernel counts
# as long. One NVIDIA work-item streaming 64 KiB takes tens of µs, as does a PoCL work-item
# (a work-group per core) over 64 KiB with the loads of a matmul; below that a kernel ends before
# another lane's enqueue (~10 µs NVIDIA) has paid for itself.
LONG_BYTES_PER_ITEM = 64 * 1024


def may_overlap(global_size: tuple[int, ...], local_size: tuple[int, ...], bytes_touched: int,
                compute_units: int) -> bool:
    """Whether a kernel may run beside others to advantage: it leaves compute units idle (fewer
    work-groups than units) and runs long (``LONG_BYTES_PER_ITEM`` per work-item)."""
    items = math.prod(global_size)
    groups = items // max(1, math.prod(local_size))
    return groups < compute_units and bytes_touched >= LONG_BYTES_PER_ITEM * items


@attrs.frozen
class OutOfOrderStrategy:
    """``native``: one out-of-order queue; ``lanes``: ``lanes`` in-order queues with event waits."""

    kind: str = attrs.field(validator=attrs.validators.in_(("native", "lanes")))
    lanes: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    reason: str = ""
    # Lanes only: every independent kernel takes the next lane in turn, overlap or not (the
    # rule before ``may_overlap``; ``lanes:N:spread``), to see what spreading costs or gives.
    spread: bool = False


def parse_override(text: str) -> OutOfOrderStrategy:
    name, _, count = text.strip().partition(":")
    if name == "native" and not count:
        return OutOfOrderStrategy("native", 1, "TRIODNN_OOO_STRATEGY")
    if name == "lanes":
        count, _, mode = count.partition(":")
        try:
            lanes = int(count) if count else DEFAULT_LANES
        except ValueError:
            lanes = 0
        if lanes >= 1 and mode in ("", "spread"):
            return OutOfOrderStrategy("lanes", lanes, "TRIODNN_OOO_STRATEGY", spread=mode == "spread")
    raise InvalidArgumentError(
        f"TRIODNN_OOO_STRATEGY={text!r} is not 'native', 'lanes', 'lanes:N' or 'lanes:N:spread' with N >= 1"
    )


def choose_out_of_order_strategy(
    *, vendor: str, platform: str, compute_units: int = 2, override: str | None = None,
) -> OutOfOrderStrategy:
    """Apply the rule in this module's docstring to one device's facts. Whether the device
    offers out-of-order queues no longer matters: lanes are in-order queues; an override asking
    for ``native`` gets it as asked."""
    if override:
        return parse_override(override)
    if "nvidia" in vendor.lower() or "nvidia" in platform.lower():
        return OutOfOrderStrategy(
            "lanes", DEFAULT_LANES, "NVIDIA runs out-of-order queues one command at a time"
        )
    lanes = max(2, min(DEFAULT_LANES, compute_units))
    return OutOfOrderStrategy("lanes", lanes, "one lane per compute unit; independent long kernels overlap")
