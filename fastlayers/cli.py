"""The ``fastlayers`` command: demo, info, run and warmup.

    fastlayers demo                      run the bundled trained models on bundled samples
    fastlayers info MODEL                print a model's summary
    fastlayers run MODEL --input X.npy [--output Y.npy] [--batch-size N]
    fastlayers warmup                    kept for old scripts: says that nothing needs compiling
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from . import __version__
from .errors import FastlayersError

#: The bundled demo models and samples (``fastlayers.DEMO_DIR``).
DATA = Path(__file__).resolve().parent / "data"

#: Bundled demo models: (model file, samples file, sample shape, description), trained by
#: scripts/train_demo.py on scikit-learn's 8x8 handwritten digits. Models whose layers this build
#: lacks are skipped by name (none, in a complete build).
DEMOS = [
    ("digits_mlp.flm", "digits_samples.npz", (64,),
     "MLP on the 64 pixels: Rescaling, Dense 64 relu, BatchNorm, Dense 10 softmax"),
    ("digits_cnn.flm", "digits_samples.npz", (8, 8, 1),
     "CNN on the 8x8 image: Conv2D 16, MaxPooling, Conv2D 32, GlobalAveragePooling, Dense 10"),
    ("digits_lstm.flm", "digits_samples.npz", (8, 8),
     "LSTM over the 8 rows of 8 pixels: LSTM 32, Dense 10"),
    ("digits_transformer.flm", "digits_samples.npz", (8, 8),
     "Transformer encoder over the 8 rows: Conv1D embedding, 4-head self-attention, FFN, pooling"),
]


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
        line = (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                f"{frac:4.0%} {elapsed:6.1f}s {note}")
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
    import fastlayers

    print(f"fastlayers {fastlayers.__version__} demo (backend {args.backend}, "
          f"{args.threads or 'default'} threads)")
    for model_file, samples_file, shape, description in DEMOS:
        if not (DATA / model_file).exists():
            continue
        print(f"\n{model_file}: loading ...", flush=True)
        t0 = time.perf_counter()
        model = fastlayers.load(DATA / model_file)
        load_ms = (time.perf_counter() - t0) * 1e3
        with np.load(DATA / samples_file, allow_pickle=False) as samples:
            x, y = samples["x"].reshape(-1, *shape), samples["y"]
        print(f"{model_file}: loaded in {load_ms:.1f} ms; running {len(x)} samples, then timing "
              f"{args.repeats} calls at batch 1 and at batch {len(x)} ...", flush=True)
        with fastlayers.use_ops(args.backend):
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
        print(f"  latency: first call {first_ms:.1f} ms; median of {args.repeats}: batch 1 "
              f"{one_ms:.3f} ms, batch {len(x)} {batch_ms:.3f} ms ({batch_ms / len(x) * 1e3:.2f} us/sample)")
    return 0


def cmd_info(args) -> int:
    import fastlayers

    model = fastlayers.load(args.model)
    if hasattr(model, "summary"):
        model.summary()
    else:  # a fastlayers.nn module (from a PyTorch file): torch's repr and the parameter count
        print(model)
        print(f"parameters: {sum(int(p.size) for p in model.parameters()):,}")
    return 0


def cmd_run(args) -> int:
    import fastlayers

    model = fastlayers.load(args.model)
    inputs = []
    for path in args.input:
        try:
            inputs.append(np.load(path, allow_pickle=False))
        except (OSError, ValueError) as e:
            raise fastlayers.errors.ModelFileError(f"{path}: not a readable .npy array ({e})") from e
    n = len(inputs[0])
    if any(len(a) != n for a in inputs):
        raise fastlayers.errors.ShapeError(f"inputs have different batch sizes: {[len(a) for a in inputs]}")
    batch = args.batch_size or n
    steps = max(1, -(-n // batch))
    progress = Progress(steps, "run") if steps > 1 else None
    outputs: list[list[np.ndarray]] = []
    with fastlayers.use_ops(args.backend):
        for step in range(steps):
            chunk = [a[step * batch:(step + 1) * batch] for a in inputs]
            out = model(chunk if len(chunk) > 1 else chunk[0])
            outputs.append(out if isinstance(out, list) else [out])
            if progress:
                progress.update(step + 1)
    results = [np.concatenate([o[i] for o in outputs]) if outputs else np.zeros(0)
               for i in range(len(outputs[0]))]
    if args.output:
        if len(results) == 1 and not args.output.endswith(".npz"):
            np.save(args.output, results[0])
        else:
            np.savez(args.output, **{f"output_{i}": r for i, r in enumerate(results)})
        print(f"wrote {len(results)} output(s) of shape(s) {[r.shape for r in results]} to {args.output}",
              file=sys.stderr)
    else:
        for i, r in enumerate(results):
            print(f"output {i}: shape {r.shape}")
            print(np.array2string(r[:5], precision=5, suppress_small=True))
    return 0


def cmd_warmup(args) -> int:
    from . import native

    print(f"nothing to compile: fastlayers' kernels were compiled when the package was "
          f"installed (running the {native.isa()} path on {native.get_num_threads()} threads)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastlayers", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="threads for fastlayers' kernels")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "reference", "cuda"])
    parser.add_argument("--version", action="version", version=f"fastlayers {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the bundled models on bundled samples")
    demo.add_argument("--repeats", type=int, default=50, help="timed runs per latency figure")
    demo.set_defaults(func=cmd_demo)
    info = sub.add_parser("info", help="print a model's summary")
    info.add_argument("model")
    info.set_defaults(func=cmd_info)
    run = sub.add_parser("run", help="run a model on .npy inputs")
    run.add_argument("model")
    run.add_argument("--input", action="append", required=True,
                     help=".npy file (repeat once per model input, in order)")
    run.add_argument("--output", help=".npy (one output) or .npz file for the results")
    run.add_argument("--batch-size", type=int, default=None)
    run.set_defaults(func=cmd_run)
    warm = sub.add_parser("warmup", help="nothing to do: kernels are compiled at install")
    warm.set_defaults(func=cmd_warmup)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        from .backends import set_num_threads

        set_num_threads(args.threads)
    try:
        return args.func(args)
    except FastlayersError as e:
        print(f"fastlayers: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
