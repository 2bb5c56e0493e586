"""Cache blobs: primitive implementations (key, generated kernel, device binary) as bytes.

A blob lets a new process, or a new engine, create the same primitives without compiling: its
entries go into the primitive cache, and engines load the binaries. It records the triodnn
version, its own format version and the device identity, and is refused (``CacheBlobError``)
when any of them differs from the engine loading it.

Layout (format 2): ``MAGIC``, little-endian u32 format version and u32 header length, the 32-byte
BLAKE2b digest of those two numbers and the header, the UTF-8 JSON header, then the binaries back
to back (the header gives each entry's offset, size and BLAKE2b digest). JSON rather than pickle:
loading a blob never runs code. Digests because a device compiler trusts the binaries it is
given (PoCL aborts or crashes the process on a damaged one) and the header holds each kernel's
launch geometry; every digest is checked before anything reaches OpenCL.
"""

from __future__ import annotations

import hashlib
import json
import struct

import attrs

from ._errors import CacheBlobError
from ._kernel_spec import KernelConfig, KernelSpec
from ._keys import PrimitiveImpl, PrimitiveKey, StoredBinary
from ._memory_desc import MemoryDesc
from ._op_desc import OP_KINDS
from ._quantization import Quantization

MAGIC = b"TRIODNN-PRIMITIVE-CACHE-BLOB\n"
FORMAT_VERSION = 2
_PREFIX = struct.Struct("<II")  # format version, header length
_DIGEST_SIZE = 32
_HEADER_START = len(MAGIC) + _PREFIX.size + _DIGEST_SIZE


def _digest(*parts: bytes | memoryview) -> bytes:
    hasher = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    for part in parts:
        hasher.update(part)
    return hasher.digest()


def frame(header: bytes, binaries: bytes) -> bytes:
    """A blob of the JSON ``header`` and the ``binaries`` its entries describe."""
    prefix = _PREFIX.pack(FORMAT_VERSION, len(header))
    return b"".join([MAGIC, prefix, _digest(prefix, header), header, binaries])


def unframe(blob: bytes) -> tuple[bytes, memoryview]:
    """``blob``'s JSON header, its digest checked, and the binaries after it (unchecked: the
    header holds their digests); ``CacheBlobError`` for a blob of another format, or one
    damaged or cut short."""
    view = memoryview(blob)
    if not blob.startswith(MAGIC):
        raise CacheBlobError("blob is not a triodnn primitive cache blob (bad magic)")
    if len(blob) < _HEADER_START:
        raise CacheBlobError(f"blob is truncated: {len(blob)} bytes, shorter than a blob's fixed prefix")
    prefix = view[len(MAGIC) : len(MAGIC) + _PREFIX.size]
    found, length = _PREFIX.unpack(prefix)
    if found != FORMAT_VERSION:
        # Format 1 had its header length where the format now is, and its JSON header right after.
        if blob[len(MAGIC) + 4 :].startswith(b'{"format": 1,'):
            found = 1
        raise CacheBlobError(
            f"blob format {found}; this triodnn reads {FORMAT_VERSION} (write the blob again with it)"
        )
    end = _HEADER_START + length
    if end > len(blob):
        raise CacheBlobError(
            f"blob header runs past the blob's end ({end} bytes needed, {len(blob)} there): truncated or damaged"
        )
    header = view[_HEADER_START:end]
    if _digest(prefix, header) != bytes(view[len(MAGIC) + _PREFIX.size : _HEADER_START]):
        raise CacheBlobError("blob header is damaged: its checksum does not match")
    return bytes(header), view[end:]


def _entry_name(index: int, entry) -> str:
    spec = entry.get("spec") if isinstance(entry, dict) else None
    name = spec.get("name") if isinstance(spec, dict) else None
    return f"blob entry {index} (kernel {name!r})" if isinstance(name, str) else f"blob entry {index}"


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


def _key_from_json(data: dict, device, entry_name: str) -> PrimitiveKey:
    cls = OP_KINDS.get(data["kind"])
    if cls is None:
        raise CacheBlobError(f"{entry_name} is of unknown primitive kind {data['kind']!r}")
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


