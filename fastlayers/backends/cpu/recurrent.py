"""CpuOps recurrent primitives: the native core's time loops (``native/recurrent.c``).

One call runs a whole sequence: each share first projects its inputs for every step (one
product on the packed sgemm; with integer ids the loop reads the rows of the folded table in
place; a SimpleRNN or LSTM share of 8 rows or more, whose projection of every step would
leave the cache, projects each step's inputs into its gates instead), then steps with one
recurrent product and one fused gate pass per step. No Python runs per timestep.

Threads. Where the batch splits into shares of at least ``MIN_SHARE_ROWS`` rows
(``_row_parts``), each of ``set_num_threads`` threads runs its rows through the whole sequence
on all units, with no meeting. Otherwise (batch 1, say) the units are split among the threads
(``_unit_parts``): each share owns a block of units (the matching columns of every gate block,
packed side by side once per weight array, ``_packed``) and the shares meet after each step;
each thread thus reads only its part of the recurrent weights per step (half of a 1 MiB LSTM
kernel stays in its core's L2 cache at two threads). A share whose thread is late is taken
over by a thread that is there (recurrent.c), so a busy machine costs a call at most one
wait. Too little work per step (small layers, small batches) or per call (a streaming step)
runs on one thread.

Each function returns None when the native loop does not cover the call (a softmax
activation, an empty sequence or input), and CpuOps falls back to the numpy reference.
Arguments follow ``backends/reference/recurrent.py`` (x as float32 (B, T, I) or integer ids
(B, T) of one-hot inputs).
"""

from __future__ import annotations

import functools
import typing

import numpy as np

from ... import native
from ...native import _core
from ..derived import derived_from, derived_view
from ..types import Cell
from .memory import l2_cache_bytes, weights_empty

#: Fewest multiply-adds of the recurrent product per share and step worth a thread (a share
#: should compute for several times what a meeting of the threads costs).
MIN_SHARE_MADDS = 1 << 16
#: Fewest multiply-adds of recurrent products per share and call worth a second thread: below
#: (a step or a few of a streaming call) the hand-off to the pool, and on a busy machine the
#: wait for a descheduled thread, cost about what the share saves (docs/design.md,
#: "Figures behind the code's constants").
MIN_CALL_MADDS = 1 << 20
#: Unit shares own multiples of this many units (whole vectors, and whole cache lines of the
#: state each share writes).
UNIT_STEP = 16
#: Largest recurrent weights (bytes) for which threads share the batch rather than the units:
#: every thread then reads all of them each step, but the threads never meet (which a busy
#: machine punishes) and no state moves between cores; the two splits measure alike where the
#: weights fit the caches (docs/design.md, "CPU time loops"); past the L3 cache each thread
#: would stream all of them from memory.
ROW_SHARE_MAX_BYTES = 8 << 20
#: Fewest rows per batch share: the sgemm's register tiles run at their full rate from 4 rows.
MIN_SHARE_ROWS = 4
#: Largest share of a core's L2 cache that one direction's recurrent weights may take to run on
#: a thread of its own beside the other direction (``sequences``). Larger ones are read from
#: L3 at every step; split by units among the threads, one direction after the other, each
#: thread's share stays in its L2 (a bidirectional LSTM of 512 units, 4 MiB per direction:
#: 3.3 ms at once against 1.8 ms split, on a 2 MiB L2; docs/design.md, "CPU time loops").
OWN_THREAD_L2_SHARE = 0.5
#: Activation names the loops take: every elementwise code of the native core but leaky_relu,
#: whose slope (Keras's default 0.2) the loops do not carry; it runs on the reference loop.
CODES = {name: code for name, code in native.CODES.items() if name not in ("softmax", "log_softmax", "leaky_relu")}

_ALL_BLOCKS = {1: (0,), 3: (0, 1, 2), 4: (0, 1, 2, 3)}


def _c32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


def _codes(*names):
    codes = tuple(CODES.get(n) for n in names)
    return None if any(c is None for c in codes) else codes


