"""Gaussian splatting front-end: ``rasterize(gaussians, cameras, ...)`` with a torch or gsplat backend.

``backend="auto"`` uses gsplat on CUDA tensors when it is installed and builds, else the pure-PyTorch
rasterizer; the choice (and any fallback) is logged once. Both give the same images and gradients
(tests/render/splats/test_parity.py checks it on a GPU).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from lift3d.base import Configurable
from lift3d.cameras import Cameras
from lift3d.config import ConfigError, bounded, choice
from lift3d.registry import register
from lift3d.render.splats.distributed import rasterize_distributed_torch
from lift3d.render.splats.gsplat_backend import gsplat_available, rasterize_gsplat
from lift3d.render.splats.torch_backend import rasterize_torch

log = logging.getLogger("lift3d.render.splats.renderer")
BACKENDS = ("auto", "torch", "gsplat")
RASTERIZE_MODES = ("classic", "antialiased")
_logged: set[str] = set()
_gsplat_broken: list[str] = []  # the error of a failed gsplat build, once seen


class SplatSource(Protocol):
    """What ``rasterize`` reads from a Gaussian model: activated parameters."""

    means: Tensor  # [N, 3]
    quats: Tensor  # [N, 4] wxyz, any norm
    scales: Tensor  # [N, 3] positive
    opacities: Tensor  # [N] in (0, 1)
    sh: Tensor  # [N, K, 3] SH coefficients, DC first


@dataclass
class Splats:
    """A plain bundle of activated Gaussian parameters (anything with these attributes works)."""

    means: Tensor  # [N, 3]
    quats: Tensor  # [N, 4]
    scales: Tensor  # [N, 3]
    opacities: Tensor  # [N]
    sh: Tensor  # [N, K, 3]


def _log_once(message: str, level: int = logging.INFO) -> None:
    if message not in _logged:
        _logged.add(message)
        log.log(level, message)


def choose_backend(backend: str, device: torch.device) -> str:
    """Resolve ``auto`` to ``gsplat`` (CUDA and gsplat importable and not failed) or ``torch``."""
    if backend not in BACKENDS:
        raise ValueError(f"splat backend must be one of {', '.join(BACKENDS)}, got '{backend}'")
    if backend == "gsplat":
        if device.type != "cuda":
            raise ValueError("the gsplat backend needs CUDA tensors; use backend: torch (or auto) on this device")
        if not gsplat_available():
            raise ValueError("backend: gsplat was asked for but gsplat is not installed: pip install 'lift3d[gpu]'")
        return "gsplat"
    if backend == "torch":
        return "torch"
    if device.type == "cuda" and gsplat_available() and not _gsplat_broken:
        _log_once("splat rasterizer: gsplat (CUDA)")
        return "gsplat"
    reason = "no CUDA device" if device.type != "cuda" else (
        "gsplat failed to build" if _gsplat_broken else "gsplat is not installed")
    _log_once(f"splat rasterizer: pure PyTorch ({reason})")
    return "torch"


def _backgrounds(background: Tensor | None, n: int, channels: int, like: Tensor) -> tuple[Tensor, Tensor | None]:
    """(per-camera colors [B, D], background image [B, H, W, D] or None) from any accepted form."""
    if background is None:
        return like.new_zeros(n, channels), None
    background = background.to(like)
    if background.ndim == 4:
        return like.new_zeros(n, channels), background
    return background.expand(n, channels) if background.ndim == 1 else background, None


def rasterize(
    gaussians: SplatSource,
    cameras: Cameras,
    width: int | None = None,
    height: int | None = None,
    background: Tensor | None = None,
    sh_degree: int | None = None,
    *,
    colors: Tensor | None = None,
    backend: str = "auto",
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    chunk_elements: int = 1 << 22,
    save_elements: int = 1 << 26,
    absgrad: bool = False,
    with_depth: bool = True,
    isect_capacity: int = 0,
    rasterize_mode: str = "classic",
    distributed: bool = False,
) -> dict[str, Tensor]:
    """Render B views of N Gaussians.

    Returns ``rgb`` [B, H, W, 3] over ``background`` ([3], [B, 3] or an image [B, H, W, 3]; default
    black), ``alpha`` [B, H, W, 1], ``depth`` [B, H, W, 1] (expected camera z, 0 where empty),
    ``radii`` [B, N, 2] int32 (0: not visible) and ``means2d`` [B, N, 2] pixels (its ``.grad`` after
    backward is the image-space gradient densification uses). Colors come from the SH coefficients
    at ``sh_degree`` (default: all of them), or from ``colors`` [N, 3] / [B, N, 3] when given.
    ``width``/``height`` default to the cameras' own size; other sizes scale the intrinsics.
    ``with_depth=False`` leaves ``depth`` out (a training step that does not read it skips its channel).
    ``isect_capacity`` > 0 (gsplat only): the tile intersections go into that many fixed slots, so the render waits
    on nothing and can be captured in a CUDA graph; ``isect_count`` then says how many there were (more: dropped).
    ``absgrad``: after backward ``means2d.absgrad`` holds the per-pixel gradients' absolute values summed (AbsGS).
    ``rasterize_mode="antialiased"``: Mip-Splatting's 2D filter (opacity x sqrt(det(cov2d) / det(cov2d + eps2d I))).
    ``distributed``: ``gaussians`` are this rank's shard and ``cameras`` its own views (as many on every rank): every rank
    renders its views from the Gaussians of all ranks (gsplat's ``distributed=True``, or its PyTorch twin
    ``render.splats.distributed``); ``means2d`` and ``radii`` are then [C_all, N, 2], this rank's Gaussians in every
    rank's cameras.
    """
    if rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {', '.join(RASTERIZE_MODES)}, got '{rasterize_mode}'")
    width, height = width or cameras.width, height or cameras.height
    if (width, height) != (cameras.width, cameras.height):
        cameras = cameras.resized(width, height)
    means = gaussians.means
    device, B = means.device, len(cameras)
    cameras = cameras.to(device)
    if colors is None:
        sh = gaussians.sh
        sh_degree = round(sh.shape[-2] ** 0.5) - 1 if sh_degree is None else sh_degree
        features = sh
    else:
        features, sh_degree = colors, None
    bg_colors, bg_image = _backgrounds(background, B, features.shape[-1] if colors is not None else 3, means)
    viewmats = cameras.w2c_opencv()  # world-to-camera in OpenCV axes (precomputed, or no solver and no GPU sync)
    args = (means, gaussians.quats, gaussians.scales, gaussians.opacities, features, viewmats,
            cameras.intrinsics, width, height, bg_colors)
    kwargs: dict[str, Any] = {"sh_degree": sh_degree, "near_plane": near_plane, "far_plane": far_plane, "eps2d": eps2d}
    chosen = choose_backend(backend, device)
    if distributed and absgrad:
        raise ValueError("absolute gradients (AbsGS) do not go with sharded Gaussians: set system.densify.absgrad=false "
                         "or system.shard_gaussians=false")
    out = None
    if chosen == "gsplat":
        try:
            out = rasterize_gsplat(*args, **kwargs, absgrad=absgrad, with_depth=with_depth, rasterize_mode=rasterize_mode,
                                   capacity=0 if distributed else isect_capacity, distributed=distributed)
        except Exception as error:  # a JIT build that fails (no compiler, no CUDA toolkit) falls back once
            if backend == "gsplat":
                raise RuntimeError(f"gsplat rasterization failed: {error}") from error
            _gsplat_broken.append(str(error))
            _log_once(f"splat rasterizer: gsplat failed ({str(error).splitlines()[0][:200]}); using pure PyTorch",
                      logging.WARNING)
    if out is None:  # the torch rasterizers always composite depth
        torch_rasterizer = rasterize_distributed_torch if distributed else rasterize_torch
        extra = {} if distributed else {"absgrad": absgrad}
        out = torch_rasterizer(*args, **kwargs, tile_size=tile_size, chunk_elements=chunk_elements,
                               save_elements=save_elements, rasterize_mode=rasterize_mode, **extra)
        with_depth_channel = True
    else:
        with_depth_channel = with_depth
    render, alpha = out["render"], out["alpha"]
    rgb = render[..., :-1] if with_depth_channel else render
    if bg_image is not None:
        rgb = rgb + (1 - alpha) * bg_image
    means2d = out["means2d"]
    if means2d.requires_grad:
        means2d.retain_grad()
    result = {"rgb": rgb, "alpha": alpha, "radii": out["radii"], "means2d": means2d}
    if "isect_count" in out:
        result["isect_count"] = out["isect_count"]
    if with_depth:
        result["depth"] = render[..., -1:] / alpha.clamp_min(1e-6)
    return result


@dataclass
class SplatRendererConfig:
    """Options of the Gaussian rasterizer."""

    backend: str = choice("auto", among=BACKENDS)  # auto (gsplat on CUDA when installed, else torch), torch or gsplat
    near_plane: float = bounded(0.01, low=0)  # Gaussians with camera z below this are culled
    far_plane: float = bounded(1e10, above=0)  # ... and above this
    eps2d: float = bounded(0.3, low=0)  # low-pass dilation added to the 2D covariance (pixels^2), as 3DGS
    tile_size: int = bounded(16, low=1)  # torch backend: tile side in pixels (results do not depend on it; 8 is faster on CPU)
    chunk_elements: int = bounded(4194304, low=1)  # torch backend: pixel x Gaussian pairs processed at once (memory bound)
    save_elements: int = bounded(67108864, low=0)  # torch backend: pairs whose intermediates are kept for backward
    absgrad: bool = False  # also accumulate absolute image-space gradients (AbsGS; densify.absgrad turns it on for growing)
    # classic, or antialiased (Mip-Splatting's 2D filter: opacity compensated for eps2d)
    rasterize_mode: str = choice("classic", among=RASTERIZE_MODES)


@register("splat-rasterizer")
class SplatRenderer(Configurable):
    """``rasterize`` with options from config: ``renderer(gaussians, cameras, background, sh_degree)``."""

    Config = SplatRendererConfig
    distributed = False  # set by a system whose Gaussians are sharded over ranks: every render is collective

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.near_plane >= c.far_plane:
            raise ConfigError(f"system.renderer.near_plane must be below far_plane ({c.far_plane}), got {c.near_plane}: "
                              "e.g. system.renderer.near_plane=0.01")

    def __call__(self, gaussians: SplatSource, cameras: Cameras, background: Tensor | None = None,
                 sh_degree: int | None = None, **kwargs: Any) -> dict[str, Tensor]:
        c = self.cfg
        options = {"backend": c.backend, "near_plane": c.near_plane, "far_plane": c.far_plane, "eps2d": c.eps2d,
                   "tile_size": c.tile_size, "chunk_elements": c.chunk_elements, "save_elements": c.save_elements,
                   "absgrad": c.absgrad, "rasterize_mode": c.rasterize_mode, "distributed": self.distributed, **kwargs}
        return rasterize(gaussians, cameras, background=background, sh_degree=sh_degree, **options)
