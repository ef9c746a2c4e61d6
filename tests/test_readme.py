"""Every Python block of the README and of the documentation's pages runs as written.

Pages: README.md, docs/index.md and docs/guide/*.md (but files whose name starts with "_").
Each ```python block runs alone, in a fresh namespace, in an empty folder holding the files it
opens by name (``FILES``: small models made with onnx, Keras on the torch backend and torch, each
made once per session). A block fenced as another language (```text, ```bash), or preceded by
the line ``<!-- no-test -->``, is not run. Blocks calling ``use_ops("cuda")`` run under
numba-cuda's CUDA simulator in tests/model/test_cuda_backend.py.

Also checked: the README's "Development" block is exactly the commands .ci/run runs, and
docs/index.md (the site's home page) is the README's first sections with links made relative to
docs/ (``python tests/test_readme.py`` rewrites it from the README).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import fastlayers

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HOME = ROOT / "docs" / "index.md"
CI = ROOT / ".ci" / "run"
CUDA_MARK = 'use_ops("cuda")'
NO_TEST = "<!-- no-test -->"

#: Modules whose absence skips a block (fails it under FASTLAYERS_REQUIRE_ORACLES=1): the
#: frameworks the examples compare with or make files with. Other optional packages (dask,
#: distributed) skip it.
ORACLES = {"torch", "keras", "onnx", "onnxruntime"}
OPTIONAL = {"dask", "distributed", "numba", "numba_cuda"}


def pages() -> list[Path]:
    """The pages whose blocks run: the README, the home page and the user guide's pages."""
    guide = sorted(p for p in (ROOT / "docs" / "guide").glob("*.md") if not p.name.startswith("_"))
    return [README, HOME, *guide]


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """(page, line number, code) of each ```python block of ``page`` not marked ``NO_TEST``."""
    text = page.read_text()
    found = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() != NO_TEST:
            found.append((str(page.relative_to(ROOT)), text.count("\n", 0, m.start()) + 2, m.group(1)))
    return found


def all_blocks() -> list[tuple[str, int, str]]:
    return [b for page in pages() for b in blocks(page)]


def cuda_blocks() -> list[tuple[str, int, str]]:
    """The blocks that run on the cuda backend (tests/model/test_cuda_backend.py runs them)."""
    return [b for b in all_blocks() if CUDA_MARK in b[2]]


def run_block(block: tuple[str, int, str]) -> dict:
    page, line, code = block
    namespace = {"__name__": f"doc_block_{line}"}
    exec(compile(code, f"{page}:{line}", "exec"), namespace)  # noqa: S102 - the docs' own code, run as their test
    return namespace


