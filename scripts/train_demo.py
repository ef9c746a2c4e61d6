"""Train the bundled demo models once and write them to fastlayers/data/.

Needs scikit-learn (the digits data set) and keras on the torch backend; the package itself
needs neither. Run from the repository root:

    KERAS_BACKEND=torch python scripts/train_demo.py

Writes
- fastlayers/data/digits_mlp.flm: 8x8 digit images (64 pixels, 0..16) -> 10 class probabilities.
- fastlayers/data/digits_cnn.flm: the same images as (8, 8, 1) -> a small CNN.
- fastlayers/data/digits_transformer.flm: the images as 8-step sequences of 8-pixel rows -> a
  Transformer encoder block (convolutional embedding, multi-head self-attention, feed-forward).
- fastlayers/data/digits_lstm.flm: the rows as an 8-step sequence -> an LSTM.
- fastlayers/data/digits_samples.npz: 300 held-out images (``x``, uint8) and labels (``y``).

Each model is trained with Keras, rebuilt with fastlayers layers from the Keras file written by
the training (``fastlayers.load``), checked against Keras's predictions and saved natively.
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


def build_cnn(keras):
    L = keras.layers
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    h = L.Rescaling(1.0 / 16.0)(inputs)
    h = L.Conv2D(16, 3, padding="same", activation="relu")(h)
    h = L.MaxPooling2D(2)(h)
    h = L.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, L.Dense(10, activation="softmax")(h), name="digits_cnn")


def build_transformer(keras):
    L = keras.layers
    inputs = keras.Input(shape=(8, 8), name="rows")
    h = L.Conv1D(32, 3, padding="same")(L.Rescaling(1.0 / 16.0)(inputs))  # embedding with order
    a = L.MultiHeadAttention(num_heads=4, key_dim=8)(h, h)
    h = L.LayerNormalization()(L.Add()([h, a]))
    f = L.Dense(32)(L.Dense(64, activation="relu")(h))
    h = L.LayerNormalization()(L.Add()([h, f]))
    h = L.GlobalAveragePooling1D()(h)
    return keras.Model(inputs, L.Dense(10, activation="softmax")(h), name="digits_transformer")


def build_lstm(keras):
    L = keras.layers
    inputs = keras.Input(shape=(8, 8), name="rows")
    h = L.LSTM(32)(L.Rescaling(1.0 / 16.0)(inputs))
    return keras.Model(inputs, L.Dense(10, activation="softmax")(h), name="digits_lstm")


def train(keras, model, x_train, y_train, x_test, y_test, epochs, lr):
    """Fit, then rebuild from the saved .keras file with fastlayers and check it matches."""
    import tempfile

    import fastlayers

    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy")
    model.fit(x_train, y_train, epochs=epochs, batch_size=64, verbose=0)
    keras_probs = model.predict(x_test, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        model.save(f"{tmp}/m.keras")
        ours = fastlayers.load(f"{tmp}/m.keras")
    probs = ours(x_test)
    np.testing.assert_allclose(probs, keras_probs, rtol=1e-4, atol=1e-5)
    print(
        f"{model.name}: keras accuracy {np.mean(keras_probs.argmax(1) == y_test):.4f}, "
        f"fastlayers accuracy {np.mean(probs.argmax(1) == y_test):.4f}"
    )
    ours.save(DATA / f"{model.name}.flm")


def main():
    import keras

    import fastlayers

    keras.utils.set_random_seed(SEED)
    x_train, y_train, x_test, y_test = digits_split()
    DATA.mkdir(exist_ok=True)
    model = build_mlp(keras)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train.astype("float32"), y_train, epochs=60, batch_size=64, verbose=0)
    keras_probs = model.predict(x_test.astype("float32"), verbose=0)
    print(f"keras test accuracy: {np.mean(keras_probs.argmax(1) == y_test):.4f}")

    ours = build_mlp(fastlayers)
    ours.set_weights(model.get_weights())
    probs = ours(x_test)
    np.testing.assert_allclose(probs, keras_probs, rtol=1e-4, atol=1e-6)
    print(f"fastlayers test accuracy: {np.mean(probs.argmax(1) == y_test):.4f}")
    ours.save(DATA / "digits_mlp.flm")

    images = lambda x: x.reshape(-1, 8, 8, 1).astype("float32")  # noqa: E731
    rows = lambda x: x.reshape(-1, 8, 8).astype("float32")  # noqa: E731
    train(keras, build_cnn(keras), images(x_train), y_train, images(x_test), y_test, 40, 3e-3)
    train(keras, build_transformer(keras), rows(x_train), y_train, rows(x_test), y_test, 60, 2e-3)
    if "LSTM" in fastlayers.layers.__all__:
        train(keras, build_lstm(keras), rows(x_train), y_train, rows(x_test), y_test, 60, 5e-3)

    np.savez(DATA / "digits_samples.npz", x=x_test, y=y_test)
    print(f"wrote the models and {DATA / 'digits_samples.npz'} to {DATA}")


if __name__ == "__main__":
    main()
