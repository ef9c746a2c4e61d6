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

#: Largest folded table (bytes) a model builds: a 5000-word vocabulary into a 128-unit LSTM
#: takes 10 MiB, 30 000 words into 256 units 120 MiB (left unfolded).
FOLD_MAX_BYTES = 32 << 20


def fold_embeddings(nodes, plan, outputs) -> list:
    """``plan`` (one step per node of ``nodes``, as ``Model._plan_step`` makes them) with every
    foldable Embedding -> recurrent layer pair folded; ``outputs`` are the model's outputs."""
    from ..layers.core import Embedding
    from ..layers.recurrent import RecurrentLayer
    from ..layers.symbolic import SymbolicTensor

    readers: dict[int, list] = {}
    for j, node in enumerate(nodes):
        args = node.args if isinstance(node.args, list) else [node.args]
        for t in args:
            readers.setdefault(id(t), []).append(j)
    output_ids = {id(t) for t in outputs}
    plan = list(plan)
    for i, node in enumerate(nodes):
        emb = node.layer
        if (
            type(emb) is not Embedding
            or node.extra_args
            or node.kwargs
            or not isinstance(node.args, SymbolicTensor)
            or len(node.args.shape) != 2
        ):
            continue
        out = node.outputs[0]
        if id(out) in output_ids or len(readers.get(id(out), ())) != 1:
            continue
        j = readers[id(out)][0]
        rnn_node = nodes[j]
        rnn = rnn_node.layer
        first = rnn_node.args[0] if isinstance(rnn_node.args, list) else rnn_node.args
        if (
            not isinstance(rnn, RecurrentLayer)
            or rnn_node.extra_args
            or first is not out
            or emb.input_dim * rnn.gates * rnn.units * 4 > FOLD_MAX_BYTES
        ):
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
