"""The package version, stated once (pyproject.toml reads it)."""

__version__ = "0.1.0"
