"""ONNX model files: read a file (or its bytes, or an ``onnx.ModelProto``) and import it.

The file is parsed by ``fastlayers.onnx.proto`` (no onnx package needed; weights in external
data files are read from beside the model), then checked, optimised and made an ``OnnxModel``
by ``fastlayers.onnx.importer.from_model``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError
from ..onnx.importer import from_model
from ..onnx.model import OnnxModel
from ..onnx.proto import parse_model, read_buffer


class FileSource:
    """A model file to read again when the model is pickled, so that a loaded model keeps no
    second copy of its file in memory (the ONNX optimiser replaces every initializer of common
    exports: the file's buffer is otherwise freed after the import).

    The file must be the one read (same device, inode, size and modification time), else
    pickling raises ``ModelFileError``: the pickle carries exactly what was imported.
    """

    __slots__ = ("path", "identity")

    def __init__(self, path, stat: os.stat_result):
        self.path, self.identity = os.path.abspath(path), self._identity(stat)

    @staticmethod
    def _identity(stat: os.stat_result) -> tuple:
        return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns

    @staticmethod
    def _read(f, stat: os.stat_result) -> np.ndarray:
        data = np.empty(stat.st_size, np.uint8)  # not zero-filled: the read writes every byte
        # numpy's stubs give ndarray __buffer__ only from Python 3.12; it has the buffer protocol
        if f.readinto(memoryview(data)) != stat.st_size:  # type: ignore[arg-type]
            raise OSError("the file changed size while it was read")
        return data

    @classmethod
    def read_new(cls, path) -> tuple[Any, FileSource]:
        """The bytes of the file at ``path`` in one fresh buffer (``proto.read_buffer``: for
        ``parse_model(..., own=True)``, which spends it), and its ``FileSource``."""
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                return read_buffer(f, stat.st_size), cls(path, stat)
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read the file ({e})") from e

    def read(self) -> np.ndarray:
        """The file's bytes, read again; ModelFileError where it is gone or changed since."""
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if self._identity(stat) != self.identity:
                    raise ModelFileError(
                        f"{self.path}: the file changed since the model was read "
                        "from it, and a pickle carries the file's bytes: load it "
                        "again, then pickle"
                    )
                return self._read(f, stat)
        except OSError as e:
            if isinstance(e, ModelFileError):
                raise
            raise ModelFileError(
                f"{self.path}: cannot read the file again, and a pickle carries the file's bytes ({e})"
            ) from e


def load_onnx(path) -> OnnxModel:
    """Import an ONNX model file (see the module docstring)."""
    where = str(path)
    source: FileSource | None
    data, source = FileSource.read_new(path)
    # each weight copied out of the buffer into memory of its own, the buffer's pages handed
    # back as it goes: the optimiser frees what it replaces weight by weight
    parsed = parse_model(data, where, Path(path).parent, own=True)
    del data
    if parsed.external_data:  # its pickle could not carry the weights beside it
        source = None
    return from_model(parsed, where, source, own=True)


def from_proto(proto, where: str = "ONNX model") -> OnnxModel:
    """Import an in-memory ``onnx.ModelProto`` (its external data, if any, must be loaded)."""
    return from_bytes(bytearray(proto.SerializeToString()), where)


def from_bytes(data, where: str = "ONNX model") -> OnnxModel:
    """Import a serialized ModelProto (a writeable buffer, which the weights may view; external
    data refused); the model keeps ``data``, which its pickle carries."""
    return from_model(parse_model(data, where), where, data)
