"""The kernel side of the op registry: each primitive kind's generator, numpy reference and
tolerance, keyed by its descriptor class (declared in ``triodnn._values``).

Each kernel module registers its kinds at import (``register(MatmulDesc, generate=...)``), and
``triodnn.kernels`` imports every kernel module, so importing the package fills the registry. The
actors build through ``generate(desc, config)``, tests and the testing harness reach references and
tolerances through ``kind_of(desc)``; nobody needs to know which module serves which kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .._values._errors import UnsupportedError
from .._values._kernel_spec import KernelConfig, KernelSpec


@attrs.frozen
class KernelKind:
    """What the kernels layer provides for one descriptor class.

    ``generate(desc, config) -> KernelSpec``; ``reference(desc, inputs) -> ndarray``: the float64
    numpy reference of dst from ``{argument name: array}`` (None where the kind's reference needs
    more than its inputs); ``tolerance(desc) -> float``: the largest relative error benchdnn-style
    checks accept for it.
    """

    desc_class: type
    generate: Callable[[Any, KernelConfig], KernelSpec]
    reference: Callable[..., Any] | None = None
    tolerance: Callable[[Any], float] | None = None


KERNELS: dict[type, KernelKind] = {}


def register(desc_class: type, *, generate, reference=None, tolerance=None) -> KernelKind:
    """Declare the kernel of ``desc_class``; a class registers once."""
    if desc_class in KERNELS:
        raise TypeError(f"{desc_class.__name__} has a kernel registered already")
    kind = KERNELS[desc_class] = KernelKind(desc_class, generate, reference, tolerance)
    return kind


def kind_of(desc) -> KernelKind:
    """The registered kernel of ``desc``'s class; ``UnsupportedError`` when it has none."""
    kind = KERNELS.get(type(desc))
    if kind is None:
        raise UnsupportedError(f"no kernel is registered for {type(desc).__name__}")
    return kind


def generate(desc, config: KernelConfig) -> KernelSpec:
    """The kernel for ``desc`` shaped for ``config`` (a device's ``KernelConfig``)."""
    return kind_of(desc).generate(desc, config)
