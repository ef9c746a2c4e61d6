"""Keras model files without Keras or TensorFlow: ``.keras`` (Keras 3 zip or its unzipped
directory), legacy full-model ``.h5`` (Keras 3 and tf.keras 2.x) and weight files
(``.weights.h5``, legacy ``.h5`` weights). Needs h5py (``pip install fastlayers[keras]``).

The architecture (JSON) is rebuilt with fastlayers layers, each made by the creator of its Keras
class (one table, ``keras_layers``; users add their own with ``register_keras_layer``); weights
are read by position in Keras's own order. Nothing in a file is executed: ``Lambda`` layers
(Python bytecode) and unregistered custom classes are refused with ``UnsupportedError`` at load
time.

Files are checked before h5py or a layer sees them (``fastlayers.limits`` for the limits): the zip
layer (flags, methods, sizes; the weights member's CRC-32 when it is read in place), the config
(size, nesting, structure, types, the ranges of layer options, weight sizes against the bytes
the file holds), the HDF5 objects (only hard links are followed, datasets must be numeric and
stored in the file itself, their bytes inside it) and, before any attribute is read from a
legacy ``.h5``, every global heap collection (``heaps``).

The modules, by subject:

- ``files``: the entry points (``load_keras``, ``load_keras_h5``, ``load_weights``), opening
  and checking the file;
- ``config``: the structure and types of a model config (``check_config``);
- ``creators``: the creator of each Keras class, and a layer config -> a fastlayers layer
  (``build_layer``);
- ``models``: a model config -> a fastlayers model (``build_model``), operation nodes included;
- ``weights``: the HDF5 weights, read into the built layers;
- ``heaps``: the walk of the HDF5 global heaps before h5py reads an attribute.
"""

from .config import check_config
from .creators import KerasLayer, build_layer, keras_layers, register_keras_layer
from .files import load_keras, load_keras_h5, load_weights
from .models import build_model, build_operation

__all__ = [
    "KerasLayer",
    "build_layer",
    "build_model",
    "build_operation",
    "check_config",
    "keras_layers",
    "load_keras",
    "load_keras_h5",
    "load_weights",
    "register_keras_layer",
]
