"""The layer-graph model and what serves every kind of model.

- ``graph.py``: ``Model``, ``Sequential``, ``Input``, ``model_from_json``: a graph of
  ``fastlayers.layers`` and its run plan;
- ``folding.py``: plan rewrites that fold layers together (embedding folds);
- ``summary.py``: ``Model.summary``'s table;
- ``placement.py``: ``model.to(device)``;
- ``warmup.py``: the warm-up run at load, and its one rule, for layer graphs and ONNX graphs alike.

Nothing is imported here, so that importing ``fastlayers.model.warmup`` (an ONNX load does) does
not import the layers.
"""
