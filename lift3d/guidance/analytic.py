"""The analytic prior: an exact denoiser over a finite set of reference images, so the whole score
distillation path runs with no weights.

If the data distribution is the reference set {y_i} (pixels in -1..1), the noisy image
x_t = sqrt(a) y + sqrt(1 - a) eps has the posterior p(y_i | x_t) proportional to
pi_i exp(-||x_t - sqrt(a) y_i||^2 / (2 (1 - a))), and the MMSE denoiser is its mean: a softmax-weighted
sum of the references, in closed form. The "conditional" prior pi keeps the references whose camera is
within ``view_angle_deg`` of the rendered view (at least the nearest one); the "unconditional" prior is
uniform over all of them, so classifier-free guidance extrapolates from "any view" towards "this view".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.cameras import normalize, spherical_to_position
from lift3d.config import bounded
from lift3d.guidance.base import DistillationConfig, DistillationGuidance
from lift3d.guidance.score import classifier_free_guidance, per_sample, scaled_linear_alphas_cumprod
from lift3d.registry import register


def guided_noise(x_t: Tensor, alpha_bar: Tensor, uncond_mean: Tensor, cond_mean: Tensor, scale: float) -> Tensor:
    """Classifier-free guided noise [B, C, H, W] from the unconditional and conditional clean-image estimates
    (any shape of B x C*H*W elements): eps = (x_t - sqrt(a) x0) / sqrt(1 - a) of each, then guided by ``scale``."""
    a = per_sample(alpha_bar, x_t)
    eps = [(x_t - a.sqrt() * mean.reshape(x_t.shape)) / (1 - a).sqrt() for mean in (uncond_mean, cond_mean)]
    return classifier_free_guidance(eps[0], eps[1], scale)


def posterior_mean(x_t: Tensor, references: Tensor, alpha_bar: Tensor, log_prior: Tensor | None = None) -> Tensor:
    """E[y | x_t] [B, D] for x_t [B, D], references [N, D], alpha_bar [B], log_prior [B, N] (None: uniform)."""
    s = alpha_bar.sqrt()[:, None]
    variance = (1 - alpha_bar)[:, None]
    # -||x_t - s y||^2 / (2 var) up to a per-row constant: (s <x_t, y> - s^2 ||y||^2 / 2) / var
    logits = (s * (x_t @ references.T) - 0.5 * s**2 * references.square().sum(-1)[None]) / variance
    if log_prior is not None:
        logits = logits + log_prior
    return torch.softmax(logits, dim=-1) @ references


@dataclass
class AnalyticConfig(DistillationConfig):
    """An exact denoiser over the images of a posed-image scene folder (NeRF-synthetic layout)."""

    guidance_scale: float = 1.0  # CFG scale between all views (0) and the views near the camera (1); > 1 extrapolates
    root: str = ""  # scene folder with transforms_<split>.json and its images
    split: str = "train"  # which transforms file holds the references
    max_views: int = bounded(-1, low=1, allowed=(-1,), example=100)  # use at most this many references, evenly spread (-1: all)
    exclude_views: list = bounded([], low=0)  # frame indices of the split left out (the image-to-3D twin's input view)
    # read the images downscaled by this integer factor (they are resized to the render size anyway)
    downscale: int = bounded(1, low=1)
    background: list = bounded([1.0, 1.0, 1.0], low=0, high=1, lengths=(3,))  # color the RGBA references are composited on
    # references within this angle of the rendered camera form the conditional set
    view_angle_deg: float = bounded(30.0, low=0, high=180)
    num_train_timesteps: int = bounded(1000, low=1)  # T of the noise schedule (Stable Diffusion's scaled-linear betas)
    beta_start: float = bounded(0.00085, above=0, below=1)  # first beta of the schedule
    beta_end: float = bounded(0.012, above=0, below=1)  # last beta of the schedule


@register("analytic")
class AnalyticGuidance(DistillationGuidance):
    """SDS against the exact posterior mean of a reference image set (pixel space, no weights)."""

    Config = AnalyticConfig

    def __init__(self, cfg: Any = None, references: tuple[Tensor, Tensor] | None = None) -> None:
        """``references`` = (rgb [N,H,W,3] in 0..1, c2w [N,4,4]) replaces reading ``root``."""
        super().__init__(cfg)
        cfg = self.cfg
        if references is None:
            references = self._read_scene()
        rgb, c2w = references
        self.register_buffer("reference_rgb", rgb.float().permute(0, 3, 1, 2).contiguous(), persistent=False)
        self.register_buffer("reference_dirs", normalize(c2w[:, :3, 3].float()), persistent=False)
        self.set_noise_schedule(scaled_linear_alphas_cumprod(cfg.num_train_timesteps, cfg.beta_start, cfg.beta_end))
        self._resized: dict[tuple[int, int, torch.device], Tensor] = {}

    def _read_scene(self) -> tuple[Tensor, Tensor]:
        from lift3d.data.posed_images import read_transforms

        if not self.cfg.root:
            raise ValueError("guidance.root is empty: point the analytic prior at a scene folder with transforms_<split>.json")
        scene = read_transforms(self.cfg.root, self.cfg.split, self.cfg.downscale, self.cfg.max_views)
        keep = torch.tensor([i for i in range(len(scene)) if i not in {int(v) for v in self.cfg.exclude_views}])
        if len(keep) == 0:
            raise ValueError("guidance.exclude_views leaves no reference views")
        rgba = scene.rgba[keep].float() / 255.0
        background = torch.tensor(self.cfg.background, dtype=torch.float32)
        rgb = rgba[..., :3] * rgba[..., 3:] + background * (1 - rgba[..., 3:])
        return rgb, scene.cameras.c2w[keep]

    def references_at(self, height: int, width: int) -> Tensor:
        """The references resized to the render size, flattened: [N, 3*H*W] in -1..1."""
        key = (height, width, self.reference_rgb.device)
        if key not in self._resized:
            images = self.reference_rgb
            if images.shape[-2:] != (height, width):
                images = F.interpolate(images, (height, width), mode="bilinear", align_corners=False, antialias=True)
            self._resized = {key: (images * 2 - 1).flatten(1)}  # keep one size: resolutions only grow
        return self._resized[key]

    def view_dirs(self, batch: dict[str, Any], n: int) -> Tensor:
        """Unit directions [n, 3] from the origin to the rendered cameras."""
        if "cameras" in batch:
            return normalize(batch["cameras"].c2w[:, :3, 3].float().to(self.reference_dirs.device))
        if "elevation_deg" in batch and "azimuth_deg" in batch:
            el = torch.deg2rad(torch.as_tensor(batch["elevation_deg"]).float().reshape(n))
            az = torch.deg2rad(torch.as_tensor(batch["azimuth_deg"]).float().reshape(n))
            return spherical_to_position(el, az, torch.ones_like(el)).to(self.reference_dirs.device)
        raise KeyError("the analytic prior needs 'cameras' (or 'elevation_deg' and 'azimuth_deg') in the batch")

    def conditional_log_prior(self, batch: dict[str, Any], n: int) -> Tensor:
        """[n, N]: 0 for references within view_angle_deg of the view (always the nearest), -inf otherwise."""
        cosine = self.view_dirs(batch, n) @ self.reference_dirs.T
        near = cosine >= math.cos(math.radians(self.cfg.view_angle_deg))
        near |= cosine == cosine.max(dim=-1, keepdim=True).values
        return torch.where(near, 0.0, float("-inf"))

    # ------------------------------------------------------------------ the guidance hooks
    def encode(self, rgb: Tensor) -> Tensor:
        if rgb.shape[-1] != 3:
            raise ValueError(f"the analytic prior takes [B,H,W,3] renders in 0..1, got {tuple(rgb.shape)}")
        return rgb.permute(0, 3, 1, 2) * 2 - 1

    def decode(self, x: Tensor) -> Tensor:
        return (x.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)

    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        n, _, height, width = x_t.shape
        references = self.references_at(height, width)
        alpha_bar = self.alphas_cumprod[t]
        flat = x_t.flatten(1)
        uncond = posterior_mean(flat, references, alpha_bar)
        cond = posterior_mean(flat, references, alpha_bar, self.conditional_log_prior(batch, n))
        return guided_noise(x_t, alpha_bar, uncond, cond, self.cfg.guidance_scale)
