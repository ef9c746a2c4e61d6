"""Pickling by value (fastlayers/pickling.py): every kind of model pickles as data (its
architecture and weights, one reconstructor named), unpickles through the loaders' checks, and
the copy computes bit for bit what the original does, its derived weights rebuilt lazily."""

from __future__ import annotations

import copy
import os
import pickle
import pickletools
import warnings
from collections import OrderedDict

import numpy as np
import pytest

import fastlayers
import fastlayers.nn as nn
from fastlayers import layers as L
from fastlayers.backends import derived
from fastlayers.errors import ModelFileError, UnsupportedError
from fastlayers.io.onnx import FileSource
from fastlayers.nn import MODULE_CLASSES

from ..conftest import oracle, set_random_weights

PROTOCOLS = range(3, pickle.HIGHEST_PROTOCOL + 1)  # below 3, bytes pickle through a codecs global


def outputs(y) -> list:
    return list(y) if isinstance(y, (list, tuple)) else [y]


def cnn_and_lstm(rng):
    x = fastlayers.Input((10, 10, 3), name="image")
    h = L.Conv2D(6, 3, padding="same", activation="relu")(x)  # Winograd 3x3
    h = L.BatchNormalization()(L.MaxPooling2D()(h))
    h = L.GlobalAveragePooling2D()(L.Conv2D(8, 1)(h))  # packed 1x1
    cnn = set_random_weights(fastlayers.Model(x, [L.Dense(4, activation="softmax")(h), L.Dense(1)(h)]), rng)
    lstm = set_random_weights(
        fastlayers.Sequential(
            [
                fastlayers.Input((None,), dtype="int32"),
                L.Embedding(30, 8, mask_zero=True),
                L.LSTM(12, return_sequences=True),
                L.GRU(6),
                L.Dense(3),
            ]
        ),
        rng,
    )
    return {
        cnn: rng.standard_normal((5, 10, 10, 3)).astype(np.float32),
        lstm: rng.integers(0, 30, (5, 7)).astype(np.int32),
    }


