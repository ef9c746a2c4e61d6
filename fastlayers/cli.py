"""The fastlayers command: demo, info, run, profile and bench.

    fastlayers demo                      run the bundled trained models on bundled samples
    fastlayers info MODEL                print a model's summary
    fastlayers run MODEL --input X.npy [--output Y.npy] [--batch-size N]
    fastlayers profile MODEL.onnx [--input X.npy ...]   time an ONNX model step by step
    fastlayers bench MODEL [--batch-size N ...] [--threads N ...] [--against onnxruntime]
                                         latency percentiles and throughput (fastlayers.benchmark)

``--threads N`` and ``--backend NAME`` go before or after the command. Every error (a bad
argument, an unreadable model or input, a shape the model refuses, an output that cannot be
written) prints one line, ``fastlayers: error: ...``, on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from .backends import use_ops
from .errors import FastlayersError, ShapeError
from .io import load
from .version import __version__

#: The bundled demo models and samples (``fastlayers.DEMO_DIR``).
DATA = Path(__file__).resolve().parent / "data"

#: Bundled demo models: (model file, samples file, sample shape, description), trained by
#: scripts/train_demo.py on scikit-learn's 8x8 handwritten digits. Models whose layers this build
#: lacks are skipped by name (none, in a complete build).
DEMOS = [
    (
        "digits_mlp.flm",
        "digits_samples.npz",
        (64,),
        "MLP on the 64 pixels: Rescaling, Dense 64 relu, BatchNorm, Dense 10 softmax",
    ),
    (
        "digits_cnn.flm",
        "digits_samples.npz",
        (8, 8, 1),
        "CNN on the 8x8 image: Conv2D 16, MaxPooling, Conv2D 32, GlobalAveragePooling, Dense 10",
    ),
    ("digits_lstm.flm", "digits_samples.npz", (8, 8), "LSTM over the 8 rows of 8 pixels: LSTM 32, Dense 10"),
    (
        "digits_transformer.flm",
        "digits_samples.npz",
        (8, 8),
        "Transformer encoder over the 8 rows: Conv1D embedding, 4-head self-attention, FFN, pooling",
    ),
]

#: Suffixes ``--output`` writes: one array (.npy) or an archive of one or more (.npz).
OUTPUT_SUFFIXES = (".npy", ".npz")


class CommandError(FastlayersError):
    """A command-line argument the command cannot use (printed as one line, exit status 2)."""


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise."""

    def __init__(self, total: int, label: str, stream=None, width: int = 30):
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_decile = -1

    def update(self, done: int, note: str = "") -> None:
        frac = done / self.total
        if not self.tty:
            decile = int(frac * 10)
            if decile == self._last_decile and done != self.total:
                return
            self._last_decile = decile
        filled = int(frac * self.width)
        elapsed = time.perf_counter() - self.start
        line = (
            f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
            f"{frac:4.0%} {elapsed:6.1f}s {note}"
        )
        self.stream.write(("\r" + line.ljust(100)) if self.tty else line.rstrip() + "\n")
        if self.tty and done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def cmd_demo(args) -> int:
    print(f"fastlayers {__version__} demo (backend {args.backend}, {args.threads or 'default'} threads)")
    for model_file, samples_file, shape, description in DEMOS:
        if not (DATA / model_file).exists():
            continue
        print(f"\n{model_file}: loading ...", flush=True)
        t0 = time.perf_counter()
        model = load(DATA / model_file)
        load_ms = (time.perf_counter() - t0) * 1e3
        with np.load(DATA / samples_file, allow_pickle=False) as samples:
            x, y = samples["x"].reshape(-1, *shape), samples["y"]
        print(
            f"{model_file}: loaded in {load_ms:.1f} ms; running {len(x)} samples, then timing "
            f"{args.repeats} calls at batch 1 and at batch {len(x)} ...",
            flush=True,
        )
        with use_ops(args.backend):
            t0 = time.perf_counter()
            probs = model(x)
            first_ms = (time.perf_counter() - t0) * 1e3
            batch_ms = _median_ms(lambda: model(x), args.repeats)
            one_ms = _median_ms(lambda: model(x[:1]), args.repeats)
        pred = probs.argmax(axis=-1)
        print(f"{model.name}: {description}")
        print(f"  predictions (first 20): {' '.join(map(str, pred[:20]))}")
        print(f"  labels      (first 20): {' '.join(map(str, y[:20]))}")
        print(f"  accuracy on {len(y)} held-out samples: {np.mean(pred == y):.2%}")
        print(
            f"  latency: first call {first_ms:.1f} ms; median of {args.repeats}: batch 1 "
            f"{one_ms:.3f} ms, batch {len(x)} {batch_ms:.3f} ms ({batch_ms / len(x) * 1e3:.2f} us/sample)"
        )
    return 0


