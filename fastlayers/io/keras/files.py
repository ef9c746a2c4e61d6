"""The Keras entry points: ``load_keras`` (a ``.keras`` archive or its directory),
``load_keras_h5`` (a legacy full-model ``.h5``) and ``load_weights`` (``Model.load_weights``);
they open the file, check it, then build the model and read its weights."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np

from ... import limits, settings
from ...errors import FastlayersError, ModelFileError
from .config import check_config
from .heaps import scan_file
from .models import build_model
from .weights import (
    H5_ERRORS,
    RawFile,
    assign_keras3,
    assign_legacy,
    check_weights_fit,
    get_object,
    import_h5py,
    text_attr,
)


# --------------------------------------------------------------------------------- entry points
def _open_h5(source, where):
    h5py = import_h5py()
    try:
        return h5py.File(source, "r")
    except H5_ERRORS as e:
        raise ModelFileError(f"{where}: not a readable HDF5 file ({type(e).__name__}: {str(e)[:200]})") from e


def _weights_stage(where: str, fn, *args):
    """``fn(*args)`` (a step that reads the HDF5 file), h5py's errors on a corrupt file (missing
    objects, bad addresses, heaps) turned into ModelFileError naming the file."""
    try:
        return fn(*args)
    except FastlayersError:
        raise
    except H5_ERRORS as e:
        raise ModelFileError(f"{where}: corrupt weights ({type(e).__name__}: {str(e)[:200]})") from e
    except MemoryError as e:
        raise ModelFileError(f"{where}: the weights cannot be allocated ({e})") from e


def load_keras(source):
    """Load a Keras 3 ``.keras`` archive (a path or a seekable binary file object), or its
    unzipped directory, as a fastlayers model."""
    where = str(source)
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        path = Path(source)
        config = path / "config.json"
        weights = path / "model.weights.h5"
        try:
            limit = settings.current().max_config_bytes
            if config.stat().st_size > limit:
                limits.parse_json(b" " * (limit + 1), where, "config.json")
            entry = limits.parse_json(config.read_bytes(), where, "config.json")
            fobj = open(weights, "rb")
        except FileNotFoundError as e:
            raise ModelFileError(f"{where}: the directory has no {Path(e.filename).name}") from None
        except OSError as e:
            raise ModelFileError(f"{where}: cannot read the archive directory ({e})") from None
        with fobj, _open_h5(fobj, where) as f:
            raw = RawFile(fobj)
            return _model_with_weights(entry, f, where, raw, raw.size)
    opened = limits.open_file(source, where)
    fobj = opened or source
    try:
        try:
            z = limits.open_zip(fobj, where)
        except ModelFileError as e:
            raise ModelFileError(
                str(e).replace("not a readable zip archive", "not a readable .keras archive")
            ) from None
        with z:
            info = limits.get_member(z, "config.json", where)
            limit = settings.current().max_config_bytes
            entry = limits.parse_json(limits.read_member(z, info, where, limit), where, "config.json")
            info = limits.get_member(z, "model.weights.h5", where)
            if info.compress_type != zipfile.ZIP_STORED:
                data = limits.read_member(z, info, where, info.file_size)
                member = io.BytesIO(data)
                with _open_h5(member, where) as f:
                    return _model_with_weights(entry, f, where, RawFile(member), len(data))
            # h5py reads the metadata through the member; the weight bytes of a stored
            # (uncompressed) member are read straight from the archive at their offset, after
            # the member's CRC-32 is checked (the bytes bypass zipfile)
            size = limits.source_size(z)
            start = limits.member_data_offset(fobj, info, where, size)
            limits.check_crc(fobj, start, info.compress_size, info.CRC, where, "zip member 'model.weights.h5'")
            member = _Region(fobj, start, info.file_size)
            with _open_h5(member, where) as f:
                return _model_with_weights(entry, f, where, RawFile(fobj, start, info.file_size), info.file_size)
    finally:
        if opened is not None:
            opened.close()


class _Region(io.RawIOBase):
    """A read-only, seekable window ``[start, start + size)`` of an open binary file (a stored zip
    member), so h5py reads the member in place; zipfile's own member objects re-read and
    checksum everything before each forward seek."""

    def __init__(self, fobj, start: int, size: int):
        super().__init__()
        self._f, self._start, self._size, self._pos = fobj, start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer):
        n = max(0, min(len(buffer), self._size - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buffer)[:n])
        self._pos += got
        return got


def _model_with_weights(entry, h5file, where, raw, h5_bytes: int):
    """Build the model of ``entry`` (checked first) and read its weights from ``h5file`` (an
    image of ``h5_bytes`` bytes)."""
    from ...layers.base import weights_loaded_later  # the layers are imported at the first load

    check_config(entry, where)  # parse_json checked the nesting
    with weights_loaded_later(), np.errstate(all="ignore"):
        model = build_model(entry, where, h5_bytes, _checked=True)
    from ...model.graph import all_graph_nodes

    limits.check_graph(all_graph_nodes(model), where)
    check_weights_fit(model, where, h5_bytes * settings.current().max_compression_ratio)
    _weights_stage(where, assign_keras3, model, h5file, where, set(), raw)
    return model


def load_keras_h5(source):
    """Load a legacy full-model HDF5 file (Keras 3 or tf.keras 2.x ``model.save("x.h5")``) from a
    path or a seekable binary file object."""
    from ...layers.base import weights_loaded_later  # the layers are imported at the first load

    where = str(source)
    with _h5_source(source, where) as (fobj, size):
        scan_file(fobj, 0, size, where)
        with _open_h5(fobj, where) as f:

            def read_config():
                if "model_config" not in f.attrs:
                    raise ModelFileError(
                        f"{where}: HDF5 file without a model_config attribute (a weights file? use model.load_weights)"
                    )
                return text_attr(f, "model_config", where)

            entry = limits.parse_json(_weights_stage(where, read_config), where, "the model_config attribute")
            check_config(entry, where)
            with weights_loaded_later(), np.errstate(all="ignore"):
                model = build_model(entry, where, size, _checked=True)
            from ...model.graph import all_graph_nodes

            limits.check_graph(all_graph_nodes(model), where)
            check_weights_fit(model, where, size * settings.current().max_compression_ratio)

            def assign():
                group = get_object(f, "model_weights", where, "group")
                if group is None:
                    raise ModelFileError(f"{where}: no model_weights group")
                assign_legacy(model, group, where, set(), RawFile(fobj))

            _weights_stage(where, assign)
    return model


class _h5_source:
    """An open binary file for a path (or the given file object, left open) and its size."""

    def __init__(self, source, where):
        self.source, self.where, self.opened = source, where, None

    def __enter__(self):
        fobj = self.source
        if isinstance(self.source, (str, os.PathLike)):
            try:
                fobj = self.opened = open(self.source, "rb")
            except FileNotFoundError:
                raise ModelFileError(f"{self.where}: no such file") from None
            except OSError as e:
                raise ModelFileError(f"{self.where}: cannot open the file ({e.strerror or e})") from None
        fobj.seek(0, io.SEEK_END)
        size = fobj.tell()
        fobj.seek(0)
        return fobj, size

    def __exit__(self, *exc):
        if self.opened is not None:
            self.opened.close()


def load_weights(model, path) -> None:
    """Load Keras weights (``.weights.h5`` Keras 3 layout, or a legacy ``.h5``) into ``model``."""
    where = str(path)
    with _h5_source(path, where) as (fobj, size):
        scan_file(fobj, 0, size, where)
        with _open_h5(fobj, where) as f:
            raw = RawFile(fobj)

            def assign():
                if "layers" in f or "vars" in f:
                    assign_keras3(model, f, where, set(), raw)
                elif "model_weights" in f:
                    assign_legacy(model, get_object(f, "model_weights", where, "group"), where, set(), raw)
                elif "layer_names" in f.attrs:
                    assign_legacy(model, f, where, set(), raw)
                else:
                    raise ModelFileError(
                        f"{where}: no Keras weights found (expected a 'layers' group or 'layer_names' attribute)"
                    )

            _weights_stage(where, assign)