def globals_named(data: bytes) -> list[str]:
    """The globals a pickle stream imports: GLOBAL's argument, STACK_GLOBAL's two strings."""
    names, strings, memo = [], [], {}
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(arg)
        elif op.name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif op.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
            strings.append(memo[arg])
        elif op.name == "GLOBAL":
            names.append(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.append(".".join(strings[-2:]))
        elif op.name in ("INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"):
            names.append(op.name)  # any other way to name code
    return names


def cached_weights(model_arrays) -> int:
    """How many derived-weight cache entries are keyed by these arrays."""
    ids = {id(a) for a in model_arrays}
    return sum(key[0] in ids for key in list(derived._cache))


def test_models_pickle_by_value_bit_for_bit(rng):
    for model, x in cnn_and_lstm(rng).items():
        want = model(x)  # derived weights now cached for the original
        data = pickle.dumps(model)
        weights = sum(w.nbytes for w in model.get_weights())
        assert weights < len(data) < weights + 20_000  # the weights once, no derived forms
        clone = pickle.loads(data)
        assert type(clone) is type(model) and clone is not model
        assert [layer.name for layer in clone.layers] == [layer.name for layer in model.layers]
        for a, b in zip(clone.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert cached_weights(clone.get_weights()) == 0  # rebuilt lazily, at the first call
        for a, b in zip(outputs(clone(x)), outputs(want)):
            np.testing.assert_array_equal(a, b)
        assert globals_named(data) == ["fastlayers.pickling._model_from_bytes"]
        for protocol in PROTOCOLS:
            assert globals_named(pickle.dumps(model, protocol)) == ["fastlayers.pickling._model_from_bytes"]


def test_deepcopy_of_a_model_is_a_working_copy(rng):
    model, x = next(iter(cnn_and_lstm(rng).items()))
    clone = copy.deepcopy(model)
    clone.layers[-1].set_weights([np.zeros_like(w) for w in clone.layers[-1].get_weights()])
    np.testing.assert_array_equal(model(x)[1], pickle.loads(pickle.dumps(model))(x)[1])
    assert not np.array_equal(clone(x)[1], model(x)[1])  # the copy's layers are its own


def test_a_model_the_format_cannot_hold_is_refused():
    class Doubled(L.Dense):
        pass

    x = fastlayers.Input((3,))
    with pytest.raises(UnsupportedError, match="cannot be pickled.*Doubled"):
        pickle.dumps(fastlayers.Model(x, Doubled(2)(x)))
    with pytest.raises(UnsupportedError, match="cannot be pickled before its input shape"):
        pickle.dumps(fastlayers.Sequential([L.Dense(2)]))


#: One instance of every fastlayers.nn class, with arguments away from their defaults.
NN_EXAMPLES = {
    "Sequential": lambda: nn.Sequential(OrderedDict(first=nn.Linear(2, 3), act=nn.ReLU())),
    "ModuleList": lambda: nn.ModuleList([nn.Linear(2, 3), nn.Tanh()]),
    "ModuleDict": lambda: nn.ModuleDict({"proj": nn.Linear(2, 3)}),
    "Identity": lambda: nn.Identity(),
    **{
        name: (lambda name=name: getattr(nn, name)())
        for name in ("Hardsigmoid", "ReLU", "ReLU6", "SELU", "SiLU", "Sigmoid", "Softsign", "Tanh")
    },
    "Linear": lambda: nn.Linear(3, 4, bias=False),
    "LeakyReLU": lambda: nn.LeakyReLU(0.3),
    "ELU": lambda: nn.ELU(0.7),
    "GELU": lambda: nn.GELU("tanh"),
    "Softplus": lambda: nn.Softplus(2.0, 10.0),
    "Softmax": lambda: nn.Softmax(1),
    "LogSoftmax": lambda: nn.LogSoftmax(0),
    "Flatten": lambda: nn.Flatten(2, 3),
    "Dropout": lambda: nn.Dropout(0.3),
    "Dropout1d": lambda: nn.Dropout1d(0.2),
    "Dropout2d": lambda: nn.Dropout2d(0.1),
    "LayerNorm": lambda: nn.LayerNorm((3, 4), eps=1e-3, bias=False),
    "BatchNorm1d": lambda: nn.BatchNorm1d(5, eps=1e-3, momentum=None),
    "BatchNorm2d": lambda: nn.BatchNorm2d(3, affine=False),
    "Embedding": lambda: nn.Embedding(10, 4, padding_idx=0),
    "Conv1d": lambda: nn.Conv1d(4, 6, 3, stride=2, padding="valid", groups=2),
    "Conv2d": lambda: nn.Conv2d(4, 6, (3, 2), stride=(1, 2), padding=(1, 0), dilation=2, groups=2, bias=False),
    "ConvTranspose2d": lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
    "MaxPool1d": lambda: nn.MaxPool1d(3, 2, 1, ceil_mode=True),
    "MaxPool2d": lambda: nn.MaxPool2d((2, 3), dilation=2),
    "AvgPool1d": lambda: nn.AvgPool1d(3, 1, 1, count_include_pad=False),
    "AvgPool2d": lambda: nn.AvgPool2d(2, divisor_override=3),
    "AdaptiveAvgPool1d": lambda: nn.AdaptiveAvgPool1d(3),
    "AdaptiveAvgPool2d": lambda: nn.AdaptiveAvgPool2d((2, 3)),
    "AdaptiveMaxPool1d": lambda: nn.AdaptiveMaxPool1d(3),
    "AdaptiveMaxPool2d": lambda: nn.AdaptiveMaxPool2d((2, None)),
    "Upsample": lambda: nn.Upsample(scale_factor=2.0, mode="bilinear", align_corners=True),
    "LocalResponseNorm": lambda: nn.LocalResponseNorm(3, 1e-3, 0.5, 2.0),
    "RoIPool": lambda: nn.RoIPool((2, 2), 0.5),
    "RNN": lambda: nn.RNN(3, 4, 2, nonlinearity="relu", bias=False, batch_first=True, bidirectional=True),
    "LSTM": lambda: nn.LSTM(3, 6, 2, batch_first=True, proj_size=2),
    "GRU": lambda: nn.GRU(3, 4, dropout=0.1, bidirectional=True),
    "RNNCell": lambda: nn.RNNCell(3, 4, nonlinearity="relu"),
    "LSTMCell": lambda: nn.LSTMCell(3, 4, bias=False),
    "GRUCell": lambda: nn.GRUCell(3, 4),
    "MultiheadAttention": lambda: nn.MultiheadAttention(
        8, 2, bias=False, add_bias_kv=True, add_zero_attn=True, kdim=5, vdim=6, batch_first=True
    ),
    "TransformerEncoderLayer": lambda: nn.TransformerEncoderLayer(
        8, 2, 16, activation=nn.GELU("tanh"), layer_norm_eps=1e-3, batch_first=True, norm_first=True, bias=False
    ),
    "TransformerDecoderLayer": lambda: nn.TransformerDecoderLayer(8, 2, 16, activation="gelu"),
    "TransformerEncoder": lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16), 3, norm=nn.LayerNorm(8), enable_nested_tensor=False
    ),
    "TransformerDecoder": lambda: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16), 2),
}


