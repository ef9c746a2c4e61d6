"""torch.nn-style modules: torch's names, constructor signatures and state_dict keys, running
on fastlayers kernels over numpy arrays. Porting a model means changing the imports::

    import fastlayers.nn as nn
    import fastlayers.nn.functional as F
"""

from . import functional
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
from .functional_conv import roi_pool
from .module import IncompatibleKeys, Module
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

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "ELU",
    "Embedding",
    "Flatten",
    "GELU",
    "Hardsigmoid",
    "Identity",
    "IncompatibleKeys",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LogSoftmax",
    "Module",
    "ModuleDict",
    "ModuleList",
    "ReLU",
    "ReLU6",
    "SELU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softplus",
    "Softsign",
    "Tanh",
    "functional",
]
__all__ += [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose2d",
    "LocalResponseNorm",
    "MaxPool1d",
    "MaxPool2d",
    "RoIPool",
    "Upsample",
    "roi_pool",
]

# attention and transformers
from .attention import MultiheadAttention  # noqa: E402
from .transformer import (  # noqa: E402
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    generate_square_subsequent_mask,
    greedy_decode,
)

__all__ += [
    "MultiheadAttention",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "generate_square_subsequent_mask",
    "greedy_decode",
]
__all__ += ["GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNCell"]

#: Class name -> module class (torch's names), every concrete module class exported here: the
#: table that ``pickling`` rebuilds modules from. A new module class is exported here.
MODULE_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (globals()[name] for name in sorted(__all__))
    if isinstance(cls, type) and issubclass(cls, Module) and cls is not Module
}
