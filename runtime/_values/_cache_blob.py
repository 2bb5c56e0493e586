"""Cache blobs: primitive implementations (key, generated kernel, device binary) as bytes.

A blob lets a new process, or a new engine, create the same primitives without compiling: its
entries go into the primitive cache, and engines load the binaries. It records the triodnn
version, its own format version and the device identity, and is refused (``CacheBlobError``)
when any of them differs from the engine loading it.

Layout: ``MAGIC``, a little-endian u32 header length, the UTF-8 JSON header, then the binaries
back to back (the header gives each entry's offset and size). JSON rather than pickle: loading a
blob never runs code.
"""

from __future__ import annotations

import json
import struct

import attrs

from ._errors import CacheBlobError
from ._kernel_spec import KernelConfig, KernelSpec
from ._keys import PrimitiveImpl, PrimitiveKey
from ._memory_desc import MemoryDesc
from ._op_desc import OP_KINDS
from ._quantization import Quantization

MAGIC = b"TRIODNN-PRIMITIVE-CACHE-BLOB\n"
FORMAT_VERSION = 1
_LENGTH = struct.Struct("<I")

def _value_to_json(value):
    if isinstance(value, MemoryDesc):
        return {"memory_desc": {"dims": value.dims, "dtype": value.dtype, "strides": value.strides}}
    if isinstance(value, tuple):
        return {"tuple": [_value_to_json(v) for v in value]}
    if isinstance(value, Quantization):  # quantized attention and convolution operands
        return {"quantization": attrs.asdict(value)}
    return value


def _value_from_json(value):
    if isinstance(value, dict) and "memory_desc" in value:
        md = value["memory_desc"]
        return MemoryDesc(tuple(md["dims"]), md["dtype"], tuple(md["strides"]))
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_value_from_json(v) for v in value["tuple"])
    if isinstance(value, dict) and "quantization" in value:
        return Quantization(**value["quantization"])
    return value


def serializable(key: PrimitiveKey) -> bool:
    # Registered kinds only (``@op_kind``): a key descriptor such as the cross-engine reorder's
    # holds engine identities, which mean nothing in another process.
    return OP_KINDS.get(key.kind) is type(key.desc)


def _key_to_json(key: PrimitiveKey) -> dict:
    desc = key.desc
    return {
        "kind": key.kind,
        "desc": {f.name: _value_to_json(getattr(desc, f.name)) for f in attrs.fields(type(desc))},
        "attr": list(key.attr),
        "impl": key.impl,
        "config": attrs.asdict(key.config),
        "engine_kind": key.engine_kind,
        "runtime_kind": key.runtime_kind,
        "build_options": list(key.build_options),
    }


def _key_from_json(data: dict, device) -> PrimitiveKey:
    cls = OP_KINDS.get(data["kind"])
    if cls is None:
        raise CacheBlobError(f"blob entry of unknown primitive kind {data['kind']!r}")
    desc = cls(**{name: _value_from_json(value) for name, value in data["desc"].items()})
    return PrimitiveKey(
        kind=data["kind"],
        desc=desc,
        attr=tuple(data["attr"]),
        impl=data["impl"],
        config=KernelConfig(**data["config"]),
        engine_kind=data["engine_kind"],
        runtime_kind=data["runtime_kind"],
        device=device,
        build_options=tuple(data["build_options"]),
    )


def dump(impls: list[PrimitiveImpl], device, triodnn_version: str) -> bytes:
    """A blob of ``impls`` (all of ``device``)."""
    entries, binaries, offset = [], [], 0
    for impl in impls:
        entries.append({
            "key": _key_to_json(impl.key),
            "spec": {**attrs.asdict(impl.spec)},
            "build_seconds": impl.build_seconds,
            "offset": offset,
            "size": len(impl.binary),
        })
        binaries.append(impl.binary)
        offset += len(impl.binary)
    header = json.dumps({
        "format": FORMAT_VERSION,
        "triodnn": triodnn_version,
        "device": attrs.asdict(device),
        "entries": entries,
    }).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, *binaries])


def load(blob: bytes, device, triodnn_version: str) -> list[PrimitiveImpl]:
    """The implementations in ``blob``; ``CacheBlobError`` unless it was made for ``device``."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CacheBlobError(f"blob is {type(blob).__name__}, expected bytes")
    blob = bytes(blob)
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _LENGTH.size:
        raise CacheBlobError("blob is not a triodnn primitive cache blob (bad magic)")
    (length,) = _LENGTH.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    try:
        header = json.loads(blob[start : start + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheBlobError(f"blob header is corrupt: {exc}") from None
    if header.get("format") != FORMAT_VERSION:
        raise CacheBlobError(f"blob format {header.get('format')!r}; this triodnn reads {FORMAT_VERSION}")
    if header.get("triodnn") != triodnn_version:
        raise CacheBlobError(
            f"blob was written by triodnn {header.get('triodnn')!r}; this is {triodnn_version}"
        )
    if header.get("device") != attrs.asdict(device):
        raise CacheBlobError(
            f"blob is for device {header.get('device')!r}, not this engine's {attrs.asdict(device)!r}"
        )
    base = start + length
    impls = []
    try:
        for entry in header["entries"]:
            lo, size = base + entry["offset"], entry["size"]
            if lo + size > len(blob):
                raise CacheBlobError("blob is truncated: an entry's binary runs past its end")
            spec = entry["spec"]
            spec = KernelSpec(**{
                **spec,
                "arg_names": tuple(spec["arg_names"]),
                "global_size": tuple(spec["global_size"]),
                "local_size": tuple(spec["local_size"]),
            })
            key = _key_from_json(entry["key"], device)
            impls.append(PrimitiveImpl(key, spec, blob[lo : lo + size], float(entry["build_seconds"])))
    except CacheBlobError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheBlobError(f"blob entry is malformed: {exc!r}") from None
    return impls
