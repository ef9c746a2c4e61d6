"""HierarchicalSoftmax against a brute-force product of logistic decisions along each path."""

import numpy as np
import pytest

import fastlayers
from fastlayers import Input, Model
from fastlayers import layers as L
from fastlayers.errors import InputError, ShapeError
from fastlayers.layers.hierarchical_softmax import tree_paths

from ..conftest import assert_close


def brute_force(x, kernel, bias, tree):
    """p(c|x) by walking the nested-list tree directly (pre-order node numbering)."""
    probs = {}
    counter = iter(range(10**6))

    def walk(node, p):
        if isinstance(node, int):
            probs[node] = p
            return
        n = next(counter)
        s = 1 / (1 + np.exp(-(x @ kernel[:, n] + bias[n])))
        walk(node[0], p * s)
        walk(node[1], p * (1 - s))

    walk(tree, np.ones(len(x)))
    return np.stack([probs[c] for c in range(len(probs))], axis=1)


@pytest.mark.parametrize("num_classes", [2, 3, 7, 16, 33])
def test_full_distribution_matches_brute_force(num_classes, rng, backend):
    layer = L.HierarchicalSoftmax(num_classes)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    layer(x)
    layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in layer.get_weights()])
    p = layer(x)
    assert_close(p, brute_force(x.astype(np.float64), layer.kernel, layer.bias, layer.tree), rtol=1e-5)
    assert_close(p.sum(axis=1), np.ones(5), rtol=1e-5)
    classes = rng.integers(0, num_classes, 5)
    assert_close(layer([x, classes]), p[np.arange(5), classes], rtol=1e-5)
    assert_close(layer.class_log_probs(x, classes), np.log(p[np.arange(5), classes]), rtol=1e-5, atol=1e-6)
    assert_close(layer.log_probs(x), np.log(p), rtol=1e-5, atol=1e-6)


def test_balanced_tree_depth_is_logarithmic():
    nodes, signs, inner = tree_paths(L.balanced_tree(1000), 1000)
    assert inner == 999 and nodes.shape[1] == 10
    assert np.all((signs != 0).sum(axis=1) >= 9)


def test_huffman_tree_gives_short_paths_to_frequent_classes(rng):
    counts = [1000, 500, 10, 10, 5, 1]
    tree = L.huffman_tree(counts)
    nodes, signs, inner = tree_paths(tree, 6)
    depth = (signs != 0).sum(axis=1)
    assert depth[0] == 1 and depth[5] >= depth[2] and inner == 5
    layer = L.HierarchicalSoftmax(6, tree=tree)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    assert_close(layer(x).sum(axis=1), np.ones(3), rtol=1e-6)


def test_custom_tree_and_tree_errors(rng):
    tree = [[0, [1, 2]], [3, 4]]
    layer = L.HierarchicalSoftmax(5, tree=tree, use_bias=False)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    layer(x)
    assert layer.get_weights()[0].shape == (3, 4) and len(layer.get_weights()) == 1
    assert_close(layer(x), brute_force(x.astype(np.float64), layer.kernel, np.zeros(4), tree), rtol=1e-5)
    with pytest.raises(ValueError, match="exactly 2 children"):
        L.HierarchicalSoftmax(3, tree=[0, 1, 2])
    with pytest.raises(ValueError, match="missing"):
        L.HierarchicalSoftmax(4, tree=[0, [1, 2]])
    with pytest.raises(ValueError, match="appears twice"):
        L.HierarchicalSoftmax(3, tree=[0, [1, 1]])


def test_in_a_functional_model_with_class_input(tmp_path, rng):
    x_in, c_in = Input((4,)), Input((), dtype="int64")
    hs = L.HierarchicalSoftmax(9, name="hs")
    h = L.Dense(4, activation="tanh")(x_in)
    model = Model([x_in, c_in], [hs(h), hs([h, c_in])])
    x, c = rng.standard_normal((3, 4)), np.array([0, 8, 4])
    full, chosen = model([x, c])
    assert_close(chosen, full[np.arange(3), c], rtol=1e-5)
    model.save(tmp_path / "hs.flm")
    for got, want in zip(fastlayers.load(tmp_path / "hs.flm")([x, c]), (full, chosen)):
        np.testing.assert_array_equal(got, want)


def test_bad_classes_raise():
    layer = L.HierarchicalSoftmax(4)
    x = np.zeros((2, 3), np.float32)
    layer(x)
    with pytest.raises(InputError, match=r"classes must be in \[0, 4\)"):
        layer([x, np.array([0, 4])])
    with pytest.raises(ShapeError, match="integers of shape"):
        layer([x, np.array([0])])
