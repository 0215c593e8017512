"""The mesh renderer: a ``Mesh`` and a ``Cameras`` batch -> the image batch every renderer returns.

Surface color comes, in order of preference, from ``color_fn`` (e.g. a texture field and a material,
evaluated only at covered pixels), the mesh's UV texture, its vertex colors, or ``default_color``; an RGBA texture
or RGBA vertex colors are drawn opaque (their RGB).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.cameras import Cameras, normalize
from lift3d.config import ConfigError, bounded, choice
from lift3d.meshes.mesh import Mesh, face_normals, vertex_normals
from lift3d.meshes.topology import EdgeTopology, edge_topology
from lift3d.registry import register
from lift3d.render.meshes.antialias import antialias
from lift3d.render.meshes.raster import interpolate, rasterize, world_to_clip

ColorFn = Callable[[dict[str, Tensor]], Tensor]


def sample_texture(texture: Tensor, uv: Tensor, mode: str = "bilinear") -> Tensor:
    """Texels [N, C] of ``texture`` [Ht, Wt, C] (row 0 at the top) at ``uv`` [N, 2] ((0, 0) bottom-left),
    clamped at the border; differentiable in both."""
    grid = torch.stack([uv[:, 0] * 2.0 - 1.0, 1.0 - uv[:, 1] * 2.0], dim=-1).view(1, 1, -1, 2).to(texture)
    image = texture.permute(2, 0, 1).unsqueeze(0)
    return F.grid_sample(image, grid, mode=mode, padding_mode="border", align_corners=False)[0, :, 0].transpose(0, 1)


def _background_image(background: Tensor | None, default: list, shape: tuple[int, int, int, int], like: Tensor) -> Tensor:
    """Background [B, H, W, C] from None (the configured color), [C], [B, C] or [B, H, W, C]."""
    batch, height, width, channels = shape
    bg = torch.as_tensor(default if background is None else background).to(like)
    if bg.ndim == 1:
        bg = bg.view(1, 1, 1, -1)
    elif bg.ndim == 2:
        bg = bg.view(bg.shape[0], 1, 1, -1)
    if bg.ndim != 4 or bg.shape[-1] != channels:
        raise ValueError(f"background must be [{channels}], [B, {channels}] or [B, H, W, {channels}], got {tuple(bg.shape)}")
    return bg.expand(batch, height, width, channels)


def _opaque(colors: Tensor) -> Tensor:
    """RGB of RGBA colors [..., 4] (a texture with its alpha channel, glTF's COLOR_0 as VEC4): surfaces are drawn
    opaque, so the image keeps the background's three channels; other channel counts pass through."""
    return colors[..., :3] if colors.shape[-1] == 4 else colors


@dataclass
class MeshRendererConfig:
    near: float = bounded(0.01, above=0)  # near clipping plane distance (scene units)
    far: float = bounded(100.0, above=0)  # far clipping plane distance (scene units)
    antialias: bool = True  # blend colors across silhouette edges (gives gradients to vertex positions there)
    normal_type: str = choice("vertex", "face")  # shading normals: vertex (smooth, area-weighted) or face (flat)
    background_color: list = bounded([1.0, 1.0, 1.0], low=0, high=1)  # background when none is passed
    default_color: list = bounded([0.8, 0.8, 0.8], low=0, high=1)  # surface color with no texture/colors/color_fn
    texture_filter: str = choice("bilinear", "nearest")  # UV texture lookup: bilinear or nearest
    max_candidates: int = bounded(4194304, low=1)  # (triangle, pixel) pairs tested per chunk: bounds rasterizer memory


@register("mesh-rasterizer")
class MeshRenderer(BaseModule):
    """Differentiable rasterization of triangle meshes in plain PyTorch (see ``render.meshes.raster``)."""

    Config = MeshRendererConfig

    def __init__(self, cfg=None) -> None:
        super().__init__(cfg)
        if self.cfg.near >= self.cfg.far:
            raise ConfigError(f"system.renderer.near must be below far ({self.cfg.far}), got {self.cfg.near}: "
                              "e.g. system.renderer.near=0.01")

    def forward(
        self,
        mesh: Mesh,
        cameras: Cameras,
        background: Tensor | None = None,
        color_fn: ColorFn | None = None,
        topology: EdgeTopology | None = None,
    ) -> dict[str, Tensor]:
        """Render ``mesh`` from every camera: ``rgb`` [B,H,W,C], ``alpha`` [B,H,W,1], ``depth`` [B,H,W,1],
        ``normal`` [B,H,W,3] (world space), plus ``face_ids`` [B,H,W] (-1: empty) and ``mask`` [B,H,W,1]
        (hard coverage). ``color_fn`` receives a dict of per-covered-pixel tensors: ``points`` [N,3],
        ``normals`` [N,3] (unit, world), ``view_dirs`` [N,3] (unit, camera to point), ``batch_index`` [N],
        ``face_index`` [N] and ``uv`` [N,2] when the mesh has UVs; it returns colors [N,C].
        ``topology`` caches ``edge_topology(mesh.faces)`` for meshes rendered many times."""
        cfg = self.cfg
        vertices, faces = mesh.vertices, mesh.faces.long()
        height, width, batch = cameras.height, cameras.width, len(cameras)
        cameras = cameras.to(vertices.device)
        clip = world_to_clip(vertices, cameras, cfg.near, cfg.far)
        rast = rasterize(clip, faces, height, width, cfg.max_candidates)
        view = rast.batch_index

        points = interpolate(vertices, rast, faces)
        if cfg.normal_type == "vertex":
            normals = normalize(interpolate(vertex_normals(vertices, faces), rast, faces))
        else:
            normals = face_normals(vertices, faces)[rast.face_index]
        view_dirs = normalize(points - cameras.positions.to(points)[view])
        uv = None
        if mesh.uv is not None:
            uv = interpolate(mesh.uv, rast, faces if mesh.uv_faces is None else mesh.uv_faces.long())

        if color_fn is not None:
            surface = {"points": points, "normals": normals, "view_dirs": view_dirs, "batch_index": view,
                       "face_index": rast.face_index}
            if uv is not None:
                surface["uv"] = uv
            colors = color_fn(surface)
        elif mesh.texture is not None and uv is not None:
            colors = sample_texture(_opaque(mesh.texture), uv, cfg.texture_filter)
        elif mesh.vertex_colors is not None:
            colors = interpolate(_opaque(mesh.vertex_colors), rast, faces)
        else:
            colors = torch.as_tensor(cfg.default_color).to(points).expand(points.shape[0], -1)
        if colors.ndim != 2 or colors.shape[0] != points.shape[0]:
            raise ValueError(f"color_fn must return [N={points.shape[0]}, C] colors, got {tuple(colors.shape)}")
        channels = colors.shape[-1]

        bg = _background_image(background, cfg.background_color, (batch, height, width, channels), points)
        hard = rast.to_image(torch.ones_like(points[:, :1]))
        rgb = rast.to_image(colors) + (1.0 - hard) * bg
        depth = rast.to_image(rast.depth.unsqueeze(-1).to(points))
        normal = rast.to_image(normals)
        if cfg.antialias:
            stacked = antialias(torch.cat([rgb, hard, depth, normal], dim=-1), rast, clip, faces, topology)
            rgb, alpha, depth, normal = stacked.split([channels, 1, 1, 3], dim=-1)
            depth = torch.where(alpha > 1e-6, depth / alpha.clamp_min(1e-6), torch.zeros_like(depth))
        else:
            alpha = hard
        return {"rgb": rgb, "alpha": alpha, "depth": depth, "normal": normal, "face_ids": rast.face_ids(), "mask": hard > 0}


__all__ = ["MeshRenderer", "MeshRendererConfig", "sample_texture", "edge_topology"]