def module_view(m) -> dict:
    """A module's class, plain attributes (its configuration), parameters, buffers and
    children, recursively: what a faithful copy must reproduce."""
    plain = (type(None), bool, int, float, str, tuple, list, set)
    view = {"class": type(m)}
    for k, v in m.__dict__.items():
        if k in ("_parameters", "_buffers", "_modules"):
            continue
        if isinstance(v, plain) and not any(
            isinstance(e, np.ndarray) for e in (v if isinstance(v, (tuple, list)) else ())
        ):
            view[k] = v
        elif callable(v) and not isinstance(v, nn.Module):
            view[k] = v  # functions (an activation) by identity
    for table in ("_parameters", "_buffers"):
        view[table] = {k: None if v is None else (v.dtype, v.shape, v.tobytes()) for k, v in getattr(m, table).items()}
    view["children"] = {k: None if v is None else module_view(v) for k, v in m._modules.items()}
    return view


def test_every_nn_class_has_an_example():
    assert set(NN_EXAMPLES) == set(MODULE_CLASSES)


@pytest.mark.parametrize("name", sorted(NN_EXAMPLES))
def test_nn_modules_pickle_by_value(name):
    module = NN_EXAMPLES[name]()
    data = pickle.dumps(module)
    clone = pickle.loads(data)
    assert module_view(clone) == module_view(module)
    assert globals_named(data) == ["fastlayers.pickling._module_from_bytes"]


def test_nn_module_copies_compute_bit_for_bit(rng):
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, norm=nn.LayerNorm(16))
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 5),
    )
    cnn[1].load_state_dict(
        {
            k: rng.random(v.shape).astype(v.dtype) + 0.5 if v.dtype.kind == "f" else v
            for k, v in cnn[1].state_dict().items()
        }
    )
    lstm = nn.LSTM(6, 10, num_layers=2, batch_first=True, bidirectional=True)
    cases = [
        (encoder, rng.standard_normal((3, 7, 16))),
        (cnn, rng.standard_normal((4, 3, 8, 8))),
        (lstm, rng.standard_normal((4, 5, 6))),
    ]
    for module, x in cases:
        x = x.astype(np.float32)
        want = module(x)
        clone = pickle.loads(pickle.dumps(module))
        assert cached_weights(clone.state_dict().values()) == 0
        np.testing.assert_array_equal(outputs(clone(x))[0], outputs(want)[0])


def test_a_module_class_of_ones_own_is_refused_but_deep_copies():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    with pytest.raises(
        UnsupportedError,
        match=r"module head is a .*Net, not a fastlayers.nn "
        r"class.*state_dict",
    ):
        pickle.dumps(nn.Sequential(OrderedDict(body=nn.ReLU(), head=Net())))
    net = Net()
    clone = copy.deepcopy(net)  # copying is not pickling: the object graph
    assert type(clone) is Net and clone.fc.weight is not net.fc.weight
    np.testing.assert_array_equal(clone.fc.weight, net.fc.weight)
    with pytest.raises(UnsupportedError, match="activation .* is code"):
        pickle.dumps(nn.TransformerEncoderLayer(8, 2, 16, activation=lambda t: t))


def tampered(data: bytes, payload: bytes, at: int) -> bytes:
    """``data`` with one byte of ``payload`` (found in it) flipped."""
    start = data.index(payload) + at
    return data[:start] + bytes([data[start] ^ 0x5A]) + data[start + 1 :]


