"""The engines a benchmark runs: fastlayers' call of a loaded model (``runner``), an
onnxruntime session on the same file (``onnxruntime_session``), and the check that their
outputs agree before anything is timed (``compare_outputs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import MismatchError, UnsupportedError

#: The engine ``against`` may name.
ONNXRUNTIME = "onnxruntime"
#: Relative tolerance of the output check (``compare_outputs``).
RTOL = 1e-4


def is_onnx(model) -> bool:
    """Whether ``model`` is an imported ONNX model.

    Parameters
    ----------
    model
        Any object.

    Returns
    -------
    bool
        True for a ``fastlayers.onnx.model.OnnxModel``.
    """
    from ..onnx.model import OnnxModel

    return isinstance(model, OnnxModel)


def runner(model, arrays: Sequence[np.ndarray]) -> Callable[[], list]:
    """One inference of ``model`` on ``arrays``, as a callable.

    Parameters
    ----------
    model
        What ``fastlayers.load`` returned.
    arrays : sequence of ndarray
        The inputs, in the model's order.

    Returns
    -------
    callable
        Without arguments, returning the outputs as a list: ``model.run(None, feed)`` for an
        ONNX model (as onnxruntime is called), else the model's call (one array, a list for a
        Keras-style model of several inputs, positional arguments for a ``fastlayers.nn``
        module).
    """
    arrays = list(arrays)
    if is_onnx(model):
        feed = dict(zip([s.name for s in model.get_inputs()], arrays))
        return lambda: model.run(None, feed)

    def listed(out):
        return list(out) if isinstance(out, (list, tuple)) else [out]

    if len(arrays) == 1:
        x = arrays[0]
        return lambda: listed(model(x))
    if callable(getattr(model, "input_specs", None)):
        return lambda: listed(model(arrays))
    return lambda: listed(model(*arrays))


def import_onnxruntime():
    """The onnxruntime module; UnsupportedError saying how to install it where it is missing."""
    try:
        import onnxruntime
    except ImportError:
        raise UnsupportedError(
            "comparing against onnxruntime needs the onnxruntime package (pip install onnxruntime)"
        ) from None
    return onnxruntime


def onnxruntime_session(path, threads: int):
    """An onnxruntime CPU session on ``path`` with ``threads`` intra-op threads and one inter-op
    thread (fastlayers runs one operator at a time, on ``threads`` threads).

    Raises
    ------
    UnsupportedError
        onnxruntime is not installed, or it cannot load the file (its message, on one line).
    """
    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
        text = " ".join(str(e).split())[:400]
        raise UnsupportedError(f"{path}: onnxruntime cannot load the file ({text})") from None


def compare_outputs(
    want: Sequence,
    got: Sequence,
    names: Sequence[str] | None = None,
    rtol: float = RTOL,
    atol: float | None = None,
    where: str = "",
    reference: str = ONNXRUNTIME,
) -> float:
    """Check fastlayers' outputs ``got`` against the reference's ``want``.

    Float outputs agree where ``|got - want| <= atol + rtol * |want|`` element by element (NaN
    where both are NaN), ``atol`` defaulting to ``rtol`` times the output's largest ``|want|``
    (so outputs near zero are judged at their own scale); integer and boolean outputs must be
    equal.

    Parameters
    ----------
    want, got : sequence of array_like
        The reference's outputs and fastlayers', in the same order.
    names : sequence of str, optional
        The outputs' names, for the message.
    rtol, atol : float
        Tolerances (``atol`` None: ``rtol`` x max |want| per output).
    where : str
        Said in the message (``"threads 2, batch 8"``).
    reference : str
        The reference engine's name, for the message.

    Returns
    -------
    float
        The largest absolute difference over all outputs.

    Raises
    ------
    MismatchError
        A different number of outputs, or an output of another shape, or one beyond the
        tolerance (naming it, its largest difference and where).
    """
    at = f" ({where})" if where else ""
    if len(want) != len(got):
        raise MismatchError(f"fastlayers gives {len(got)} outputs and {reference} {len(want)}{at}")
    names = list(names) if names is not None else [f"#{k}" for k in range(len(want))]
    worst = 0.0
    for name, w, g in zip(names, want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            raise MismatchError(f"output {name!r}: fastlayers gives shape {g.shape} and {reference} {w.shape}{at}")
        if not w.size:
            continue
        if w.dtype.kind not in "fc" and g.dtype.kind not in "fc":
            diff = np.abs(w.astype(np.float64) - g.astype(np.float64))
            biggest = float(diff.max())
            if biggest:
                raise MismatchError(
                    f"output {name!r}: fastlayers and {reference} differ in "
                    f"{int((diff > 0).sum())} of {w.size} values (max |difference| "
                    f"{biggest:.3g}){at}: not timed"
                )
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        finite = np.isfinite(w64) & np.isfinite(g64)
        same = (w64 == g64) | (np.isnan(w64) & np.isnan(g64))  # equal infinities, NaN and NaN
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(finite, np.abs(g64 - w64), np.where(same, 0.0, np.inf))
        scale = np.abs(w64[np.isfinite(w64)])
        tol = (rtol * float(scale.max()) if scale.size else 0.0) if atol is None else atol
        bad = ~np.where(finite, diff <= tol + rtol * np.abs(np.where(finite, w64, 0.0)), same)
        biggest = float(diff.max())
        if bad.any():
            k = int(np.argmax(np.where(bad, diff, -1.0)))
            raise MismatchError(
                f"output {name!r}: fastlayers and {reference} differ beyond rtol {rtol:g}, atol "
                f"{tol:.3g} in {int(bad.sum())} of {w.size} values (max |difference| "
                f"{float(diff.flat[k]):.3g}: {float(g64.flat[k]):.6g} against "
                f"{float(w64.flat[k]):.6g}){at}: not timed"
            )
        worst = max(worst, biggest)
    return worst
