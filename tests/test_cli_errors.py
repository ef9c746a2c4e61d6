"""The fastlayers command as a new user meets it: every error is one line on stderr
with exit status 2, global options go before or after the command, --output keeps the name
given, --batch-size is validated, and the help has no raw markup."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fastlayers
from fastlayers import native
from fastlayers.cli import DATA, main

MODEL = str(DATA / "digits_mlp.flm")


@pytest.fixture
def cli(capsys):
    """Run ``main(argv)`` in this process; returns (status, stdout, stderr). The thread count a
    command sets is restored."""
    threads = native.get_num_threads()

    def run(*argv):
        try:
            status = main(list(argv))
        except SystemExit as e:  # --help, --version
            status = e.code
        out, err = capsys.readouterr()
        return status, out, err

    yield run
    native.set_num_threads(threads)


def one_line_error(result, *fragments):
    status, out, err = result
    assert status == 2, (status, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastlayers: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def x(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).random((5, 64)))
    return str(path)


@pytest.mark.parametrize(
    "array,fragment",
    [
        (np.zeros((0, 64)), "holds no samples"),
        (np.float32(3), "a scalar"),
        (np.array(["a", "b"]), "plain numeric dtype"),
    ],
)
def test_unusable_input_arrays(cli, tmp_path, array, fragment):
    np.save(tmp_path / "bad.npy", array)
    one_line_error(cli("run", MODEL, "--input", str(tmp_path / "bad.npy")), "bad.npy", fragment)


def test_npz_and_corrupt_inputs(cli, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((2, 64)))
    one_line_error(cli("run", MODEL, "--input", str(tmp_path / "x.npz")), "x.npz", ".npz archive")
    (tmp_path / "c.npy").write_bytes(b"\x93NUMPY\x01\x00\x01\x00{")
    one_line_error(cli("run", MODEL, "--input", str(tmp_path / "c.npy")), "c.npy")


def test_output_into_a_missing_directory(cli, tmp_path, x):
    one_line_error(cli("run", MODEL, "--input", x, "--output", str(tmp_path / "no" / "y.npy")), "does not exist")


@pytest.mark.parametrize("value", ["0", "-5", "many", "1000"])
def test_threads_validated(cli, x, value):
    one_line_error(cli("--threads", value, "run", MODEL, "--input", x), "--threads")
    one_line_error(cli("run", MODEL, "--input", x, "--threads", value), "--threads")


@pytest.mark.parametrize("value", ["0", "-5", "2.5"])
def test_batch_size_validated(cli, x, value):
    one_line_error(cli("run", MODEL, "--input", x, "--batch-size", value), "--batch-size")


def test_output_keeps_the_name_or_refuses_the_suffix(cli, tmp_path, x):
    expected = fastlayers.load(MODEL)(np.load(x))
    one_line_error(cli("run", MODEL, "--input", x, "--output", str(tmp_path / "y.txt")), "y.txt", ".npy", ".npz")
    assert not list(tmp_path.glob("y.txt*"))
    status, _, err = cli("run", MODEL, "--input", x, "--output", str(tmp_path / "y.NPY"))
    assert status == 0 and "y.NPY" in err
    np.testing.assert_allclose(np.load(tmp_path / "y.NPY"), expected, rtol=1e-5, atol=1e-7)
    assert not (tmp_path / "y.NPY.npy").exists()
    status, _, _ = cli("run", MODEL, "--input", x, "--output", str(tmp_path / "y.npz"))
    assert status == 0
    with np.load(tmp_path / "y.npz") as z:
        np.testing.assert_allclose(z["output_0"], expected, rtol=1e-5, atol=1e-7)


def test_global_options_after_the_command(cli, x):
    status, out, _ = cli("run", MODEL, "--input", x, "--threads", "1", "--backend", "reference")
    assert status == 0 and "output 0: shape (5, 10)" in out
    assert native.get_num_threads() == 1
    status, out, _ = cli("info", MODEL, "--backend", "reference")
    assert status == 0 and "Total params" in out
    one_line_error(cli("info", MODEL, "--backend", "tpu"), "--backend")


def test_usage_errors_are_one_line(cli):
    one_line_error(cli(), "COMMAND")
    one_line_error(cli("bogus"), "bogus")
    one_line_error(cli("info"), "model")
    one_line_error(cli("run", MODEL), "--input")


def test_bad_model_files_are_one_line(cli, tmp_path, x):
    (tmp_path / "m.flm").write_bytes(b"PK\x03\x04" + b"\0" * 40)
    one_line_error(cli("info", str(tmp_path / "m.flm")), "m.flm")
    one_line_error(cli("info", str(tmp_path)), "is a directory")
    one_line_error(cli("run", str(tmp_path / "m.flm"), "--input", x), "m.flm")


def test_inf_input_prints_no_warnings(cli, tmp_path):
    np.save(tmp_path / "inf.npy", np.full((2, 64), 1e300))
    status, out, err = cli("run", MODEL, "--input", str(tmp_path / "inf.npy"), "--backend", "reference")
    assert status == 0 and err == "" and "output 0: shape (2, 10)" in out


def test_help_has_no_raw_markup(cli):
    for argv in (["--help"], ["run", "--help"], ["info", "--help"], ["demo", "--help"]):
        status, out, _ = cli(*argv)
        assert status == 0 and "usage: fastlayers" in out
        assert "``" not in out and ":func:" not in out and "**" not in out, out


def test_real_process_exit_status(tmp_path):
    """The installed entry point's status and stderr, end to end."""
    np.save(tmp_path / "e.npy", np.zeros((0, 64)))
    proc = subprocess.run(
        [sys.executable, "-m", "fastlayers.cli", "run", MODEL, "--input", str(tmp_path / "e.npy"), "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
