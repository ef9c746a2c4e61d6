"""The report of a benchmark (``BenchReport``): the table ``fastlayers bench`` prints and the
JSON of ``--json`` (``as_dict``, ``SCHEMA``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

#: The ``schema`` entry of ``BenchReport.as_dict``.
SCHEMA = "fastlayers.bench/1"


def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 100 else f"{v:.3f}" if v >= 1 else f"{v:.4f}"


@dataclass
class BenchReport:
    """The figures of ``run_benchmark``: one ``Latency`` per engine and configuration.

    Attributes
    ----------
    model : str
        The model's file (or name).
    kind : str
        The class the file loaded as (``OnnxModel``, ``Model``, ``Sequential``, a module's).
    inputs : list of InputSpec
        The inputs as the model declares them.
    input_shapes : dict
        Batch -> the shapes the inputs were timed at.
    seconds, warmup_s : float
        Timed and warm-up seconds per engine and configuration.
    against : str or None
        The engine compared with (``"onnxruntime"``), or None.
    rtol : float
        The output check's relative tolerance.
    atol : float or None
        Its absolute tolerance (None: ``rtol`` x each output's largest value).
    results : list of Latency
    notes : list of str
        What the figures do not show by themselves (a batch size the model fixes).
    host, versions : dict
        ``host_info()`` and ``versions()``.
    """

    model: str
    kind: str
    inputs: list
    seconds: float
    warmup_s: float
    against: str | None
    rtol: float
    atol: float | None
    results: list = field(default_factory=list)
    input_shapes: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    host: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)

    def table(self) -> str:
        """The report as text.

        Returns
        -------
        str
            The model and its inputs, the host, the method, one row per engine and
            configuration, the output check and the notes.
        """
        h = self.host
        cpu = h.get("cpu") or "unknown CPU"
        engines = ", ".join(f"{k} {v}" for k, v in self.versions.items() if k != "python")
        lines = [
            f"model: {self.model} ({self.kind}; inputs: {'; '.join(s.describe() for s in self.inputs) or 'none'})",
            f"host: {cpu} ({h.get('machine')}, {h.get('usable_cpus')} of {h.get('cpu_count')} "
            f"CPUs usable, fastlayers {h.get('isa')} path); {engines}",
            f"each configuration: {self.warmup_s:g} s warm-up, then {self.seconds:g} s timed "
            f"per engine" + (", engines taking turns call by call" if self.against else ""),
        ]
        for batch, shapes in self.input_shapes.items():
            lines.append(f"batch {batch}: input shapes {', '.join(f'{n} {s}' for n, s in shapes.items())}")
        head = (
            f"{'threads':>7}  {'batch':>5}  {'engine':<12}{'calls':>7}  {'mean ms':>9}  "
            f"{'p50 ms':>9}  {'p90 ms':>9}  {'p99 ms':>9}  {'items/s':>11}"
        )
        if self.against:
            head += f"  {'vs ' + self.against:>15}"
        lines += ["", head, "-" * len(head)]
        for r in self.results:
            row = (
                f"{r.threads:>7}  {r.batch:>5}  {r.engine:<12}{r.calls:>7}  {_ms(r.mean_ms):>9}  "
                f"{_ms(r.p50_ms):>9}  {_ms(r.p90_ms):>9}  {_ms(r.p99_ms):>9}  "
                f"{r.items_per_s:>11,.1f}"
            )
            if self.against:
                row += f"  {(f'{r.ratio:.2f}x' if r.ratio is not None else '-'):>15}"
            lines.append(row)
        if self.against:
            diffs = [r.max_abs_diff for r in self.results if r.max_abs_diff is not None]
            tol = f"rtol {self.rtol:g}, atol " + ("rtol x max |value|" if self.atol is None else f"{self.atol:g}")
            lines += [
                "",
                f"outputs checked against {self.against}'s before timing each "
                f"configuration ({tol}): max |difference| {max(diffs, default=0.0):.3g}",
                f"vs {self.against}: fastlayers' p50 over {self.against}'s (below 1: fastlayers is faster)",
            ]
        if self.notes:
            lines += [""] + [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def as_dict(self) -> dict:
        """The report as plain data (what ``write_json`` writes).

        Returns
        -------
        dict
            ``schema`` (``SCHEMA``), ``model`` {``path``, ``kind``, ``inputs``: [{``name``,
            ``shape``, ``dtype``}]}, ``settings`` {``seconds``, ``warmup_s``, ``threads``,
            ``batch_sizes``, ``input_shapes``, ``against``, ``rtol``, ``atol``}, ``results``
            (``Latency.as_dict()`` of each row), ``notes``, ``host`` and ``versions``.
        """
        return {
            "schema": SCHEMA,
            "model": {
                "path": self.model,
                "kind": self.kind,
                "inputs": [
                    {"name": s.name, "shape": None if s.shape is None else list(s.shape), "dtype": str(s.dtype)}
                    for s in self.inputs
                ],
            },
            "settings": {
                "seconds": self.seconds,
                "warmup_s": self.warmup_s,
                "threads": sorted({r.threads for r in self.results}),
                "batch_sizes": list(self.input_shapes),
                "input_shapes": {
                    str(b): {n: list(s) for n, s in shapes.items()} for b, shapes in self.input_shapes.items()
                },
                "against": self.against,
                "rtol": self.rtol,
                "atol": self.atol,
            },
            "results": [r.as_dict() for r in self.results],
            "notes": list(self.notes),
            "host": dict(self.host),
            "versions": dict(self.versions),
        }

    def write_json(self, path) -> None:
        """Write ``as_dict()`` as JSON.

        Parameters
        ----------
        path : str or Path
            The file to write (its directory must exist).
        """
        Path(path).write_text(json.dumps(self.as_dict(), indent=1) + "\n")
