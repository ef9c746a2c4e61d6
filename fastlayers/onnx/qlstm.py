"""The contrib DynamicQuantizeLSTM: an LSTM whose input and recurrent weights are 8-bit, its
input and hidden state quantized per step as DynamicQuantizeLinear; the time loop runs on the
native core (``native/qlstm.c``), else in numpy."""

from __future__ import annotations

import numpy as np

from ..backends.activations import onnx_sigmoid, onnx_tanh
from ..errors import FastlayersError, InputError, ShapeError, UnsupportedError
from .qlinear import (
    _column_zero_points,
    _float_product,
    _quantized,
    dynamic_product_to_float,
    integer_matmul,
    integer_matmul_to_float,
    native_product_to_float,
    pack_operand,
)
from .quant import MS, _scale, _zero_point, dynamic_quantize, integer_kernels
from .records import BOOL, A, Family

#: This family's operator records (``ops.RECORDS`` gathers the families): DynamicQuantizeLSTM.
FAMILY = Family("quantized LSTM")


def _direction_param(p, d, n_gates, what, name):
    """Direction ``d``'s scale or zero point of a DynamicQuantizeLSTM weight: given per
    direction (n_dir,) or per direction and column (n_dir, 4 * hidden)."""
    p = np.asarray(p)
    if p.ndim == 1:
        return p[d]
    if p.ndim == 2 and p.shape[1] == n_gates:
        return p[d]
    raise ShapeError(f"{what}: {name} of shape {p.shape}, expected (directions,) or (directions, {n_gates})")


def _pack_lstm(node, constants, core) -> None:
    """A DynamicQuantizeLSTM's constant W and R (with their zero points) packed per direction
    (attribute ``_packed``: ((W, R) packed of each direction))."""
    names = [node.inputs[i] if len(node.inputs) > i else "" for i in (1, 2, 9, 11)]
    if not all(n in constants for n in names):
        return
    w, r, w_zp, r_zp = (constants[n] for n in names)
    try:
        packed = []
        for d in range(w.shape[0] if w.ndim == 3 else 0):
            pair = []
            for m, zp, name in ((w, w_zp, "W_zero_point"), (r, r_zp, "R_zero_point")):
                z = _zero_point(
                    _direction_param(zp, d, m.shape[2], "DynamicQuantizeLSTM", name), m.dtype, "DynamicQuantizeLSTM"
                )
                pair.append(core.qpack(np.ascontiguousarray(m[d]), _column_zero_points(z, m.shape[2])))
            packed.append(tuple(pair))
    except (FastlayersError, ValueError, TypeError, IndexError):
        return  # the operator raises its error when it runs
    if packed and r.ndim == 3 and r.shape[0] == len(packed):
        node.attrs = dict(node.attrs, _packed=tuple(packed))
        params = _direction_params(node, constants, w, r)
        if params is not None:
            node.attrs["_params"] = params
            node.attrs["_checked"] = set()  # input shapes checked (_dynamic_quantize_lstm)


def _direction_params(node, constants, w, r):
    """Per direction, what a call derives from the constant B, scales and zero points: (W zero
    point, R zero point, W and R scales per column as float32, B's input and recurrent halves
    summed); None where one of them is computed by the graph or does not check."""
    what = "DynamicQuantizeLSTM"
    names = [node.inputs[i] if len(node.inputs) > i else "" for i in (3, 8, 9, 10, 11)]
    if not all(n in constants for n in names[1:]) or names[0] and names[0] not in constants:
        return None
    b, w_scale, w_zp, r_scale, r_zp = (constants.get(n) if n else None for n in names)
    n_gates = r.shape[2]
    try:
        params = []
        for d in range(w.shape[0]):
            if b is not None and np.size(b):
                bias = (b[d, :n_gates] + b[d, n_gates:]).astype(np.float32)
            else:
                bias = np.zeros(n_gates, np.float32)
            params.append(
                (
                    _zero_point(_direction_param(w_zp, d, n_gates, what, "W_zero_point"), w.dtype, what),
                    _zero_point(_direction_param(r_zp, d, n_gates, what, "R_zero_point"), r.dtype, what),
                    np.ascontiguousarray(
                        np.broadcast_to(
                            _scale(_direction_param(w_scale, d, n_gates, what, "W_scale"), what), (n_gates,)
                        )
                    ),
                    np.ascontiguousarray(
                        np.broadcast_to(
                            _scale(_direction_param(r_scale, d, n_gates, what, "R_scale"), what), (n_gates,)
                        )
                    ),
                    bias,
                )
            )
    except (FastlayersError, ValueError, TypeError, IndexError):
        return None  # the operator raises its error when it runs
    return tuple(params)


#: Most input shapes whose checks a DynamicQuantizeLSTM node remembers.
MAX_CHECKED = 64


