"""Explicit recurrent state for step-by-step (streaming) inference.

A ``StreamState`` holds the arrays a recurrent layer or module carries between timesteps (``h``,
``c``, ...) for one stream. It is a plain object owned by the caller: keep one per client,
``copy()`` it to fork a stream, ``reset()`` it to start over. Feeding a sequence chunk by chunk
through ``layer.stream(chunk, state)`` gives the same outputs as one call on the whole sequence.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError


class StreamState:
    """The carried arrays of one stream (batch axis first), with its initial values for ``reset``.

    Parameters
    ----------
    arrays : dict of str to ndarray
        Named state arrays, each (batch, ...) float32.
    owner : str
        What created it (a layer or module name), for error messages.
    batch_axis : int, default 0
        The batch axis of the arrays (1 for torch's (layers * directions, batch, hidden)).

    Attributes
    ----------
    steps : int
        Timesteps consumed since creation or the last ``reset``.
    """

    def __init__(self, arrays: dict, owner: str = "", batch_axis: int = 0):
        self._arrays = {k: np.array(v, dtype=np.float32, order="C") for k, v in arrays.items()}
        self._initial = {k: v.copy() for k, v in self._arrays.items()}
        self.owner = owner
        self.batch_axis = batch_axis
        self.steps = 0

    @property
    def batch_size(self) -> int:
        return next(iter(self._arrays.values())).shape[self.batch_axis]

    def keys(self):
        return self._arrays.keys()

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        if name not in self._arrays:
            raise KeyError(f"stream state of {self.owner!r} has no array {name!r}; it holds {sorted(self._arrays)}")
        value = np.asarray(value, np.float32)
        if value.shape != self._arrays[name].shape:
            raise ShapeError(
                f"stream state of {self.owner!r}: {name!r} expects shape {self._arrays[name].shape}, got {value.shape}"
            )
        self._arrays[name] = np.ascontiguousarray(value)

    def copy(self) -> StreamState:
        """An independent copy (same values, same initial values, same step count)."""
        new = StreamState(self._arrays, self.owner, self.batch_axis)
        new._initial = {k: v.copy() for k, v in self._initial.items()}
        new.steps = self.steps
        return new

    def reset(self) -> None:
        """Back to the initial values (zeros unless initial states were given)."""
        self._arrays = {k: v.copy() for k, v in self._initial.items()}
        self.steps = 0

    def check_batch(self, batch: int, where: str) -> None:
        if batch != self.batch_size:
            raise ShapeError(f"{where}: the stream state holds batch {self.batch_size}, got an input of batch {batch}")

    def __repr__(self):
        shapes = ", ".join(f"{k}={v.shape}" for k, v in self._arrays.items())
        return f"<StreamState of {self.owner!r}: {shapes}, steps={self.steps}>"
