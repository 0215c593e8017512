"""Image editors for editing a reconstruction: ``edit(render, photo) -> edited`` on [B, H, W, 3] images in 0..1.

An editor turns the current render of a training view into that view's new training target, given the
view's original photo (Instruct-NeRF2NeRF's iterative dataset update). ``instruct-pix2pix`` does it with a
diffusion model and a text instruction; ``analytic-edit`` is its offline twin: a fixed color transform of
the photo (a 3x3 matrix and an offset), optionally blended with the render, so the editing loop runs and
can be measured with no weights at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded
from lift3d.registry import register

# a warm metallic tint: the analytic stand-in for "make it look like bronze" (rows: output r, g, b)
BRONZE_MATRIX = [[0.50, 0.40, 0.20], [0.30, 0.35, 0.15], [0.10, 0.15, 0.10]]
BRONZE_OFFSET = [0.10, 0.05, 0.0]


@dataclass
class EditorConfig:
    """What every editor has."""

    prompt: str = ""  # the edit instruction, e.g. "make it look like bronze" (lift3d edit sets it)


class Editor(BaseModule):
    """Base of editors: ``edit(render, photo, generator) -> [B, H, W, 3]`` in 0..1, no gradients."""

    Config = EditorConfig

    def edit(self, render: Tensor, photo: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The edited view [B, H, W, 3] from the current render and the original photo (both [B, H, W, 3])."""
        raise NotImplementedError


def color_transform(images: Tensor, matrix: Tensor, offset: Tensor) -> Tensor:
    """``clamp(M rgb + b, 0, 1)`` per pixel: images [..., 3], matrix [3, 3] (rows are output channels), offset [3]."""
    return (images @ matrix.to(images).T + offset.to(images)).clamp(0, 1)


@dataclass
class AnalyticEditConfig(EditorConfig):
    matrix: list = field(default_factory=lambda: [list(row) for row in BRONZE_MATRIX])  # 3x3 color matrix (rows: output r, g, b)
    offset: list = field(default_factory=lambda: list(BRONZE_OFFSET))  # added after the matrix (RGB, 0..1)
    render_blend: float = bounded(0.0, low=0, high=1)  # weight of the current render in the edit (0: the transformed photo alone)


@register("analytic-edit")
class AnalyticEditor(Editor):
    """The offline editor: the transformed photo, blended with the render by ``render_blend``."""

    Config = AnalyticEditConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        matrix, offset = torch.tensor(self.cfg.matrix, dtype=torch.float32), torch.tensor(self.cfg.offset, dtype=torch.float32)
        if matrix.shape != (3, 3) or offset.shape != (3,):
            raise ValueError(f"analytic-edit needs a 3x3 matrix and 3 offsets, got {list(matrix.shape)} and {list(offset.shape)}")
        self.register_buffer("matrix", matrix, persistent=False)
        self.register_buffer("offset", offset, persistent=False)

    @torch.no_grad()
    def edit(self, render: Tensor, photo: Tensor, generator: torch.Generator | None = None) -> Tensor:
        edited = color_transform(photo.float(), self.matrix, self.offset)
        blend = self.cfg.render_blend
        return edited if blend == 0 else (1 - blend) * edited + blend * render.float().clamp(0, 1)
