"""The one source of symalg's version (pyproject.toml reads it statically; ``symalg.__version__`` re-exports it)."""

__version__ = "0.1.0"
