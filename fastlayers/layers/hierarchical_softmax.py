"""Hierarchical softmax: class probabilities as products of logistic decisions down a binary tree."""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import numpy as np

from ..backends.derived import derived
from ..errors import ShapeError
from .base import InputSpec, Layer


def balanced_tree(num_classes: int):
    """The default tree: classes 0..C-1 split in halves recursively (depth ceil(log2 C))."""

    def split(lo, hi):
        if hi - lo == 1:
            return lo
        mid = (lo + hi + 1) // 2
        return [split(lo, mid), split(mid, hi)]

    return split(0, num_classes)


def huffman_tree(class_counts) -> list:
    """A Huffman tree from class frequencies: frequent classes get short paths (word2vec style)."""
    counts = [float(c) for c in class_counts]
    if len(counts) < 2:
        raise ValueError("huffman_tree needs at least 2 classes")
    tie = itertools.count()
    heap: list[tuple[float, int, Any]] = [(c, next(tie), i) for i, c in enumerate(counts)]  # (count, tie, subtree)
    heapq.heapify(heap)
    while len(heap) > 1:
        c1, _, a = heapq.heappop(heap)
        c2, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (c1 + c2, next(tie), [a, b]))
    return heap[0][2]


def tree_paths(tree, num_classes: int):
    """Per class, the inner nodes on its path (pre-order numbering, root 0) and the signs.

    Sign +1 means the path goes to the node's first child, whose probability is
    ``sigmoid(x . w_node + b_node)``; -1 the second child, ``sigmoid(-(...))``.
    Returns ``(nodes (C, depth) int, signs (C, depth) float32, num_inner)``; padded steps have sign 0.
    """
    paths: dict[int, list[tuple[int, int]]] = {}
    counter = itertools.count()

    def walk(node, prefix):
        if isinstance(node, (int, np.integer)):
            c = int(node)
            if not 0 <= c < num_classes or c in paths:
                raise ValueError(
                    f"hierarchical softmax tree: class {c} is out of range [0, {num_classes}) or appears twice"
                )
            paths[c] = prefix
            return
        children = list(node)
        if len(children) != 2:
            raise ValueError(
                f"hierarchical softmax tree: every inner node needs exactly 2 children, got {len(children)} in {node!r}"
            )
        n = next(counter)
        walk(children[0], prefix + [(n, 1)])
        walk(children[1], prefix + [(n, -1)])

    walk(tree, [])
    missing = sorted(set(range(num_classes)) - set(paths))
    if missing:
        raise ValueError(f"hierarchical softmax tree: classes {missing[:10]} are missing")
    depth = max(len(p) for p in paths.values())
    nodes = np.zeros((num_classes, depth), dtype=np.intp)
    signs = np.zeros((num_classes, depth), dtype=np.float32)
    for c, path in paths.items():
        for d, (n, s) in enumerate(path):
            nodes[c, d], signs[c, d] = n, s
    return nodes, signs, next(counter)


