"""A folder of photos with no poses (in ``images/`` or the folder itself): structure from motion poses them first."""

from __future__ import annotations

from pathlib import Path

from lift3d.data.formats import CaptureFormat, register_format
from lift3d.data.transforms_json import IMAGE_SUFFIXES


def photo_folder(path: Path) -> Path | None:
    """Where the photos of a folder are: ``images/`` when it holds images, else the folder itself (None: none)."""
    for folder in (path / "images", path):
        if folder.is_dir() and any(p.suffix in IMAGE_SUFFIXES for p in folder.iterdir()):
            return folder
    return None


FORMAT = register_format(CaptureFormat(
    name="photos",
    description="a folder of photos alone",
    detect=lambda path: path.is_dir() and photo_folder(path) is not None,
    priority=90,
))
