"""CpuOps recurrent primitives: one input GEMM for all steps, then a compiled time loop.

Where the batch divides into equal shares of at least ``MIN_SHARE_ROWS`` rows (``_row_parts``),
each of ``set_num_threads`` threads runs its rows through the whole sequence on all units, with
no barrier, after projecting its own rows' inputs (on the packed sgemm; ``_prepare``).
Otherwise (batch 1, say) the loop's units are split among the threads (``_split.shares``):
each share owns a block of units (the matching columns of every gate block, packed side by
side once per weight array, ``derived``) for the whole sequence and the shares meet at a
barrier after each step (``_sync``), inside one parallel region. Each thread thus reads only
its part of the recurrent weights per step (half of a 1 MiB LSTM kernel stays in its core's L2
cache at two threads). Too little work per step (small layers, small batches)
runs serially.

Each function returns None when the compiled loop does not cover the call (an activation other
than tanh, sigmoid, relu, linear, hard_sigmoid; an empty sequence), and CpuOps falls back to the
numpy reference. Arguments follow ``backends/recurrent_reference.py`` (x as float32 (B, T, I) or
integer ids (B, T) of one-hot inputs).
"""

from __future__ import annotations

import functools
import math
import threading

import numba
import numpy as np

from .._jit import apply_num_threads, warm_call
from ..derived import derived, derived_from
from . import _blas, _split
from . import _recurrent as K
from ._gemm import matmul, packed_weights
from ._pages import aligned_empty, weights_empty
from ._split import shares
from ._sync import aborted, barrier_safe

_EMPTY_1D = np.zeros(0, np.float32)
_EMPTY_3D = np.zeros((0, 0, 0), np.float32)
#: Fewest multiply-adds of the recurrent product per share and step worth a thread (a barrier
#: costs about 0.2 us; a share should compute for a few microseconds between two).
MIN_SHARE_MADDS = 1 << 16
#: Shares own multiples of this many units (whole SIMD vectors).
UNIT_STEP = 16
#: Largest recurrent weights (bytes) for which threads share the batch rather than the units:
#: every thread then reads all of them each step, but no barrier is needed and no state moves
#: between cores (``_row_parts``). Measured faster at 2 threads up to 4 MiB of weights (hidden
#: 512, beyond this machine's 1 MiB L2 per core; docs/design.md, "Recurrent loops"); past the
#: L3 cache each thread would stream all of them from memory.
ROW_SHARE_MAX_BYTES = 8 << 20
#: Fewest rows per batch share: the sgemm's 4-row tile runs at its full rate from 4 rows.
MIN_SHARE_ROWS = 4
_local = threading.local()
_warming = [False]


def _c32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _codes(*names):
    codes = tuple(K.CODES.get(n) for n in names)
    return None if any(c is None for c in codes) else codes


