"""Keras-style layers (channels_last by default), with Keras's names, arguments and defaults."""

from .base import InputSpec, Layer
from .core import (
    ELU, Activation, Dense, Dropout, Embedding, Flatten, LeakyReLU, Permute, ReLU, RepeatVector,
    Rescaling, Reshape, Softmax, SpatialDropout1D, SpatialDropout2D, SpatialDropout3D,
)
from .hierarchical_softmax import HierarchicalSoftmax, balanced_tree, huffman_tree
from .merging import Add, Average, Concatenate, Maximum, Minimum, Multiply, Subtract
from .normalization import BatchNormalization, LayerNormalization, RMSNormalization
from .reshaping import Cropping1D, Cropping2D, ZeroPadding1D, ZeroPadding2D
from .recurrent import (
    GRU, LSTM, Bidirectional, GRUCell, LSTMCell, PaddingMask, SimpleRNN, SimpleRNNCell,
)
from ..graph import InputLayer

__all__ = [
    "Activation", "Add", "Average", "BatchNormalization", "Concatenate", "Cropping1D", "Cropping2D",
    "Dense", "Dropout", "ELU", "Embedding", "Flatten", "HierarchicalSoftmax", "InputLayer",
    "InputSpec", "Layer", "LayerNormalization", "LeakyReLU", "Maximum", "Minimum", "Multiply",
    "Permute", "RMSNormalization", "ReLU", "RepeatVector", "Rescaling", "Reshape", "Softmax",
    "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "Subtract", "ZeroPadding1D",
    "ZeroPadding2D", "balanced_tree", "huffman_tree",
]
__all__ += [
    "Bidirectional", "GRU", "GRUCell", "LSTM", "LSTMCell", "PaddingMask", "SimpleRNN",
    "SimpleRNNCell",
]