def _optional(inputs):
    """B, sequence_lens, initial_h, initial_c and P of a DynamicQuantizeLSTM call (None where
    absent or empty)."""
    return [
        inputs[i] if len(inputs) > i and inputs[i] is not None and np.size(inputs[i]) else None for i in range(3, 8)
    ]


def _check_lstm(x, inputs, attrs, optional):
    """A DynamicQuantizeLSTM call's inputs checked: (W, R, direction count, hidden size)."""
    what = "DynamicQuantizeLSTM"
    w, r = _quantized(inputs[1], what, "W"), _quantized(inputs[2], what, "R")
    if x.dtype != np.float32 or x.ndim != 3:
        raise InputError(f"{what}: X of type {x.dtype} and shape {x.shape}; expected float32 (time, batch, input)")
    if optional[1] is not None:
        raise UnsupportedError(f"{what}: sequence_lens is not supported")
    names = [a.lower() for a in attrs.get("activations", [])]
    if any(n != d for n, d in zip(names, ["sigmoid", "tanh", "tanh"] * 2)) or len(names) not in (0, 3, 6):
        raise UnsupportedError(
            f"{what}: activations {attrs.get('activations')} (only the default Sigmoid, Tanh, Tanh are supported)"
        )
    n_dir = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    steps, batch, n_in = x.shape
    hidden = r.shape[1] if r.ndim == 3 else 0
    n_gates = 4 * hidden
    if (
        w.shape != (n_dir, n_in, n_gates)
        or r.shape != (n_dir, hidden, n_gates)
        or not hidden
        or attrs.get("hidden_size", hidden) != hidden
    ):
        raise ShapeError(
            f"{what}: W of shape {w.shape} and R of shape {r.shape} for X of shape {x.shape} "
            f"(expected ({n_dir}, {n_in}, 4 * hidden) and ({n_dir}, hidden, 4 * hidden))"
        )
    for given, name, want in zip(
        optional[:1] + optional[2:],
        ("B", "initial_h", "initial_c", "P"),
        ((n_dir, 2 * n_gates), (n_dir, batch, hidden), (n_dir, batch, hidden), (n_dir, 3 * hidden)),
    ):
        if given is not None and np.shape(given) != want:
            raise ShapeError(f"{what}: {name} of shape {np.shape(given)}, expected {want}")
    return w, r, n_dir, hidden


def _native_lstm(x, optional, attrs, params, packed, core):
    """DynamicQuantizeLSTM on checked inputs whose constants were derived (``params``) and
    packed (``packed``) at load: per direction, the input product for every step at once, then
    the time loops of ``native/qlstm.c``, the directions of a bidirectional layer side by side
    on the pool's threads."""
    steps, batch, n_in = x.shape
    n_dir, n_gates = len(params), params[0][4].shape[0]
    hidden = n_gates // 4
    _, _, h0, c0, p = optional
    ys = np.zeros((steps, n_dir, batch, hidden), np.float32)
    h_last = np.empty((n_dir, batch, hidden), np.float32)
    c_last = np.empty((n_dir, batch, hidden), np.float32)
    x2 = x.reshape(-1, n_in)
    reverse, clip = attrs.get("direction", "forward") == "reverse", float(attrs.get("clip") or 0.0)
    input_forget = bool(attrs.get("input_forget", 0))
    runs = []
    for d in range(n_dir):
        w_zp, r_zp, w_scale, r_scale, bias = params[d]
        w_packed, r_packed = packed[d]
        x_proj = dynamic_product_to_float(core, x2, w_packed, n_gates, w_scale, None)
        h_last[d] = 0.0 if h0 is None else h0[d]  # the states, updated in place by the runs
        c_last[d] = 0.0 if c0 is None else c0[d]
        runs.append(
            (
                x_proj.reshape(steps, batch, n_gates),
                reverse or d == 1,
                r_packed,
                r_scale,
                bias,
                None if p is None else p[d].astype(np.float32),
                clip,
                input_forget,
                h_last[d],
                c_last[d],
                ys[:, d],
            )
        )
    core.qlstm_runs(runs)
    return [ys, h_last, c_last]


