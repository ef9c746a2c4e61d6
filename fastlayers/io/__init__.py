"""Model file readers: ``load`` picks one by the file's content and suffix."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFileError, UnsupportedError
from .native import is_native, load_native

_FOREIGN = {
    ".keras": "Keras", ".h5": "Keras/HDF5", ".hdf5": "Keras/HDF5", ".onnx": "ONNX",
    ".pt": "PyTorch", ".pth": "PyTorch", ".bin": "PyTorch", ".safetensors": "safetensors",
}


def load(path):
    """Load a model file and return a ready ``fastlayers.Model``.

    Parameters
    ----------
    path : str or os.PathLike
        A model written by ``Model.save`` (fastlayers native format).

    Raises
    ------
    ModelFileError
        The file is missing, truncated, corrupt or not a model.
    UnsupportedError
        The format or a layer in it is not supported.
    """
    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"{path}: no such file")
    if is_native(p):
        return load_native(p)
    kind = _FOREIGN.get(p.suffix.lower())
    if kind is not None:
        raise UnsupportedError(f"{path}: reading {kind} files is not supported by this version of "
                               "fastlayers yet; only the native format written by Model.save is")
    raise ModelFileError(f"{path}: not a fastlayers model file (unknown format)")
