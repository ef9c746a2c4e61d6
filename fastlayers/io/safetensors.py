"""``.safetensors`` files through the ``safetensors`` package (numpy API), extra
``fastlayers[safetensors]``.

The format is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}`` and the raw little-endian tensor bytes.
It holds no code. bfloat16 tensors, which numpy (and so the package's numpy API) cannot represent,
are read from their byte range here and widened exactly to float32.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import limits, settings
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


#: Element sizes of the safetensors dtypes.
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


def _header(path, where: str) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset of its data, checked: the length
    field against the file's size and ``max_config_bytes`` (``settings.current()``), the JSON's
    size and nesting (``limits.parse_json``), and every tensor entry (dtype, shape, byte range inside the data,
    ranges in order without overlap)."""
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ModelFileError(f"{where}: truncated safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ModelFileError(
                    f"{where}: the safetensors header claims {n:,} bytes, more than the {size:,}-byte file holds"
                )
            limit = settings.current().max_config_bytes
            if n > limit:
                raise ModelFileError(
                    f"{where}: the safetensors header is {n:,} bytes, over the "
                    f"{limit:,}-byte limit "
                    "(FASTLAYERS_MAX_CONFIG_BYTES)"
                )
            raw = f.read(n)
    except OSError as e:
        raise ModelFileError(f"{where}: cannot read the file ({e.strerror or e})") from None
    if len(raw) != n:
        raise ModelFileError(f"{where}: truncated safetensors header")
    header = limits.parse_json(raw, where, "the safetensors header")
    if not isinstance(header, dict):
        raise ModelFileError(
            f"{where}: corrupt safetensors header: expected an object, found {limits.describe(header)}"
        )
    _check_entries(header, where, size - 8 - n)
    return header, 8 + n


def _check_entries(header: dict, where: str, data_size: int) -> None:
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is not None and not isinstance(entry, dict):
                raise ModelFileError(f"{where}: __metadata__: expected an object, found {limits.describe(entry)}")
            continue
        here = f"{where}: tensor {limits.short_repr(name)}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ModelFileError(
                f"{here}: expected an object of dtype, shape and data_offsets, found {limits.describe(entry)}"
            )
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
            raise ModelFileError(f"{here}: unknown dtype {limits.short_repr(dtype)}")
        if not isinstance(shape, list) or len(shape) > 64 or any(type(d) is not int or d < 0 for d in shape):
            raise ModelFileError(
                f"{here}: shape: expected a list of non-negative integers, found {limits.describe(shape)}"
            )
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(v) is int for v in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise ModelFileError(
                f"{here}: data_offsets: expected [begin, end] inside the "
                f"{data_size:,} data bytes, found {limits.describe(offsets)}"
            )
        count = 1
        for d in shape:
            count *= d
        if count * DTYPE_SIZES[dtype] != offsets[1] - offsets[0]:
            raise ModelFileError(
                f"{here}: {dtype} {tuple(shape)} needs {count * DTYPE_SIZES[dtype]:,} "
                f"bytes, its data_offsets span {offsets[1] - offsets[0]:,}"
            )
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ModelFileError(
                f"{where}: tensors {limits.short_repr(n0)} and {limits.short_repr(n1)} overlap in the data"
            )


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


def load_safetensors(path) -> OrderedDict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file as numpy arrays, in the file's order.

    Raises ``UnsupportedError`` without the ``safetensors`` package and ``ModelFileError`` for a
    truncated or corrupt file.
    """
    where = str(path)
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise UnsupportedError(
            f"{where}: reading safetensors files needs the safetensors package: pip install 'fastlayers[safetensors]'"
        ) from e
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
