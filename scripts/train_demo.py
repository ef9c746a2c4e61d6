"""Train the bundled demo models once and write them to fastlayers/data/.

Needs scikit-learn (the digits data set) and keras on the torch backend; the package itself
needs neither. Run from the repository root:

    KERAS_BACKEND=torch python scripts/train_demo.py

Writes
- fastlayers/data/digits_mlp.flm: 8x8 digit images (64 pixels, 0..16) -> 10 class probabilities.
- fastlayers/data/digits_samples.npz: 300 held-out images (``x``, uint8) and labels (``y``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")

DATA = Path(__file__).resolve().parent.parent / "fastlayers" / "data"
SEED = 0
N_SAMPLES = 300


def digits_split():
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.data.astype(np.uint8), digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    test, train = order[:N_SAMPLES], order[N_SAMPLES:]
    return x[train], y[train], x[test], y[test]


def build_mlp(lib):
    """The same architecture in keras or fastlayers (``lib`` is either module)."""
    L = lib.layers
    inputs = lib.Input(shape=(64,), name="pixels")
    h = L.Rescaling(1.0 / 16.0, name="scale")(inputs)
    h = L.Dense(64, activation="relu", name="hidden")(h)
    h = L.BatchNormalization(name="norm")(h)
    h = L.Dropout(0.2, name="dropout")(h)
    outputs = L.Dense(10, activation="softmax", name="classes")(h)
    return lib.Model(inputs, outputs, name="digits_mlp")


def main():
    import keras

    import fastlayers

    keras.utils.set_random_seed(SEED)
    x_train, y_train, x_test, y_test = digits_split()
    model = build_mlp(keras)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x_train.astype("float32"), y_train, epochs=60, batch_size=64, verbose=0)
    keras_probs = model.predict(x_test.astype("float32"), verbose=0)
    print(f"keras test accuracy: {np.mean(keras_probs.argmax(1) == y_test):.4f}")

    ours = build_mlp(fastlayers)
    ours.set_weights(model.get_weights())
    probs = ours(x_test)
    np.testing.assert_allclose(probs, keras_probs, rtol=1e-4, atol=1e-6)
    print(f"fastlayers test accuracy: {np.mean(probs.argmax(1) == y_test):.4f}")

    DATA.mkdir(exist_ok=True)
    ours.save(DATA / "digits_mlp.flm")
    np.savez(DATA / "digits_samples.npz", x=x_test, y=y_test)
    print(f"wrote {DATA / 'digits_mlp.flm'} and {DATA / 'digits_samples.npz'}")


if __name__ == "__main__":
    main()
