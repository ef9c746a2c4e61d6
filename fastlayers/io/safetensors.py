"""``.safetensors`` files through the ``safetensors`` package (numpy API), extra
``fastlayers[safetensors]``.

The format is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}`` and the raw little-endian tensor bytes.
It holds no code. bfloat16 tensors, which numpy (and so the package's numpy API) cannot represent,
are read from their byte range here and widened exactly to float32.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, UnsupportedError

_WIDENED = {"BF16"}


def is_safetensors(path) -> bool:
    """Whether the file starts like a safetensors file (header length, then a JSON object)."""
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= size - 8 and head[8:9] == b"{"


def _header(path, where: str) -> tuple[dict, int]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ModelFileError(f"{where}: truncated safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ModelFileError(f"{where}: implausible safetensors header length {n}")
        raw = f.read(n)
    if len(raw) != n:
        raise ModelFileError(f"{where}: truncated safetensors header")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{where}: corrupt safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise ModelFileError(f"{where}: corrupt safetensors header")
    return header, 8 + n


def _read_bf16(path, where: str, name: str, entry: dict, data_start: int) -> np.ndarray:
    try:
        begin, end = (int(v) for v in entry["data_offsets"])
        shape = tuple(int(s) for s in entry["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{where}: malformed header entry for {name!r}") from e
    count = int(np.prod(shape, dtype=np.int64))
    if end - begin != 2 * count or begin < 0:
        raise ModelFileError(f"{where}: tensor {name!r} byte range does not match its shape {shape}")
    with open(path, "rb") as f:
        f.seek(data_start + begin)
        raw = f.read(end - begin)
    if len(raw) != end - begin:
        raise ModelFileError(f"{where}: truncated data for tensor {name!r}")
    bits = np.frombuffer(raw, "<u2").astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).reshape(shape)


def load_safetensors(path) -> "OrderedDict[str, np.ndarray]":
    """The tensors of a ``.safetensors`` file as numpy arrays, in the file's order.

    Raises ``UnsupportedError`` without the ``safetensors`` package and ``ModelFileError`` for a
    truncated or corrupt file.
    """
    where = str(path)
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise UnsupportedError(f"{where}: reading safetensors files needs the safetensors package: "
                               "pip install 'fastlayers[safetensors]'") from e
    header, data_start = _header(path, where)
    out: OrderedDict = OrderedDict()
    try:
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():
                entry = header.get(name)
                if isinstance(entry, dict) and entry.get("dtype") in _WIDENED:
                    out[name] = _read_bf16(path, where, name, entry, data_start)
                else:
                    out[name] = np.array(f.get_tensor(name), order="C", copy=None)
    except ModelFileError:
        raise
    except Exception as e:  # safetensors_rust.SafetensorError and numpy's dtype errors
        raise ModelFileError(f"{where}: not a readable safetensors file ({type(e).__name__}: {e})") from e
    return out
