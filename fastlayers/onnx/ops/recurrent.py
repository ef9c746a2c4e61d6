"""The ONNX recurrences RNN, GRU and LSTM (and fastlayers' Embedding<kind> nodes): on the
backend's compiled time loops where the node uses only what they do, bound once per input shape
and weights; else a float64 reference that honours every attribute."""

from __future__ import annotations

import numpy as np

from ...backends import get_ops
from ...backends.derived import derived, derived_from, derived_generation, fold_projection
from ...backends.types import Cell
from ...errors import ShapeError, UnsupportedError
from ..records import BOOL, FASTLAYERS, FLOATS, FLT, POS, STRING, STRINGS, A, Family, fail, short
from ..tensors import f32

#: This family's operator records (``ops.RECORDS`` gathers the families).
FAMILY = Family("recurrent")
op = FAMILY.op


def _rnn_activation(name, alpha, beta):
    """An ONNX recurrent activation function by name (with its optional alpha/beta)."""
    name = name.lower()
    table = {
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "tanh": np.tanh,
        "relu": lambda x: np.maximum(x, 0),
        "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: np.where(x > alpha, x, 0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "affine": lambda x: alpha * x + beta,
        "elu": lambda x: np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0))),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.logaddexp(0, x),
    }
    if name not in table:
        raise UnsupportedError(f"recurrent activation {name!r} is not supported")
    return table[name]


