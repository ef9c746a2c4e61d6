"""Core torch.nn modules: containers, Linear, activations, dropout, flatten, normalization, embedding."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from ..backends import get_ops
from ..backends.reference import fold_batch_norm
from ..errors import ShapeError
from . import functional as F
from . import tracing  # noqa: F401 - attaches the tracer to the calls of modules of one's own
from .module import Module
from .plans import compiled_call


def _uniform(rng, bound, shape):
    # float32 from the start, in place: no float64 array of the weight's size at any moment
    # (a module rebuilt from a file allocates no more than its weights)
    a = rng.random(shape, dtype=np.float32)
    a *= np.float32(2 * bound)
    a -= np.float32(bound)
    return a


# --------------------------------------------------------------------------------- containers
class Sequential(Module):
    """Modules applied in order; children are named "0", "1", ... (or by an OrderedDict's keys)."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Sequential(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[idx]

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def forward(self, input):
        # one float32 array: the stack's compiled ONNX plan where every module has a form
        out = compiled_call(self, input)
        if out is not None:
            return out
        for m in self._modules.values():
            input = m(input)
        return input


class ModuleList(Module):
    """A list of modules, indexed like torch.nn.ModuleList (keys "0", "1", ...)."""

    def __init__(self, modules=None):
        super().__init__()
        for m in modules or []:
            self.append(m)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, idx):
        values = list(self._modules.values())
        return ModuleList(values[idx]) if isinstance(idx, slice) else values[idx]

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for m in modules:
            self.append(m)
        return self


class ModuleDict(Module):
    """A dict of modules keyed by name."""

    def __init__(self, modules=None):
        super().__init__()
        for name, m in (modules or {}).items():
            self.add_module(name, m)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()


class Identity(Module):
    """Returns its input."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


# ------------------------------------------------------------------------------------ linear
class Linear(Module):
    """y = x W^T + b; ``weight`` (out_features, in_features), ``bias`` (out_features,)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        rng = np.random.default_rng()
        bound = 1.0 / math.sqrt(max(1, self.in_features))
        self.weight = _uniform(rng, bound, (self.out_features, self.in_features))
        self.bias = _uniform(rng, bound, (self.out_features,)) if bias else None

    def forward(self, input):
        x = F._f32(input, "linear")
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(
                f"Linear(in_features={self.in_features}): expected input (..., {self.in_features}), got shape {x.shape}"
            )
        return get_ops().dense(x, self.weight.T, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# ------------------------------------------------------------------------------- activations
def _activation_module(name: str, fn, doc: str):
    def forward(self, input):
        return fn(input)

    return type(
        name,
        (Module,),
        {"__init__": lambda self, inplace=False: Module.__init__(self), "forward": forward, "__doc__": doc},
    )


ReLU = _activation_module("ReLU", F.relu, "max(x, 0).")
ReLU6 = _activation_module("ReLU6", F.relu6, "min(max(x, 0), 6).")
SELU = _activation_module("SELU", F.selu, "scale * elu(x, alpha) with the SELU constants.")
Sigmoid = _activation_module("Sigmoid", F.sigmoid, "1 / (1 + exp(-x)).")
Hardsigmoid = _activation_module("Hardsigmoid", F.hardsigmoid, "relu6(x + 3) / 6.")
Tanh = _activation_module("Tanh", F.tanh, "tanh(x).")
Softsign = _activation_module("Softsign", F.softsign, "x / (1 + |x|).")
SiLU = _activation_module("SiLU", F.silu, "x * sigmoid(x).")


class LeakyReLU(Module):
    """x for x >= 0, else negative_slope * x."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope)


class ELU(Module):
    """x for x > 0, else alpha * (exp(x) - 1)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, input):
        return F.elu(input, self.alpha)


class GELU(Module):
    """x * Phi(x); ``approximate="tanh"`` for the tanh approximation."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, self.approximate)


class Softplus(Module):
    """log(1 + exp(beta x)) / beta, linear above ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)


class Softmax(Module):
    """Softmax along ``dim``."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmax(input, self.dim)


class LogSoftmax(Module):
    """Log-softmax along ``dim``."""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.log_softmax(input, self.dim)


# ---------------------------------------------------------------------------- shape, dropout
class Flatten(Module):
    """Flatten axes ``start_dim`` to ``end_dim`` into one."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        x = F._f32(input, "Flatten")
        start, end = self.start_dim % max(x.ndim, 1), self.end_dim % max(x.ndim, 1)
        # the flattened size itself, not -1: a batch of 0 leaves -1 undetermined
        return x.reshape(*x.shape[:start], math.prod(x.shape[start : end + 1]), *x.shape[end + 1 :])


class Dropout(Module):
    """The identity at inference."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)

    def forward(self, input):
        return F._f32(input, "Dropout")


class Dropout1d(Dropout):
    """Channel dropout: the identity at inference."""


class Dropout2d(Dropout):
    """Channel dropout: the identity at inference."""


# ----------------------------------------------------------------------------- normalization
class LayerNorm(Module):
    """Normalize the trailing ``normalized_shape`` axes; ``weight`` and ``bias`` of that shape."""

    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, float(eps)
        self.elementwise_affine = elementwise_affine
        self.weight = np.ones(shape, np.float32) if elementwise_affine else None
        self.bias = np.zeros(shape, np.float32) if elementwise_affine and bias else None

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class _BatchNorm(Module):
    _ranks: tuple[int, ...] = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device=None,
        dtype=None,
        bias: bool = True,
    ):
        super().__init__()
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = np.ones(self.num_features, np.float32) if affine else None
        self.bias = np.zeros(self.num_features, np.float32) if affine and bias else None
        if track_running_stats:
            self.register_buffer("running_mean", np.zeros(self.num_features, np.float32))
            self.register_buffer("running_var", np.ones(self.num_features, np.float32))
            self.register_buffer("num_batches_tracked", np.array(0, np.int64))
        self._state_changed()

    def _state_changed(self):
        if self.track_running_stats:
            object.__setattr__(
                self, "_folded", fold_batch_norm(self.running_mean, self.running_var, self.weight, self.bias, self.eps)
            )

    def forward(self, input):
        x = F._f32(input, type(self).__name__)
        if x.ndim not in self._ranks or x.shape[1] != self.num_features:
            raise ShapeError(
                f"{type(self).__name__}({self.num_features}): expected input of rank "
                f"{' or '.join(map(str, self._ranks))} with {self.num_features} channels "
                f"on axis 1, got shape {x.shape}"
            )
        if not self.track_running_stats:
            raise ShapeError(
                f"{type(self).__name__}: track_running_stats=False normalizes with batch "
                "statistics, which inference does not support"
            )
        scale, shift = self._folded
        return get_ops().batch_norm(x, scale, shift, axis=1)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchNorm1d(_BatchNorm):
    """Inference batch norm over (N, C) or (N, C, L) with the running statistics."""

    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Inference batch norm over (N, C, H, W) with the running statistics."""

    _ranks = (4,)


# ----------------------------------------------------------------------------------- embedding
class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) selected by integer indices."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm=None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight=None,
        _freeze: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if max_norm is not None:
            from ..errors import UnsupportedError

            raise UnsupportedError("Embedding(max_norm=...) renormalizes weights during lookup; not supported")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = padding_idx
        if _weight is None:  # float32 from the start (no float64 table)
            _weight = np.random.default_rng().standard_normal(
                (self.num_embeddings, self.embedding_dim), dtype=np.float32
            )
        self.weight = np.asarray(_weight, np.float32)

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"