def test_tampered_or_foreign_payloads_are_refused(rng, tmp_path):
    """A flipped byte anywhere in a payload raises ModelFileError, or falls where the archive
    keeps nothing the model is made of (a time stamp) and the copy is exact."""
    from fastlayers import pickling

    model, x = next(iter(cnn_and_lstm(rng).items()))
    module = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    onnx_model = fastlayers.load(exported_onnx(tmp_path))
    cases = [
        (model, x),
        (module, rng.standard_normal((2, 4)).astype(np.float32)),
        (onnx_model, rng.standard_normal((2, 3, 8, 8)).astype(np.float32)),
    ]
    for obj, x in cases:
        data = pickle.dumps(obj)
        reconstructor, (payload,) = obj.__reduce__()
        refused = 0
        for at in np.linspace(0, len(payload) - 1, 40).astype(int):
            try:
                clone = pickle.loads(tampered(data, payload, int(at)))
            except ModelFileError:
                refused += 1
                continue
            for a, b in zip(outputs(clone(x)), outputs(obj(x))):
                np.testing.assert_array_equal(a, b)
        assert refused >= 30
        with pytest.raises(ModelFileError):
            reconstructor(payload[: len(payload) // 2])
        with pytest.raises(ModelFileError, match="expected the payload as bytes"):
            reconstructor(bytearray(payload))
    # one kind's payload given to another's reconstructor
    with pytest.raises(ModelFileError):
        pickling._module_from_bytes(model.__reduce__()[1][0])
    with pytest.raises(ModelFileError):
        pickling._model_from_bytes(module.__reduce__()[1][0])
    with pytest.raises(ModelFileError):
        pickling._onnx_from_bytes(module.__reduce__()[1][0])


def test_unpickling_checks_the_architecture_as_the_loaders_do():
    from fastlayers import pickling

    def nn_payload(tree, state):
        header = pickling.json.dumps({"format": pickling.NN_FORMAT, "version": 1, "module": tree})
        return pickling._npz_bytes({pickling.NN_KEY: np.frombuffer(header.encode(), np.uint8), **state})

    linear = {"class_name": "Linear", "config": {"in_features": 2, "out_features": 3}, "modules": {}}
    w, b = np.zeros((3, 2), np.float32), np.zeros(3, np.float32)
    assert isinstance(pickling._module_from_bytes(nn_payload(linear, {"weight": w, "bias": b})), nn.Linear)
    with pytest.raises(ModelFileError, match="do not match"):
        pickling._module_from_bytes(nn_payload(linear, {"weight": w}))
    with pytest.raises(ModelFileError, match="do not match"):
        pickling._module_from_bytes(nn_payload(linear, {"weight": w.T, "bias": b}))
    with pytest.raises(UnsupportedError, match="unknown class 'os.system'"):
        pickling._module_from_bytes(nn_payload(dict(linear, class_name="os.system"), {}))
    with pytest.raises(ModelFileError, match="invalid arguments"):
        pickling._module_from_bytes(nn_payload(dict(linear, config={"in_features": "x"}), {}))
    with pytest.raises(ModelFileError, match="invalid arguments"):
        bad = {"class_name": "MultiheadAttention", "config": {"embed_dim": 6, "num_heads": 4}, "modules": {}}
        pickling._module_from_bytes(nn_payload(bad, {}))


def test_keras_and_torch_files_load_into_models_that_pickle(keras, torch, tmp_path, rng):
    kmodel = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(2)])
    kmodel.save(tmp_path / "mlp.keras")
    tmodel = torch.nn.Sequential(
        torch.nn.Conv1d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6, 2)
    )
    torch.save(tmodel, tmp_path / "net.pt")
    cases = [
        (fastlayers.load(tmp_path / "mlp.keras"), rng.standard_normal((3, 6))),
        (fastlayers.load(tmp_path / "net.pt"), rng.standard_normal((3, 3, 8))),
    ]
    for model, x in cases:
        x = x.astype(np.float32)
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(model))(x), model(x))


def exported_onnx(directory, name="net.onnx"):
    torch = oracle("torch")
    oracle("onnx")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 2),
    ).eval()
    path = directory / name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.zeros(1, 3, 8, 8),), str(path), dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "n"}}
        )
    return path


def test_onnx_models_pickle_the_file_without_keeping_it(tmp_path, rng):
    path = exported_onnx(tmp_path)
    model = fastlayers.load(path)
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    data = pickle.dumps(model)
    assert globals_named(data) == ["fastlayers.pickling._onnx_from_bytes"]
    assert path.stat().st_size < len(data) < path.stat().st_size + 2_000
    assert isinstance(model.source, FileSource)  # no copy of the file kept: read again
    assert model.where == str(path)
    clone = pickle.loads(data)
    assert not isinstance(clone.source, FileSource) and clone.where == str(path)  # its bytes
    assert (clone.name, clone.op_types, clone.input_names) == (model.name, model.op_types, model.input_names)
    np.testing.assert_array_equal(clone(x), model(x))
    again = pickle.loads(pickle.dumps(clone))  # an unpickled model keeps its bytes
    np.testing.assert_array_equal(again(x), model(x))
    os.utime(path, ns=(0, 0))  # the file is not the one read any more
    with pytest.raises(ModelFileError, match="changed since the model was read"):
        pickle.dumps(model)


def test_onnx_models_with_external_data_are_refused(tmp_path):
    onnx = oracle("onnx")
    proto = onnx.load(str(exported_onnx(tmp_path)))
    onnx.save_model(
        proto, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.data", size_threshold=0
    )
    model = fastlayers.load(tmp_path / "ext.onnx")
    assert model.source is None
    with pytest.raises(UnsupportedError, match="external data files"):
        pickle.dumps(model)
