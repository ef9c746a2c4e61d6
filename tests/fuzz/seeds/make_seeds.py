"""Write the Keras seed files of the fuzz suite (tests/fuzz/test_io.py): small models saved by
Keras itself as ``.keras`` and legacy ``.h5``, so that the mutations start from the bytes Keras
writes (its HDF5 layout, attributes and zip members). Run from the repository root, with Keras
on the torch backend:

    KERAS_BACKEND=torch python tests/fuzz/seeds/make_seeds.py

The files are committed (a few KB each): the fuzz suite itself needs neither Keras nor torch.
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def models(keras):
    K = keras.layers
    mlp = keras.Sequential(
        [
            keras.Input((6,)),
            K.Dense(8, activation="relu"),
            K.BatchNormalization(),
            K.Dropout(0.2),
            K.Dense(3, activation="softmax"),
        ],
        name="mlp",
    )
    x = keras.Input((8, 8, 2), name="image")
    a = K.Conv2D(4, 3, padding="same", activation="relu")(x)
    b = K.DepthwiseConv2D(3, padding="same", dilation_rate=2)(x)
    h = K.Concatenate()([a, K.Conv2D(4, 1)(b)])
    h = K.MaxPooling2D(2)(h)
    h = K.LayerNormalization()(h)
    conv = keras.Model(x, K.Dense(3)(K.Flatten()(h)), name="conv")
    ids = keras.Input((5,), dtype="int32", name="ids")
    e = K.Embedding(20, 4)(ids)
    s = K.LSTM(4, return_sequences=True)(e)
    s = K.MultiHeadAttention(2, 3)(s, s)
    s = K.GRU(3)(s)
    seq = keras.Model(ids, K.Dense(2, activation="sigmoid")(s), name="seq")
    return {"mlp": mlp, "conv": conv, "seq": seq}


def main():
    import keras

    rng = np.random.default_rng(0)
    for name, model in models(keras).items():
        model.set_weights(
            [rng.uniform(0.1 if "variance" in v.path else -1, 1, v.shape).astype(np.float32) for v in model.weights]
        )
        model.save(HERE / f"{name}.keras")
        model.save(HERE / f"{name}.h5")
        print(name, (HERE / f"{name}.keras").stat().st_size, (HERE / f"{name}.h5").stat().st_size)


if __name__ == "__main__":
    main()
