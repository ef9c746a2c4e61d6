"""Reading ``torch.save`` files: the object a zip archive or a legacy pickle holds, through the
restricted unpickler (``unpickler.py``).

Formats read (layouts in docs/formats.md):

- ``torch.save`` zip archives (the default since torch 1.6): ``<prefix>/data.pkl`` (the pickle),
  ``<prefix>/data/<key>`` (one raw little-endian storage per key), ``<prefix>/byteorder``;
  any record prefix. ``pytorch_model.bin`` files are the same archives (or legacy pickles).
- legacy pickles (``_use_new_zipfile_serialization=False``): five concatenated pickles/blobs:
  magic number, protocol version, sys info, the object, the storage keys, then per storage an
  int64 element count and the raw elements.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from collections.abc import Collection

import numpy as np

from ...errors import FastlayersError, ModelFileError, UnsupportedError
from .records import ONNX_HINT, StorageType, brepr
from .unpickler import RestrictedUnpickler

#: The number a legacy torch pickle starts with.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def is_torch_file(path) -> bool:
    """Whether ``path`` looks like a torch.save file (zip with a data.pkl, or legacy pickle)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        if head[:2] == b"PK":
            with zipfile.ZipFile(path) as zf:
                return any(n == "data.pkl" or n.endswith("/data.pkl") for n in zf.namelist())
        return head[:2] == b"\x80\x02" and head[2:3] == b"\x8a"  # protocol 2 + LONG1 magic
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def read_torch_pickle(path, unknown_globals: str = "refuse", module_classes: Collection[str] = ()):
    """The object a torch.save file holds, with tensors as numpy arrays and modules as
    ``TorchModuleRecord`` trees (``unknown_globals`` and ``module_classes``: those of
    ``RestrictedUnpickler``). Raises ``ModelFileError`` for anything unreadable or refused."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelFileError(f"{where}: cannot read ({e})") from e
    try:
        if head[:2] == b"PK":
            return _read_zip(path, where, unknown_globals, module_classes)
        return _read_legacy(path, where, unknown_globals, module_classes)
    except FastlayersError as e:
        msg = str(e)
        raise type(e)(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except MemoryError as e:
        raise ModelFileError(f"{where}: corrupt file (implausible sizes)") from e
    except RecursionError as e:
        raise ModelFileError(f"{where}: pickle nests too deeply") from e
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        raise ModelFileError(f"{where}: truncated or corrupt file ({type(e).__name__}: {e})") from e
    except Exception as e:  # the pickle machine's own errors on malformed input
        raise ModelFileError(f"{where}: corrupt pickle ({type(e).__name__}: {e})") from e


def _read_zip(path, where: str, unknown_globals: str, module_classes: Collection[str]):
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        pkls = sorted((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")), key=lambda n: (n.count("/"), n))
        if not pkls:
            raise ModelFileError(f"{where}: a zip archive without data.pkl is not a torch.save file")
        prefix = pkls[0][: -len("data.pkl")]
        if f"{prefix}constants.pkl" in names or any(n.startswith(f"{prefix}code/") for n in names):
            raise UnsupportedError(
                f"{where}: a TorchScript archive (torch.jit.save) holds code, which "
                f"fastlayers does not run; {ONNX_HINT}"
            )
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            byteorder = zf.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise ModelFileError(f"{where}: unknown byteorder {byteorder!r}")

        def load_storage(storage_type: type[StorageType], key: str, numel: int) -> np.ndarray:
            name = f"{prefix}data/{key}"
            try:
                info = zf.getinfo(name)
            except KeyError:
                raise ModelFileError(f"{where}: storage {name!r} is missing from the archive") from None
            dtype = storage_type.np_dtype
            nbytes = numel * dtype.itemsize
            if info.file_size < nbytes:
                raise ModelFileError(
                    f"{where}: storage {name!r} holds {info.file_size} bytes, the "
                    f"pickle expects {numel} x {dtype.itemsize}"
                )
            return _typed(_read_entry(zf, info, where)[:nbytes], dtype, byteorder)

        _check_entry_size(zf, zf.getinfo(pkls[0]), where)
        data = zf.read(pkls[0])
        return RestrictedUnpickler(io.BytesIO(data), where, load_storage, unknown_globals, module_classes).load()


def _archive_size(zf: zipfile.ZipFile):
    """The bytes of the file behind ``zf`` (None where it has no file descriptor)."""
    size = getattr(zf, "_fastlayers_size", False)
    if size is False:
        try:
            size = os.fstat(zf.fp.fileno()).st_size
        except (AttributeError, OSError, ValueError):
            size = None
        zf._fastlayers_size = size
    return size


def _check_entry_size(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> None:
    """Refuse a zip entry whose size its compressed bytes in this archive cannot hold."""
    archive = _archive_size(zf)
    stored = info.compress_type == zipfile.ZIP_STORED
    if (
        (archive is not None and info.compress_size > archive)
        or (stored and info.file_size != info.compress_size)
        or (not stored and info.file_size > 1032 * info.compress_size + 64)
    ):
        raise ModelFileError(
            f"{where}: zip entry {brepr(info.filename)} claims {info.file_size} bytes "
            f"({info.compress_size} compressed) in an archive of {archive} bytes"
        )


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str) -> np.ndarray:
    """A zip entry's bytes in a fresh numpy buffer, CRC checked.

    torch stores entries uncompressed: those are read straight from the file into the buffer,
    skipping ``ZipFile.open``'s intermediate bytes (see docs/design.md for the measurement);
    compressed entries (a re-packed archive) go through ``ZipFile.open``. The size an entry
    claims is checked against the archive before anything is allocated: a stored entry holds its
    bytes in the archive, a deflated one at most 1032 bytes per compressed byte (deflate's limit).
    """
    _check_entry_size(zf, info, where)
    buf = np.empty(info.file_size, np.uint8)
    if info.compress_type == zipfile.ZIP_STORED:
        f = zf.fp
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise ModelFileError(f"{where}: corrupt zip entry {info.filename!r} (bad local header)")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        got = f.readinto(buf)
        if got != info.file_size:
            raise ModelFileError(f"{where}: zip entry {info.filename!r} is truncated")
        if zlib.crc32(buf) != info.CRC:
            raise ModelFileError(f"{where}: zip entry {info.filename!r} is corrupt (CRC mismatch)")
        return buf
    with zf.open(info) as fh:
        got = fh.readinto(buf)
        fh.read(1)  # reach EOF so the CRC is checked
    if got != info.file_size:
        raise ModelFileError(f"{where}: zip entry {info.filename!r} is truncated")
    return buf


def _typed(raw: np.ndarray, dtype: np.dtype, byteorder: str) -> np.ndarray:
    if byteorder == "big" and dtype.itemsize > 1:
        return raw.view(dtype.newbyteorder(">")).astype(dtype)
    return raw.view(dtype)


def _read_legacy(path, where: str, unknown_globals: str, module_classes: Collection[str]):
    with open(path, "rb") as f:

        def plain():
            return RestrictedUnpickler(f, where).load()

        magic = plain()
        if magic != LEGACY_MAGIC:
            raise ModelFileError(
                f"{where}: not a PyTorch file (no zip archive, no legacy magic "
                "number); tar archives from torch < 0.4 are not supported"
            )
        plain()  # protocol version
        sys_info = plain()
        little = not (isinstance(sys_info, dict) and sys_info.get("little_endian") is False)
        # The storages' bytes follow the object's pickle, and their element sizes are only known
        # from it: a first pass unpickles against zero-stride stand-in storages (no memory) to
        # learn each key's type and size, then the data is read and the object unpickled again.
        start = f.tell()
        file_size = os.fstat(f.fileno()).st_size
        layout: dict[str, tuple[type[StorageType], int]] = {}

        def probe_storage(storage_type, key, numel):
            if numel * storage_type.np_dtype.itemsize > file_size:
                raise ModelFileError(
                    f"{where}: storage {brepr(key)} claims {numel} elements, more "
                    f"than the file's {file_size} bytes hold"
                )
            layout[key] = (storage_type, numel)
            return np.lib.stride_tricks.as_strided(
                np.zeros(1, storage_type.np_dtype), shape=(numel,), strides=(0,), writeable=False
            )

        RestrictedUnpickler(f, where, probe_storage, unknown_globals, module_classes).load()
        keys = plain()
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ModelFileError(f"{where}: malformed storage key list")
        arrays: dict[str, np.ndarray] = {}
        for key in keys:
            if key not in layout:
                raise ModelFileError(f"{where}: storage {key!r} is listed but never used")
            storage_type, numel = layout[key]
            count = np.frombuffer(_read_exact(f, 8, where), "<i8" if little else ">i8")[0]
            if count != numel:
                raise ModelFileError(f"{where}: storage {key!r} holds {count} elements, the pickle expects {numel}")
            raw = np.empty(numel * storage_type.np_dtype.itemsize, np.uint8)
            if f.readinto(raw) != raw.size:
                raise ModelFileError(f"{where}: truncated file (storage {key!r} ends early)")
            arrays[key] = _typed(raw, storage_type.np_dtype, "little" if little else "big")
        missing = sorted(set(layout) - set(arrays))
        if missing:
            raise ModelFileError(f"{where}: storage(s) {missing} have no data")

        def load_storage(storage_type, key, numel):
            return arrays[key]

        f.seek(start)
        return RestrictedUnpickler(f, where, load_storage, unknown_globals, module_classes).load()


def _read_exact(f, n: int, where: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ModelFileError(f"{where}: truncated file (storage data ends early)")
    return data
