"""The package version (read by pyproject.toml and written into saved files)."""

__version__ = "0.1.0"