def dump(impls: list[PrimitiveImpl], device, triodnn_version: str, *,
         splits_float16_calls: bool | None = None) -> bytes:
    """A blob of ``impls`` (all of ``device``), each with its binary; an implementation whose
    program this process no longer holds (``PrimitiveImpl.binary`` gives None) is left out.
    ``splits_float16_calls``: the writing engine's float16 answer (its device probe), which a
    loading process takes instead of probing; None leaves it to the entries' configurations."""
    entries, binaries, offset = [], [], 0
    for impl in impls:
        binary = impl.binary()
        if binary is None:
            continue
        entries.append({
            "key": _key_to_json(impl.key),
            "spec": {**attrs.asdict(impl.spec)},
            "build_seconds": impl.build_seconds,
            "offset": offset,
            "size": len(binary),
            "blake2b": _digest(binary).hex(),
        })
        binaries.append(binary)
        offset += len(binary)
    header = json.dumps({
        "triodnn": triodnn_version,
        "device": attrs.asdict(device),
        "entries": entries,
        **({} if splits_float16_calls is None else {"splits_float16_calls": bool(splits_float16_calls)}),
    }).encode()
    return frame(header, b"".join(binaries))


def load(blob: bytes, device, triodnn_version: str) -> list[PrimitiveImpl]:
    """The implementations in ``blob``; ``CacheBlobError`` unless it was made for ``device``,
    and whole: every entry's checksum is checked before any of it is used."""
    return load_with_answer(blob, device, triodnn_version)[0]


def load_with_answer(blob: bytes, device, triodnn_version: str) -> tuple[list[PrimitiveImpl], bool | None]:
    """``load``'s implementations, and the float16 answer the blob's writer recorded (``dump``'s
    ``splits_float16_calls``; None where it recorded none), from one reading of the header."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CacheBlobError(f"blob is {type(blob).__name__}, expected bytes")
    header_bytes, binaries = unframe(bytes(blob))
    try:
        header = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheBlobError(f"blob header is corrupt: {exc}") from None
    if not isinstance(header, dict):
        raise CacheBlobError(f"blob header is corrupt: a JSON {type(header).__name__}, expected an object")
    if header.get("triodnn") != triodnn_version:
        raise CacheBlobError(
            f"blob was written by triodnn {header.get('triodnn')!r}; this is {triodnn_version}"
        )
    if header.get("device") != attrs.asdict(device):
        raise CacheBlobError(
            f"blob is for device {header.get('device')!r}, not this engine's {attrs.asdict(device)!r}"
        )
    entries = header.get("entries")
    if not isinstance(entries, list):
        raise CacheBlobError(f"blob header is corrupt: entries is {type(entries).__name__}, expected a list")
    impls = []
    offset = 0
    for index, entry in enumerate(entries):
        name = _entry_name(index, entry)
        try:
            size = entry["size"]
            if not isinstance(size, int) or size < 0:
                raise CacheBlobError(f"{name} is malformed: size {size!r}")
            if entry["offset"] != offset:
                raise CacheBlobError(f"{name} starts at {entry['offset']}, expected {offset}")
            if offset + size > len(binaries):
                raise CacheBlobError(
                    f"{name} runs past the blob's end ({offset + size} bytes of binaries needed, "
                    f"{len(binaries)} there): truncated"
                )
            binary = binaries[offset : offset + size]
            if _digest(binary).hex() != entry["blake2b"]:
                raise CacheBlobError(f"{name} is damaged: its binary's checksum does not match")
            spec = entry["spec"]
            spec = KernelSpec(**{
                **spec,
                "arg_names": tuple(spec["arg_names"]),
                "global_size": tuple(spec["global_size"]),
                "local_size": tuple(spec["local_size"]),
            })
            key = _key_from_json(entry["key"], device, name)
            impls.append(PrimitiveImpl(key, spec, StoredBinary(bytes(binary)), float(entry["build_seconds"])))
        except CacheBlobError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheBlobError(f"{name} is malformed: {exc!r}") from None
        offset += size
    if offset != len(binaries):
        raise CacheBlobError(f"blob has {len(binaries) - offset} bytes past its last entry: damaged or appended to")
    answer = header.get("splits_float16_calls")
    return impls, answer if isinstance(answer, bool) else None
