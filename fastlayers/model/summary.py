"""Text summary of a model: layers, output shapes, parameter counts and connections."""

from __future__ import annotations

from ..arrays import shape_str
from ..layers.input_layer import InputLayer


def _fit(text: str, width: int) -> str:
    return text if len(text) < width else text[: width - 2] + "…"


def model_summary(model, functional: bool, line_length: int = 98) -> str:
    """The table ``Model.summary`` prints; ``functional``: a functional model, not a Sequential
    (which shows no InputLayer and no connections)."""
    cols = [0.33, 0.55, 0.67, 1.0] if functional else [0.45, 0.85, 1.0]
    stops = [int(line_length * c) for c in cols]
    header = ["Layer (type)", "Output Shape", "Param #", "Connected to"][: len(stops)]

    def row(fields):
        line, start = "", 0
        for text, stop in zip(fields, stops):
            line += _fit(str(text), stop - start).ljust(stop - start)
            start = stop
        return line.rstrip()

    lines = [f'Model: "{model.name}"', "=" * line_length, row(header), "=" * line_length]
    seen = set()
    for node in model.graph_spec.nodes:
        layer = node.layer
        if isinstance(layer, InputLayer) and not functional:
            continue
        shapes = [shape_str(t.shape) for t in node.outputs]
        out = shapes[0] if len(shapes) == 1 else "[" + ", ".join(shapes) + "]"
        fields = [
            f"{layer.name} ({type(layer).__name__})",
            out,
            "0 (shared)" if id(layer) in seen else f"{layer.count_params():,}",
        ]
        seen.add(id(layer))
        if functional:
            fields.append(", ".join(f"{p.node.layer.name}[{p.index}]" for p in node.parents) or "-")
        lines.append(row(fields))
    total = model.count_params()
    lines += ["=" * line_length, f"Total params: {total:,} ({total * 4 / 1024:.2f} KB)", "=" * line_length]
    return "\n".join(lines)
