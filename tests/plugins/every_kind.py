"""A test-only plugin package's module that adds one extension of every kind, as a third-party package would through
the ``lift3d.modules`` entry point: a part, a capture format (a survey's ``cameras.csv`` beside its photos), a Gaussian
file codec (``.pts``: one Gaussian a line, ``x y z r g b``) and an export format writing that codec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lift3d.base import BaseModule
from lift3d.data.capture import Capture, Frame, Lens, SceneFormatError
from lift3d.data.formats import CaptureFormat, register_format
from lift3d.export.formats import ExportFormat, ExportJob
from lift3d.gaussians.formats.codec import read_file, register_codec, write_file
from lift3d.gaussians.formats.files import save_gaussian_file
from lift3d.gaussians.formats.ply import pruned
from lift3d.registry import EXPORT_FORMAT, register, register_entry
from lift3d.sh import rgb_to_sh, sh_to_rgb

POINT_LOG_SCALE = -4.0  # every .pts Gaussian is a small opaque ball


@register("plugin-every-kind-part")
class PluginPart(BaseModule):
    """A part a config can name by ``*_type``."""


def read_survey(root: Path, downscale: int) -> tuple[Capture, int]:
    """``cameras.csv``: image,width,height,focal,x,y,z a line (cameras looking down -z from x, y, z)."""
    frames = []
    for number, line in enumerate((root / "cameras.csv").read_text().splitlines()[1:], start=2):
        image, width, height, focal, *position = line.split(",")
        if len(position) != 3:
            raise SceneFormatError(f"{root / 'cameras.csv'} line {number}: expected image,width,height,focal,x,y,z")
        c2w = np.eye(4)
        c2w[:3, 3] = [float(v) for v in position]
        w, h = int(width), int(height)
        frames.append(Frame(root / image, c2w, Lens(w, h, float(focal), float(focal), w / 2, h / 2), name=image))
    return Capture(root, "survey-csv", frames), downscale


FORMAT = register_format(CaptureFormat(
    name="survey-csv",
    description="a survey (cameras.csv beside its photos)",
    detect=lambda path: (path / "cameras.csv").is_file(),
    read=read_survey,
    priority=50,  # before a folder of photos alone, which the same folder also is
))


def load_pts(path: str | Path) -> dict[str, torch.Tensor]:
    values = np.loadtxt(read_file(path, ".pts file").decode().splitlines(), dtype=np.float32, ndmin=2).reshape(-1, 6)
    points = torch.from_numpy(values)
    n = len(points)
    return {"means": points[:, :3], "log_scales": torch.full((n, 3), POINT_LOG_SCALE),
            "quats": torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(n, 1), "opacity_logits": torch.full((n,), 4.0),
            "sh0": rgb_to_sh(points[:, 3:])[:, None, :], "shN": torch.zeros(n, 0, 3)}


def save_pts(path: str | Path, params: dict[str, torch.Tensor], keep: torch.Tensor | None = None,
             sh_degree: int | None = None) -> Path:
    params = pruned(params, keep, 0)
    rows = torch.cat([params["means"], sh_to_rgb(params["sh0"][:, 0]).clamp(0, 1)], dim=1).detach().cpu().numpy()
    return write_file(path, "".join(" ".join(f"{v:.6f}" for v in row) + "\n" for row in rows).encode())


register_codec(".pts", load_pts, save_pts, "points as text (x y z r g b)")


def write_points(job: ExportJob, path: Path) -> list[Path]:
    return [save_gaussian_file(path, job.sources.gaussian_params(), keep=job.kept_gaussians())]


register_entry(EXPORT_FORMAT, "pts", ExportFormat("pts", "gaussian_params", "the Gaussians' centers and colors as text",
                                                  ".pts", write_points))
