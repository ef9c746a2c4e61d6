"""ONNX model files: read a file (or its bytes, or an ``onnx.ModelProto``) and import it.

The file is parsed by ``fastlayers.onnx.proto`` (no onnx package needed; weights in external
data files are read from beside the model), then checked, optimised and made an ``OnnxModel``
by ``fastlayers.onnx.model.from_model``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFileError
from ..onnx.proto import parse_model
from ..onnx.model import OnnxModel, from_model


def load_onnx(path) -> OnnxModel:
    """Import an ONNX model file (see the module docstring)."""
    from ..pickling import FileSource

    where = str(path)
    data, source = FileSource.read_new(path)   # one buffer, which the weights are views of
    try:
        parsed = parse_model(data, where)
    except ModelFileError:   # weights in external data files beside it (or a defect: raised again)
        parsed, source = parse_model(data, where, Path(path).parent), None
    model = from_model(parsed, where)
    model._source = source
    return model


def from_proto(proto, where: str = "ONNX model") -> OnnxModel:
    """Import an in-memory ``onnx.ModelProto`` (its external data, if any, must be loaded)."""
    return from_bytes(bytearray(proto.SerializeToString()), where)


def from_bytes(data, where: str = "ONNX model") -> OnnxModel:
    """Import a serialized ModelProto (a writeable buffer, which the weights may view; external
    data refused); the model keeps ``data``, which its pickle carries."""
    model = from_model(parse_model(data, where), where)
    model._source = data
    return model
