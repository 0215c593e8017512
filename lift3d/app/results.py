"""What a run folder holds for the page: its exported assets and videos, the checkpoint an interrupted run
kept, and the error a crashed run logged."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

VIEWER_SUFFIXES = (".glb", ".gltf", ".ply", ".splat", ".obj")  # what the 3D viewer shows, best first
NOT_VIEWED = ("-gaussians.glb",)  # KHR_gaussian_splatting exports (`--format gltf-splat`): downloads, not the mesh viewer's
_EVAL_FOLDER = re.compile(r"^it\d+-(val|test)$")
_TEST_VIDEO = re.compile(r"^it(\d+)-test\.mp4$")



@dataclass
class Results:
    """What a run's ``save/`` holds for the page."""

    model: Path | None  # the asset for the 3D viewer (.glb first, then Gaussian/mesh .ply, ...)
    video: Path | None  # the latest test orbit video
    files: list[Path]  # every exported file (assets and videos), for download


def result_files(run_dir: Path | None) -> Results:
    """Exported assets and videos under ``run_dir/save`` (validation and test frame folders left out)."""
    save = run_dir / "save" if run_dir else None
    if save is None or not save.is_dir():
        return Results(None, None, [])
    files = sorted(
        (p for p in save.rglob("*") if p.is_file() and not p.name.startswith(".") and p.name != "metrics.json"
         and not any(_EVAL_FOLDER.match(part) for part in p.relative_to(save).parts[:-1])),
        key=lambda p: str(p.relative_to(save)),
    )
    videos = [(int(m.group(1)), p) for p in files if (m := _TEST_VIDEO.match(p.name)) and p.parent == save]
    model = None
    for suffix in VIEWER_SUFFIXES:
        candidates = [p for p in files if p.suffix.lower() == suffix and not p.name.endswith(NOT_VIEWED)]
        if candidates:
            model = max(candidates, key=lambda p: p.stat().st_mtime)
            break
    return Results(model, max(videos)[1] if videos else None, files)


_STEP_NAME = re.compile(r"step[=_-]?(\d+)")


def checkpoint_step(path: Path) -> int | None:
    """The training step a checkpoint was written at: from its name (``step0000500.ckpt``), else its
    ``global_step`` (read with weights_only and mmap: the tensors are not loaded); None when unreadable."""
    if match := _STEP_NAME.search(path.stem):
        return int(match.group(1))
    try:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(state["global_step"])
    except Exception:  # a checkpoint being written, truncated or foreign: it does not count as kept
        return None


def kept_checkpoint(run_dir: Path | None) -> tuple[Path, int] | None:
    """The newest checkpoint in ``run_dir/ckpts`` by step (``last.ckpt`` on a tie, as export reads it) and its
    step; None when the run kept none."""
    folder = run_dir / "ckpts" if run_dir else None
    if folder is None or not folder.is_dir():
        return None
    found = [(step, path.name == "last.ckpt", path) for path in folder.glob("*.ckpt") if path.is_file()
             and (step := checkpoint_step(path)) is not None]
    if not found:
        return None
    step, _, path = max(found)
    return path, step


def describe_kept(run_dir: Path | None, step: int | None) -> str:
    """What an interrupted run kept, for the page: the checkpoint (as ckpts/NAME) and its step, or that there is none."""
    kept = kept_checkpoint(run_dir)
    if kept is None:
        return "no checkpoint was kept (the run had not written one yet)"
    path, at = kept
    lost = f"; steps {at + 1} to {step} are lost" if step is not None and step > at else ""
    return f"kept {path.parent.name}/{path.name} (step {at}){lost}"


def error_from_log(path: Path | None, max_bytes: int = 20_000) -> str | None:
    """The error a crashed run reported: its ``lift3d: error:`` line, else the last line (a traceback's)."""
    if path is None or not path.is_file():
        return None
    with open(path, "rb") as handle:
        handle.seek(max(path.stat().st_size - max_bytes, 0))
        lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("lift3d: error:"):
            return line[len("lift3d: error:"):].strip()
    return lines[-1] if lines else None