def _row_parts(batch, weight_floats, threads):
    """Batch shares for a loop whose recurrent weights (every gate block, and the LSTM's
    projection) hold ``weight_floats`` floats: the most, up to ``threads``, that give every
    share at least ``MIN_SHARE_ROWS`` rows and ``MIN_SHARE_MADDS`` multiply-adds per step; 1
    (share the units instead) when none does or the weights exceed ``ROW_SHARE_MAX_BYTES``."""
    if weight_floats * 4 > ROW_SHARE_MAX_BYTES:
        return 1
    for parts in range(min(threads, batch // MIN_SHARE_ROWS), 1, -1):
        if batch // parts * weight_floats >= MIN_SHARE_MADDS:
            return parts
    return 1


def _unit_parts(batch, k, units, gate_blocks, threads):
    """Unit shares of a loop whose recurrent product is (batch, k) @ (k, gate_blocks units):
    as many as ``threads`` where each gets ``MIN_SHARE_MADDS`` multiply-adds and ``UNIT_STEP``
    units per step."""
    min_units = max(UNIT_STEP, -(-MIN_SHARE_MADDS // (batch * k * gate_blocks)))
    return max(1, min(threads, units // min_units))


def _shares(batch, t_len, k, units, gate_blocks, weight_floats):
    """(batch shares, unit shares) of a loop over ``t_len`` steps (one of them 1). A loop with
    too little work for a second thread (``_serial``) keeps the unit shares a longer one gets,
    so that its weights are packed once for both (a warm-up's one-step call would otherwise pack
    a second copy that stays beside the first), and runs them on the calling thread."""
    threads = _core.get_num_threads()
    if threads == 1:
        return 1, 1
    row_parts = _row_parts(batch, weight_floats, threads)
    if row_parts > 1:
        return (1 if _serial(batch, t_len, weight_floats) else row_parts), 1
    return 1, _unit_parts(batch, k, units, gate_blocks, threads)


def _serial(batch, t_len, weight_floats):
    """Whether a loop over ``t_len`` steps of ``batch`` rows with ``weight_floats`` recurrent
    weights has too little work for a second thread (``MIN_CALL_MADDS``): a one-step call
    (a stream's) under it, or one of several steps whose weights stay in one core's L2 cache
    from step to step (``OWN_THREAD_L2_SHARE`` of it). Larger weights, read from L3 at every
    step by one thread, are split under it too: each thread's share then stays in its L2."""
    if t_len * batch * weight_floats >= 2 * MIN_CALL_MADDS:
        return False
    return t_len < 2 or weight_floats * 4 <= OWN_THREAD_L2_SHARE * l2_cache_bytes()


def _loop_call(loop_args, serial):
    """``_core.rnn_loop(*loop_args)``, its shares on the calling thread alone where ``serial``."""
    if not serial:
        return _core.rnn_loop(*loop_args)
    previous = native.set_call_threads(1)
    try:
        return _core.rnn_loop(*loop_args)
    finally:
        native.set_call_threads(previous)


@functools.lru_cache(maxsize=256)
def _bounds(size, parts):
    """Share boundaries over ``size`` columns, (parts + 1) int64: multiples of UNIT_STEP when
    every share gets at least one step of them, else of 1 (cached: read-only)."""
    step = UNIT_STEP if size >= UNIT_STEP * parts else 1
    steps = -(-size // step)
    bounds = np.array([min(size, step * (steps * p // parts)) for p in range(parts + 1)], np.int64)
    bounds.flags.writeable = False
    return bounds


@functools.lru_cache(maxsize=1024)
def _packed_kind(blocks, n_blocks, size, parts):
    """The ``derived`` kind of weights packed by ``_pack_shares`` for ``_bounds(size, parts)``."""
    return f"recurrent-packed:{blocks}:{n_blocks}:{_bounds(size, parts).tolist()}"


def _pack_shares(w_kn, blocks, n_blocks, bounds):
    """``w_kn`` (k, n_blocks * units) for the loops (recurrent.h): share p's columns of each
    gate block in ``blocks`` side by side, packed, the shares one after the other (on huge
    pages where the platform has them: ``weights_empty``)."""
    units = w_kn.shape[1] // n_blocks
    packed = []
    for u0, u1 in zip(bounds[:-1], bounds[1:]):
        if u1 > u0:
            cols = np.concatenate([np.arange(b * units + u0, b * units + u1) for b in blocks])
            packed.append(_core.pack(np.ascontiguousarray(w_kn[:, cols], np.float32)))
    out = weights_empty((sum(p.size for p in packed),))
    np.concatenate(packed, out=out)
    return out


def _packed(w_kn, blocks, n_blocks, parts):
    """``_pack_shares`` for ``parts`` unit shares (``_bounds``), computed once per weight array
    (a view is keyed by the array it views, its offset, shape and strides: views made anew per
    call find it too)."""
    size = w_kn.shape[1] // n_blocks
    kind = _packed_kind(blocks, n_blocks, size, parts)

    def make(_):
        return _pack_shares(w_kn, blocks=blocks, n_blocks=n_blocks, bounds=_bounds(size, parts))

    return derived_view(w_kn, kind, make)


def _inputs(x_bti, w_ig, b_g, n_blocks, parts):
    """The loop's input arguments (x, ids, table, packed input weights, bias): float inputs
    with their weights packed per share, or ids with the table of ``w_ig + b_g`` (the sum
    computed once per weight array) read in place."""
    if x_bti.ndim == 2:
        table = (
            _c32(w_ig)
            if b_g is None
            else derived_from((w_ig, b_g), "recurrent-table-bias", lambda w, b: _c32(w) + _c32(b))
        )
        return None, np.ascontiguousarray(x_bti, np.int64), table, None, None
    return (
        _c32(x_bti),
        None,
        None,
        _packed(w_ig, _ALL_BLOCKS[n_blocks], n_blocks, parts),
        None if b_g is None else _c32(b_g),
    )


def _state(s0, batch, size):
    """A new float32 (batch, size) array holding ``s0`` (broadcast): a state the loop updates."""
    if getattr(s0, "shape", None) == (batch, size):
        return np.array(s0, np.float32)
    out = np.empty((batch, size), np.float32)
    out[...] = s0
    return out


def _outputs(t_len, batch, size, return_sequences, y0):
    """Every step's output (or None) and the carried output, from ``y0`` or zeros."""
    y = np.empty((batch, t_len, size), np.float32) if return_sequences else None
    last = np.zeros((batch, size), np.float32) if y0 is None else _state(y0, batch, size)
    return y, last


def _mask(mask_bt):
    if mask_bt is None:
        return None
    m = np.ascontiguousarray(mask_bt)
    return m.view(np.uint8) if m.dtype == np.bool_ else m.astype(np.uint8)


def _finish(y, last, mask_bt, reverse, zero_masked):
    if y is not None:
        return y
    if zero_masked and mask_bt is not None:
        last[~np.asarray(mask_bt, bool)[:, 0 if reverse else -1]] = 0
    return last


def _covered(x_bti, codes):
    return codes is not None and x_bti.shape[0] > 0 and x_bti.shape[1] > 0 and (x_bti.ndim == 2 or x_bti.shape[2] > 0)


class _LoopArgs(typing.NamedTuple):
    """``_core.rnn_loop``'s arguments, named as its parameters (``native/recurrent.pxi``)."""

    kind: int
    x: object
    ids: object
    table: object
    pw_ig: object
    b_g: object
    pw_hg: object
    pw_hn: object
    pw_hp: object
    b_hg: object
    ubounds: object
    qbounds: object
    row_parts: int
    mask: object
    h: object
    c: object
    y: object
    last: object
    act: int
    ract: int
    reverse: bool
    zero_masked: bool
    reset_after: bool


#: Where the arguments hold the arrays each call reads or writes anew: the input x, and the
#: run from the mask to the carried output (mask, the states h and c, every step's output y,
#: the carried output last), which a bound loop (``_filler``) makes per call.
_X_ARG = _LoopArgs._fields.index("x")
_CALL_ARGS = slice(_LoopArgs._fields.index("mask"), _LoopArgs._fields.index("last") + 1)


class _Loop(typing.NamedTuple):
    """One call of the native loop: ``rnn_loop``'s arguments, the function that gives the
    call's result once the loop ran, its batch and steps, and the floats of its recurrent
    weights."""

    args: _LoopArgs
    finish: typing.Callable
    batch: int
    steps: int
    weight_floats: int

    @property
    def serial(self) -> bool:
        """Whether its unit shares run on the calling thread alone (``_serial``)."""
        return len(self.args.ubounds) > 2 and _serial(self.batch, self.steps, self.weight_floats)


def _rnn_loop(
    x_bti,
    w_ih,
    w_hh,
    b,
    h0,
    *,
    activation="tanh",
    mask_bt=None,
    reverse=False,
    return_sequences=True,
    zero_masked=False,
    y0=None,
    shares=None,
):
    codes = _codes(activation)
    if not _covered(x_bti, codes):
        return None
    batch, t_len = x_bti.shape[:2]
    units = w_hh.shape[0]
    row_parts, parts = shares or _shares(batch, t_len, units, units, 1, w_hh.size)
    y, last = _outputs(t_len, batch, units, return_sequences, y0)
    h = _state(h0, batch, units)
    args = _LoopArgs(
        _core.RNN_SIMPLE,
        *_inputs(x_bti, w_ih, b, 1, parts),
        pw_hg=_packed(w_hh, (0,), 1, parts),
        pw_hn=None,
        pw_hp=None,
        b_hg=None,
        ubounds=_bounds(units, parts),
        qbounds=None,
        row_parts=row_parts,
        mask=_mask(mask_bt),
        h=h,
        c=None,
        y=y,
        last=last,
        act=codes[0],
        ract=codes[0],
        reverse=reverse,
        zero_masked=zero_masked,
        reset_after=True,
    )
    return _Loop(args, lambda: (_finish(y, last, mask_bt, reverse, zero_masked), h), batch, t_len, w_hh.size)


def _lstm_loop(
    x_bti,
    w_ig,
    w_hg,
    b_g,
    h0,
    c0,
    *,
    w_hp=None,
    activation="tanh",
    recurrent_activation="sigmoid",
    mask_bt=None,
    reverse=False,
    return_sequences=True,
    zero_masked=False,
    y0=None,
    shares=None,
):
    codes = _codes(activation, recurrent_activation)
    if not _covered(x_bti, codes):
        return None
    batch, t_len = x_bti.shape[:2]
    out_size, units = w_hg.shape[0], w_hg.shape[1] // 4
    weight_floats = w_hg.size + (0 if w_hp is None else w_hp.size)
    row_parts, parts = shares or _shares(batch, t_len, out_size, units, 4, weight_floats)
    y, last = _outputs(t_len, batch, out_size, return_sequences, y0)
    h, c = _state(h0, batch, out_size), _state(c0, batch, units)
    args = _LoopArgs(
        _core.RNN_LSTM,
        *_inputs(x_bti, w_ig, b_g, 4, parts),
        pw_hg=_packed(w_hg, (0, 1, 2, 3), 4, parts),
        pw_hn=None,
        pw_hp=None if w_hp is None else _packed(w_hp, (0,), 1, parts),
        b_hg=None,
        ubounds=_bounds(units, parts),
        qbounds=None if w_hp is None else _bounds(out_size, parts),
        row_parts=row_parts,
        mask=_mask(mask_bt),
        h=h,
        c=c,
        y=y,
        last=last,
        act=codes[0],
        ract=codes[1],
        reverse=reverse,
        zero_masked=zero_masked,
        reset_after=True,
    )
    return _Loop(args, lambda: (_finish(y, last, mask_bt, reverse, zero_masked), h, c), batch, t_len, weight_floats)


def _gru_loop(
    x_bti,
    w_ig,
    w_hg,
    b_ig,
    b_hg,
    h0,
    *,
    reset_after=True,
    activation="tanh",
    recurrent_activation="sigmoid",
    mask_bt=None,
    reverse=False,
    return_sequences=True,
    zero_masked=False,
    y0=None,
    shares=None,
):
    codes = _codes(activation, recurrent_activation)
    if not _covered(x_bti, codes):
        return None
    batch, t_len = x_bti.shape[:2]
    units = w_hg.shape[0]
    row_parts, parts = shares or _shares(batch, t_len, units, units, 3, w_hg.size)
    y, last = _outputs(t_len, batch, units, return_sequences, y0)
    h = _state(h0, batch, units)
    if reset_after:
        pw_hg, pw_hn = _packed(w_hg, (0, 1, 2), 3, parts), None
        bias_h = None if b_hg is None else _c32(b_hg)
    else:  # the recurrent bias does not exist without reset_after
        pw_hg, pw_hn = _packed(w_hg, (0, 1), 3, parts), _packed(w_hg, (2,), 3, parts)
        bias_h = None
    args = _LoopArgs(
        _core.RNN_GRU,
        *_inputs(x_bti, w_ig, b_ig, 3, parts),
        pw_hg=pw_hg,
        pw_hn=pw_hn,
        pw_hp=None,
        b_hg=bias_h,
        ubounds=_bounds(units, parts),
        qbounds=None,
        row_parts=row_parts,
        mask=_mask(mask_bt),
        h=h,
        c=None,
        y=y,
        last=last,
        act=codes[0],
        ract=codes[1],
        reverse=reverse,
        zero_masked=zero_masked,
        reset_after=reset_after,
    )
    return _Loop(args, lambda: (_finish(y, last, mask_bt, reverse, zero_masked), h), batch, t_len, w_hg.size)


def _run(loop):
    if loop is None:
        return None
    _loop_call(loop.args, loop.serial)
    return loop.finish()


def rnn_sequence(x_bti, w_ih, w_hh, b, h0, **kw):
    """SimpleRNN over a sequence; see ``reference.recurrent.rnn_sequence``. Returns (y, h), or
    None where the native loop does not cover the call."""
    return _run(_rnn_loop(x_bti, w_ih, w_hh, b, h0, **kw))


def lstm_sequence(x_bti, w_ig, w_hg, b_g, h0, c0, **kw):
    """LSTM (with the projection ``w_hp`` when given) over a sequence; see
    ``reference.recurrent.lstm_sequence``. Returns (y, h, c), or None where the native loop
    does not cover the call."""
    return _run(_lstm_loop(x_bti, w_ig, w_hg, b_g, h0, c0, **kw))


def gru_sequence(x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw):
    """GRU over a sequence; see ``reference.recurrent.gru_sequence``. Returns (y, h), or None
    where the native loop does not cover the call."""
    return _run(_gru_loop(x_bti, w_ig, w_hg, b_ig, b_hg, h0, **kw))


_LOOPS = {Cell.RNN: _rnn_loop, Cell.LSTM: _lstm_loop, Cell.GRU: _gru_loop}


def sequences(calls):
    """Independent sequence calls (the directions of a bidirectional layer), ``calls`` a list
    of (cell, args, kwargs) of this module's ``*_sequence`` functions: at once, one
    thread each (``rnn_loops``), where the pool has at least two threads and each call enough
    work (``MIN_CALL_MADDS``), and either a thread per call or calls that would not split
    their batch anyway: two directions at batch 1 on their own threads, rather than one after
    the other with their units split (meeting every step). Returns the results, or None for
    calls to make one by one."""
    threads = _core.get_num_threads()
    if threads < 2 or not 2 <= len(calls) <= _core.RNN_MAX_LOOPS:
        return None
    loops = []
    for name, args, kw in calls:
        loop = _LOOPS[name](*args, **kw, shares=(1, 1))
        if not _own_thread(loop, len(calls), threads):
            return None
        loops.append(loop)
    _core.rnn_loops([tuple(loop.args) for loop in loops])
    return [loop.finish() for loop in loops]


def _own_thread(loop, n_calls, threads):
    """Whether ``loop``, one of ``n_calls`` independent ones, runs on a thread of its own:
    ``_may_own_thread``, and a batch the threads would not split anyway."""
    return (
        loop is not None
        and _may_own_thread(loop.batch, loop.steps, loop.weight_floats)
        and not (n_calls < threads and _row_parts(loop.batch, loop.weight_floats, threads) > 1)
    )


def _at_once(loops, threads):
    """Whether independent ``loops`` (bound one thread each) run at once under ``threads``
    threads, rather than one after the other with their units split: the one rule of
    ``sequences_plan`` and ``sequence_loops``."""
    return threads >= 2 and all(_own_thread(loop, len(loops), threads) for loop in loops)


def _may_own_thread(batch, steps, weight_floats):
    """Whether a loop of ``weight_floats`` recurrent weights over ``batch`` x ``steps`` may run
    on a thread of its own at some thread count: enough work, and recurrent weights that stay
    in that thread's L2 cache from step to step (``OWN_THREAD_L2_SHARE``)."""
    return (
        steps * batch * weight_floats >= MIN_CALL_MADDS and weight_floats * 4 <= OWN_THREAD_L2_SHARE * l2_cache_bytes()
    )


def _recurrent_floats(cell, args, kw):
    """The floats of a ``cell`` call's recurrent weights (``_Loop.weight_floats``), from the
    arguments of its ``*_sequence`` function, without packing them."""
    w_hp = kw.get("w_hp") if cell == Cell.LSTM else None
    return args[1].size + (0 if w_hp is None else w_hp.size)


def _bindable(x_bti, kw, ids=False, masks=False):
    """Whether a call on float inputs laid out as ``x_bti`` (or, with ``ids``, also on integer
    ids (B, T) of a table's rows) with keywords ``kw`` binds (with ``masks``, under a mask too:
    a native plan's step, which replaces it by its own)."""
    shaped = x_bti.ndim == 3 or (ids and x_bti.ndim == 2 and x_bti.dtype.kind in "iu")
    return shaped and (masks or kw.get("mask_bt") is None) and kw.get("y0") is None


def _filler(loop, x_bti):
    """A function ``(x, states) -> (args, result)``: ``loop``'s arguments for the input x laid
    out as ``x_bti``, with states (the bound ones, or ``states``: (h0,) or (h0, c0)) and
    outputs made anew, and the call's result once it ran."""
    head, middle, tail = loop.args[:_X_ARG], loop.args[_X_ARG + 1 : _CALL_ARGS.start], loop.args[_CALL_ARGS.stop :]
    held = loop.args  # its states and outputs are held, never written
    h_init, c_init, y_init, last_init = held.h, held.c, held.y, held.last
    y_shape = None if y_init is None else y_init.shape
    float_c = x_bti.dtype == np.float32 and x_bti.flags.c_contiguous
    if x_bti.ndim == 2:  # ids: the call's ids take the place of the traced ones, x stays None
        middle = middle[1:]

    def fill(x, states=None):
        if states is None:
            h, c = h_init.copy(), None if c_init is None else c_init.copy()
        else:
            h = _state(states[0], *h_init.shape)
            c = None if c_init is None else _state(states[1], *c_init.shape)
        last = last_init.copy()
        y = None if y_shape is None else np.empty(y_shape, np.float32)
        out = last if y is None else y
        result = (out, h) if c is None else (out, h, c)
        if x.ndim == 2:
            return (*head, None, np.ascontiguousarray(x, np.int64), *middle, None, h, c, y, last, *tail), result
        return (*head, x if float_c else _c32(x), *middle, None, h, c, y, last, *tail), result

    return fill


def _per_thread_count(bind):
    """A function ``(x, states) -> result`` that runs ``bind(threads)``'s function for the
    thread count in force at the call, each made at its first call and kept: a loop's shares
    (and the weights packed for them) depend on the thread count, and a service may change it
    after a model is bound. Thread counts are few, so the functions kept are few."""
    made = {}

    def run(x, states=None):
        threads = _core.get_num_threads()
        fn = made.get(threads)
        if fn is None:
            fn = made.setdefault(threads, bind(threads))
        return fn(x, states)

    return run


def sequence_plan(cell, x_bti, args, kw):
    """A function ``(x, states=None) -> run_sequence(cell, x, *args, **kw)`` (``rnn_sequence``,
    ``lstm_sequence`` or ``gru_sequence``) for float inputs laid out as ``x_bti``: the loop's
    arguments that depend on the layout and the weights alone (packed weights, shares,
    activation codes) made once per thread count (``_per_thread_count``), the states and
    outputs made anew each call (from the bound initial states, or from ``states``, the call's
    (h0,) or (h0, c0) of the same shapes). Integer ids (B, T) of the rows of the folded table
    that ``args`` hold bind too (the caller checks them against the table: the loop reads
    those rows unchecked). None where the native loop does not cover the call, for a mask or a
    carried output ``y0``."""
    if not _bindable(x_bti, kw, ids=True):
        return None
    loop = _LOOPS[cell](x_bti, *args, **kw)
    if loop is None:
        return None
    bound_threads = _core.get_num_threads()

    def bind(threads):
        made = loop if threads == bound_threads else _LOOPS[cell](x_bti, *args, **kw)
        filled, serial = _filler(made, x_bti), made.serial

        def run(x, states):
            loop_args, result = filled(x, states)
            _loop_call(loop_args, serial)
            return result

        return run

    return _per_thread_count(bind)


def sequence_loops(x_bti, calls):
    """The loops of independent calls (the directions of a bidirectional layer; ``calls`` of
    (cell, args, kw) as ``sequence_loop`` takes them) bound as ``sequences_plan`` binds them at
    the thread count in force, for a native plan's steps: (each loop's ``rnn_loop`` arguments,
    True) where they run at once, one thread each (``rnn_loops``), else (each call's
    ``sequence_loop`` result, False), one after the other. None where a call does not bind."""
    if not 2 <= len(calls) <= _core.RNN_MAX_LOOPS or not all(
        _bindable(x_bti, kw, ids=True, masks=True) for _, _, kw in calls
    ):
        return None
    threads = _core.get_num_threads()
    batch, steps = x_bti.shape[:2]
    if threads >= 2 and all(
        _may_own_thread(batch, steps, _recurrent_floats(cell, args, kw)) for cell, args, kw in calls
    ):
        loops = [_LOOPS[cell](x_bti, *args, **kw, shares=(1, 1)) for cell, args, kw in calls]
        if all(loop is not None for loop in loops) and _at_once(loops, threads):
            return [loop.args for loop in loops], True
    singles = [sequence_loop(cell, x_bti, args, kw) for cell, args, kw in calls]
    return None if any(single is None for single in singles) else (singles, False)


def sequence_loop(cell, x_bti, args, kw):
    """(``rnn_loop``'s arguments as a ``_LoopArgs``, serial) of the time loop ``cell`` over
    float inputs laid out as ``x_bti`` (B, T, I), or integer ids (B, T) of the rows of the
    folded table ``args`` hold, with ``args`` (the weights, then the initial states) and
    options ``kw``, bound as ``sequence_plan`` binds it, for a native plan's step: the caller
    replaces the input (x or ids), states, outputs and mask (``mask_bt``: a (B, T) uint8 array
    of its own) by its own arrays (``_replace``; ids it has checked against the table). None
    where the loop does not cover the call."""
    if not _bindable(x_bti, kw, ids=True, masks=True):
        return None
    loop = _LOOPS[cell](x_bti, *args, **kw)
    return None if loop is None else (loop.args, loop.serial)


def sequences_plan(x_bti, calls):
    """A function ``(x, states=None) -> sequences([(name, (x, *args), kw) for name, args, kw
    in calls])`` for float inputs laid out as ``x_bti`` (or integer ids (B, T) of the rows of
    the folded tables the calls hold, checked by the caller), bound as ``sequence_plan``'s (with
    ``states`` one tuple of initial states per call): under a thread count where ``sequences``
    runs the calls at once, one ``rnn_loops`` call on their loops bound once (one thread each:
    their arguments do not depend on the count); under one where it does not, each call's
    ``sequence_plan`` (made at the first such call) one after the other. None where a call does
    not bind."""
    if not 2 <= len(calls) <= _core.RNN_MAX_LOOPS or not all(
        _bindable(x_bti, kw, ids=True, masks=True) for _, _, kw in calls
    ):
        return None
    batch, steps = x_bti.shape[:2]
    if not all(_may_own_thread(batch, steps, _recurrent_floats(name, args, kw)) for name, args, kw in calls):
        # never at once, whatever the thread count: no weights packed for one thread each,
        # which would be kept beside those the one-by-one plans pack
        singles = [sequence_plan(name, x_bti, args, kw) for name, args, kw in calls]
        if any(single is None for single in singles):
            return None
        return lambda x, states=None: [
            single(x, st) for single, st in zip(singles, states or [None] * len(calls), strict=True)
        ]
    loops = [_LOOPS[name](x_bti, *args, **kw, shares=(1, 1)) for name, args, kw in calls]
    if any(loop is None for loop in loops):
        return None
    fills = [_filler(loop, x_bti) for loop in loops]
    singles = []  # each call's sequence_plan, once one_by_one first runs

    def at_once(x, per_call):
        filled = [fill(x, st) for fill, st in zip(fills, per_call)]
        _core.rnn_loops([loop_args for loop_args, _ in filled])
        return [result for _, result in filled]

    def one_by_one(x, per_call):
        if not singles:  # two threads may both make them: either list serves
            singles[:] = [sequence_plan(name, x_bti, args, kw) for name, args, kw in calls]
        return [single(x, st) for single, st in zip(singles, per_call)]

    def bind(threads):
        return at_once if _at_once(loops, threads) else one_by_one

    run = _per_thread_count(bind)
    return lambda x, states=None: run(x, states or [None] * len(calls))
