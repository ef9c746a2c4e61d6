"""Tooling around the benchmarks: the report that renders docs/benchmarks.md, process metrics."""
