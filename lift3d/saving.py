"""One helper for everything a run writes under its ``save/`` folder: grids, frames, videos, JSON; and the rule that
exports never replace a file lift3d did not write.

Inside ``OutputSaver.exporting()`` every file written under the saver's folder (through ``atomic_write_bytes`` or
``OutputSaver.video``: every export writer) is checked first and recorded after: a file already there is replaced
only when lift3d's record of its own exports in that folder (``MANIFEST``: each file's size and SHA-256) says lift3d
wrote it as it is now; anyone else's file, or one edited since, stops that format with ``ForeignFileError`` (one line
naming it) unless the saver was made with ``overwrite=True`` (``lift3d export --overwrite``). Names do not count:
a file called ``it1000.glb`` that someone edited is theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import numpy as np
from torch import Tensor

from lift3d.imaging import hstack_panels, panel_to_rgb, to_numpy_image

Panel = tuple[str, Any]  # (kind, image): kind in rgb, grayscale, depth, normal


MANIFEST = ".lift3d-exports.json"  # lift3d's record of the exports it wrote into a folder


class ForeignFileError(FileExistsError):
    """An export would replace a file that lift3d did not write (or that changed since it did); the message names it."""


class ExportRecord:
    """The files lift3d wrote into ``folder`` (their names relative to it, sizes and SHA-256 digests), kept in
    ``folder / MANIFEST``: how an export tells its own earlier files, which it may replace, from anyone else's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / MANIFEST

    def _files(self) -> dict[str, dict[str, Any]]:
        try:
            files = json.loads(self.path.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            return {}
        return files if isinstance(files, dict) else {}

    def _name(self, path: Path) -> str:
        return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(self.folder))).as_posix()

    def owns(self, path: Path) -> bool:
        """Whether lift3d wrote ``path`` as it is now: recorded, a plain file, of the recorded size and digest."""
        entry = self._files().get(self._name(path))
        if not isinstance(entry, dict) or path.is_symlink() or not path.is_file():
            return False
        return path.stat().st_size == entry.get("size") and _sha256_of(path) == entry.get("sha256")

    def add(self, path: Path, data: bytes | None = None) -> None:
        """Record ``path`` as written by lift3d (``data``: its bytes, when at hand)."""
        digest = hashlib.sha256(data).hexdigest() if data is not None else _sha256_of(path)
        files = self._files()
        files[self._name(path)] = {"size": path.stat().st_size, "sha256": digest}
        record = {"written_by": "lift3d", "files": dict(sorted(files.items()))}
        _replace_bytes(self.path, (json.dumps(record, indent=1) + "\n").encode())


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


class _ExportGuard:
    """The check and the record of one ``OutputSaver.exporting()``: writes under ``root`` only."""

    def __init__(self, root: Path, overwrite: bool) -> None:
        self.root = Path(os.path.abspath(root))
        self.overwrite = overwrite
        self.record = ExportRecord(self.root)

    def governs(self, path: Path) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(self.root)

    def check(self, path: Path) -> None:
        """ForeignFileError when ``path`` holds a file lift3d did not write (and overwriting was not asked for)."""
        if not self.governs(path) or self.overwrite or not os.path.lexists(path) or self.record.owns(path):
            return
        if path.is_dir() and not path.is_symlink():
            raise ForeignFileError(f"{path} is a folder, where an export would write a file: move it away")
        raise ForeignFileError(f"{path} exists and lift3d did not write it (it is not in lift3d's record of its exports, "
                               f"{MANIFEST}, or changed since): move it away, or pass --overwrite to replace it")

    def wrote(self, path: Path, data: bytes | None = None) -> None:
        if self.governs(path):
            self.record.add(path, data)


_EXPORTING: ContextVar[_ExportGuard | None] = ContextVar("lift3d_exporting", default=None)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers never see half a file. Inside
    ``OutputSaver.exporting()``, a file there that lift3d did not write is not replaced (``ForeignFileError``)."""
    guard = _EXPORTING.get()
    if guard is not None:
        guard.check(path)
    _replace_bytes(path, data)
    if guard is not None:
        guard.wrote(path, data)


def _replace_bytes(path: Path, data: bytes) -> None:
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
    """Writes images, grids, videos and files under one folder; returns the paths written. ``overwrite``: exports
    may replace files lift3d did not write (see the module docstring)."""

    def __init__(self, root: str | Path, overwrite: bool = False) -> None:
        self.root = Path(root)
        self.overwrite = overwrite

    @contextlib.contextmanager
    def exporting(self) -> Iterator[None]:
        """Inside: files written under the folder never replace one lift3d did not write, and each is recorded as
        lift3d's (``MANIFEST``), so a later export may replace it."""
        token = _EXPORTING.set(_ExportGuard(self.root, self.overwrite))
        try:
            yield
        finally:
            _EXPORTING.reset(token)

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
        guard = _EXPORTING.get()
        if guard is not None:
            guard.check(out)
        arrays = [to_numpy_image(f)[..., :3] for f in frames]
        if out.suffix == ".gif":
            iio.imwrite(out, np.stack(arrays), extension=".gif", duration=1000 / fps, loop=0)
        else:
            # even sizes for yuv420p; macro_block_size=1 keeps the exact size when already even
            h, w = arrays[0].shape[:2]
            arrays = [a[: h - h % 2, : w - w % 2] for a in arrays]
            _write_mp4(out, arrays, fps)
        if guard is not None:
            guard.wrote(out)
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
