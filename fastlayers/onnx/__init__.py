"""ONNX graphs on fastlayers kernels: the protobuf reader (``proto``), the load-time checks
(``check``), optimisations (``rewrite``, ``encoder``, ``quant`` and the fusions of ``model``),
the operators by family (``ops``, ``indexing``, ``control``, ``quant``) and ``OnnxModel``, the
interpreter. ``fastlayers.io.onnx`` reads files into it; ``fastlayers.load`` is the entry point.
"""

from .model import OnnxModel

__all__ = ["OnnxModel"]
