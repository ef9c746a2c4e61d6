"""onnxruntime.quantization's static quantization for the tests' torch exports."""

from __future__ import annotations

import logging


def quantize_static_on(float_path, path, feeds: list, **options) -> None:
    """Quantizes the ONNX file at ``float_path`` into ``path`` with
    ``onnxruntime.quantization.quantize_static`` (QDQ), calibrated on ``feeds`` ({input name:
    array} each); ``options`` go to ``quantize_static``. Its advice to pre-process the model
    first is silenced."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(float_path, path, Feeds(), **options)
