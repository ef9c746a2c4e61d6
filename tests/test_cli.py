"""The fastlayers command, end to end in a subprocess."""

import subprocess
import sys

import numpy as np
import pytest

from fastlayers.cli import DATA


def run_cli(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "fastlayers.cli", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_demo_prints_predictions_accuracy_latency():
    out = run_cli("--threads", "1", "demo", "--repeats", "3").stdout
    for name in ("digits_mlp", "digits_cnn", "digits_transformer"):
        assert f"{name}:" in out
    assert "predictions" in out and "latency" in out
    for name in ("digits_mlp", "digits_cnn", "digits_lstm", "digits_transformer"):  # says what it does
        assert out.index(f"{name}.flm: loading ...") < out.index(f"{name}.flm: loaded in") < out.index(f"{name}: ")
    accuracies = [float(part.split("%")[0]) for part in out.split("held-out samples: ")[1:]]
    assert len(accuracies) >= 3 and min(accuracies) > 95.0  # the bundled models are really trained


def test_version_prints_the_package_version():
    import fastlayers

    assert run_cli("--version").stdout.strip() == f"fastlayers {fastlayers.__version__}"


def test_info_prints_summary():
    out = run_cli("info", str(DATA / "digits_mlp.flm")).stdout
    assert "hidden (Dense)" in out and "Total params: 5,066" in out


def test_run_batches_with_progress_and_writes_output(tmp_path):
    import fastlayers

    with np.load(DATA / "digits_samples.npz") as d:
        x = d["x"][:50]
    np.save(tmp_path / "x.npy", x)
    proc = run_cli(
        "run",
        str(DATA / "digits_mlp.flm"),
        "--input",
        str(tmp_path / "x.npy"),
        "--output",
        str(tmp_path / "y.npy"),
        "--batch-size",
        "8",
    )
    assert "7/7" in proc.stderr and "100%" in proc.stderr
    y = np.load(tmp_path / "y.npy")
    # batches of 8 rows and one of 50 take different BLAS kernels, which sum in other orders
    # (8.6e-6 relative on a Zen 5 host's OpenBLAS): a model's tolerance
    np.testing.assert_allclose(y, fastlayers.load(DATA / "digits_mlp.flm")(x), rtol=1e-4, atol=1e-7)


def test_run_prints_when_no_output_file(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 64)))
    out = run_cli("run", str(DATA / "digits_mlp.flm"), "--input", str(tmp_path / "x.npy")).stdout
    assert "output 0: shape (2, 10)" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["info", "missing.flm"], "missing.flm: no such file"),
        (["run", str(DATA / "digits_mlp.flm"), "--input", "nowhere.npy"], "nowhere.npy"),
    ],
)
def test_errors_exit_2_with_message(args, message):
    proc = run_cli(*args, check=False)
    assert proc.returncode == 2 and message in proc.stderr


def test_run_wrong_shape_is_a_clear_error(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 63)))
    proc = run_cli("run", str(DATA / "digits_mlp.flm"), "--input", str(tmp_path / "x.npy"), check=False)
    assert proc.returncode == 2 and "expected shape (None, 64), got (2, 63)" in proc.stderr
