"""The package's version: its one source (``pyproject.toml`` reads it for the distribution's metadata)."""

__version__ = "0.1.0"
