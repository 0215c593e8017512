"""Surfel rendering front end: ``rasterize_surfels(surfels, cameras, ...)`` with a torch or gsplat backend, and the
``surfel-rasterizer`` part.

``backend="auto"`` uses gsplat's ``rasterization_2dgs`` on CUDA tensors when gsplat is installed and builds, else the
pure-PyTorch rasterizer (``render.surfels.torch_backend``); the choice and any fallback are logged once. Both give the
same images, depths, normals and gradients (tests/render/surfels/test_parity_gpu.py checks it on a GPU).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.base import Configurable
from lift3d.cameras import Cameras
from lift3d.config import ConfigError, bounded, choice
from lift3d.registry import register
from lift3d.render.splats.gsplat_backend import gsplat_available
from lift3d.render.splats.renderer import SplatSource
from lift3d.render.surfels.gsplat_backend import rasterize_surfels_gsplat
from lift3d.render.surfels.project import FILTER_INV_SQUARE
from lift3d.render.surfels.torch_backend import rasterize_surfels_torch

log = logging.getLogger("lift3d.render.surfels")
BACKENDS = ("auto", "torch", "gsplat")
SURFACE_DEPTHS = ("expected", "median")
GSPLAT_TILE_SIZE = 16  # the tile side gsplat's 2DGS kernels are written and tested for (the torch one is free)
_logged: set[str] = set()
_gsplat_broken: list[str] = []  # the error of a failed gsplat build, once seen


def _log_once(message: str, level: int = logging.INFO) -> None:
    if message not in _logged:
        _logged.add(message)
        log.log(level, message)


def choose_backend(backend: str, device: torch.device, low_pass: float = FILTER_INV_SQUARE) -> str:
    """Resolve ``auto`` to ``gsplat`` (CUDA, gsplat importable and not failed, the 2DGS filter) or ``torch``."""
    if backend not in BACKENDS:
        raise ValueError(f"surfel backend must be one of {', '.join(BACKENDS)}, got '{backend}'")
    if low_pass != FILTER_INV_SQUARE:  # gsplat's kernel fixes the filter
        if backend == "gsplat":
            raise ValueError(f"low_pass {low_pass:g}: gsplat's rasterization_2dgs fixes its low-pass filter at "
                             f"{FILTER_INV_SQUARE:g}; use low_pass: {FILTER_INV_SQUARE:g} or backend: torch (or auto)")
        if device.type == "cuda":
            _log_once(f"surfel rasterizer: pure PyTorch (low_pass {low_pass:g}; gsplat's kernel has only "
                      f"{FILTER_INV_SQUARE:g})")
            return "torch"
    if backend == "gsplat" and device.type != "cuda":
        raise ValueError("the gsplat backend needs CUDA tensors; use backend: torch (or auto) on this device")
    if backend == "gsplat" and not gsplat_available():
        raise ValueError("backend: gsplat was asked for but gsplat is not installed: pip install 'lift3d[gpu]'")
    if backend != "auto":
        return backend
    if device.type == "cuda" and gsplat_available() and not _gsplat_broken:
        _log_once("surfel rasterizer: gsplat rasterization_2dgs (CUDA)")
        return "gsplat"
    reason = "no CUDA device" if device.type != "cuda" else "gsplat failed to build" if _gsplat_broken else \
        "gsplat is not installed"
    _log_once(f"surfel rasterizer: pure PyTorch ({reason})")
    return "torch"


def normals_from_depth(depth: Tensor, cameras: Cameras) -> Tensor:
    """World-space unit normals [B, H, W, 3] of a z-depth map [B, H, W, 1] seen by ``cameras``: the cross product of
    the central differences of its points down and across (facing the camera), 0 on the border row and column."""
    origins, directions = cameras.rays(normalized=False)  # camera-space z of the directions is -1: points at z-depth
    points = origins.to(depth) + depth * directions.to(depth)  # [B, H, W, 3]
    down = points[:, 2:, 1:-1] - points[:, :-2, 1:-1]
    across = points[:, 1:-1, 2:] - points[:, 1:-1, :-2]
    normal = F.normalize(torch.linalg.cross(down, across, dim=-1), dim=-1)
    return F.pad(normal, (0, 0, 1, 1, 1, 1))


def _backgrounds(background: Tensor | None, n: int, channels: int, like: Tensor) -> tuple[Tensor, Tensor | None]:
    """(per-camera colors [B, D], background image [B, H, W, D] or None) from None, [D], [B, D] or [B, H, W, D]."""
    if background is None:
        return like.new_zeros(n, channels), None
    background = background.to(like)
    if background.ndim == 4:
        return like.new_zeros(n, channels), background
    return (background.expand(n, channels) if background.ndim == 1 else background), None


def rasterize_surfels(
    surfels: SplatSource,
    cameras: Cameras,
    background: Tensor | None = None,
    sh_degree: int | None = None,
    *,
    colors: Tensor | None = None,
    backend: str = "auto",
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    tile_size: int = 16,
    chunk_elements: int = 1 << 22,
    save_elements: int = 1 << 26,
    surface_depth: str = "expected",
    low_pass: float = FILTER_INV_SQUARE,
) -> dict[str, Tensor]:
    """Render B views of N surfels (a Gaussian model whose third scale is ignored).

    Returns ``rgb`` [B, H, W, 3] over ``background``, ``alpha``, ``depth`` (expected camera z, 0 where empty),
    ``median_depth`` (0 where empty) and ``distortion`` [B, H, W, 1], ``normal`` [B, H, W, 3] (world, sum w n),
    ``surface_normal`` [B, H, W, 3] (of the ``surface_depth`` map: expected or median), ``radii`` [B, N, 2],
    ``means2d`` [B, N, 2] and ``densify_grad`` [B, N, 2] (filled by the backward pass: what densification reads).
    Colors come from the SH coefficients at ``sh_degree`` (default: all), or ``colors`` [N, 3] / [B, N, 3]."""
    if surface_depth not in SURFACE_DEPTHS:
        raise ValueError(f"surface_depth must be expected or median, got {surface_depth!r}")
    means = surfels.means
    device, B = means.device, len(cameras)
    cameras = cameras.to(device)
    if colors is None:
        features = surfels.sh
        sh_degree = round(features.shape[-2] ** 0.5) - 1 if sh_degree is None else sh_degree
    else:
        features, sh_degree = colors, None
    bg_colors, bg_image = _backgrounds(background, B, features.shape[-1] if colors is not None else 3, means)
    args = (means, surfels.quats, surfels.scales, surfels.opacities, features, cameras.w2c_opencv(), cameras.intrinsics,
            cameras.width, cameras.height, bg_colors)
    options: dict[str, Any] = {"sh_degree": sh_degree, "near_plane": near_plane, "far_plane": far_plane,
                               "radius_clip": radius_clip}
    out = None
    if choose_backend(backend, device, low_pass) == "gsplat":
        try:
            out = rasterize_surfels_gsplat(*args, **options, tile_size=GSPLAT_TILE_SIZE)
        except Exception as error:  # a JIT build that fails (no compiler, no CUDA toolkit) falls back once
            if backend == "gsplat":
                raise RuntimeError(f"gsplat rasterization_2dgs failed: {error}") from error
            _gsplat_broken.append(str(error))
            _log_once(f"surfel rasterizer: gsplat failed ({str(error).splitlines()[0][:200]}); using pure PyTorch",
                      logging.WARNING)
    if out is None:
        out = rasterize_surfels_torch(*args, **options, tile_size=tile_size, chunk_elements=chunk_elements,
                                      save_elements=save_elements, low_pass=low_pass)
    alpha = out["alpha"]
    rgb = out["render"] if bg_image is None else out["render"] + (1 - alpha) * bg_image
    depth = out["depth_sum"] / alpha.clamp_min(1e-6)
    surface = depth if surface_depth == "expected" else out["median"]
    return {"rgb": rgb, "alpha": alpha, "depth": depth, "median_depth": out["median"], "normal": out["normal"],
            "surface_normal": normals_from_depth(surface, cameras), "distortion": out["distortion"],
            "radii": out["radii"], "means2d": out["means2d"], "densify_grad": out["densify_grad"]}


@dataclass
class SurfelRendererConfig:
    """Options of the surfel rasterizer."""

    # auto (gsplat's rasterization_2dgs on CUDA when installed, else torch), torch or gsplat
    backend: str = choice("auto", among=BACKENDS)
    near_plane: float = bounded(0.01, low=0)  # surfels with camera z below this are culled
    far_plane: float = bounded(1e10, above=0)  # ... and above this
    radius_clip: float = bounded(0.0, low=0)  # surfels whose screen box is no larger than this many pixels are skipped
    tile_size: int = bounded(16, low=1)  # torch backend: tile side in pixels (4 or 8 is faster on a CPU; gsplat always uses 16)
    chunk_elements: int = bounded(4194304, low=1)  # torch backend: pixel x surfel pairs processed at once (memory bound)
    # torch backend: renders with more pairs recompute each chunk in the backward pass
    save_elements: int = bounded(67108864, low=0)
    # the depth map whose normals (surface_normal) the normal-consistency term compares the surfels' with: expected or median
    surface_depth: str = choice("expected", among=SURFACE_DEPTHS)
    # the screen-space low-pass filter, sigma_2d = low_pass |pixel - center|^2: 2 is 2DGS's and gsplat's (a 0.7 px wide
    # Gaussian, the only value gsplat's kernel has); larger is sharper: a silhouette of small or edge-on surfels spreads
    # less past the surface, which training would otherwise offset by pulling them inward (torch backend only)
    low_pass: float = bounded(FILTER_INV_SQUARE, above=0)


@register("surfel-rasterizer")
class SurfelRenderer(Configurable):
    """``rasterize_surfels`` with options from config: ``renderer(surfels, cameras, background, sh_degree)``."""

    Config = SurfelRendererConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if not c.near_plane < c.far_plane:
            raise ConfigError(f"system.renderer needs 0 <= near_plane < far_plane, got {c.near_plane} and {c.far_plane}: "
                              "e.g. system.renderer.near_plane=0.01")
        if c.backend == "gsplat" and c.low_pass != FILTER_INV_SQUARE:
            raise ConfigError(f"system.renderer.low_pass={c.low_pass:g} with backend gsplat: gsplat's rasterization_2dgs "
                              f"fixes the filter at {FILTER_INV_SQUARE:g}; set system.renderer.low_pass="
                              f"{FILTER_INV_SQUARE:g}, or system.renderer.backend=torch")

    def __call__(self, surfels: SplatSource, cameras: Cameras, background: Tensor | None = None,
                 sh_degree: int | None = None, with_depth: bool = True, **kwargs: Any) -> dict[str, Tensor]:
        """Render; ``with_depth`` is accepted for the Gaussian systems' calls (surfels always render their depths)."""
        c = self.cfg
        options = {"backend": c.backend, "near_plane": c.near_plane, "far_plane": c.far_plane,
                   "radius_clip": c.radius_clip, "tile_size": c.tile_size, "chunk_elements": c.chunk_elements,
                   "save_elements": c.save_elements, "surface_depth": c.surface_depth, "low_pass": c.low_pass, **kwargs}
        return rasterize_surfels(surfels, cameras, background, sh_degree, **options)
