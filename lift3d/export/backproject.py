"""Colors for surface points taken from renders: project each point into a set of rendered views and
average the color of the views that see it (its depth matches the rendered depth there), weighting
each view by cos^2 of the angle between its ray and the surface normal (the renderer's ``normal`` if
it gives one, else the normal of the rendered depth map), so grazing views count little. Pixels
within one pixel of a silhouette are left out: their color mixes in the background.

Works with any representation that renders (Gaussians, NeRF): ``render_fn(cameras)`` returns the
renderer outputs of CONTRIBUTING.md (``rgb`` [B, H, W, 3], ``depth`` [B, H, W, 1] camera-space z,
``alpha`` [B, H, W, 1]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.cameras import Cameras, w2c_opencv
from lift3d.export.grid import ColorFn

RenderFn = Callable[[Cameras], dict[str, Tensor]]  # cameras -> {"rgb": [B,H,W,3], "depth": [B,H,W,1], "alpha": ...}


class RenderedColors:
    """A color function [N, 3] -> [N, 3] read from renders of ``cameras``, made once up front."""

    def __init__(
        self,
        render_fn: RenderFn,
        cameras: Cameras,
        batch_size: int = 4,
        depth_tolerance: float = 0.02,
        min_alpha: float = 0.5,
        fallback: ColorFn | None = None,
    ) -> None:
        rgb, depth, weight = [], [], []
        with torch.no_grad():
            for start in range(0, len(cameras), batch_size):
                view = cameras[start : start + batch_size]
                out = render_fn(view)
                for key in ("rgb", "depth"):
                    if key not in out:
                        raise KeyError(f"back-projecting colors needs '{key}' from the renderer; it returned {sorted(out)}")
                rgb.append(out["rgb"].detach().float())
                depth.append(out["depth"].detach().float()[..., 0])
                weight.append(view_weights(view, out, min_alpha))
        self.rgb = torch.cat(rgb).permute(0, 3, 1, 2)  # [B, 3, H, W]
        self.depth = torch.cat(depth)  # [B, H, W]
        self.weight = torch.cat(weight)  # [B, H, W]: cos^2 incidence, 0 off the surface and on silhouettes
        self.seen = self.weight > 0
        self.w2c = w2c_opencv(cameras.c2w.float()).to(self.rgb.device)  # [B, 4, 4]
        self.intrinsics = cameras.intrinsics.float().to(self.rgb.device)
        self.width, self.height = cameras.width, cameras.height
        self.depth_tolerance = depth_tolerance  # relative: |z - rendered depth| <= tolerance * z
        self.fallback = fallback  # colors of points no view sees (None: mid gray)

    @torch.no_grad()
    def __call__(self, points: Tensor) -> Tensor:
        """Mean color [N, 3] over the views that see each of ``points`` [N, 3]."""
        device = self.rgb.device
        p = points.to(device).float()
        cam = torch.einsum("bij,nj->bni", self.w2c[:, :3, :3], p) + self.w2c[:, None, :3, 3]  # [B, N, 3] OpenCV
        z = cam[..., 2]
        safe_z = z.clamp_min(1e-8)
        u = self.intrinsics[:, None, 0, 0] * cam[..., 0] / safe_z + self.intrinsics[:, None, 0, 2]
        v = self.intrinsics[:, None, 1, 1] * cam[..., 1] / safe_z + self.intrinsics[:, None, 1, 2]
        col, row = u.floor().long(), v.floor().long()
        inside = (z > 1e-8) & (col >= 0) & (col < self.width) & (row >= 0) & (row < self.height)
        col_c, row_c = col.clamp(0, self.width - 1), row.clamp(0, self.height - 1)
        views = torch.arange(len(self.w2c), device=device)[:, None].expand_as(col_c)
        seen_depth = self.depth[views, row_c, col_c]
        visible = inside & self.seen[views, row_c, col_c] & ((z - seen_depth).abs() <= self.depth_tolerance * z)
        # bilinear color at the projected position (pixel centers at i + 0.5); every tap is on the surface
        grid = torch.stack([u / self.width * 2 - 1, v / self.height * 2 - 1], dim=-1)[:, :, None, :]  # [B, N, 1, 2]
        colors = F.grid_sample(self.rgb, grid, mode="bilinear", padding_mode="border", align_corners=False)[..., 0]  # [B, 3, N]
        weight = torch.where(visible, self.weight[views, row_c, col_c], torch.zeros_like(z))
        total = weight.sum(0)
        out = torch.einsum("bn,bcn->nc", weight, colors) / total.clamp_min(1e-12)[:, None]
        unseen = total <= 0
        if bool(unseen.any()):
            out[unseen] = self.fallback(points[unseen]).to(out) if self.fallback is not None else 0.5
        return out.clamp(0.0, 1.0).to(points.device)


def view_weights(cameras: Cameras, out: dict[str, Tensor], min_alpha: float) -> Tensor:
    """Per-pixel weights [B, H, W] of rendered views: cos^2 between the pixel's ray and the surface normal
    there, 0 where the pixel or one of its 8 neighbors is less opaque than ``min_alpha``."""
    depth = out["depth"].detach().float()[..., 0]
    alpha = out["alpha"].detach().float()[..., 0] if "alpha" in out else torch.ones_like(depth)
    solid = (alpha >= min_alpha).float()[:, None]
    interior = -F.max_pool2d(-solid, kernel_size=3, stride=1, padding=1)[:, 0] > 0.5  # eroded by one pixel
    origins, directions = cameras.rays(normalized=False)  # camera-space z of directions is -1: t is depth
    directions = directions.to(depth)
    if "normal" in out:
        normal = F.normalize(out["normal"].detach().float(), dim=-1)
    else:
        points = origins.to(depth) + depth[..., None] * directions
        dx = F.pad((points[:, :, 2:] - points[:, :, :-2]).permute(0, 3, 1, 2), (1, 1, 0, 0), mode="replicate")
        dy = F.pad((points[:, 2:] - points[:, :-2]).permute(0, 3, 1, 2), (0, 0, 1, 1), mode="replicate")
        normal = F.normalize(torch.cross(dx, dy, dim=1).permute(0, 2, 3, 1), dim=-1)
    cos = (normal * F.normalize(directions, dim=-1)).sum(-1)
    return torch.where(interior, cos * cos, torch.zeros_like(cos))