def cmd_info(args) -> int:
    model = load(args.model)
    if hasattr(model, "summary"):
        model.summary()
    else:  # a fastlayers.nn module (from a PyTorch file): torch's repr and the parameter count
        print(model)
        print(f"parameters: {sum(int(p.size) for p in model.parameters()):,}")
    return 0


def _check_output(path: str) -> None:
    """Refuse, before anything runs, an --output the command could not write as named."""
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise CommandError(f"--output {path}: the name must end in .npy (one output) or .npz (any number of outputs)")
    parent = Path(path).parent
    if not parent.is_dir():
        raise CommandError(f"--output {path}: the directory {str(parent)!r} does not exist")
    if Path(path).is_dir():
        raise CommandError(f"--output {path}: is a directory")


def _read_inputs(paths, batched: bool = True) -> list[np.ndarray]:
    """The .npy arrays at ``paths``; ``batched``: each must have a non-empty first axis."""
    from .io.native import read_npy

    inputs = []
    for path in paths:
        array = read_npy(path, "the input array")
        if not batched:
            inputs.append(array)
            continue
        if array.ndim == 0:
            raise CommandError(f"{path}: a scalar; expected an array whose first axis is the batch")
        if len(array) == 0:
            raise CommandError(f"{path}: holds no samples (shape {array.shape})")
        inputs.append(array)
    return inputs


def _output_count(model) -> int | None:
    outputs = getattr(model, "outputs", None)
    if isinstance(outputs, list):
        return len(outputs)
    get_outputs = getattr(model, "get_outputs", None)  # an OnnxModel
    return len(get_outputs()) if callable(get_outputs) else None


