"""The walk of an HDF5 image's global heap collections before h5py reads any attribute (see
``_check_global_heaps``)."""

from __future__ import annotations

import io
import mmap
import struct

from ...errors import ModelFileError

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_global_heaps(buf, start: int, end: int, where: str) -> None:
    """Walk every global heap collection (``GCOL``: variable-length strings such as the model
    config and the ``weight_names`` lists) in ``buf[start:end]`` as HDF5 will, before HDF5 does:
    a free-space object of size 0, or an object running past its collection, makes HDF5's
    reader loop forever (H5HG__cache_heap_deserialize, through HDF5 2.0: a hang inside
    ``fastlayers.load`` that no timeout in the process can stop), so such a file is refused.

    The scan finds the collections by their signature anywhere in the image (HDF5 keeps no list
    of them); a weight whose bytes happen to read ``GCOL`` followed by a plausible header and an
    impossible object list would refuse a valid file, at odds under 2**-64 per position."""
    length_size = _hdf5_length_size(buf, start, end, where)
    header = 8 + length_size
    objhdr = 8 + length_size
    fmt = {2: "<H", 4: "<I", 8: "<Q"}[length_size]
    at = buf.find(b"GCOL", start, end)
    while at != -1:
        if at + header <= end and buf[at + 4] == 1 and buf[at + 5 : at + 8] == b"\x00\x00\x00":
            (size,) = struct.unpack_from(fmt, buf, at + 8)
            stop = at + size
            if at + header < stop <= end:  # HDF5 refuses collections past the end of the file
                p = at + header
                while p < stop:
                    if p + objhdr > stop:
                        break  # the tail: free space HDF5 skips to the end
                    index = struct.unpack_from("<H", buf, p)[0]
                    (osize,) = struct.unpack_from(fmt, buf, p + 8)
                    need = objhdr + ((osize + 7) & ~7) if index > 0 else osize
                    if need <= 0 or need > stop - p:
                        raise ModelFileError(
                            f"{where}: corrupt HDF5 global heap at byte {at:,} (object {index} "
                            f"of size {osize:,} at byte {p:,}); HDF5 would never finish reading it"
                        )
                    p += need
        at = buf.find(b"GCOL", at + 1, end)


def _hdf5_length_size(buf, start: int, end: int, where: str) -> int:
    """The superblock's 'size of lengths' (8 in every file h5py writes)."""
    base = start
    while base + 16 <= end and buf[base : base + 8] != _HDF5_SIGNATURE:
        base = start + max(512, 2 * (base - start))  # a user block: 512, 1024, 2048, ...
    if base + 16 > end:
        raise ModelFileError(f"{where}: not a readable HDF5 file (no superblock)")
    version = buf[base + 8]
    size = buf[base + 14] if version in (0, 1) else buf[base + 10]
    return size if size in (2, 4, 8) else 8


def scan_file(fobj, start: int, size: int, where: str) -> None:
    """``_check_global_heaps`` over ``size`` bytes at ``start`` of an open file or buffer."""
    if size <= 0:
        raise ModelFileError(f"{where}: not a readable HDF5 file (empty)")
    if isinstance(fobj, io.BytesIO):  # getvalue shares the bytes the buffer was made from
        data = fobj.getvalue()
        return _check_global_heaps_safe(data, start, min(start + size, len(data)), where)
    try:
        mapped = mmap.mmap(fobj.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, io.UnsupportedOperation):
        fobj.seek(start)
        return _check_global_heaps_safe(fobj.read(size), 0, size, where)
    with mapped:
        _check_global_heaps_safe(mapped, start, min(start + size, len(mapped)), where)


def _check_global_heaps_safe(buf, start, end, where) -> None:
    try:
        _check_global_heaps(buf, start, end, where)
    except (struct.error, IndexError):
        raise ModelFileError(f"{where}: corrupt HDF5 global heap (truncated)") from None
