"""The layer classes by class name: the one table that the loaders (``io/keras.py``,
``io/native.py``) read. A new layer class is added here, beside its module."""

from __future__ import annotations

from .attention import (
    AdditiveAttention,
    Attention,
    HardAttention,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SelfAttention,
)
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
from .hierarchical_softmax import HierarchicalSoftmax
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
    Bidirectional,
    GRUCell,
    LSTMCell,
    PaddingMask,
    SimpleRNN,
    SimpleRNNCell,
)
from .reshaping import Cropping1D, Cropping2D, ZeroPadding1D, ZeroPadding2D

#: Class name -> layer class (the names of Keras and of the native format's "class_name").
LAYER_CLASSES: dict[str, type] = {cls.__name__: cls for cls in (
    Activation, Add, AdditiveAttention, Attention, Average, AveragePooling1D, AveragePooling2D,
    BatchNormalization, Bidirectional, BinaryOp, Concatenate, Conv1D, Conv2D, Conv2DTranspose,
    Cropping1D, Cropping2D, CustomScaleLayer, Dense, DepthwiseConv2D, Dropout, ELU, Embedding,
    Flatten, GRU, GRUCell, GlobalAveragePooling1D, GlobalAveragePooling2D, GlobalMaxPooling1D,
    GlobalMaxPooling2D, HardAttention, HierarchicalSoftmax, InceptionBlock, InputLayer, LSTM,
    LSTMCell, LayerNormalization, LayerScale, LeakyReLU, LocalResponseNormalization,
    MaxPooling1D, MaxPooling2D, Maximum, Minimum, MultiHeadAttention, Multiply, NiNBlock,
    Normalization, PaddingMask, Permute, PositionalEncoding, PositionwiseFeedForward,
    RMSNormalization, ReLU, RepeatVector, Rescaling, Reshape, RoIPooling2D, SelfAttention,
    SeparableConv2D, SimpleRNN, SimpleRNNCell, Softmax, SpatialDropout1D, SpatialDropout2D,
    SpatialDropout3D, StochasticDepth, Subtract, UpSampling2D, ZeroPadding1D, ZeroPadding2D,
)}
