"""How an out-of-order stream gets real concurrency on a given device.

Measured here: PoCL's native out-of-order queue overlaps independent kernels (1.76x on 2 cores);
NVIDIA's OpenCL accepts an out-of-order queue but runs its commands one at a time (1.00x), while 8
in-order queues run 8 independent kernels 6.2x faster. So the rule is:

1. ``TRIODNN_OOO_STRATEGY`` (``native`` or ``lanes`` / ``lanes:N``) wins when set;
2. a device that does not offer out-of-order execution gets lanes;
3. NVIDIA devices get lanes;
4. every other device gets its native out-of-order queue.
"""

from __future__ import annotations

import attrs

from .._values._errors import InvalidArgumentError

DEFAULT_LANES = 8
_OUT_OF_ORDER_EXEC_MODE_ENABLE = 1  # CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE


@attrs.frozen
class OutOfOrderStrategy:
    """``native``: one out-of-order queue; ``lanes``: ``lanes`` in-order queues with event waits."""

    kind: str = attrs.field(validator=attrs.validators.in_(("native", "lanes")))
    lanes: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    reason: str = ""


def parse_override(text: str) -> OutOfOrderStrategy:
    name, _, count = text.strip().partition(":")
    if name == "native" and not count:
        return OutOfOrderStrategy("native", 1, "TRIODNN_OOO_STRATEGY")
    if name == "lanes":
        try:
            lanes = int(count) if count else DEFAULT_LANES
        except ValueError:
            lanes = 0
        if lanes >= 1:
            return OutOfOrderStrategy("lanes", lanes, "TRIODNN_OOO_STRATEGY")
    raise InvalidArgumentError(
        f"TRIODNN_OOO_STRATEGY={text!r} is not 'native', 'lanes' or 'lanes:N' with N >= 1"
    )


def choose_out_of_order_strategy(
    *, vendor: str, platform: str, queue_properties: int, override: str | None = None
) -> OutOfOrderStrategy:
    """Apply the rule in this module's docstring to one device's facts."""
    if override:
        return parse_override(override)
    if not queue_properties & _OUT_OF_ORDER_EXEC_MODE_ENABLE:
        return OutOfOrderStrategy("lanes", DEFAULT_LANES, "no native out-of-order queue")
    if "nvidia" in vendor.lower() or "nvidia" in platform.lower():
        return OutOfOrderStrategy(
            "lanes", DEFAULT_LANES, "NVIDIA runs out-of-order queues one command at a time"
        )
    return OutOfOrderStrategy("native", 1, "native out-of-order queue overlaps commands")
