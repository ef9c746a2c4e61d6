"""Model file readers: ``load`` picks one by the file's content and suffix."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFileError, UnsupportedError
from .native import is_native, load_native

_FOREIGN = {
    ".onnx": "ONNX",
    ".pt": "PyTorch", ".pth": "PyTorch", ".bin": "PyTorch", ".safetensors": "safetensors",
}


def load(path):
    """Load a model file and return a ready ``fastlayers.Model``.

    Parameters
    ----------
    path : str or os.PathLike
        A model written by ``Model.save`` (fastlayers native format), a Keras 3 ``.keras``
        archive (or its unzipped directory), or a full-model Keras ``.h5`` file.

    Raises
    ------
    ModelFileError
        The file is missing, truncated, corrupt or not a model.
    UnsupportedError
        The format or a layer in it is not supported.
    """
    p = Path(path)
    if p.is_dir() and (p / "config.json").is_file():  # an unzipped .keras archive
        from .keras import load_keras

        return load_keras(p)
    if not p.is_file():
        raise ModelFileError(f"{path}: no such file")
    if is_native(p):
        return load_native(p)
    with open(p, "rb") as f:
        magic = f.read(8)
    if p.suffix.lower() == ".keras":
        from .keras import load_keras

        return load_keras(p)
    if magic == b"\x89HDF\r\n\x1a\n" or p.suffix.lower() in (".h5", ".hdf5"):
        from .keras import load_keras_h5

        return load_keras_h5(p)
    kind = _FOREIGN.get(p.suffix.lower())
    if kind is not None:
        raise UnsupportedError(f"{path}: reading {kind} files is not supported by this version of "
                               "fastlayers yet (readable now: the native format and Keras .keras/.h5 files)")
    raise ModelFileError(f"{path}: not a fastlayers model file (unknown format)")
