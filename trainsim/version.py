"""The installed trainsim version, recorded in every result."""

from __future__ import annotations

from importlib import metadata


def _installed_version() -> str:
    """The version of the installed ``trainsim`` distribution (pyproject.toml), or
    ``"0+unknown"`` when the sources run without being installed."""
    try:
        return metadata.version("trainsim")
    except metadata.PackageNotFoundError:
        return "0+unknown"


#: The trainsim version (importlib.metadata).
VERSION = _installed_version()
