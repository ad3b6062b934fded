"""A data-only encoding for state jitckpt writes itself (data-loader states): JSON with type tags.

Files read back from a checkpoint directory are untrusted (README, Security):
decoding one can only yield plain data or a ``SafeCodecError``, never run
code, unlike a pickle.  It covers what state dicts are made of: dicts (any
keys of these types, order kept), lists, tuples, str, int, float (nan and
inf included), bool, None, bytes and CPU tensors (dtype, shape, raw bytes).
Anything else is refused when encoding, by type name, so nothing is ever
silently turned into something else.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

MAGIC = "jitckpt-safe-codec-1"


class SafeCodecError(ValueError):
    """A value that cannot be encoded, or a payload that is not this encoding."""


def encode(value: Any) -> bytes:
    """``value`` as bytes; raises SafeCodecError naming the first unsupported type."""
    return json.dumps({"format": MAGIC, "value": _encode(value, "value")}, separators=(",", ":"),
                      allow_nan=False).encode()


def decode(payload: bytes) -> Any:
    """The value ``encode`` was given; raises SafeCodecError on anything else."""
    try:
        document = json.loads(payload.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise SafeCodecError(f"not a jitckpt state file ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != MAGIC or "value" not in document:
        raise SafeCodecError("not a jitckpt state file (bad header)")
    return _decode(document["value"])


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"int": str(value)}  # any size, and kept apart from float
    if isinstance(value, float):
        return {"float": repr(value) if math.isfinite(value) else str(value)}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, (list, tuple)):
        items = [_encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return {"list" if isinstance(value, list) else "tuple": items}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, f"{where} key"), _encode(v, f"{where}[{k!r}]")] for k, v in value.items()]}
    tensor = _tensor_type()
    if tensor is not None and isinstance(value, tensor):
        data = value.detach().cpu().contiguous()
        return {"tensor": {"dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape),
                           "data": base64.b64encode(data.view(-1).view(_uint8()).numpy().tobytes()).decode()}}
    raise SafeCodecError(f"{where}: a {type(value).__module__}.{type(value).__qualname__} cannot be stored safely")


def _decode(node: Any) -> Any:
    if node is None or isinstance(node, (bool, str)):
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise SafeCodecError(f"not a jitckpt state file (unexpected {type(node).__name__})")
    (tag, body), = node.items()
    try:
        if tag == "int":
            return int(body)
        if tag == "float":
            return float(body)
        if tag == "bytes":
            return base64.b64decode(body, validate=True)
        if tag == "list":
            return [_decode(item) for item in body]
        if tag == "tuple":
            return tuple(_decode(item) for item in body)
        if tag == "dict":
            return {_decode(k): _decode(v) for k, v in body}
        if tag == "tensor":
            return _decode_tensor(body)
    except SafeCodecError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise SafeCodecError(f"not a jitckpt state file (bad {tag}: {exc})") from None
    raise SafeCodecError(f"not a jitckpt state file (unknown tag {tag!r})")


def _decode_tensor(body: dict) -> Any:
    import torch

    dtype = getattr(torch, str(body["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise SafeCodecError(f"not a jitckpt state file (unknown dtype {body['dtype']!r})")
    shape = [int(n) for n in body["shape"]]
    raw = bytearray(base64.b64decode(body["data"], validate=True))
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    count = math.prod(shape)
    if flat.numel() != count * torch.empty(0, dtype=dtype).element_size():
        raise SafeCodecError("not a jitckpt state file (tensor size does not match its shape)")
    return flat.view(dtype).reshape(shape).clone()


def _tensor_type() -> type | None:
    import sys

    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _uint8() -> Any:
    import torch

    return torch.uint8
