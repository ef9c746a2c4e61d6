"""Batch inference on Dask: a model applied chunk by chunk to arrays and dataframes larger than
one machine's memory, on a ``distributed`` cluster or on dask's local schedulers.

The model travels by value (``fastlayers.pickling``): with a ``distributed`` Client active it
is scattered to every worker once per call of ``predict`` (``broadcast=True``), each worker
unpickles it once and its tasks read that copy; a worker that joins later (one restarted after
a crash, say) fetches it from a peer once. On the local schedulers the graph holds it as one
object. Each worker process (started by a nanny: ``LocalCluster``'s default, ``dask worker``)
uses as many fastlayers threads as it runs tasks (``distributed.get_worker().state.nthreads``),
unless ``fastlayers.set_num_threads`` was called in it, so that the workers of a machine do not
oversubscribe its cores; workers inside the client's process (``processes=False``) leave its
setting alone.

Axis 0 is the batch axis of every input and output; chunks along it are the tasks.
Requires the ``dask`` extra: ``pip install 'fastlayers[dask]'`` (dask[array,dataframe],
distributed).
"""

from __future__ import annotations

import math
import uuid

import numpy as np

try:
    import dask
    import dask.array as da
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(
        "fastlayers.dask needs dask: pip install 'fastlayers[dask]' (dask[array,dataframe] and distributed)"
    ) from e

from .backends import get_num_threads, set_num_threads
from .errors import InputError, ShapeError

__all__ = ["predict", "predict_partitions"]


# ---------------------------------------------------------------------------- on the workers
def _use_worker_threads() -> None:
    """In a worker process (started by a nanny) with no fastlayers thread count set yet, use
    the worker's thread count. Workers inside the client's process (``processes=False``) and
    dask's local schedulers leave that process's setting alone."""
    if get_num_threads() is not None:
        return
    try:
        from distributed import get_worker

        worker = get_worker()
    except (ImportError, ValueError):  # not in a task of a distributed worker
        return
    if worker.nanny is not None:
        set_num_threads(worker.state.nthreads)


def _predict_block(model, expected, *blocks) -> tuple:
    """The model's outputs on one block of rows of every input, checked against ``expected``
    ((shape without the batch axis, dtype) per output)."""
    rows = blocks[0].shape[0]
    if rows == 0:
        return tuple(np.empty((0, *shape), dtype) for shape, dtype in expected)
    _use_worker_threads()
    out = model(*blocks)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for k, (o, (shape, dtype)) in enumerate(zip(outs, expected)):
        if not isinstance(o, np.ndarray) or o.shape != (rows, *shape) or o.dtype != dtype:
            found = (o.shape, o.dtype) if isinstance(o, np.ndarray) else type(o).__name__
            raise ShapeError(
                f"fastlayers.dask: output {k} of a block of {rows} rows is {found}, "
                f"expected {((rows, *shape), np.dtype(dtype))} (axis 0 must be the "
                "batch axis, and the other sizes those of a 1-row batch)"
            )
    return tuple(outs)


def _output(outputs: tuple, k: int) -> np.ndarray:
    return outputs[k]


def _predict_frame(partition, model, columns, names, expected):
    import pandas as pd

    arrays = [partition[list(cols)].to_numpy() for cols in columns]
    outs = _predict_block(model, expected, *arrays)
    features = [o.reshape(len(partition), math.prod(o.shape[1:])) for o in outs]
    frame = pd.DataFrame(
        {i: column for i, column in enumerate(block[:, j] for block in features for j in range(block.shape[1]))},
        index=partition.index,
    )
    frame.columns = names
    return frame


# ------------------------------------------------------------------------------ the client
def _shipped(model):
    """The model as a graph argument: scattered to every worker of the default distributed
    Client (each unpickles it once), else one delayed object (dask's local schedulers)."""
    try:
        from distributed import default_client

        client = default_client()
    except (ImportError, ValueError):
        return dask.delayed(model, name=f"fastlayers-model-{uuid.uuid4().hex}", traverse=False)
    return client.scatter(model, broadcast=True, hash=False)


def _probe(model, samples: list[np.ndarray]) -> tuple[bool, list[np.ndarray]]:
    """(whether the model returns a list or tuple, its outputs) on one row of each input."""
    out = model(*samples)
    several = isinstance(out, (list, tuple))
    outs = list(out) if several else [out]
    for k, o in enumerate(outs):
        if not isinstance(o, np.ndarray) or o.ndim == 0 or o.shape[0] != 1:
            found = o.shape if isinstance(o, np.ndarray) else type(o).__name__
            raise ShapeError(
                f"fastlayers.dask: output {k} of the model on a 1-row batch is "
                f"{found}; predict needs arrays with the batch axis first"
            )
    return several, outs


def _expected(outs) -> tuple:
    return tuple((o.shape[1:], o.dtype.str) for o in outs)


