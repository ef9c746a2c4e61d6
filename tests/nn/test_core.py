"""fastlayers.nn core modules against torch.nn: same names, state_dict keys and outputs."""

import numpy as np
import pytest

import fastlayers.nn as nn
import fastlayers.nn.functional as F
from fastlayers.errors import ShapeError, StateDictError

from ..conftest import assert_close

CASES = [
    ("Linear", (5, 3), {}, (4, 5)),
    ("Linear", (5, 3), {"bias": False}, (2, 7, 5)),
    ("ReLU", (), {}, (3, 4)),
    ("ReLU6", (), {}, (3, 4)),
    ("LeakyReLU", (0.2,), {}, (3, 4)),
    ("ELU", (0.5,), {}, (3, 4)),
    ("SELU", (), {}, (3, 4)),
    ("GELU", (), {}, (3, 4)),
    ("GELU", (), {"approximate": "tanh"}, (3, 4)),
    ("Sigmoid", (), {}, (3, 4)),
    ("Hardsigmoid", (), {}, (3, 4)),
    ("Tanh", (), {}, (3, 4)),
    ("Softsign", (), {}, (3, 4)),
    ("SiLU", (), {}, (3, 4)),
    ("Softplus", (), {}, (3, 4)),
    ("Softplus", (2.0, 5.0), {}, (3, 4)),
    ("Softmax", (), {"dim": 1}, (2, 5, 3)),
    ("LogSoftmax", (), {"dim": -1}, (2, 5)),
    ("Flatten", (), {}, (2, 3, 4)),
    ("Flatten", (0, 1), {}, (2, 3, 4)),
    ("Dropout", (0.3,), {}, (3, 4)),
    ("Identity", (), {}, (3, 4)),
    ("LayerNorm", (6,), {}, (2, 3, 6)),
    ("LayerNorm", ((3, 6),), {"eps": 1e-3}, (2, 3, 6)),
    ("LayerNorm", (6,), {"elementwise_affine": False}, (1, 6)),
    ("LayerNorm", (6,), {"bias": False}, (1, 6)),
    ("BatchNorm1d", (4,), {}, (3, 4)),
    ("BatchNorm1d", (4,), {"affine": False}, (3, 4, 5)),
    ("BatchNorm2d", (3,), {"eps": 1e-3}, (2, 3, 4, 5)),
]


def randomize(module, rng, torch):
    with torch.no_grad():
        for name, p in module.state_dict().items():
            if p.dtype.is_floating_point:
                p.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, tuple(p.shape)).astype(np.float32)))


@pytest.mark.parametrize("name,args,kwargs,shape", CASES)
def test_module_matches_torch(name, args, kwargs, shape, torch, rng, backend):
    ref = getattr(torch.nn, name)(*args, **kwargs).eval()
    randomize(ref, rng, torch)
    ours = getattr(nn, name)(*args, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    # torch's float32 gelu/erf is off by ~1e-6 absolute near x = -3.5
    assert_close(ours(x), expected, rtol=1e-5, atol=2e-6, what=name)


def test_embedding_matches_torch(torch, rng):
    ref = torch.nn.Embedding(10, 4, padding_idx=0)
    ours = nn.Embedding(10, 4, padding_idx=0)
    ours.load_state_dict(ref.state_dict())  # torch tensors are accepted too
    ids = rng.integers(0, 10, (2, 5))
    with torch.no_grad():
        assert_close(ours(ids), ref(torch.from_numpy(ids)).numpy())


def test_containers_and_custom_module(torch, rng):
    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.BatchNorm1d(8))
            self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(8, 2), "b": torch.nn.Linear(8, 3)})
            self.extra = torch.nn.ModuleList([torch.nn.LayerNorm(8)])

        def forward(self, x):
            h = self.extra[0](self.body(x))
            return torch.cat([torch.log_softmax(self.heads["a"](h), -1), torch.sigmoid(self.heads["b"](h))], -1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.BatchNorm1d(8))
            self.heads = nn.ModuleDict({"a": nn.Linear(8, 2), "b": nn.Linear(8, 3)})
            self.extra = nn.ModuleList([nn.LayerNorm(8)])

        def forward(self, x):
            h = self.extra[0](self.body(x))
            return np.concatenate([F.log_softmax(self.heads["a"](h), -1), F.sigmoid(self.heads["b"](h))], -1)

    ref = TorchNet().eval()
    randomize(ref, rng, torch)
    ours = Net()
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with torch.no_grad():
        assert_close(ours(x), ref(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert (
        len(ours.body) == 3
        and isinstance(ours.body[1], nn.ReLU)
        and len(list(ours.parameters())) == len(list(ref.parameters())) == 10
    )
    assert "body.2.running_mean" in dict(ours.named_buffers())


def test_load_state_dict_reports_keys_like_torch():
    m = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    sd = m.state_dict()
    sd["extra.weight"] = np.zeros(1, np.float32)
    del sd["2.bias"]
    with pytest.raises(
        StateDictError,
        match=r'Missing key\(s\) in state_dict: "2.bias".*Unexpected key\(s\) '
        r'in state_dict: "extra.weight"',
    ):
        m.load_state_dict(sd)
    assert isinstance(StateDictError("x"), RuntimeError)
    result = m.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["2.bias"] and result.unexpected_keys == ["extra.weight"]
    bad = m.state_dict()
    bad["0.weight"] = np.zeros((4, 2), np.float32)
    before = m.state_dict()
    with pytest.raises(ShapeError, match=r"size mismatch for 0.weight: copying a param with shape \(4, 2\)"):
        m.load_state_dict(bad)
    for k, v in m.state_dict().items():  # nothing was half-loaded
        np.testing.assert_array_equal(v, before[k])


def test_shape_errors_name_the_module():
    with pytest.raises(ShapeError, match=r"Linear\(in_features=3\): expected input \(\.\.\., 3\), got shape \(2, 4\)"):
        nn.Linear(3, 1)(np.zeros((2, 4)))
    with pytest.raises(ShapeError, match="BatchNorm2d"):
        nn.BatchNorm2d(3)(np.zeros((2, 4, 5, 5)))