def _lines(n):
    """n rounded up to whole 64-byte cache lines of float32 (or int32) values."""
    return -(-n // 16) * 16


def _workspace(name, shape, dtype=np.float32):
    """A C-contiguous, cache-line aligned scratch array of ``shape``, reused by later calls in
    this thread (a fresh multi-MB array costs its page faults)."""
    size = math.prod(shape)
    buf = getattr(_local, name, None)
    if buf is None or buf.size < size:
        buf = aligned_empty((max(size, 1),), dtype)
        setattr(_local, name, buf)
    return buf[:size].reshape(shape)


def _input_projection(x_bti, w_ig, b_g, parts=1):
    """xw (parts, T * B / parts, G) = x (B, T, I) @ w_ig + b_g as one GEMM over all timesteps
    (shared among the threads by rows), written into a per-thread workspace: batch share p's
    rows in xw[p], time-major (row t B / parts + r: ``_step_rows``), so that a step reads one
    contiguous block: batch-major rows lie T * G floats apart, a power of two in common shapes,
    and fell on the same cache sets (a batch-8, 128-unit LSTM step: 22 us batch-major, 19 us)."""
    b, t_len, i = x_bti.shape
    x = np.ascontiguousarray(_rows(x_bti, parts).transpose(0, 2, 1, 3), dtype=np.float32)
    x = x.reshape(t_len * b, i)
    xw = _workspace("xw", (t_len * b, w_ig.shape[1]))
    matmul(x, _c32(w_ig), xw, None if b_g is None else _c32(b_g), weights=True)
    return xw.reshape(parts, t_len * (b // parts), -1)


@functools.lru_cache(maxsize=64)
def _step_rows(parts, t_len, rows):
    """(parts, T, rows) int64, [p, t, r] = t rows + r: where ``_input_projection`` put step t of
    batch share p's row r in xw[p] (cached per shape: never written to). A writable array, as
    ``_table_rows``' ids are: Numba compiles every loop again for a read-only one."""
    return np.tile(np.arange(t_len * rows, dtype=np.int64).reshape(1, t_len, rows), (parts, 1, 1))


def _table_rows(ids_bt, w_vg, b_g, parts=1):
    """The input projection of one-hot inputs given by their ids (B, T), as the loops read it in
    place: the table (1, V, G) of w_vg + b_g (the sum computed once per weight array) and the
    ids as (parts, T, B / parts) int64 (batch share p's in [p]). Copying the rows out for the
    loop had cost a text classifier's first layer about a third of its time: the copy's lines
    moved to the other core's cache in each call."""
    if ids_bt.min() < 0 or ids_bt.max() >= w_vg.shape[0]:
        raise IndexError(f"ids in [{ids_bt.min()}, {ids_bt.max()}] for {w_vg.shape[0]} rows")
    table = _c32(w_vg) if b_g is None else \
        derived_from((w_vg, b_g), "recurrent-table-bias", lambda w, b: _c32(w) + _c32(b))
    if not table.flags.writeable:       # read-only arrays are another Numba type: a writable copy
        table = derived(table, "recurrent-table-writable", np.array)
    ids = np.array(_rows(ids_bt, parts).transpose(0, 2, 1), dtype=np.int64, order="C")
    return table.reshape(1, *table.shape), ids


def _rows(a_b, parts):
    """``a_b`` (batch, ...) as (parts, batch / parts, ...): batch share p's rows in [p] (a view
    of a C-contiguous array: outputs written through it land in ``a_b``)."""
    return a_b.reshape(parts, a_b.shape[0] // parts, *a_b.shape[1:])


def _mask_tb(mask_bt, parts=1):
    """The mask as uint8 (parts, T, B / parts) (batch share p's rows in [p]), or an empty
    (parts, 0, 0) without a mask."""
    if mask_bt is None:
        return np.zeros((parts, 0, 0), np.uint8)
    return np.ascontiguousarray(_rows(np.asarray(mask_bt, bool), parts).transpose(0, 2, 1),
                                np.uint8)


@functools.lru_cache(maxsize=256)
def _bounds(size, parts):
    """Share boundaries over ``size`` columns: multiples of UNIT_STEP when every share gets at
    least one step of them, else of 1 (cached per call shape: never written to)."""
    step = UNIT_STEP if size >= UNIT_STEP * parts else 1
    steps = -(-size // step)
    return np.array([min(size, step * (steps * p // parts)) for p in range(parts + 1)], np.int64)


def _widest(bounds):
    """The most units any share owns."""
    return int(np.diff(bounds).max()) if len(bounds) > 2 else int(bounds[1] - bounds[0])


def _pack(w_kn, blocks, n_blocks, bounds):
    """(parts, k, len(blocks) * nmax): share p's columns of each gate block in ``blocks`` of
    ``w_kn`` (k, n_blocks * units), side by side, zero-padded to the widest share."""
    k, width = w_kn.shape
    units = width // n_blocks
    sizes = np.diff(bounds)
    out = weights_empty((len(sizes), k, len(blocks) * int(sizes.max())))
    out[...] = 0
    for p, (u0, n) in enumerate(zip(bounds[:-1], sizes)):
        for i, blk in enumerate(blocks):
            out[p, :, i * n:(i + 1) * n] = w_kn[:, blk * units + u0:blk * units + u0 + n]
    return out


def _share_weights(w_kn, blocks, n_blocks, bounds):
    """``_pack``, computed once per weight array and split (the whole array, viewed, for one
    share of every block)."""
    w = _c32(w_kn)
    if len(bounds) == 2 and len(blocks) == n_blocks:
        return w.reshape(1, *w.shape)
    kind = f"recurrent-shares:{blocks}:{n_blocks}:{bounds.tolist()}"
    return derived(w, kind, lambda a: _pack(a, blocks, n_blocks, bounds))


def _loop_fn():
    """The product routine the loops get: fastlayers' packed sgemm, else numpy's CBLAS sgemm
    (read at call time: tests switch it)."""
    return _blas.PACKED if _blas.PACKED is not None else _blas.SGEMM


def _packed_shares(w_kn, blocks, n_blocks, bounds, fn, batch):
    """``_share_weights`` with each share packed for ``fn`` (computed once per weight array) when
    ``fn`` is ``_blas.PACKED`` and the batch needs a matrix product, else an empty (parts, 0)."""
    if w_kn is None or fn is None or fn is not _blas.PACKED or batch == 1:
        return np.zeros((len(bounds) - 1, 0), np.float32)
    kind = f"recurrent-packed:{blocks}:{n_blocks}:{bounds.tolist()}"
    return derived(_c32(w_kn), kind, lambda w: np.stack(
        [_blas.pack(share) for share in _share_weights(w, blocks, n_blocks, bounds)]))


def _share_count(batch, k, units, gate_blocks):
    """Shares of a loop whose recurrent product is (batch, k) @ (k, gate_blocks * units)."""
    madds_per_unit = batch * k * gate_blocks
    min_units = max(UNIT_STEP, -(-MIN_SHARE_MADDS // madds_per_unit))
    return units, min_units


def _scratch(parts, width, batch):
    """Per-share gate rows (parts, batch, width) and activation scratch (parts, width), each
    share's rows on cache lines of their own: two threads writing one line (false sharing)
    made a two-thread LSTM step up to 1.6x slower, depending on where the buffer started."""
    width = _lines(width)
    return (_workspace("gates", (parts, batch, width)), _workspace("tmp", (parts, width)),
            _workspace("bits", (parts, width), np.int32))


def _run(drivers, make_args, units, min_units, fn, row_parts):
    """Run a loop's shares and return the arguments run. ``drivers``: (one: a single share,
    all: unit shares in one parallel region, rows_one / rows_all: batch shares one after the
    other / in one parallel region). ``make_args(parts, by_rows)`` builds fresh outputs and
    states; ``fn`` is the drivers' leading argument (``_loop_fn()``). With ``row_parts`` > 1
    (``_row_parts``) threads share the batch (serially when another call holds the parallel
    slot); else they share the units,
    again serially if a share gave up (``_sync.SPIN_LIMIT``). A loop too small for two shares
    goes straight to the serial run (no slot, no thread query). While ``warm_loops`` runs,
    every driver runs with one share (compiling each)."""
    one, all_shares, rows_one, rows_all = drivers
    if _warming[0]:
        all_shares(fn, make_args(1), 1)
        rows_all(fn, make_args(1, True), 1)
        rows_one(fn, make_args(1, True), 1)
        args = make_args(1)
        one(fn, args)
        return args
    if row_parts > 1:
        args = make_args(row_parts, True)
        with shares(row_parts, 1) as parts:
            (rows_all if parts == row_parts else rows_one)(fn, args, row_parts)
        return args
    if min(_split.thread_count(), units // max(min_units, 1)) > 1:
        with shares(units, min_units) as parts:
            parts = min(parts, numba.get_num_threads())   # a barrier needs every share running
            if parts > 1 and barrier_safe():
                args = make_args(parts)
                all_shares(fn, args, parts)
                if not aborted(args[-1]):
                    return args
    args = make_args(1)
    one(fn, args)
    return args


def _row_parts(batch, weight_floats):
    """Batch shares for a loop whose recurrent weights (every gate block, and the LSTM's
    projection) hold ``weight_floats`` floats: the most, up to the thread count, that cut the
    batch into equal shares of at least ``MIN_SHARE_ROWS`` rows and ``MIN_SHARE_MADDS``
    multiply-adds per step; 1 (share the units instead) when none does or the weights exceed
    ``ROW_SHARE_MAX_BYTES``."""
    if weight_floats * 4 > ROW_SHARE_MAX_BYTES:
        return 1
    for parts in range(min(_split.thread_count(), batch // MIN_SHARE_ROWS), 1, -1):
        if batch % parts == 0 and batch // parts * weight_floats >= MIN_SHARE_MADDS:
            return parts
    return 1


class _Layout:
    """Where the arrays of one run of a loop go: ``split`` batch shares (1: unit shares), whose
    batch-major arrays are passed as (split, B / split, ...) views (``_rows``), ``rows`` each;
    ``parts`` shares in all (for per-share scratch)."""

    def __init__(self, parts, by_rows, batch):
        self.parts, self.split = parts, (parts if by_rows else 1)
        self.by_rows, self.rows = by_rows, batch // (parts if by_rows else 1)

    def batch(self, a):
        """A batch-major array as the loop takes it."""
        return _rows(a, self.split) if self.by_rows else a

    def shared(self, a):
        """An array laid out (split, ...) by ``_input_projection``/``_mask_tb``/``_states``."""
        return a if self.by_rows else a[0]


def _state_empty(shape, parts):
    """A new float32 state or output array, cache-line aligned when several shares write it."""
    return aligned_empty(shape) if parts > 1 else np.empty(shape, np.float32)


def _outputs(t_len, batch, size, return_sequences, y0, parts):
    y_btp = np.empty((batch, t_len if return_sequences else 0, size), np.float32)
    last = _state_empty((batch, size), parts)
    last[...] = 0 if y0 is None else y0
    return y_btp, last


def _states(h0, batch, size, lay):
    """The state of even and odd steps, (split, 2, batch / split, size), starting from h0 (a
    per-thread workspace: ``_final`` copies the result out)."""
    hbuf = _workspace("hbuf", (lay.split, 2, lay.rows, size))
    hbuf[:, 0] = (h0 if h0.shape == (batch, size) else
                  np.broadcast_to(h0, (batch, size))).reshape(lay.split, lay.rows, size)
    return hbuf


def _final(hbuf, t_len):
    """The state after step ``t_len`` in ``_states``' buffer, as a new (batch, size) array."""
    return np.array(hbuf[:, t_len % 2].reshape(-1, hbuf.shape[-1]))


def _cell(c0, batch, units, parts):
    """The LSTM cell state, (batch, units), starting from c0 (updated in place by the loop)."""
    c = _state_empty((batch, units), parts)
    c[...] = c0
    return c


def _finish(y_btp, last, mask_bt, reverse, return_sequences, zero_masked):
    if return_sequences:
        return y_btp
    if zero_masked and mask_bt is not None:
        last[~np.asarray(mask_bt, bool)[:, 0 if reverse else -1]] = 0
    return last


def _prepare(x_bti, w_i, b, mask_bt, weight_floats):
    """What every loop needs before its shares are built: the batch shares (``_row_parts``),
    the input projection and the rows each step reads of it (``_step_rows``; the table of
    ``w_i`` and the ids themselves for integer ids ``x_bti``: ``_table_rows``), the mask laid
    out for them, the product routine, and the batch-share drivers' projection arguments (x as
    (shares, B / shares, T, I), the packed input weights, the bias). On the packed sgemm each
    batch share projects its own rows in its thread, into the workspace returned (one parallel
    region, and its part of xw stays in its core's cache); otherwise the projection is computed
    here and those arguments are empty (``_no_projection``)."""
    apply_num_threads()
    batch, t_len = x_bti.shape[:2]
    row_parts, fn = _row_parts(batch, weight_floats), _loop_fn()
    mask = _mask_tb(mask_bt, row_parts)
    if x_bti.ndim == 2:
        return (row_parts, *_table_rows(x_bti, w_i, b, row_parts), mask, fn,
                _no_projection(row_parts))
    xrow = _step_rows(row_parts, t_len, batch // row_parts)
    if row_parts > 1 and fn is _blas.PACKED:
        xw = _workspace("xw", (row_parts, t_len * (batch // row_parts), w_i.shape[1]))
        proj = (_rows(_c32(x_bti), row_parts), packed_weights(_c32(w_i)),
                _EMPTY_1D if b is None else _c32(b))
        return row_parts, xw, xrow, mask, fn, proj
    return (row_parts, _input_projection(x_bti, w_i, b, row_parts), xrow, mask, fn,
            _no_projection(row_parts))


@functools.lru_cache(maxsize=16)
def _no_projection(parts):
    """The batch-share drivers' projection arguments when the shares do not project: empty
    (parts, 0, 0, 0) inputs, packed weights and bias (cached: never written to)."""
    return np.zeros((parts, 0, 0, 0), np.float32), _EMPTY_1D, _EMPTY_1D


def rnn_sequence(x_bti, w_ih, w_hh, b, h0, *, activation="tanh", mask_bt=None, reverse=False,
                 return_sequences=True, zero_masked=False, y0=None):
    codes = _codes(activation)
    batch, t_len = x_bti.shape[:2]
    if codes is None or t_len == 0 or batch == 0:
        return None
    units = w_hh.shape[0]
    row_parts, xw, xrow, mask, fn, proj = _prepare(x_bti, w_ih, b, mask_bt, units * units)
    kept = {}

    def make_args(parts, by_rows=False):
        lay = _Layout(parts, by_rows, batch)
        bounds = _bounds(units, parts // lay.split)
        gates, tmp, bits = _scratch(parts, _widest(bounds), lay.rows)
        y_btp, last = _outputs(t_len, batch, units, return_sequences, y0, parts)
        kept.update(hbuf=_states(h0, batch, units, lay), y=y_btp, last=last)
        return (lay.shared(xw), lay.shared(xrow), _share_weights(w_hh, (0,), 1, bounds),
                _packed_shares(w_hh, (0,), 1, bounds, fn, lay.rows), lay.shared(kept["hbuf"]),
                lay.shared(mask), bool(reverse), bool(zero_masked), codes[0], lay.batch(y_btp),
                lay.batch(last), gates, tmp, bits, bounds,
                np.zeros(2, np.int64)) + (proj if by_rows else ())

    _run((K.rnn_one, K.rnn_all, K.rnn_rows_one, K.rnn_rows_all), make_args,
         *_share_count(batch, units, units, 1), fn, row_parts)
    return (_finish(kept["y"], kept["last"], mask_bt, reverse, return_sequences, zero_masked),
            _final(kept["hbuf"], t_len))


def lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, *, w_hp=None, activation="tanh",
                  recurrent_activation="sigmoid", mask_bt=None, reverse=False,
                  return_sequences=True, zero_masked=False, y0=None):
    codes = _codes(activation, recurrent_activation)
    batch, t_len = x_bti.shape[:2]
    if codes is None or t_len == 0 or batch == 0:
        return None
    out_size, units = w_hg.shape[0], w_hg.shape[1] // 4
    row_parts, xw, xrow, mask, fn, proj = _prepare(x_bti, w_ig, b_g, mask_bt,
                                                   w_hg.size + (0 if w_hp is None else w_hp.size))
    kept = {}

    def make_args(parts, by_rows=False):
        lay = _Layout(parts, by_rows, batch)
        unit_parts = parts // lay.split
        ub = _bounds(units, unit_parts)
        width = _widest(ub)
        gates, tmp, bits = _scratch(parts, 4 * width, lay.rows)
        if w_hp is None:
            qb, w_proj, proj_q = ub, _EMPTY_3D, _EMPTY_3D
        else:
            qb = _bounds(out_size, unit_parts)
            w_proj = _share_weights(w_hp, (0,), 1, qb)
            proj_q = _workspace("proj", (parts, lay.rows, _lines(w_proj.shape[2])))
        y_btp, last = _outputs(t_len, batch, out_size, return_sequences, y0, parts)
        kept.update(hbuf=_states(h0, batch, out_size, lay), c=_cell(c0, batch, units, parts),
                    y=y_btp, last=last)
        return (lay.shared(xw), lay.shared(xrow), _share_weights(w_hg, (0, 1, 2, 3), 4, ub),
                _packed_shares(w_hg, (0, 1, 2, 3), 4, ub, fn, lay.rows), w_proj,
                _packed_shares(w_hp, (0,), 1, qb, fn, lay.rows), lay.shared(kept["hbuf"]),
                lay.batch(_workspace("hfull", (batch, units))), lay.batch(kept["c"]),
                lay.shared(mask), bool(reverse), bool(zero_masked), codes[0], codes[1],
                lay.batch(y_btp), lay.batch(last), gates, proj_q, tmp, bits, ub, qb,
                np.zeros(2, np.int64)) + (proj if by_rows else ())

    _run((K.lstm_one, K.lstm_all, K.lstm_rows_one, K.lstm_rows_all), make_args,
         *_share_count(batch, out_size, units, 4), fn, row_parts)
    return (_finish(kept["y"], kept["last"], mask_bt, reverse, return_sequences, zero_masked),
            _final(kept["hbuf"], t_len), kept["c"])


def gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, *, reset_after=True, activation="tanh",
                 recurrent_activation="sigmoid", mask_bt=None, reverse=False,
                 return_sequences=True, zero_masked=False, y0=None):
    codes = _codes(activation, recurrent_activation)
    batch, t_len = x_bti.shape[:2]
    if codes is None or t_len == 0 or batch == 0:
        return None
    units = w_hg.shape[0]
    row_parts, xw, xrow, mask, fn, proj = _prepare(x_bti, w_ig, b_ig, mask_bt, w_hg.size)
    # the recurrent bias does not exist without reset_after
    bias = _c32(b_hg) if reset_after and b_hg is not None else _EMPTY_1D
    kept = {}

    def make_args(parts, by_rows=False):
        lay = _Layout(parts, by_rows, batch)
        bounds = _bounds(units, parts // lay.split)
        width = _widest(bounds)
        gate_blocks = (0, 1, 2) if reset_after else (0, 1)
        w_gates = _share_weights(w_hg, gate_blocks, 3, bounds)
        w_cand = _EMPTY_3D if reset_after else _share_weights(w_hg, (2,), 3, bounds)
        gates, tmp, bits = _scratch(parts, 3 * width, lay.rows)
        y_btp, last = _outputs(t_len, batch, units, return_sequences, y0, parts)
        kept.update(hbuf=_states(h0, batch, units, lay), y=y_btp, last=last)
        return (lay.shared(xw), lay.shared(xrow), w_gates,
                _packed_shares(w_hg, gate_blocks, 3, bounds, fn, lay.rows), w_cand,
                _packed_shares(None if reset_after else w_hg, (2,), 3, bounds, fn, lay.rows),
                bias, lay.shared(kept["hbuf"]), lay.batch(_workspace("rh", (batch, units))),
                lay.shared(mask), bool(reverse), bool(zero_masked), codes[0], codes[1],
                lay.batch(y_btp), lay.batch(last), gates,
                _workspace("cand", (parts, lay.rows, _lines(width))), tmp, bits, bounds,
                np.zeros(2, np.int64)) + (proj if by_rows else ())

    _run((K.gru_one, K.gru_all, K.gru_rows_one, K.gru_rows_all), make_args,
         *_share_count(batch, units, units, 3), fn, row_parts)
    return (_finish(kept["y"], kept["last"], mask_bt, reverse, return_sequences, zero_masked),
            _final(kept["hbuf"], t_len))


@warm_call
def warm_loops():
    """Compile the serial and parallel drivers of the three loops by running each once on a tiny
    input: their arguments (a ctypes sgemm, a tuple of arrays) have no signature string, and
    compiling them on first use took about a minute with an empty cache."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 3)).astype(np.float32)
    h0 = np.zeros((1, 4), np.float32)

    def w(k, n):
        return rng.standard_normal((k, n)).astype(np.float32)

    _warming[0] = True
    try:
        lstm_sequence(x, w(3, 16), w(4, 16), None, h0, h0)
        gru_sequence(x, w(3, 12), w(4, 12), None, None, h0)
        rnn_sequence(x, w(3, 4), w(4, 4), None, h0)
    finally:
        _warming[0] = False
