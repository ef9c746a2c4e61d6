"""Rewrites of a model's run plan that compute the same outputs with less work.

Embedding folded into a recurrent layer: a SimpleRNN, LSTM or GRU whose sequence input is the
output of an Embedding (and nothing else reads that output) projects every step's looked-up
vector, ``table[ids] @ kernel + bias``. That equals ``(table @ kernel + bias)[ids]``: the layer
gathers rows of the projected table instead (computed once per weight set, ``_input_weights``
in ``layers/recurrent.py``), and the Embedding step passes the ids through. For a batch-8,
T = 64 text classifier (Embedding 5000x128, LSTM 128) the first LSTM's projection (67 MFLOP,
about 0.3 ms at two threads) becomes a 1 MiB gather (docs/design.md, "Embedding folding").
The folded table holds ``input_dim x gates * units`` floats; past ``FOLD_MAX_BYTES`` the layers
run unfolded.
"""

from __future__ import annotations

import numpy as np

from .native import CODES, _core

#: Largest folded table (bytes) a model builds: a 5000-word vocabulary into a 128-unit LSTM
#: takes 10 MiB, 30 000 words into 256 units 120 MiB (left unfolded).
FOLD_MAX_BYTES = 32 << 20


def fold_projection(table_ve, w_eg, b_g=None):
    """The input projection of every embedding row: table @ w + b, (V, G) float32 C-ordered,
    on the native sgemm and fastlayers' threads (a 5000 x 128 table into 512 gates: 8.6 ms
    against numpy's matmul 9.7 ms, AMD EPYC Zen 3, AVX2, 2 threads; numpy's BLAS threads are
    not started)."""
    table = np.ascontiguousarray(table_ve, dtype=np.float32)
    w = np.ascontiguousarray(w_eg, dtype=np.float32)
    bias = None if b_g is None else np.ascontiguousarray(b_g, dtype=np.float32).reshape(-1)
    folded = np.empty((table.shape[0], w.shape[1]), np.float32)
    return _core.matmul(table, w, folded, None, bias, CODES["linear"], 0.0)


def fold_embeddings(nodes, plan, outputs) -> list:
    """``plan`` (one step per node of ``nodes``, as ``Model._plan_step`` makes them) with every
    foldable Embedding -> recurrent layer pair folded; ``outputs`` are the model's outputs."""
    from .layers.core import Embedding
    from .layers.recurrent import _RNNLayer
    from .symbolic import SymbolicTensor

    readers: dict[int, list] = {}
    for j, node in enumerate(nodes):
        args = node.args if isinstance(node.args, list) else [node.args]
        for t in args:
            readers.setdefault(id(t), []).append(j)
    output_ids = {id(t) for t in outputs}
    plan = list(plan)
    for i, node in enumerate(nodes):
        emb = node.layer
        if type(emb) is not Embedding or node.extra_args or node.kwargs or \
                not isinstance(node.args, SymbolicTensor) or len(node.args.shape) != 2:
            continue
        out = node.outputs[0]
        if id(out) in output_ids or len(readers.get(id(out), ())) != 1:
            continue
        j = readers[id(out)][0]
        rnn_node = nodes[j]
        rnn = rnn_node.layer
        first = rnn_node.args[0] if isinstance(rnn_node.args, list) else rnn_node.args
        if not isinstance(rnn, _RNNLayer) or rnn_node.extra_args or first is not out or \
                emb.input_dim * rnn.gates * rnn.units * 4 > FOLD_MAX_BYTES:
            continue
        _, emb_keys, emb_out = plan[i]
        _, rnn_keys, rnn_out = plan[j]
        plan[i] = (_pass_ids, emb_keys, emb_out)
        plan[j] = (_folded_step(rnn, emb, dict(rnn_node.kwargs)), rnn_keys, rnn_out)
    return plan


def _pass_ids(ids):
    """The folded Embedding's step: its ids go on to the recurrent layer, which checks them."""
    return ids


def _folded_step(rnn, emb, kwargs):
    def step(args):
        return rnn._numeric_call(args, (), kwargs, embedding=emb)
    return step
