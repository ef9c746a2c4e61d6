"""Keras-style layers (channels_last by default), with Keras's names, arguments and defaults."""

from .base import InputSpec, Layer
from .bidirectional import Bidirectional
from .blocks import InceptionBlock, NiNBlock
from .convolutional import Conv1D, Conv2D, Conv2DTranspose, DepthwiseConv2D, SeparableConv2D
from .core import (
    ELU,
    Activation,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    LayerScale,
    LeakyReLU,
    Permute,
    ReLU,
    RepeatVector,
    Rescaling,
    Reshape,
    Softmax,
    SpatialDropout1D,
    SpatialDropout2D,
    SpatialDropout3D,
    StochasticDepth,
)
from .hierarchical_softmax import HierarchicalSoftmax, balanced_tree, huffman_tree
from .input_layer import InputLayer
from .merging import (
    Add,
    Average,
    BinaryOp,
    Concatenate,
    CustomScaleLayer,
    Maximum,
    Minimum,
    Multiply,
    Subtract,
)
from .normalization import BatchNormalization, LayerNormalization, Normalization, RMSNormalization
from .pooling import (
    AveragePooling1D,
    AveragePooling2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    LocalResponseNormalization,
    MaxPooling1D,
    MaxPooling2D,
    RoIPooling2D,
    UpSampling2D,
)
from .recurrent import (
    GRU,
    LSTM,
    GRUCell,
    LSTMCell,
    PaddingMask,
    SimpleRNN,
    SimpleRNNCell,
)
from .reshaping import Cropping1D, Cropping2D, ZeroPadding1D, ZeroPadding2D

__all__ = [
    "Activation",
    "Add",
    "Average",
    "BatchNormalization",
    "BinaryOp",
    "Concatenate",
    "Cropping1D",
    "Cropping2D",
    "CustomScaleLayer",
    "Dense",
    "Dropout",
    "ELU",
    "Embedding",
    "Flatten",
    "HierarchicalSoftmax",
    "InputLayer",
    "InputSpec",
    "Layer",
    "LayerNormalization",
    "LayerScale",
    "LeakyReLU",
    "Maximum",
    "Minimum",
    "Multiply",
    "Normalization",
    "Permute",
    "RMSNormalization",
    "ReLU",
    "RepeatVector",
    "Rescaling",
    "Reshape",
    "Softmax",
    "SpatialDropout1D",
    "SpatialDropout2D",
    "SpatialDropout3D",
    "StochasticDepth",
    "Subtract",
    "ZeroPadding1D",
    "ZeroPadding2D",
    "balanced_tree",
    "huffman_tree",
]
__all__ += [
    "AveragePooling1D",
    "AveragePooling2D",
    "Conv1D",
    "Conv2D",
    "Conv2DTranspose",
    "DepthwiseConv2D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "InceptionBlock",
    "LocalResponseNormalization",
    "MaxPooling1D",
    "MaxPooling2D",
    "NiNBlock",
    "RoIPooling2D",
    "SeparableConv2D",
    "UpSampling2D",
]

# attention
from .attention import (  # noqa: E402
    AdditiveAttention,
    Attention,
    HardAttention,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SelfAttention,
)

__all__ += [
    "AdditiveAttention",
    "Attention",
    "HardAttention",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SelfAttention",
]

# recurrent
__all__ += [
    "Bidirectional",
    "GRU",
    "GRUCell",
    "LSTM",
    "LSTMCell",
    "PaddingMask",
    "SimpleRNN",
    "SimpleRNNCell",
]

#: Class name -> layer class, every concrete layer class exported above: the one table that the
#: loaders (``io/keras/``, ``io/native.py``) read (the names of Keras and of the native
#: format's "class_name"). A new layer class is exported here, beside the others of its module.
LAYER_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (globals()[name] for name in sorted(__all__))
    if isinstance(cls, type) and issubclass(cls, Layer) and cls is not Layer
}