def recurrent_reference(kind, inputs, attrs):
    """The ONNX RNN/GRU/LSTM recurrences (https://onnx.ai/onnx/operators/onnx__LSTM.html), every
    attribute: direction, layout, activations (+ alpha/beta), clip, sequence_lens, initial states,
    peepholes (LSTM), input_forget (LSTM), linear_before_reset (GRU). Computed in float64."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    x, w, r = inputs[0], inputs[1], inputs[2]
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None  # noqa: E731
    b, seq_lens, h0 = get(3), get(4), get(5)
    c0, p = (get(6), get(7)) if kind == "LSTM" else (None, None)
    layout = attrs.get("layout", 0)
    if layout:
        x = np.swapaxes(x, 0, 1)
        h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
        c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
    steps, batch, _ = x.shape
    hidden = attrs.get("hidden_size") or r.shape[-1]
    direction = attrs.get("direction", "forward")
    n_dir = 2 if direction == "bidirectional" else 1
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    names = list(attrs.get("activations", [])) or defaults * n_dir
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    acts = [
        _rnn_activation(
            n,
            alphas[i] if i < len(alphas) else 0.01 if n.lower() == "leakyrelu" else 1.0,
            betas[i] if i < len(betas) else 0.0,
        )
        for i, n in enumerate(names)
    ]
    clip = attrs.get("clip")
    lens = np.full(batch, steps, np.int64) if seq_lens is None else seq_lens.astype(np.int64)
    x64 = x.astype(np.float64)
    ys = np.zeros((steps, n_dir, batch, hidden))
    h_last = np.zeros((n_dir, batch, hidden))
    c_last = np.zeros((n_dir, batch, hidden))
    for d in range(n_dir):
        reverse = direction == "reverse" or d == 1
        f = acts[d * len(defaults) : (d + 1) * len(defaults)]
        wd, rd = w[d].astype(np.float64), r[d].astype(np.float64)
        wb = b[d, : gates * hidden].astype(np.float64) if b is not None else np.zeros(gates * hidden)
        rb = b[d, gates * hidden :].astype(np.float64) if b is not None else np.zeros(gates * hidden)
        h = np.zeros((batch, hidden)) if h0 is None else h0[d].astype(np.float64)
        c = np.zeros((batch, hidden)) if c0 is None else c0[d].astype(np.float64)
        pd = p[d].astype(np.float64) if p is not None else np.zeros(3 * hidden)
        for t in range(steps):
            for n in range(batch):
                if t >= lens[n]:
                    continue
                step = lens[n] - 1 - t if reverse else t
                xt, hp = x64[step, n], h[n]
                zx = wd @ xt + wb
                if kind == "RNN":
                    z = zx + rd @ hp + rb
                    if clip is not None:
                        z = np.clip(z, -clip, clip)
                    h[n] = f[0](z)
                elif kind == "GRU":
                    zr = zx[: 2 * hidden] + rd[: 2 * hidden] @ hp + rb[: 2 * hidden]
                    if clip is not None:
                        zr = np.clip(zr, -clip, clip)
                    zt, rt = f[0](zr[:hidden]), f[0](zr[hidden:])
                    if attrs.get("linear_before_reset", 0):
                        hh = zx[2 * hidden :] + rt * (rd[2 * hidden :] @ hp + rb[2 * hidden :])
                    else:
                        hh = zx[2 * hidden :] + rd[2 * hidden :] @ (rt * hp) + rb[2 * hidden :]
                    if clip is not None:
                        hh = np.clip(hh, -clip, clip)
                    h[n] = (1 - zt) * f[1](hh) + zt * hp
                else:
                    z = zx + rd @ hp + rb
                    zi, zo, zf, zc = (z[k * hidden : (k + 1) * hidden] for k in range(4))
                    zi = zi + pd[:hidden] * c[n]
                    zf = zf + pd[2 * hidden :] * c[n]
                    if clip is not None:
                        zi, zf, zc = (np.clip(v, -clip, clip) for v in (zi, zf, zc))
                    it, ft = f[0](zi), f[0](zf)
                    if attrs.get("input_forget", 0):
                        ft = 1 - it
                    c[n] = ft * c[n] + it * f[1](zc)
                    zo = zo + pd[hidden : 2 * hidden] * c[n]
                    if clip is not None:
                        zo = np.clip(zo, -clip, clip)
                    h[n] = f[0](zo) * f[2](c[n])
                ys[step, d, n] = h[n]
        h_last[d], c_last[d] = h, c
    y, yh, yc = ys.astype(np.float32), h_last.astype(np.float32), c_last.astype(np.float32)
    if layout:
        y, yh, yc = y.transpose(2, 0, 1, 3), np.swapaxes(yh, 0, 1), np.swapaxes(yc, 0, 1)
    return [y, yh, yc] if kind == "LSTM" else [y, yh]


_DEFAULT_ACTIVATIONS = {
    "RNN": [["tanh"], ["relu"]],
    "GRU": [["sigmoid", "tanh"]],
    "LSTM": [["sigmoid", "tanh", "tanh"]],
}


#: The loops' gate order from ONNX's LSTM blocks i, o, f, c: i, f, c, o (GRU and RNN as given).
_LSTM_ORDER = (0, 2, 3, 1)


def loop_kernel(w_gi, kind: str):
    """One direction of an ONNX W or R, (gates * hidden, n) as the file holds it, as the
    backend's loops read it: (n, gates * hidden) C-ordered float32, an LSTM's gate blocks in
    ``_LSTM_ORDER``."""
    w_gi = np.asarray(w_gi)
    if kind == "LSTM":
        w_gi = w_gi.reshape(4, w_gi.shape[0] // 4, -1)[list(_LSTM_ORDER)].reshape(w_gi.shape[0], -1)
    return np.ascontiguousarray(w_gi.T, dtype=np.float32)


def onnx_weight(kernel_ig, kind: str):
    """``loop_kernel``'s input back: (gates * hidden, n) in ONNX's gate order, a new array."""
    w_gi = kernel_ig.T
    if kind == "LSTM":
        w_gi = w_gi.reshape(4, w_gi.shape[0] // 4, -1)[list(np.argsort(_LSTM_ORDER))].reshape(w_gi.shape[0], -1)
    return np.ascontiguousarray(w_gi)


class RecurrentWeights:
    """An ONNX W or R (directions, gates * hidden, n) held only as the loops' kernels, one per
    direction (``loop_kernel``), for a graph whose recurrent nodes all run on the loops
    (``weights.hold_recurrent_weights``): ``recurrent_calls`` reads ``kernels``; anything that
    reads it as an array (``np.asarray``, ``unpacked``) gets the ONNX values anew, the same
    bits (a gate reorder and a transpose)."""

    __slots__ = ("kernels", "kind", "shape", "__weakref__")
    dtype = np.dtype(np.float32)
    ndim = 3

    def __init__(self, w_dgi, kind: str):
        self.kind = kind
        self.kernels = tuple(loop_kernel(w_dgi[d], kind) for d in range(w_dgi.shape[0]))
        self.shape = tuple(int(n) for n in w_dgi.shape)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]

    @property
    def nbytes(self) -> int:
        return sum(int(k.nbytes) for k in self.kernels)

    def unpacked(self):
        """The weights as a new (directions, gates * hidden, n) float32 array, ONNX's order."""
        return np.stack([onnx_weight(k, self.kind) for k in self.kernels])

    def __array__(self, dtype=None, copy=None):
        w = self.unpacked()
        return w if dtype is None else w.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"RecurrentWeights({self.kind}, shape={self.shape})"


