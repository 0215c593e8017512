"""A test-only recipe for the web app: the fit-image system at a watchable pace, exporting a real .glb.

Its export wraps the fitted image around a sphere as vertex colors and writes it with trimesh, so the
app's 3D viewer and download links get a genuine asset without waiting for the real recipes.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lift3d.config.layers import import_plugins
from lift3d.registry import register
from lift3d.saving import OutputSaver

import_plugins([str(Path(__file__).with_name("fit_image.py"))])
fit_image = sys.modules["lift3d_plugin_fit_image"]


@dataclass
class FitMeshConfig(fit_image.FitImageConfig):
    prompt: str = ""  # the page's prompt (kept in the export's name; the fit itself ignores it)
    step_sleep_s: float = 0.0  # pause per training step, so a browser can watch progress advance
    fail_on_build: str = ""  # when set, building the system fails with this message (as an unreachable model would)
    export_formats: list = field(default_factory=lambda: ["glb"])  # formats `lift3d export` writes by default: glb, ply
    sphere_subdivisions: int = 3  # icosphere level of the exported mesh (642 vertices at 3)


def sphere_uv(vertices: np.ndarray) -> np.ndarray:
    """Equirectangular (u, v) in 0..1 of unit-sphere points [N, 3]: u from the azimuth, v from the polar angle."""
    u = np.arctan2(vertices[:, 1], vertices[:, 0]) / (2 * math.pi) + 0.5
    v = np.arccos(np.clip(vertices[:, 2], -1.0, 1.0)) / math.pi
    return np.stack([u, v], axis=-1)


def sample_nearest(image: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """Nearest-pixel colors [N, C] of ``image`` [H, W, C] at ``uv`` [N, 2] in 0..1."""
    h, w = image.shape[:2]
    cols = np.clip(np.floor(uv[:, 0] * w), 0, w - 1).astype(int)
    rows = np.clip(np.floor(uv[:, 1] * h), 0, h - 1).astype(int)
    return image[rows, cols]


@register("test-fit-mesh")
class FitMeshSystem(fit_image.FitImageSystem):
    Config = FitMeshConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        if self.cfg.fail_on_build:
            raise RuntimeError(self.cfg.fail_on_build)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        if self.cfg.step_sleep_s > 0:
            time.sleep(self.cfg.step_sleep_s)
        return super().training_step(batch, batch_idx)

    @torch.no_grad()
    def export(self, saver: OutputSaver, formats: list[str] | None) -> list[Path]:
        import trimesh

        formats = list(formats or self.cfg.export_formats)
        unknown = sorted(set(formats) - {"glb", "ply"})
        if unknown:
            raise ValueError(f"test-fit-mesh exports glb and ply, not {unknown}")
        mesh = trimesh.creation.icosphere(subdivisions=self.cfg.sphere_subdivisions, radius=0.5)
        image = (self.image(self.cfg.resolution).cpu().numpy() * 255).round().astype(np.uint8)
        colors = sample_nearest(image, sphere_uv(np.asarray(mesh.vertices) / 0.5))
        mesh.visual.vertex_colors = np.concatenate([colors, np.full((len(colors), 1), 255, np.uint8)], axis=-1)
        written = []
        for fmt in formats:
            path = saver.path(f"it{self.true_global_step}-export/sphere.{fmt}")
            mesh.export(path, file_type=fmt)
            written.append(path)
        return written
