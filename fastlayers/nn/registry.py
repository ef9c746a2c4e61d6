"""The module classes by class name: the table that ``pickling`` rebuilds modules from. A new
module class is added here, beside its module."""

from __future__ import annotations

from .attention import MultiheadAttention
from .conv import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AvgPool1d,
    AvgPool2d,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    LocalResponseNorm,
    MaxPool1d,
    MaxPool2d,
    RoIPool,
    Upsample,
)
from .modules import (
    ELU,
    GELU,
    SELU,
    BatchNorm1d,
    BatchNorm2d,
    Dropout,
    Dropout1d,
    Dropout2d,
    Embedding,
    Flatten,
    Hardsigmoid,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    ModuleDict,
    ModuleList,
    ReLU,
    ReLU6,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Softsign,
    Tanh,
)
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from .transformer import (
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

#: Class name -> module class (torch's names).
MODULE_CLASSES: dict[str, type] = {cls.__name__: cls for cls in (
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d,
    AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d, ConvTranspose2d, Dropout, Dropout1d,
    Dropout2d, ELU, Embedding, Flatten, GELU, GRU, GRUCell, Hardsigmoid, Identity, LSTM,
    LSTMCell, LayerNorm, LeakyReLU, Linear, LocalResponseNorm, LogSoftmax, MaxPool1d,
    MaxPool2d, ModuleDict, ModuleList, MultiheadAttention, RNN, RNNCell, ReLU, ReLU6, RoIPool,
    SELU, Sequential, SiLU, Sigmoid, Softmax, Softplus, Softsign, Tanh, TransformerDecoder,
    TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer, Upsample,
)}