def recurrent_fast(kind, inputs, attrs, table=None):
    """The ONNX recurrence on the backend's compiled time loops (one input-projection GEMM, one
    recurrent product and one fused gate pass per step), when the node uses only what they do:
    no clip, peepholes, input_forget or sequence_lens, standard activations. Else None.
    Gate blocks are reordered once per weight array: ONNX LSTM i,o,f,c -> i,f,c,o; GRU z,r,h as
    is. With an embedding ``table`` (``EmbeddingLSTM`` ...), inputs[0] holds ids (batch, time)
    of its rows whatever the layout, and each direction gathers rows of table @ W^T + input
    bias (computed once). Where nothing reads Y (``_y_read`` False, set at load) the loops
    write no output per step and Y is None."""
    planned = recurrent_calls(kind, inputs, attrs, table)
    if planned is None:
        return None
    calls, _, _ = planned
    return _recurrent_outputs(kind, get_ops().recurrent_sequences(calls), attrs)


def loops_cover(kind, attrs, p=None) -> bool:
    """Whether the backend's loops compute a ``kind`` node with these attributes and peepholes
    ``p`` (None: absent): its default activations, no clip, input_forget, activation alpha or
    beta, no nonzero peephole. (sequence_lens, read per call, is not looked at.)"""
    names = [n.lower() for n in attrs.get("activations", [])]
    per_dir = len(_DEFAULT_ACTIVATIONS[kind][0])
    if names and (names[:per_dir] not in _DEFAULT_ACTIVATIONS[kind] or names[per_dir:] not in ([], names[:per_dir])):
        return False
    return not (
        attrs.get("clip") is not None
        or attrs.get("input_forget", 0)
        or (p is not None and np.any(p))
        or attrs.get("activation_alpha")
        or attrs.get("activation_beta")
    )


