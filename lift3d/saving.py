"""One helper for everything a run writes under its ``save/`` folder: grids, frames, videos, JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import numpy as np
from torch import Tensor

from lift3d.imaging import hstack_panels, panel_to_rgb, to_numpy_image

Panel = tuple[str, Any]  # (kind, image): kind in rgb, grayscale, depth, normal


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


class OutputSaver:
    """Writes images, grids, videos and files under one folder; returns the paths written."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, name: str) -> Path:
        out = self.root / name
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def image(self, name: str, image: Tensor | np.ndarray) -> Path:
        """One image ([H, W, C] float 0..1 or uint8) as PNG."""
        out = self.path(name)
        iio.imwrite(out, to_numpy_image(image))
        return out

    def grid(self, name: str, panels: list[Panel], mask: Tensor | np.ndarray | None = None) -> Path:
        """Panels side by side (e.g. rgb | normal | depth | opacity) as one PNG."""
        if not panels:
            raise ValueError("an image grid needs at least one panel")
        out = self.path(name)
        iio.imwrite(out, hstack_panels([panel_to_rgb(kind, image, mask) for kind, image in panels]))
        return out

    def video(self, name: str, frames: list[np.ndarray] | list[Tensor], fps: int = 30) -> Path:
        """Frames as an .mp4 (H.264 through imageio-ffmpeg) or .gif, chosen by the name's suffix."""
        if not frames:
            raise ValueError("a video needs at least one frame")
        out = self.path(name)
        arrays = [to_numpy_image(f)[..., :3] for f in frames]
        if out.suffix == ".gif":
            iio.imwrite(out, np.stack(arrays), extension=".gif", duration=1000 / fps, loop=0)
        else:
            # even sizes for yuv420p; macro_block_size=1 keeps the exact size when already even
            h, w = arrays[0].shape[:2]
            arrays = [a[: h - h % 2, : w - w % 2] for a in arrays]
            _write_mp4(out, arrays, fps)
        return out

    def json(self, name: str, obj: Any) -> Path:
        out = self.path(name)
        atomic_write_bytes(out, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
        return out

    def text(self, name: str, text: str) -> Path:
        out = self.path(name)
        atomic_write_bytes(out, text.encode())
        return out


def _write_mp4(path: Path, frames: list[np.ndarray], fps: int) -> None:
    import imageio

    from lift3d.aftercare import require_ffmpeg

    require_ffmpeg()
    with imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", macro_block_size=1,
                            quality=8, pixelformat="yuv420p") as writer:
        for frame in frames:
            writer.append_data(frame)
