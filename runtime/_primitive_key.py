"""The primitive cache key and value: what makes two creations the same, and what they share."""

from __future__ import annotations

import attrs

from .kernels import KernelConfig, KernelSpec


@attrs.frozen(cache_hash=True)
class PrimitiveKey:
    """Everything that decides a primitive's compiled code, and nothing per-context.

    The op descriptor carries the memory descriptors and algorithm parameters; ``attr`` the
    attributes (post-ops, scales; none yet); ``config`` the implementation's work-group and
    vector configuration; ``device`` the device identity (platform, device, driver). The hash is
    computed once; equality compares every field.
    """

    kind: str
    desc: object
    attr: tuple
    impl: str
    config: KernelConfig
    engine_kind: str
    runtime_kind: str
    device: object  # DeviceIdentity
    build_options: tuple[str, ...]


@attrs.frozen(eq=False)
class PrimitiveImpl:
    """A cache entry: the immutable implementation, valid in any context of its device."""

    key: PrimitiveKey
    spec: KernelSpec = attrs.field(repr=False)
    binary: bytes = attrs.field(repr=False)
    build_seconds: float

    @property
    def impl(self) -> str:
        return self.spec.impl
