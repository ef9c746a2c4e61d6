"""``model.to(device)`` for graph models and nn modules: a model bound to a backend (imports no
device backend until it is called)."""

from __future__ import annotations

from typing import Any

from ..backends import get_ops, use_ops
from ..errors import UnsupportedError


def device_backend(device, strict: bool = True) -> str | None:
    """The backend name of ``device``: "cuda" for "cuda" / "cuda:0" / torch.device("cuda"),
    None for "cpu" (and, unless ``strict``, for anything that is not a device, e.g. a dtype)."""
    name = getattr(device, "type", None) if not isinstance(device, str) else device
    index = getattr(device, "index", None) if not isinstance(device, str) else None
    if isinstance(name, str):
        base, _, idx = name.partition(":")
        if idx:
            index = int(idx) if idx.isdigit() else idx
        if base == "cpu":
            return None
        if base == "cuda":
            if index not in (None, 0):
                raise UnsupportedError(f"device {device!r}: only one GPU (cuda:0) is supported")
            return "cuda"
    if strict:
        raise UnsupportedError(f"unknown device {device!r}; expected 'cpu' or 'cuda'")
    return None


def on_device(model, device, strict: bool = True):
    """``model`` itself for the CPU, else a ``BackendModel`` running it on the device's backend."""
    if isinstance(model, BackendModel):
        model = model.model
    backend = device_backend(device, strict)
    if backend is None:
        return model

    get_ops(backend)  # fail now (no GPU, no numba-cuda), not at the first call
    return BackendModel(model, backend)


def _host(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_host(a) for a in v)
    if isinstance(v, dict):
        return {k: _host(a) for k, a in v.items()}
    return v.copy_to_host() if hasattr(v, "copy_to_host") else v


class BackendModel:
    """A model whose calls run under ``use_ops(backend)``; results are host numpy arrays.

    Every other attribute (layers, weights, ``summary``...) is the wrapped model's. ``to("cpu")``
    gives the wrapped model back.
    """

    def __init__(self, model, backend: str):
        self.model = model
        self.backend = backend

    def _run(self, method, *args, **kwargs):
        with use_ops(self.backend):
            return _host(method(*args, **kwargs))

    def __call__(self, *args, **kwargs) -> Any:
        return self._run(self.model, *args, **kwargs)

    def predict(self, *args, **kwargs):
        return self._run(self.model.predict, *args, **kwargs)

    def predict_on_batch(self, *args, **kwargs):
        return self._run(self.model.predict_on_batch, *args, **kwargs)

    def run(self, *args, **kwargs):  # an OnnxModel's onnxruntime-style call
        return self._run(self.model.run, *args, **kwargs)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def to(self, *args, **kwargs):
        return self.model.to(*args, **kwargs)

    def __getattr__(self, name):
        model = self.__dict__.get("model")
        if model is None:
            raise AttributeError(name)
        return getattr(model, name)

    def __repr__(self):
        return f"<{self.backend} {self.model!r}>"
