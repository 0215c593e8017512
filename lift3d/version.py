"""The package version (one place: the facade, the CLI and lift3d info read it)."""

__version__ = "0.1.0"
