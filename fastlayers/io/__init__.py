"""Model file readers: ``load`` picks one by the file's content and suffix."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFileError, UnsupportedError

_TORCH_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".pkl"}
__all__ = ["load", "load_state_dict"]


def __getattr__(name):
    if name == "load_state_dict":   # imported at first use, as each reader is
        from .torch import load_state_dict

        return load_state_dict
    raise AttributeError(f"module 'fastlayers.io' has no attribute {name!r}")


def load(path, warm_up: bool = True):
    """Load a model file and return a ready model.

    Parameters
    ----------
    path : str or os.PathLike
        A model written by ``Model.save`` (fastlayers native format), a Keras 3 ``.keras``
        archive (or its unzipped directory), or a full-model Keras ``.h5`` file: returns a
        ``fastlayers.Model``. Or a whole pickled ``torch.nn`` module (``torch.save(model)``,
        ``.pt``/``.pth``/``.bin``, zip or legacy) made of standard torch.nn classes: returns the
        ``fastlayers.nn`` equivalent, rebuilt without torch and without running code from the
        file. Files holding only weights (state dicts, safetensors) are refused with a pointer to
        ``fastlayers.load_state_dict``. Or an ONNX graph (``.onnx``): returns an ``OnnxModel``
        that runs on fastlayers primitives.
    warm_up : bool, default True
        Run the model once on zeros of its declared input shapes before returning it
        (``Model.warm_up``, ``OnnxModel.warm_up``; batch 1), so that the first real call finds
        its weights packed and its threads started. torch modules declare no input shape and
        are not warmed up.

    Raises
    ------
    ModelFileError
        The file is missing, truncated, corrupt or not a model.
    UnsupportedError
        The format or a layer in it is not supported (a custom torch class: export to ONNX).
    """
    model = _load(path)
    if warm_up and hasattr(model, "warm_up"):
        model.warm_up()
    return model


def _load(path):
    from ..backends import get_ops

    get_ops()  # the active backend loads now (its kernels), not inside the model's first call
    p = Path(path)
    if p.is_dir() and (p / "config.json").is_file():  # an unzipped .keras archive
        from .keras import load_keras

        return load_keras(p)
    if not p.is_file():
        raise ModelFileError(f"{path}: no such file")
    with open(p, "rb") as f:
        magic = f.read(8)
    if magic[:4] == b"PK\x03\x04":   # a zip: the native format, a .keras archive or a torch file
        from .native import is_native, load_native

        if is_native(p):
            return load_native(p)
    if p.suffix.lower() == ".keras":
        from .keras import load_keras

        return load_keras(p)
    if magic == b"\x89HDF\r\n\x1a\n" or p.suffix.lower() in (".h5", ".hdf5"):
        from .keras import load_keras_h5

        return load_keras_h5(p)
    if p.suffix.lower() == ".onnx":
        from .onnx import load_onnx

        return load_onnx(p)
    from .safetensors import is_safetensors
    from .torch import is_torch_file, load_torch_module

    if p.suffix.lower() == ".safetensors" or is_safetensors(p):
        raise ModelFileError(f"{path}: a safetensors file holds weights only, not a model: build the "
                             "model with fastlayers.nn and load the weights with "
                             "model.load_state_dict(fastlayers.load_state_dict(path))")
    if p.suffix.lower() in _TORCH_SUFFIXES or is_torch_file(p):
        return load_torch_module(p)
    raise ModelFileError(f"{path}: not a fastlayers model file (unknown format)")