# ----------------------------------------------------------------------------- the files blocks open
def _make_onnx(path: Path) -> None:
    """A small CNN, NCHW input "input" (batch, 3, 224, 224) -> "logits" (batch, 10)."""
    from .conftest import oracle

    onnx = oracle("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((8, 3, 3, 3)) * 0.2,
        "b": np.zeros(8),
        "fc": rng.standard_normal((10, 8)) * 0.2,
        "fcb": np.zeros(10),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _keras_model():
    """A small Keras CNN on (28, 28, 1) images, on the torch backend."""
    from .conftest import oracle

    keras = oracle("keras")
    if keras.backend.backend() != "torch":
        pytest.fail(f"keras must run on the torch backend, got {keras.backend.backend()}")
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def _make_keras(path: Path) -> None:
    _keras_model().save(str(path))


def _make_keras_weights(path: Path) -> None:
    _keras_model().save_weights(str(path))


def _make_state_dict(path: Path) -> None:
    """The README's torch model (fc1: 784 -> 128, fc2: 128 -> 10), saved as its state dict."""
    from .conftest import oracle

    torch = oracle("torch")
    torch.manual_seed(0)
    net = torch.nn.Module()
    net.fc1, net.fc2 = torch.nn.Linear(784, 128), torch.nn.Linear(128, 10)
    torch.save(net.state_dict(), str(path))


def _make_custom_module(path: Path) -> None:
    """docs/guide/pytorch.md's model with a custom class, ``torch.nn.Sequential(Linear(8, 4),
    mypackage.blocks.Scale(4))``: the class is picklable by that name while the file is saved."""
    from .conftest import oracle

    torch = oracle("torch")

    class Scale(torch.nn.Module):
        def __init__(self, features):
            super().__init__()
            self.features = features
            self.weight = torch.nn.Parameter(torch.ones(features))

    Scale.__module__, Scale.__qualname__ = "mypackage.blocks", "Scale"
    package, blocks = type(sys)("mypackage"), type(sys)("mypackage.blocks")
    package.blocks, blocks.Scale = blocks, Scale
    sys.modules.update({"mypackage": package, "mypackage.blocks": blocks})
    try:
        torch.manual_seed(0)
        torch.save(torch.nn.Sequential(torch.nn.Linear(8, 4), Scale(4)), str(path))
    finally:
        del sys.modules["mypackage"], sys.modules["mypackage.blocks"]


#: File name a block opens -> the function that makes it.
FILES = {
    "model.onnx": _make_onnx,
    "model.keras": _make_keras,
    "model.h5": _make_keras,
    "model.weights.h5": _make_keras_weights,
    "weights.pt": _make_state_dict,
    "custom_model.pt": _make_custom_module,
}


@pytest.fixture(scope="session")
def doc_files(tmp_path_factory):
    """Makes each file of ``FILES`` once, at the first block that opens it."""
    folder = tmp_path_factory.mktemp("doc-files")

    def get(name: str) -> Path:
        path = folder / name
        if not path.exists():
            FILES[name](path)
        return path

    return get


def _needs(code: str) -> None:
    """Skip (or fail, for an oracle under FASTLAYERS_REQUIRE_ORACLES=1) a block whose imports
    are not installed."""
    from .conftest import oracle

    for module in sorted(set(re.findall(r"^\s*(?:import|from)\s+(\w+)", code, re.M))):
        if module in ORACLES:
            oracle(module)
        elif module in OPTIONAL:
            pytest.importorskip(module)


@pytest.mark.parametrize("block", [b for b in all_blocks() if CUDA_MARK not in b[2]], ids=lambda b: f"{b[0]}:{b[1]}")
def test_block_runs_as_written(block, tmp_path, monkeypatch, doc_files):
    from fastlayers import limits, native

    _needs(block[2])
    for name in FILES:
        if f'"{name}"' in block[2]:
            shutil.copy(doc_files(name), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    threads = fastlayers.get_num_threads() or native.get_num_threads()
    spin = fastlayers.get_idle_spin()
    isa = native.isa()
    saved = {k: v for k, v in vars(limits).items() if k.isupper()}
    try:
        run_block(block)
    finally:
        fastlayers.set_num_threads(threads)
        fastlayers.set_idle_spin(spin)
        native.set_isa(isa)
        vars(limits).update(saved)


def test_the_pages_have_their_blocks():
    """The README's three examples, and exactly one block for the cuda backend."""
    assert len(blocks(README)) == 3 and not any(CUDA_MARK in b[2] for b in blocks(README))
    assert len(cuda_blocks()) == 1
    assert all(any(f'"{name}"' in b[2] for b in all_blocks()) for name in FILES)


# ------------------------------------------------------------------------------ README and CI
#: Lines of .ci/run that prepare the run rather than test anything.
CI_SETUP = ("set ", "cd ", "export ", "python -m pip install --quiet --upgrade pip")


def ci_commands() -> list[str]:
    """The commands .ci/run runs, a subshell's parentheses taken off."""
    commands = []
    for line in CI.read_text().splitlines():
        s = line.strip()
        if not s or s.startswith(("#", "#!")) or s.startswith(CI_SETUP):
            continue
        commands.append(s[1:-1] if s.startswith("(") and s.endswith(")") else s)
    return commands


def readme_development_commands() -> list[str]:
    """The lines of the bash block of the README's "Development" section."""
    section = README.read_text().split("\n## Development\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M)
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_verbatim():
    assert readme_development_commands() == ci_commands()


def home_page() -> str:
    """docs/index.md: the README up to its "Documentation" section, links made relative to
    docs/, then the site's own list of where to go next."""
    readme = README.read_text()
    body = readme[: readme.index("\n## Documentation\n") + 1]
    body = body.replace("](docs/", "](")
    return (
        body
        + """## Where next

- The [user guide](guide/index.md), by subject: loading each format and its limits, building
  models, layers and modules, threads and services, performance and profiling, CUDA, Dask,
  errors, settings, the CLI.
- The [API reference](api/index.md): every public class and function, from the docstrings.
- [Benchmarks](benchmarks.md): every measurement, with its host.
- For maintainers: [architecture](architecture.md), [design notes](design.md),
  [file formats](formats.md).
- The [changelog](changelog.md).
"""
    )


def test_the_home_page_is_the_readme():
    assert HOME.read_text() == home_page(), "docs/index.md is stale: python tests/test_readme.py"


if __name__ == "__main__":  # rewrite docs/index.md from the README
    HOME.write_text(home_page())
    sys.exit(0)
