"""Export file names, one rule for every export, so that no two exports write the same file.

A run's exports are ``<stem><ending>`` with the stem ``it<step>`` and one ending per format (``file_endings``): each
format has its own ending, so the formats of one run never meet (the mesh ``it1000.glb`` and the Gaussians
``it1000-gaussians.glb``). A file converted by ``lift3d export FILE`` is written beside it, and its stem carries
the source's format (``converted_stem``): ``model.sog`` -> ``model-sog-gaussians.ply`` and ``model.splat`` ->
``model-splat-gaussians.ply``; a run's ``it1000-gaussians.ply`` -> ``it1000-gaussians-ply.glb`` (not the run's
``it1000-gaussians.glb``); ``it1000.spz`` -> ``it1000-spz-gaussians.ply`` (not the run's full-precision
``it1000-gaussians.ply``). Exporting the same source again rewrites its own earlier exports, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from lift3d.registry import EXPORT_FORMAT, entries, find


def file_endings() -> dict[str, str]:
    """format -> what follows the stem in its file's name (the obj's .mtl and texture .png take the stem too): each
    registered export format's ``ending`` (``lift3d.export.formats``)."""
    return {name: record.ending for name, record in entries(EXPORT_FORMAT).items()}


def export_name(stem: str, fmt: str) -> str:
    """The file name of format ``fmt`` for exports named ``stem``."""
    return f"{stem}{find(fmt, EXPORT_FORMAT).ending}"


def converted_stem(source: str | Path) -> str:
    """The stem of the files converted from ``source``: its own stem and its format (``model.sog`` -> ``model-sog``),
    so conversions of two files that share a stem, and a run's own exports beside them, keep apart."""
    source = Path(source)
    return f"{source.stem}-{source.suffix.lower().lstrip('.')}" if source.suffix else source.name