def cmd_run(args) -> int:
    if args.output:
        _check_output(args.output)
    inputs = _read_inputs(args.input)
    n = len(inputs[0])
    if any(len(a) != n for a in inputs):
        raise ShapeError(f"inputs have different batch sizes: {[len(a) for a in inputs]}")
    model = load(args.model)
    count = _output_count(model)
    if args.output and args.output.lower().endswith(".npy") and count is not None and count > 1:
        raise CommandError(f"--output {args.output}: the model has {count} outputs; give a .npz name to write them all")
    batch = args.batch_size or n
    steps = max(1, -(-n // batch))
    progress = Progress(steps, "run") if steps > 1 else None
    outputs: list[list[np.ndarray]] = []
    with use_ops(args.backend):
        for step in range(steps):
            chunk = [a[step * batch : (step + 1) * batch] for a in inputs]
            out = model(chunk if len(chunk) > 1 else chunk[0])
            outputs.append(out if isinstance(out, list) else [out])
            if progress:
                progress.update(step + 1)
    results = [np.concatenate([o[i] for o in outputs]) for i in range(len(outputs[0]))]
    if args.output:
        if len(results) > 1 and args.output.lower().endswith(".npy"):
            raise CommandError(
                f"--output {args.output}: the model gave {len(results)} outputs; give a .npz name to write them all"
            )
        with open(args.output, "wb") as f:  # the name as given: np.save would append .npy
            if args.output.lower().endswith(".npy"):
                np.save(f, results[0], allow_pickle=False)
            else:
                # mypy fears a key named allow_pickle among the arrays; the keys are output_<i>
                np.savez(f, **{f"output_{i}": r for i, r in enumerate(results)})  # type: ignore[arg-type]
        print(
            f"wrote {len(results)} output(s) of shape(s) {[r.shape for r in results]} to {args.output}", file=sys.stderr
        )
    else:
        for i, r in enumerate(results):
            print(f"output {i}: shape {r.shape}")
            print(np.array2string(r[:5], precision=5, suppress_small=True))
    return 0


def _profile_inputs(model, paths) -> list[np.ndarray]:
    """The arrays ``fastlayers profile`` runs the model on: the .npy files given, else zeros of
    each input's declared shape (free dimensions as a warm-up sizes them)."""
    if paths:
        return _read_inputs(paths, batched=False)
    from .model.warmup import zeros_like_inputs
    from .onnx.model import ORT_TYPES
    from .onnx.tensors import DTYPES

    dtypes = {ORT_TYPES[k]: t for k, t in DTYPES.items()}
    arrays = zeros_like_inputs(
        [
            ([d if isinstance(d, int) and d > 0 else None for d in arg.shape], dtypes.get(arg.type, np.float32))
            for arg in model.get_inputs()
        ]
    )
    if arrays is None:
        raise CommandError(f"{model.name}: its declared inputs are too large to make up; give them with --input")
    return arrays


def cmd_profile(args) -> int:
    model = load(args.model)
    if not hasattr(model, "profile"):
        raise CommandError(f"{args.model}: profiling runs on ONNX models; this file loads as {type(model).__name__}")
    inputs = _profile_inputs(model, args.input)
    with use_ops(args.backend):
        try:
            for _ in range(2):  # as a service's calls run: on the native plan, where one pays
                model(*inputs)
            profile = model.profile(*inputs, repeats=args.repeats, pause=args.pause / 1e3)
        except FastlayersError as e:
            if args.input:
                raise
            shapes = ", ".join(str(a.shape) for a in inputs)
            raise type(e)(
                f"{e} (on zeros of shapes {shapes}, made up from the declared inputs: give real ones with --input)"
            ) from None
    print(profile.table(top=args.top))
    return 0


def _check_json(path: str) -> None:
    """Refuse, before anything is timed, a --json the command could not write."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise CommandError(f"--json {path}: the directory {str(parent)!r} does not exist")
    if Path(path).is_dir():
        raise CommandError(f"--json {path}: is a directory")


def cmd_bench(args) -> int:
    from . import native
    from .benchmark import run_benchmark

    if args.json:
        _check_json(args.json)
    if args.input and args.shape:
        raise CommandError("--shape and --input: give the inputs' shapes or their values, not both")
    shapes = dict(args.shape or [])
    if len(shapes) != len(args.shape or []):
        names = [name for name, _ in args.shape]
        raise CommandError(f"--shape: input {next(n for n in names if names.count(n) > 1)!r} given twice")
    threads = (
        args.threads
        if isinstance(args.threads, list)
        else [args.threads]
        if args.threads is not None
        else [native.get_num_threads()]
    )
    inputs = _read_inputs(args.input, batched=False) if args.input else None
    model = load(args.model)

    def log(line):  # progress on a terminal only: stderr is the error line otherwise
        print(f"bench: {line}", file=sys.stderr, flush=True)

    with use_ops(args.backend):
        report = run_benchmark(
            model,
            path=args.model,
            threads=threads,
            batch_sizes=args.batch_size,
            shapes=shapes,
            inputs=inputs,
            seconds=args.seconds,
            against=args.against,
            rtol=args.rtol,
            log=log if sys.stderr.isatty() else None,
        )
    print(report.table())
    if args.json:
        report.write_json(args.json)
        print(f"wrote the figures to {args.json}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------- arguments
class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``fastlayers: error: ...``, exit status 2)."""

    def error(self, message):
        raise CommandError(f"{message} (see {self.prog} --help)")


def _positive_int(maximum: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
        if value < 1 or (maximum is not None and value > maximum):
            limit = f" from 1 to {maximum}" if maximum is not None else ""
            raise argparse.ArgumentTypeError(f"expected a positive integer{limit}, got {text}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _pause_ms(text: str) -> float:
    from .onnx.profile import MAX_PAUSE

    limit = f"expected milliseconds from 0 to {MAX_PAUSE * 1e3:g}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{limit}, got {text!r}") from None
    if not 0 <= value <= MAX_PAUSE * 1e3:
        raise argparse.ArgumentTypeError(f"{limit}, got {text}")
    return value


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    from .benchmark import parse_shape

    try:
        return parse_shape(text)
    except FastlayersError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _global_options(parser, suppress: bool, thread_counts: bool = False) -> None:
    from .backends import MAX_THREADS

    default = argparse.SUPPRESS if suppress else None
    if thread_counts:  # bench: one or more counts, each timed
        parser.add_argument(
            "--threads",
            type=_positive_int(MAX_THREADS),
            nargs="+",
            default=default,
            metavar="N",
            help="thread counts to time at, each in turn (default: the count in force, the CPUs unless set)",
        )
    else:
        parser.add_argument(
            "--threads",
            type=_positive_int(MAX_THREADS),
            default=default,
            metavar="N",
            help="threads for fastlayers' kernels (default: the CPUs)",
        )
    parser.add_argument(
        "--backend",
        choices=["cpu", "reference", "cuda"],
        default=argparse.SUPPRESS if suppress else "cpu",
        help="backend that runs the model (default: cpu)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fastlayers",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="CPU inference for Keras, PyTorch, ONNX and fastlayers model files.",
        epilog="--threads and --backend may also follow the command.\n"
        "Errors print one line on stderr and exit with status 2.",
    )
    _global_options(parser, suppress=False)
    parser.add_argument("--version", action="version", version=f"fastlayers {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help_text, thread_counts=False):
        p = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        _global_options(p, suppress=True, thread_counts=thread_counts)
        return p

    demo = command("demo", "run the bundled models on bundled samples")
    demo.add_argument("--repeats", type=_positive_int(), default=50, help="timed runs per latency figure (default: 50)")
    demo.set_defaults(func=cmd_demo)
    info = command("info", "print a model's summary")
    info.add_argument("model", help="a model file (.flm, .keras, .h5, .onnx, .pt, ...)")
    info.set_defaults(func=cmd_info)
    run = command("run", "run a model on .npy inputs")
    run.add_argument("model", help="a model file (.flm, .keras, .h5, .onnx, .pt, ...)")
    run.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="X.npy",
        help=".npy file, batch first (repeat once per model input, in order)",
    )
    run.add_argument(
        "--output",
        metavar="Y.npy",
        help="where to write the results: .npy (one output) or .npz (any number); default: print them",
    )
    run.add_argument(
        "--batch-size", type=_positive_int(), default=None, metavar="N", help="samples per call (default: all at once)"
    )
    run.set_defaults(func=cmd_run)
    prof = command("profile", "time an ONNX model step by step (operator, kernel, layout, shapes)")
    prof.add_argument("model", help="an .onnx file")
    prof.add_argument(
        "--input",
        action="append",
        metavar="X.npy",
        help=".npy file per model input, in order (default: zeros of the declared shapes, free dimensions 1)",
    )
    prof.add_argument(
        "--repeats", type=_positive_int(), default=20, help="timed calls; each step's time is its median (default: 20)"
    )
    prof.add_argument(
        "--top", type=_positive_int(), default=None, metavar="N", help="show the N slowest steps (default: all)"
    )
    prof.add_argument(
        "--pause",
        type=_pause_ms,
        default=0.0,
        metavar="MS",
        help="sleep this many milliseconds before each timed call, as a service's spaced calls (default: 0)",
    )
    prof.set_defaults(func=cmd_profile)
    from .benchmark import DEFAULT_SECONDS, ONNXRUNTIME, RTOL

    bench = command(
        "bench",
        "time a model: latency percentiles and throughput per batch size "
        "and thread count, optionally beside onnxruntime",
        thread_counts=True,
    )
    bench.add_argument("model", help="a model file (.onnx, .flm, .keras, .h5, .pt, ...)")
    bench.add_argument(
        "--batch-size",
        type=_positive_int(),
        nargs="+",
        default=None,
        metavar="N",
        help="batch sizes to time, where the model leaves the batch free "
        "(default: 1; a model that fixes it: that batch only)",
    )
    bench.add_argument(
        "--seconds",
        type=_positive_float,
        default=DEFAULT_SECONDS,
        metavar="S",
        help=f"timed seconds per engine and configuration, after a warm-up of a "
        f"quarter of it, at most 0.5 s (default: {DEFAULT_SECONDS:g})",
    )
    bench.add_argument(
        "--shape",
        type=_shape_arg,
        action="append",
        metavar="NAME=D1,D2,...",
        help="an input's full shape where the model leaves dimensions free "
        "(repeat per input; the batch sizes replace a free leading dimension)",
    )
    bench.add_argument(
        "--input",
        action="append",
        metavar="X.npy",
        help=".npy file per model input, in order, instead of random values (--batch-size then takes their first rows)",
    )
    bench.add_argument(
        "--against",
        choices=[ONNXRUNTIME],
        default=None,
        help="also time onnxruntime on the same ONNX file, the engines taking "
        "turns call by call on the same thread count, after checking that "
        "their outputs agree",
    )
    bench.add_argument(
        "--rtol",
        type=_positive_float,
        default=RTOL,
        help=f"relative tolerance of the output check (default: {RTOL:g}; the "
        "absolute one is rtol x each output's largest value)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write the figures, the host and the versions as JSON")
    bench.set_defaults(func=cmd_bench)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if isinstance(args.threads, int):  # bench takes a list of counts and sets each
            from .backends import set_num_threads

            set_num_threads(args.threads)
        with np.errstate(all="ignore"):  # inf and NaN inputs give inf and NaN outputs
            return args.func(args)
    except FastlayersError as e:
        message = str(e)
    except OSError as e:  # writing the output: a full disk, no permission
        message = f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}"
    except MemoryError:
        message = "out of memory (try a smaller --batch-size)"
    except KeyboardInterrupt:
        print("fastlayers: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: one line, the traceback on request
        if os.environ.get("FASTLAYERS_DEBUG", "0").strip() not in ("", "0"):
            raise
        message = f"internal error ({type(e).__name__}: {e}); run with FASTLAYERS_DEBUG=1 for the traceback"
    print(f"fastlayers: error: {_one_line(message)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