def recurrent_calls(kind, inputs, attrs, table=None):
    """``recurrent_fast``'s backend calls, one (cell, args, kwargs) per direction, the
    input as the calls read it (batch, time, input) and the initial states per direction; None
    where the compiled loops do not cover the node."""
    get = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None  # noqa: E731
    x, w, r, b, seq_lens, h0 = inputs[0], inputs[1], inputs[2], get(3), get(4), get(5)
    c0, p = (get(6), get(7)) if kind == "LSTM" else (None, None)
    direction = attrs.get("direction", "forward")
    n_dir = 2 if direction == "bidirectional" else 1
    names = [n.lower() for n in attrs.get("activations", [])]
    if not loops_cover(kind, attrs, p):
        return None
    layout = attrs.get("layout", 0)
    if table is None:
        x_bti = np.ascontiguousarray(x if layout else np.swapaxes(x, 0, 1), dtype=np.float32)
    else:
        x_bti = x
    batch, steps = x_bti.shape[:2]
    if seq_lens is not None and np.any(seq_lens != steps):
        return None
    hidden = r.shape[-1]
    if layout:
        h0, c0 = (None if s is None else np.swapaxes(s, 0, 1) for s in (h0, c0))

    def kernel(m, d):
        """Direction d of W or R as the loops read it (``loop_kernel``): held so
        (``RecurrentWeights``), or computed once per weight array (C order: the backend caches
        its own layouts per array and would otherwise copy and repack a transposed view on
        every call)."""
        if type(m) is RecurrentWeights:
            return m.kernels[d]
        return derived(m, f"onnx-{kind.lower()}-kernel:{d}", lambda a: loop_kernel(a[d], kind))

    def input_weights(d, bias):
        """(w_ig, b_ig) of direction d: the kernel and bias, or the folded embedding table."""
        w_in = kernel(w, d)
        if table is None:
            return w_in, bias
        return derived_from((w, table, b), f"onnx-{kind}-fold:{d}", lambda *_: fold_projection(table, w_in, bias)), None

    def biases(d, input_part):
        """(input bias, recurrent bias) of direction d from B = [Wb, Rb], computed once per
        array by ``input_part(wb, rb)`` (the recurrent one: Rb, for GRU's linear_before_reset
        only); (None, None) without B."""
        if b is None:
            return None, None
        return derived(
            b,
            f"onnx-{kind}-bias:{d}:{lbr}",
            lambda a: (
                f32(input_part(a[d, : a.shape[1] // 2], a[d, a.shape[1] // 2 :])),
                f32(a[d, a.shape[1] // 2 :]) if lbr else None,
            ),
        )

    lbr = kind == "GRU" and bool(attrs.get("linear_before_reset", 0))
    y_read = attrs.get("_y_read", True)
    calls, states = [], []  # (ops method, args, kwargs) and initial states per direction
    for d in range(n_dir):
        reverse = direction == "reverse" or d == 1
        options = {"reverse": reverse, "return_sequences": y_read}
        h_init = np.zeros((batch, hidden), np.float32) if h0 is None else f32(h0[d])
        if kind == "LSTM":
            order = list(_LSTM_ORDER)
            c_init = np.zeros((batch, hidden), np.float32) if c0 is None else f32(c0[d])
            b_in = biases(d, lambda wb, rb: (wb + rb).reshape(4, hidden)[order].reshape(-1))[0]
            w_ig, b_g = input_weights(d, b_in)
            calls.append((Cell.LSTM, (x_bti, w_ig, kernel(r, d), b_g, h_init, c_init), options))
            states.append((h_init, c_init))
        elif kind == "GRU":
            b_in, b_rec = biases(d, lambda wb, rb: wb if lbr else wb + rb)
            w_ig, b_ig = input_weights(d, b_in)
            calls.append(
                (
                    Cell.GRU,
                    (x_bti, w_ig, kernel(r, d), b_ig, b_rec, h_init),
                    {"reset_after": lbr, **options},
                )
            )
            states.append((h_init,))
        else:
            act = names[0] if names else "tanh"
            w_ih, b_ih = input_weights(d, biases(d, lambda wb, rb: wb + rb)[0])
            calls.append((Cell.RNN, (x_bti, w_ih, kernel(r, d), b_ih, h_init), {"activation": act, **options}))
            states.append((h_init,))
    return calls, x_bti, states


def _recurrent_outputs(kind, results, attrs):
    """The node's outputs (Y or None, Y_h, Y_c for LSTM) from the backend calls' results, one
    (y, h[, c]) per direction."""
    layout, y_read = attrs.get("layout", 0), attrs.get("_y_read", True)
    n_dir = len(results)
    ys, hs, cs = [], [], []
    for y, h, *c in results:
        ys.append(y)
        hs.append(h)
        cs.extend(c)
    # one direction: Y as a view of the batch-major output, which a following recurrent node
    # (Squeeze, then its swap back to batch-major) reads in place; two: stacked (B, 2, T, H)
    if not y_read:
        y = None
    else:
        y = ys[0][:, None] if n_dir == 1 else np.stack(ys, axis=1)
        y = y.transpose(0, 2, 1, 3) if layout else y.transpose(2, 1, 0, 3)
    axis = 1 if layout else 0
    if n_dir == 1:  # a view with the direction axis (np.stack costs several microseconds)
        index = (slice(None), None) if layout else (None,)
        return [y, hs[0][index], cs[0][index]] if kind == "LSTM" else [y, hs[0][index]]
    outs = [y, np.stack(hs, axis=axis)]
    if kind == "LSTM":
        outs.append(np.stack(cs, axis=axis))
    return outs


def _check_recurrent(kind, x_shape, inputs, attrs):
    """The shapes of a recurrent node's inputs, checked before the time loops read them:
    ``x_shape`` is X's, (time, batch, input) or with layout=1 (batch, time, input)."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    n_dir = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    r = inputs[2]
    if len(x_shape) != 3:
        raise ShapeError(f"{kind}: X of shape {tuple(x_shape)} is not (time, batch, input)")
    if r.ndim != 3 or r.shape[0] != n_dir or r.shape[2] == 0 or r.shape[1] != gates * r.shape[2]:
        raise ShapeError(f"{kind}: R of shape {r.shape} is not ({n_dir}, {gates} * hidden, hidden)")
    hidden = r.shape[2]
    if attrs.get("hidden_size") not in (None, hidden):
        raise ShapeError(f"{kind}: hidden_size {attrs['hidden_size']} does not match R of shape {r.shape}")
    batch = x_shape[0] if layout else x_shape[1]
    state = (batch, n_dir, hidden) if layout else (n_dir, batch, hidden)
    want = {
        1: (n_dir, gates * hidden, x_shape[2]),
        3: (n_dir, 2 * gates * hidden),
        4: (batch,),
        5: state,
        6: state,
        7: (n_dir, 3 * hidden),
    }
    names = {1: "W", 3: "B", 4: "sequence_lens", 5: "initial_h", 6: "initial_c", 7: "P"}
    for i in (1, 3, 4, 5) + ((6, 7) if kind == "LSTM" else ()):
        a = inputs[i] if len(inputs) > i else None
        if a is not None and (a.size or i == 1) and a.shape != want[i]:
            raise ShapeError(f"{kind}: {names[i]} of shape {a.shape}, expected {want[i]}")


#: Most bound calls a recurrent node keeps (one per input shape and weights).
_MAX_BOUND_RECURRENT = 8


def _bound_key(kind, inputs, ops):
    """What a bound recurrent call depends on: X's shape and type, the weights' identities
    (W, R, B, P: the plan's constants), the states' shapes, the backend and the derived
    weights' generation; None where the node does not bind (sequence_lens given)."""
    if len(inputs) > 4 and inputs[4] is not None and inputs[4].size:
        return None
    x, padded = inputs[0], (*inputs, None, None, None, None, None)
    return (
        x.shape,
        x.dtype.str,
        id(inputs[1]),
        id(inputs[2]),
        id(padded[3]),
        id(padded[7]),
        None if padded[5] is None else padded[5].shape,
        None if padded[6] is None else padded[6].shape,
        ops.name,
        derived_generation(),
    )


def _bind_recurrent(kind, inputs, attrs, ops, table=None):
    """A function ``inputs -> outputs`` for calls like this one (``_bound_key``): the backend's
    sequence plans (``ops.sequence_plan``, ``sequences_plan`` for two directions), bound once
    on the weights, run with each call's input and initial states. With an embedding
    ``table``, inputs[0] holds checked ids (batch, time) and one direction binds. None where
    the compiled loops do not cover the node."""
    planned = recurrent_calls(kind, inputs, attrs, table)
    if planned is None or (table is not None and len(planned[0]) != 1):
        return None
    calls, x_bti, _ = planned
    bound = [(cell, args[1:], kw) for cell, args, kw in calls]
    if len(bound) == 1:
        cell, args, kw = bound[0]
        plan = ops.sequence_plan(cell, x_bti, args, kw)
        run_all = lambda x, states: [plan(x, states[0])]  # noqa: E731
    else:
        run_all = ops.sequences_plan(x_bti, bound)
    layout, n_dir = attrs.get("layout", 0), len(calls)
    gates = 2 if kind == "LSTM" else 1
    if n_dir == 1 and table is None and not attrs.get("_y_read", True):
        return _one_direction_states_only(kind, plan, layout, gates)

    def run(inputs):
        x = inputs[0]
        if table is not None:
            x_bti = x
        else:
            x_bti = np.ascontiguousarray(x if layout else np.swapaxes(x, 0, 1), dtype=np.float32)
        given = [
            inputs[i] if len(inputs) > i and inputs[i] is not None and inputs[i].size else None for i in (5, 6)[:gates]
        ]
        given = [s if s is None or not layout else np.swapaxes(s, 0, 1) for s in given]
        shape = (x_bti.shape[0], inputs[2].shape[-1])
        states = [tuple(np.zeros(shape, np.float32) if s is None else f32(s[d]) for s in given) for d in range(n_dir)]
        return _recurrent_outputs(kind, run_all(x_bti, states), attrs)

    return run


def _one_direction_states_only(kind, plan, layout, gates):
    """``_bind_recurrent``'s function for one direction whose Y nothing reads (a streaming
    model's step: its outputs are the final states): the same steps as the general one, with
    nothing per call but the input's batch-major view, the states given (``plan`` copies
    them: the loop updates its states) and the outputs' direction axis."""
    index = (slice(None), None) if layout else (None,)

    def run(inputs):
        x = inputs[0] if layout else inputs[0].swapaxes(0, 1)
        if not (x.dtype == np.float32 and x.flags.c_contiguous):
            x = np.ascontiguousarray(x, dtype=np.float32)
        states = []
        for i in (5, 6)[:gates]:
            s = inputs[i] if len(inputs) > i else None
            if s is None or not s.size:
                states.append(np.zeros((x.shape[0], inputs[2].shape[-1]), np.float32))
            else:
                states.append(s[:, 0] if layout else s[0])
        _, *finals = plan(x, states)
        return [None, *(f[index] for f in finals)]

    return run


def _recurrent_op(kind):
    def run(inputs, attrs, opset):
        cache = attrs.get("_bound")  # per plan (OnnxModel): bound calls by _bound_key
        if cache is not None:
            ops = get_ops()
            key = _bound_key(kind, inputs, ops)
            hit = cache.get(key) if key is not None else None
            if hit is not None:
                return hit[0](inputs)
        _check_recurrent(kind, inputs[0].shape, inputs, attrs)
        if cache is not None and key is not None:
            bound = _bind_recurrent(kind, inputs, attrs, ops)
            if bound is None:  # the compiled loops do not cover the node
                return recurrent_reference(kind, inputs, attrs)
            if len(cache) >= _MAX_BOUND_RECURRENT:
                cache.clear()
            # the key holds the weights' ids: the entry holds the arrays, so that no other
            # array takes their ids while it lives
            cache[key] = (bound, tuple(inputs[i] for i in (1, 2, 3, 7) if len(inputs) > i))
            return bound(inputs)
        fast = recurrent_fast(kind, inputs, attrs)
        return fast if fast is not None else recurrent_reference(kind, inputs, attrs)

    return run


def _table_rows(table, ids, time_major):
    """The batch-major int64 rows of ``table`` that the 2-D ``ids`` (time-major where
    ``time_major``) name, negatives counted from the end as Gather counts them; IndexError
    for an id outside the table."""
    vocab = table.shape[0]
    if ids.min() < -vocab or ids.max() >= vocab:  # as Gather: negatives count back
        raise IndexError(
            f"Gather index out of bounds for a table of {vocab} rows (indices in [{ids.min()}, {ids.max()}])"
        )
    return (ids.T if time_major else ids).astype(np.int64) % vocab


def _embedding_masked_recurrent_op(kind):
    """``EmbeddingMasked<kind>`` (``onnx.fuse_embedding_recurrent`` of a ``Masked<kind>``):
    inputs [table, ids, W, R, B, mask], the masked recurrence run on rows of the table looked
    up by ids, folded into the input projection where the loops run it."""
    masked = _masked_recurrent_op(kind)

    def run(inputs, attrs, opset):
        table, ids, rest = inputs[0], inputs[1], inputs[2:]
        time_major = attrs["_ids_time_major"]
        if ids.ndim == 2 and ids.size:
            ids_bt = _table_rows(table, ids, time_major)
            out = masked([ids_bt, *rest], attrs, opset, table)
            if out is not None:
                return out
        x = np.take(table, ids.astype(np.int64), axis=0)
        if time_major != (attrs.get("layout", 0) == 0):
            x = np.swapaxes(x, 0, 1)
        return masked([x, *rest], attrs, opset)

    return run


def _embedding_recurrent_op(kind):
    """``Embedding<kind>`` (``onnx.fuse_embedding_recurrent``): inputs [table, ids, W, R, ...],
    the recurrence run on rows of the table looked up by ids (time-major ids when the attribute
    ``_ids_time_major`` is set), folded into the input projection where the fast path runs."""

    def run(inputs, attrs, opset):
        table, ids, rest = inputs[0], inputs[1], inputs[2:]
        time_major = attrs["_ids_time_major"]  # the recurrences read no other extra key but _y_read
        if ids.ndim == 2:
            x_shape = ids.shape + table.shape[1:]
            if time_major != (attrs.get("layout", 0) == 0):
                x_shape = (x_shape[1], x_shape[0], x_shape[2])
            _check_recurrent(kind, x_shape, [None, *rest], attrs)
        if ids.ndim == 2 and ids.size:
            ids_bt = _table_rows(table, ids, time_major)
            cache = attrs.get("_bound")  # per plan (OnnxModel): bound calls by key and table
            key = None if cache is None else _bound_key(kind, [ids_bt, *rest], get_ops())
            if key is not None:
                key = (*key, id(table))
                hit = cache.get(key)
                if hit is None:  # None bound where the loops do not bind
                    bound = _bind_recurrent(kind, [ids_bt, *rest], attrs, get_ops(), table)
                    if len(cache) >= _MAX_BOUND_RECURRENT:
                        cache.clear()
                    # held with the arrays whose ids the key holds (as _recurrent_op's)
                    hit = cache[key] = (bound, (table, *(rest[i] for i in (0, 1, 2, 6) if len(rest) > i)))
                if hit[0] is not None:
                    return hit[0]([ids_bt, *rest])
            fast = recurrent_fast(kind, [ids_bt, *rest], attrs, table)
            if fast is not None:
                return fast
        x = np.take(table, ids.astype(np.int64), axis=0)
        if time_major != (attrs.get("layout", 0) == 0):
            x = np.swapaxes(x, 0, 1)
        return FAMILY.run(kind)([x, *rest], attrs, opset)

    return run


def masked_calls(calls, mask, attrs):
    """``recurrent_calls``' backend calls under the (batch, time) bool ``mask`` of a
    ``Masked<kind>`` node (its ``zero_output_for_mask`` too)."""
    zero = bool(attrs.get("zero_output_for_mask", 0))
    return [(cell, args, {**kw, "mask_bt": mask, "zero_masked": zero}) for cell, args, kw in calls]


def _masked_recurrent_op(kind):
    """``ai.fastlayers`` ``Masked<kind>``: ONNX's ``kind`` node (time-major or ``layout`` 1,
    initial_h (and initial_c) after the mask as ONNX places them) whose input 4 is a (batch,
    time) bool mask in place of sequence_lens, as
    Keras masks a recurrent layer: a masked step leaves the states as they are and outputs the
    last step's output (zeros before the first valid step), or zeros with the attribute
    ``zero_output_for_mask``; a reverse direction skips the same steps from the end. Y_h (and
    Y_c) are the final states. What a compiled Keras-style graph writes for a recurrent layer
    fed by ``Embedding(mask_zero=True)``; run on the backend's time loops, which take the mask
    as the layer path does."""

    name = f"Masked{kind}"

    def run(inputs, attrs, opset, table=None):
        """The node's outputs; with an embedding ``table``, inputs[0] holds batch-major ids
        of its rows (None where the loops do not run that form)."""
        x, w, r, b, mask = inputs[:5]
        unmasked = [x, w, r, b, None, *inputs[5:]]  # the node's inputs, no sequence_lens
        layout = attrs.get("layout", 0)
        if table is None:
            _check_recurrent(kind, x.shape, unmasked, attrs)
            batch, steps = (x.shape[0], x.shape[1]) if layout else (x.shape[1], x.shape[0])
        else:
            batch, steps = x.shape
            x_shape = (batch, steps, table.shape[1]) if layout else (steps, batch, table.shape[1])
            _check_recurrent(kind, x_shape, unmasked, attrs)
        if mask.dtype != np.bool_ or mask.shape != (batch, steps):
            raise ShapeError(f"{name}: mask of shape {mask.shape} ({mask.dtype}), expected ({batch}, {steps}) bool")
        planned = recurrent_calls(kind, unmasked, attrs, table)
        if planned is None:
            if table is not None:
                return None
            raise UnsupportedError(
                f"{name}: only the default activations without clip, peepholes or input_forget are supported"
            )
        return _recurrent_outputs(kind, get_ops().recurrent_sequences(masked_calls(planned[0], mask, attrs)), attrs)

    return run


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
#: Every node a recurrence is after the import (ONNX's, its ``Embedding<op>`` and
#: ``EmbeddingMasked<op>`` fusions, fastlayers' ``Masked<op>``), by its key.
RECURRENT_NODES = frozenset(
    f"{prefix}{kind}" for kind in _GATES for prefix in ("", "Embedding", f"{FASTLAYERS}::Masked", "EmbeddingMasked")
)
_RNN_ACTIVATIONS = {
    "sigmoid",
    "tanh",
    "relu",
    "hardsigmoid",
    "leakyrelu",
    "thresholdedrelu",
    "scaledtanh",
    "affine",
    "elu",
    "softsign",
    "softplus",
}


def _recurrent_check(node, attrs, ctx):
    kind = node.op_type.rpartition("::")[2].removeprefix("Masked")
    gates, n_dir = _GATES[kind], 2 if attrs.get("direction") == "bidirectional" else 1
    names = attrs.get("activations")
    if names:
        unknown = [a for a in names if a.lower() not in _RNN_ACTIVATIONS]
        if unknown:
            fail(ctx, node, f"recurrent activation {short(unknown[0])} is not supported", unsupported=True)
        per = {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
        if len(names) != per * n_dir:
            fail(ctx, node, f"{len(names)} activations for {n_dir} direction(s) of {kind} (expected {per * n_dir})")
    w, r = (ctx.constants.get(node.inputs[i]) for i in (1, 2))
    hidden = attrs.get("hidden_size")
    if r is not None:
        if r.ndim != 3 or r.shape[0] != n_dir or r.shape[1] != gates * r.shape[2] or r.shape[2] == 0:
            fail(ctx, node, f"R of shape {r.shape} is not ({n_dir}, {gates} * hidden, hidden)")
        if hidden is not None and hidden != r.shape[2]:
            fail(ctx, node, f"hidden_size {hidden} does not match R of shape {r.shape}")
        hidden = r.shape[2]
    if w is not None and (w.ndim != 3 or w.shape[0] != n_dir or (hidden is not None and w.shape[1] != gates * hidden)):
        fail(ctx, node, f"W of shape {w.shape} is not ({n_dir}, {gates} * hidden, input)")


_RECURRENT = {
    "activation_alpha": A(FLOATS),
    "activation_beta": A(FLOATS),
    "activations": A(STRINGS),
    "clip": FLT,
    "hidden_size": POS,
    "layout": BOOL,
    "direction": A(STRING, choices=("forward", "reverse", "bidirectional")),
}
#: Per kind: (inputs, outputs, attribute rules).
_SCHEMAS = {
    "RNN": ((3, 6), 2, _RECURRENT),
    "GRU": ((3, 6), 2, dict(_RECURRENT, linear_before_reset=BOOL)),
    "LSTM": ((3, 8), 3, dict(_RECURRENT, input_forget=BOOL)),
}
for _kind, (_inputs, _outputs, _attrs) in _SCHEMAS.items():
    FAMILY.add(
        _kind,
        _recurrent_op(_kind),
        inputs=_inputs,
        outputs=_outputs,
        attrs=_attrs,
        check=_recurrent_check,
        caches=("_bound",),
    )
    FAMILY.add(f"Embedding{_kind}", _embedding_recurrent_op(_kind), internal=True, caches=("_bound",))
    FAMILY.add(f"EmbeddingMasked{_kind}", _embedding_masked_recurrent_op(_kind), internal=True)
    FAMILY.add(
        f"Masked{_kind}",
        _masked_recurrent_op(_kind),
        domain=FASTLAYERS,
        inputs=(5, _inputs[1] - (_kind == "LSTM")),  # LSTM's P not taken
        outputs=_outputs,
        attrs=dict(_attrs, zero_output_for_mask=BOOL),
        check=_recurrent_check,
    )