def _dynamic_quantize_lstm(inputs, attrs, opset):
    """com.microsoft DynamicQuantizeLSTM: ONNX LSTM (gates i, o, f, c) whose weights W
    (directions, input, 4 * hidden) and R (directions, hidden, 4 * hidden) are u8/s8 with
    scales and zero points per direction or per column; each product quantizes its float
    operand as DynamicQuantizeLinear (X over the whole sequence, h at each step) and is summed
    exactly: z = float(acc_x) * (x_scale * w_scale) + float(acc_h) * (h_scale * r_scale) + Wb + Rb.
    A node whose constants were derived and packed at load (``_pack_lstm``) checks each input
    shape once (its ``_checked`` set) and runs ``_native_lstm`` on the native core."""
    what = "DynamicQuantizeLSTM"
    x = np.asarray(inputs[0])
    optional = _optional(inputs)
    params, packed, checked = attrs.get("_params"), attrs.get("_packed"), attrs.get("_checked")
    core = integer_kernels()
    fast = params is not None and packed is not None and core is not None
    if fast and checked is not None:
        key = (x.shape, x.dtype.str, *(None if v is None else v.shape for v in optional))
        if key not in checked:
            _check_lstm(x, inputs, attrs, optional)
            if len(checked) >= MAX_CHECKED:
                checked.clear()
            checked.add(key)
        return _native_lstm(x, optional, attrs, params, packed, core)
    w, r, n_dir, hidden = _check_lstm(x, inputs, attrs, optional)
    if fast:
        return _native_lstm(x, optional, attrs, params, packed, core)
    get = lambda i: optional[i - 3]  # noqa: E731
    direction = attrs.get("direction", "forward")
    steps, batch, n_in = x.shape
    n_gates = 4 * hidden
    clip = attrs.get("clip")
    ys = np.zeros((steps, n_dir, batch, hidden), np.float32)
    h_last = np.zeros((n_dir, batch, hidden), np.float32)
    c_last = np.zeros((n_dir, batch, hidden), np.float32)
    x_q, x_scale, x_zp = dynamic_quantize(x.reshape(-1, n_in))
    for d in range(n_dir):
        if params is not None:
            w_zp, r_zp, w_scale, r_scale, bias = params[d]
        else:
            w_zp, r_zp = (
                _zero_point(_direction_param(inputs[k], d, n_gates, what, name), m.dtype, what)
                for k, name, m in ((9, "W_zero_point", w), (11, "R_zero_point", r))
            )
            w_scale = _direction_param(inputs[8], d, n_gates, what, "W_scale")
            r_scale = _direction_param(inputs[10], d, n_gates, what, "R_scale")
            b = get(3)
            bias = np.zeros(n_gates, np.float32) if b is None else (b[d, :n_gates] + b[d, n_gates:]).astype(np.float32)
        w_packed, r_packed = (
            attrs["_packed"][d]
            if "_packed" in attrs and core is not None
            else (pack_operand(w[d], w_zp), pack_operand(r[d], r_zp))
        )
        if params is not None and w_packed is not None:  # the scales per column, derived
            x_proj = native_product_to_float(core, x_q, x_zp, w_packed, n_gates, w_scale * x_scale, None)
        else:
            x_proj = integer_matmul_to_float(x_q, np.asarray(x_zp), w[d], w_zp, w_packed, x_scale, w_scale, None, what)
        x_proj = x_proj.reshape(steps, batch, n_gates)
        h0, c0, p = get(5), get(6), get(7)
        h = np.zeros((batch, hidden), np.float32) if h0 is None else h0[d].astype(np.float32)
        c = np.zeros((batch, hidden), np.float32) if c0 is None else c0[d].astype(np.float32)
        p = None if p is None else p[d].astype(np.float32)
        reverse = direction == "reverse" or d == 1
        if r_packed is not None:  # the time loop on the native core (qlstm.c)
            r_scale_columns = (
                r_scale
                if params is not None
                else np.ascontiguousarray(np.broadcast_to(_scale(r_scale, what), (n_gates,)))
            )
            core.qlstm(
                x_proj,
                reverse,
                r_packed,
                r_scale_columns,
                bias,
                p,
                float(clip or 0.0),
                bool(attrs.get("input_forget", 0)),
                h,
                c,
                ys[:, d],
            )
            h_last[d], c_last[d] = h, c
            continue
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            h_q, h_scale, h_zp = dynamic_quantize(h)
            # onnxruntime's order: (x W + h R) (+ P c) + b
            z = x_proj[t] + _float_product(
                integer_matmul(h_q, np.asarray(h_zp), r[d], r_zp, r_packed), h_scale, r_scale, None, n_gates, what
            )
            zi, zo, zf, zc = (z[:, k * hidden : (k + 1) * hidden] for k in range(4))
            bi, bo, bf, bc = (bias[k * hidden : (k + 1) * hidden] for k in range(4))
            if p is not None:
                zi, zf = zi + p[:hidden] * c, zf + p[2 * hidden :] * c
            zi, zf, zc = zi + bi, zf + bf, zc + bc
            if clip is not None:
                zi, zf, zc = (np.clip(v, -clip, clip) for v in (zi, zf, zc))
            gi = onnx_sigmoid(zi)
            gf = 1 - gi if attrs.get("input_forget", 0) else onnx_sigmoid(zf)
            c = gf * c + gi * onnx_tanh(zc)
            if p is not None:
                zo = zo + p[hidden : 2 * hidden] * c
            zo = zo + bo
            if clip is not None:
                zo = np.clip(zo, -clip, clip)
            h = (onnx_sigmoid(zo) * onnx_tanh(c)).astype(np.float32)
            ys[t, d] = h
        h_last[d], c_last[d] = h, c
    return [ys, h_last, c_last]


