"""The score-distillation loop every guidance shares: timesteps, noising, weighting, gradient injection.

A guidance subclass says how renders become the diffusion model's input space (``encode``/``decode``)
and what its denoiser predicts (``predict_noise``); this base does the rest, identically for Stable
Diffusion SDS, VSD and the analytic prior:

    x = encode(rgb); t ~ [min_step, max_step]; x_t = sqrt(a_t) x + sqrt(1 - a_t) eps
    grad = w(t) (eps_hat(x_t, t) - reference(x_t, t, eps)),   loss = inject_gradient(x, grad)

where ``reference`` is the sampled noise for SDS and the LoRA model's estimate for VSD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice, scheduled, step_count
from lift3d.guidance.inject import inject_gradient
from lift3d.guidance.score import WEIGHTINGS, add_noise, predict_x0, sds_gradient, timestep_weight
from lift3d.schedule import scheduled_value

TIMESTEP_SAMPLING = ("uniform", "linear")


@dataclass
class DistillationConfig:
    """Options of the distillation loop shared by every guidance."""

    guidance_scale: float = bounded(100.0, low=0)  # classifier-free guidance scale (DreamFusion uses 100)
    # w(t), a = alpha_bar: sds (1 - a), uniform (1), fantasia3d (sqrt(a) (1 - a)), recon (sqrt((1-a)/a))
    weighting: str = choice("sds", among=WEIGHTINGS)
    min_step_percent: Any = scheduled(0.02, low=0, high=1)  # lowest timestep as a fraction of T (number or schedule)
    max_step_percent: Any = scheduled(0.98, low=0, high=1)  # highest timestep as a fraction of T (number or schedule)
    # uniform: t ~ U{min..max} per view; linear: t falls from max to min over anneal_steps
    timestep_sampling: str = choice("uniform", among=TIMESTEP_SAMPLING)
    anneal_steps: int = step_count(10000)  # with timestep_sampling=linear: steps over which t goes from max_step to min_step
    grad_clip: Any = scheduled(0.0, low=0)  # clamp each gradient entry to [-c, c] (0: off; number or schedule)


class DistillationGuidance(BaseModule):
    """Base of guidances called as ``guidance(rgb [B,H,W,3], batch) -> {loss_sds, grad_norm, timesteps, ...}``."""

    Config = DistillationConfig
    loss_name = "loss_sds"

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.global_step = 0
        self.register_buffer("alphas_cumprod", torch.zeros(0), persistent=False)

    # ------------------------------------------------------------------ the noise schedule and timesteps
    def set_noise_schedule(self, alphas_cumprod: Tensor) -> None:
        """The model's alpha_bar [T] (from its scheduler config)."""
        self.alphas_cumprod = alphas_cumprod.detach().float().to(self.alphas_cumprod.device)

    @property
    def num_train_timesteps(self) -> int:
        return int(self.alphas_cumprod.shape[0])

    def update_step(self, epoch: int, global_step: int) -> None:
        self.global_step = int(global_step)

    def timestep_range(self) -> tuple[int, int]:
        """(min_step, max_step), inclusive, at the current step."""
        T = self.num_train_timesteps
        lo = float(scheduled_value(self.cfg.min_step_percent, self.global_step))
        hi = float(scheduled_value(self.cfg.max_step_percent, self.global_step))
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError("guidance timestep range must satisfy 0 <= min_step_percent <= max_step_percent <= 1, "
                             f"got {lo}, {hi}")
        return min(int(T * lo), T - 1), min(int(T * hi), T - 1)

    def sample_timesteps(self, n: int, device: torch.device) -> Tensor:
        """Timesteps [n] (long): uniform in the range, or one deterministic value annealed linearly."""
        lo, hi = self.timestep_range()
        if self.cfg.timestep_sampling == "linear":
            frac = min(max(self.global_step / max(self.cfg.anneal_steps, 1), 0.0), 1.0)
            return torch.full((n,), round(hi - (hi - lo) * frac), dtype=torch.long, device=device)
        return torch.randint(lo, hi + 1, (n,), dtype=torch.long, device=device)

    # ------------------------------------------------------------------ what subclasses provide
    def encode(self, rgb: Tensor) -> Tensor:
        """Renders [B,H,W,3] in 0..1 (or latents) -> the model's input space [B,C,h,w], differentiably."""
        raise NotImplementedError

    def decode(self, x: Tensor) -> Tensor:
        """Model-space [B,C,h,w] -> images [B,H,W,3] in 0..1 (for inspection only)."""
        raise NotImplementedError

    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        """The guided noise estimate eps_hat [B,C,h,w] at (x_t, t) for the batch's views (no gradient)."""
        raise NotImplementedError

    def reference_noise(self, x_t: Tensor, t: Tensor, noise: Tensor, batch: dict[str, Any]) -> Tensor:
        """What eps_hat is compared with: the sampled noise (SDS)."""
        return noise

    def after_gradient(self, x: Tensor, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Hook after the gradient is formed, given the detached input (VSD trains its LoRA here)."""
        return {}

    # ------------------------------------------------------------------ the step
    def forward(
        self,
        rgb: Tensor,
        batch: dict[str, Any],
        return_images: bool = False,
        timesteps: Tensor | None = None,
        noise: Tensor | None = None,
    ) -> dict[str, Any]:
        """One distillation step on renders ``rgb`` [B,H,W,C]; ``timesteps`` [B] / ``noise`` fix the draws (tests)."""
        if rgb.ndim != 4:
            raise ValueError(f"guidance input must be [B, H, W, C], got shape {tuple(rgb.shape)}")
        x = self.encode(rgb)
        n = x.shape[0]
        t = self.sample_timesteps(n, x.device) if timesteps is None else timesteps.to(x.device).long().reshape(n)
        noise = torch.randn(x.shape, device=x.device, dtype=torch.float32) if noise is None else noise.to(x.device).float()
        alpha_bar = self.alphas_cumprod[t]
        with torch.no_grad():
            x_t = add_noise(x.detach().float(), noise, alpha_bar)
            eps_hat = self.predict_noise(x_t, t, batch).float()
            reference = self.reference_noise(x_t, t, noise, batch).float()
            clip = float(scheduled_value(self.cfg.grad_clip, self.global_step))
            grad = sds_gradient(eps_hat, reference, timestep_weight(alpha_bar, self.cfg.weighting), clip)
        out: dict[str, Any] = {
            self.loss_name: inject_gradient(x, grad),
            "grad_norm": grad.norm().detach(),
            "timesteps": t,
        }
        out.update(self.after_gradient(x.detach(), batch))
        if return_images:
            with torch.no_grad():
                out["images"] = {"noisy": self.decode(x_t), "denoised": self.decode(predict_x0(x_t, eps_hat, alpha_bar))}
        return out
