"""Checkpoints you can trust: atomic writes (temp file + fsync + rename) and safe loading."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lift3d.saving import atomic_write_bytes


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, truncated, or holds objects that are not plain data."""


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Serialise in memory, then write atomically: an interrupted write leaves the old file intact."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    atomic_write_bytes(Path(path), buffer.getvalue())
    _fsync_dir(Path(path).parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True`` (never unpickles arbitrary objects); clear errors otherwise."""
    path = Path(path).expanduser()
    if not path.is_file():
        hint = ""
        if path.parent.is_dir():
            others = sorted(p.name for p in path.parent.glob("*.ckpt"))
            hint = f" Checkpoints in {path.parent}: {', '.join(others) or 'none'}."
        raise CheckpointError(f"checkpoint not found: {path}.{hint}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"ply\n":
        raise CheckpointError(
            f"{path} is a 3DGS .ply, not a checkpoint: convert or mesh it with `lift3d export {path} --format glb splat "
            f"mp4`, or start a run from its Gaussians with system.gaussians.init=ply system.gaussians.init_path={path}")
    import zipfile

    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not one of ours
        raise CheckpointError(f"{path} is not a readable checkpoint (not a PyTorch checkpoint file: truncated or corrupt?)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path} holds objects that are not plain tensors and numbers, so lift3d will not unpickle it "
            f"(weights_only=True): {str(error).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError) as error:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): {error}") from None


def check_recipe(checkpoint: dict[str, Any], system_type: str, path: str | Path) -> None:
    """Refuse a checkpoint another recipe wrote (lift3d records its system type; older checkpoints are told
    apart by their weight names), naming the fix."""
    written_by = (checkpoint.get("lift3d") or {}).get("system_type")
    if written_by and written_by != system_type:
        raise CheckpointError(f"{path} was written by a {written_by} run, but the config is a {system_type} run: give the "
                              f"config of the run it came from (its configs/parsed.yaml)")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint I/O with atomic writes and ``weights_only`` loading."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint(path, map_location if map_location is not None else "cpu")