def direction_constants(inputs, attrs):
    """``dynamic_qlstm``'s arguments after x for each direction of a DynamicQuantizeLSTM node
    whose constants were derived and packed at load (``_pack_lstm``) and whose P is a constant
    or absent: a list of (w_packed, w_scale, reverse, r_packed, r_scale, bias, peep, clip,
    input_forget), one per direction; None otherwise (a P computed by the graph)."""
    params, packed = attrs.get("_params"), attrs.get("_packed")
    p = inputs[7] if len(inputs) > 7 else None
    if params is None or packed is None or len(params) != len(packed) or len(params) not in (1, 2):
        return None
    if p is not None and (not isinstance(p, np.ndarray) or p.ndim != 2 or p.shape[0] != len(params)):
        return None  # a graph value, or a shape the general form rejects
    direction, clip = attrs.get("direction", "forward"), float(attrs.get("clip") or 0.0)
    if (direction == "bidirectional") != (len(params) == 2):
        return None
    found = []
    for d, ((_, _, w_scale, r_scale, bias), (w_packed, r_packed)) in enumerate(zip(params, packed)):
        peep = None if p is None or p.size == 0 else np.ascontiguousarray(p[d], np.float32)
        reverse = direction == "reverse" or d == 1
        found.append(
            (w_packed, w_scale, reverse, r_packed, r_scale, bias, peep, clip, bool(attrs.get("input_forget", 0)))
        )
    return found


def one_direction_constants(inputs, attrs):
    """``direction_constants`` of a forward or reverse node (its one tuple); None otherwise (a
    bidirectional node, a P computed by the graph)."""
    found = direction_constants(inputs, attrs)
    return found[0] if found is not None and len(found) == 1 else None


def bind_dynamic_quantize_lstm(inputs, attrs, opset):
    """DynamicQuantizeLSTM bound on its constants, for the compiled plan (its record's ``bind``): a
    forward or reverse node whose W, R, B, scales and zero points were packed and derived at
    load (``_pack_lstm``) and whose P is a constant or absent. Each input shape is checked by
    the general form at its first call; later calls run the input's quantization, its product
    with W and the time loop in one native call (``dynamic_qlstm``), the states and outputs
    made here. None for a bidirectional node, a P computed by the graph, or constants that did
    not derive (the general form runs, and raises what it raises)."""
    bound = one_direction_constants(inputs, attrs)
    if bound is None:
        return None
    hidden = bound[5].shape[0] // 4  # the bias: 4 hidden
    checked: set = set()

    def run(inputs, attrs, opset):
        x = inputs[0]
        h0 = inputs[5] if len(inputs) > 5 else None
        c0 = inputs[6] if len(inputs) > 6 else None
        key = tuple(None if v is None else (type(v), np.shape(v)) for v in (x, *inputs[3:7]))
        core = integer_kernels()
        if core is None or type(x) is not np.ndarray or key not in checked:
            out = _dynamic_quantize_lstm(inputs, attrs, opset)  # checks the shapes, raises
            if core is not None and type(x) is np.ndarray:
                if len(checked) >= MAX_CHECKED:
                    checked.clear()
                checked.add(key)
            return out
        steps, batch, _ = x.shape
        ys = np.empty((steps, 1, batch, hidden), np.float32)
        h = np.array(h0, np.float32) if h0 is not None and h0.size else np.zeros((1, batch, hidden), np.float32)
        c = np.array(c0, np.float32) if c0 is not None and c0.size else np.zeros((1, batch, hidden), np.float32)
        core.dynamic_qlstm(x if x.flags.c_contiguous else np.ascontiguousarray(x), *bound, h[0], c[0], ys[:, 0])
        return [ys, h, c]

    return run


_LSTM_ATTRS = {
    "activation_alpha": A("floats"),
    "activation_beta": A("floats"),
    "activations": A("strings"),
    "clip": A("float"),
    "hidden_size": A("int", 1),
    "direction": A("string", choices=("forward", "reverse", "bidirectional")),
    "input_forget": BOOL,
}


FAMILY.add(
    "DynamicQuantizeLSTM",
    _dynamic_quantize_lstm,
    inputs=(12, 12),
    optional=3,
    outputs=3,
    attrs=_LSTM_ATTRS,
    domain=MS,
    bind=bind_dynamic_quantize_lstm,
)