class HierarchicalSoftmax(Layer):
    """Softmax over ``num_classes`` as a binary tree of logistic units (one per inner node).

    ``p(c | x) = prod_{(n, s) on path(c)} sigmoid(s * (x . kernel[:, n] + bias[n]))``: the
    probabilities of all classes sum to 1 by construction. The full distribution costs
    O(C * features); the probability of a given class only O(depth * features), depth
    ~ log2(C) for the default balanced tree.

    Parameters
    ----------
    num_classes : int
    tree : nested lists of class ids, optional
        A binary tree, e.g. ``[[0, 1], [2, [3, 4]]]``; default ``balanced_tree(num_classes)``.
        ``huffman_tree(counts)`` builds one from class frequencies.
    use_bias : bool, default True

    Shape
    -----
    ``layer(x)``: (batch, features) -> (batch, num_classes) probabilities.
    ``layer([x, classes])``: classes (batch,) integers -> (batch,) probability of each class.
    """

    config_keys = ("num_classes", "tree", "use_bias")
    # the weights ``build`` adds
    kernel: np.ndarray  # (features, inner nodes)
    bias: np.ndarray  # (inner nodes,), with use_bias

    def __init__(self, num_classes: int, tree=None, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = int(num_classes)
        if self.num_classes < 2:
            raise ValueError(f"HierarchicalSoftmax {self.name!r}: num_classes must be >= 2")
        self.tree = balanced_tree(self.num_classes) if tree is None else _as_lists(tree)
        self.use_bias = bool(use_bias)
        self._nodes, self._signs, self.num_inner = tree_paths(self.tree, self.num_classes)

    def build(self, input_shape):
        x_shape = input_shape[0] if isinstance(input_shape, list) else input_shape
        d = x_shape[-1]
        if d is None or len(x_shape) != 2:
            raise ShapeError(
                f"HierarchicalSoftmax {self.name!r}: expected inputs (batch, features) "
                f"with known features, got {x_shape}"
            )
        self.add_weight("kernel", (d, self.num_inner), "glorot_uniform")
        if self.use_bias:
            self.add_weight("bias", (self.num_inner,), "zeros")
        self._spec = InputSpec(ndim=2, axes={-1: d})

    def _check_spec(self, shape):
        if isinstance(shape, list):
            if len(shape) != 2 or len(shape[1]) != 1:
                raise ShapeError(
                    f"HierarchicalSoftmax {self.name!r}: expected [x (batch, features), "
                    f"classes (batch,)], got shapes {shape}"
                )
            shape = shape[0]
        if self.built:
            self._spec.check(tuple(shape), f"HierarchicalSoftmax {self.name!r}")

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, list):
            return (input_shape[0][0],)
        return (input_shape[0], self.num_classes)

    def _prepare_inputs(self, inputs):
        where = f"HierarchicalSoftmax {self.name!r}"
        if isinstance(inputs, (list, tuple)) and len(inputs) == 2 and np.ndim(inputs[0]) == 2:
            x = self._float_input(inputs[0], where)
            return [x, self._classes(inputs[1], x.shape[0])]
        return self._float_input(inputs, where)

    def _classes(self, classes, batch):
        where = f"HierarchicalSoftmax {self.name!r}"
        shape = tuple(np.shape(classes))
        if shape != (batch,):
            raise ShapeError(f"{where}: classes must be integers of shape ({batch},), got shape {shape}")
        return self.ops.indices(classes, self.num_classes, where, "classes")

    def _bias(self):
        if self.use_bias:
            return self.bias
        # one zero array per kernel, so a device backend caches one copy
        return derived(self.kernel, "hsoftmax-zero-bias", lambda k: np.zeros(self.num_inner, np.float32))

    def log_probs(self, x) -> np.ndarray:
        """log p(c | x) for every class: (batch, num_classes)."""
        x = self._prepare_inputs(x)
        self._ensure_built((None, *x.shape[1:]))
        self._check_spec(x.shape)
        return self.ops.hsoftmax_log_probs(x, self.kernel, self._bias(), self._nodes, self._signs)

    def class_log_probs(self, x, classes) -> np.ndarray:
        """log p(classes[b] | x[b]) along each class's path only: (batch,)."""
        x, c = self._prepare_inputs([x, classes])
        self._ensure_built((None, *x.shape[1:]))
        self._check_spec(x.shape)
        return self.ops.hsoftmax_class_log_probs(x, self.kernel, self._bias(), self._nodes, self._signs, c)

    def call(self, inputs):
        if isinstance(inputs, list):
            x, c = inputs
            log_p = self.ops.hsoftmax_class_log_probs(x, self.kernel, self._bias(), self._nodes, self._signs, c)
        else:
            log_p = self.ops.hsoftmax_log_probs(inputs, self.kernel, self._bias(), self._nodes, self._signs)
        return self.ops.activation(log_p, "exponential")


def _as_lists(tree):
    if isinstance(tree, (int, np.integer)):
        return int(tree)
    return [_as_lists(t) for t in tree]