def predict(model, x):
    """Run ``model`` on a dask array, block by block along the batch axis, lazily.

    Parameters
    ----------
    model : fastlayers.Model, fastlayers.nn.Module or OnnxModel
        Any model that pickles by value (``fastlayers.pickling``), called as
        ``model(*blocks)`` on numpy arrays.
    x : dask.array.Array or list of dask.array.Array
        The input, or one array per input in the model's order, batch axis first; several
        inputs must have the same batch size (they are rechunked to the first one's batch
        chunks). Other axes are rechunked to one chunk each.

    Returns
    -------
    dask.array.Array or list of dask.array.Array
        Lazy outputs, batch axis first with ``x``'s batch chunks (the other axes in one chunk),
        shapes and dtypes found by running the model here on one row of zeros. A list where the
        model returns a list or tuple; the model runs once per block for all of them (compute
        them together: ``dask.compute(*outputs)``).

    Raises
    ------
    InputError
        The inputs' batch sizes differ, or a size other than the batch size is unknown.
    ShapeError
        An output lacks the batch axis (also raised by a block, on the worker, whose output's
        shape or dtype differs from the 1-row batch's).
    UnsupportedError
        The model does not pickle by value (a subclass of one's own).

    Examples
    --------
    >>> x = dask.array.random.random((10_000, 64), chunks=1_000).astype("float32")
    >>> y = fastlayers.dask.predict(model, x)        # lazy, chunks ((1000,) * 10, (10,))
    >>> y.compute()
    """
    arrays = [da.asarray(a) for a in (x if isinstance(x, (list, tuple)) else [x])]
    if not arrays:
        raise InputError("fastlayers.dask.predict: no input given")
    batch = arrays[0].chunks[0]
    for k, a in enumerate(arrays):
        if (
            a.ndim == 0
            or not (a.chunks[0] == batch or a.shape[0] == arrays[0].shape[0])
            or any(np.isnan(d) for d in a.shape[1:])
        ):
            raise InputError(
                f"fastlayers.dask.predict: input {k} has shape {a.shape}; every input "
                f"needs the batch axis first, of size {arrays[0].shape[0]}, and known "
                "sizes on the other axes"
            )
        spec = {axis: -1 for axis in range(1, a.ndim) if len(a.chunks[axis]) > 1}
        if a.chunks[0] != batch:
            spec[0] = batch
        arrays[k] = a.rechunk(spec) if spec else a
    several, outs = _probe(model, [np.zeros((1, *a.shape[1:]), a.dtype) for a in arrays])
    expected = _expected(outs)
    pairs = []
    for k, a in enumerate(arrays):
        pairs += [a, ("b", *(f"in{k}.{axis}" for axis in range(1, a.ndim)))]
    token = uuid.uuid4().hex
    blocks = da.blockwise(
        _predict_block,
        "b",
        _shipped(model),
        None,
        expected,
        None,
        *pairs,
        concatenate=True,
        name=f"fastlayers-predict-{token}",
        meta=np.empty((0,), object),
    )
    results = []
    for k, o in enumerate(outs):
        axes = tuple(f"out{k}.{axis}" for axis in range(1, o.ndim))
        results.append(
            da.blockwise(
                _output,
                ("b", *axes),
                blocks,
                "b",
                k,
                None,
                new_axes=dict(zip(axes, o.shape[1:])),
                name=f"fastlayers-output-{k}-{token}",
                meta=np.empty((0,) * o.ndim, o.dtype),
            )
        )
    return results if several else results[0]


def predict_partitions(model, df, columns=None, output_columns=None):
    """Run ``model`` on the rows of a dask DataFrame, partition by partition, lazily.

    Parameters
    ----------
    model : fastlayers.Model, fastlayers.nn.Module or OnnxModel
        A model that pickles by value, called on the partitions' values as numpy arrays.
    df : dask.dataframe.DataFrame
    columns : list of str, or list of list of str, optional
        The columns of the model's input, in order (one (rows, len(columns)) array); a list of
        such lists for a model of several inputs. Default: every column, one input.
    output_columns : list, optional
        Names of the output columns: one per output feature, the features of each output
        flattened in order, outputs one after the other. Default: 0, 1, 2...

    Returns
    -------
    dask.dataframe.DataFrame
        One row per input row, with ``df``'s index and partitions, the output features as
        columns with the model's dtypes (found by running it here on one row of zeros).

    Raises
    ------
    InputError
        Unknown columns, or ``output_columns`` of the wrong length.
    ShapeError
        An output lacks the batch axis.
    UnsupportedError
        The model does not pickle by value.

    Examples
    --------
    >>> preds = fastlayers.dask.predict_partitions(model, ddf, columns=["x0", "x1", "x2"])
    >>> ddf.join(preds).head()
    """
    import pandas as pd

    meta = df._meta
    groups = (
        [list(meta.columns)]
        if columns is None
        else ([list(c) for c in columns] if columns and isinstance(columns[0], (list, tuple)) else [list(columns)])
    )
    unknown = [c for cols in groups for c in cols if c not in meta.columns]
    if unknown:
        raise InputError(
            f"fastlayers.dask.predict_partitions: unknown columns {unknown}; the dataframe has {list(meta.columns)}"
        )
    samples = [np.zeros((1, len(cols)), np.result_type(*meta[cols].dtypes)) for cols in groups]
    _, outs = _probe(model, samples)
    expected = _expected(outs)
    widths = [int(np.prod(o.shape[1:])) for o in outs]
    names = list(range(sum(widths))) if output_columns is None else list(output_columns)
    if len(names) != sum(widths):
        raise InputError(
            f"fastlayers.dask.predict_partitions: {len(names)} output_columns for "
            f"{sum(widths)} output features {[o.shape[1:] for o in outs]}"
        )
    dtypes = [o.dtype for o, width in zip(outs, widths) for _ in range(width)]
    frame_meta = pd.DataFrame(
        {name: np.empty(0, dtype) for name, dtype in zip(names, dtypes)}, index=meta.index[:0], columns=names
    )
    return df.map_partitions(
        _predict_frame, _shipped(model), [tuple(g) for g in groups], names, expected, meta=frame_meta
    )
