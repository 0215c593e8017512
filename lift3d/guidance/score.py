"""Diffusion math as pure functions: noise schedules, parameterizations, guidance, the SDS gradient.

Notation: ``alpha_bar`` is the cumulative product of (1 - beta) at a timestep, so the forward process
is ``x_t = sqrt(alpha_bar) x_0 + sqrt(1 - alpha_bar) eps``. Per-sample scalars broadcast as
``[B, 1, 1, 1]`` against image-shaped tensors ``[B, C, H, W]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

WEIGHTINGS = ("sds", "uniform", "fantasia3d", "recon")
PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


def scaled_linear_alphas_cumprod(num_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012) -> Tensor:
    """alpha_bar [T] of Stable Diffusion's "scaled_linear" schedule (betas linear in sqrt), float64."""
    betas = torch.linspace(beta_start**0.5, beta_end**0.5, num_timesteps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0)


def per_sample(values: Tensor, like: Tensor) -> Tensor:
    """Reshape per-sample scalars [B] to broadcast against ``like`` [B, ...], in ``like``'s dtype."""
    return values.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


def add_noise(x0: Tensor, noise: Tensor, alpha_bar: Tensor) -> Tensor:
    """x_t [B, ...] = sqrt(alpha_bar) x0 + sqrt(1 - alpha_bar) noise, with ``alpha_bar`` [B]."""
    a = per_sample(alpha_bar, x0)
    return a.sqrt() * x0 + (1 - a).sqrt() * noise


def to_epsilon(output: Tensor, x_t: Tensor, alpha_bar: Tensor, prediction_type: str) -> Tensor:
    """The noise estimate [B, ...] from a model's ``output`` in its parameterization (scheduler config)."""
    a = per_sample(alpha_bar, x_t)
    if prediction_type == "epsilon":
        return output
    if prediction_type == "v_prediction":  # v = sqrt(a) eps - sqrt(1-a) x0  =>  eps = sqrt(a) v + sqrt(1-a) x_t
        return a.sqrt() * output + (1 - a).sqrt() * x_t
    if prediction_type == "sample":
        return (x_t - a.sqrt() * output) / (1 - a).sqrt()
    raise ValueError(f"unknown prediction_type '{prediction_type}'; expected one of {', '.join(PREDICTION_TYPES)}")


def training_target(x0: Tensor, noise: Tensor, alpha_bar: Tensor, prediction_type: str) -> Tensor:
    """What a model of ``prediction_type`` is trained to output for (x0, noise) at ``alpha_bar``."""
    a = per_sample(alpha_bar, x0)
    if prediction_type == "epsilon":
        return noise
    if prediction_type == "v_prediction":
        return a.sqrt() * noise - (1 - a).sqrt() * x0
    if prediction_type == "sample":
        return x0
    raise ValueError(f"unknown prediction_type '{prediction_type}'; expected one of {', '.join(PREDICTION_TYPES)}")


def predict_x0(x_t: Tensor, eps: Tensor, alpha_bar: Tensor) -> Tensor:
    """The one-step denoised estimate (x_t - sqrt(1 - alpha_bar) eps) / sqrt(alpha_bar)."""
    a = per_sample(alpha_bar, x_t)
    return (x_t - (1 - a).sqrt() * eps) / a.sqrt()


def timestep_weight(alpha_bar: Tensor, weighting: str) -> Tensor:
    """w(t) [B] of the SDS gradient: ``sds`` 1 - alpha_bar (DreamFusion), ``uniform`` 1,
    ``fantasia3d`` sqrt(alpha_bar) (1 - alpha_bar), ``recon`` sqrt((1 - alpha_bar) / alpha_bar) (the gradient of
    MVDream's x0-reconstruction loss 0.5 ||x - x0_hat||^2, since x - x0_hat = sqrt((1 - a) / a) (eps_hat - eps))."""
    if weighting == "sds":
        return 1 - alpha_bar
    if weighting == "uniform":
        return torch.ones_like(alpha_bar)
    if weighting == "fantasia3d":
        return alpha_bar.sqrt() * (1 - alpha_bar)
    if weighting == "recon":
        return ((1 - alpha_bar) / alpha_bar).sqrt()
    raise ValueError(f"unknown weighting '{weighting}'; expected one of {', '.join(WEIGHTINGS)}")


def classifier_free_guidance(eps_uncond: Tensor, eps_cond: Tensor, scale: float) -> Tensor:
    """eps_uncond + scale (eps_cond - eps_uncond)."""
    return eps_uncond + scale * (eps_cond - eps_uncond)


def perp_neg_guidance(eps_uncond: Tensor, eps_pos: Tensor, eps_neg: Tensor, weights: Tensor, scale: float) -> Tensor:
    """Perp-Neg (Armandpour et al. 2023): guidance that removes, per negative prompt, only the part of
    its direction perpendicular to the positive one, so negatives cannot cancel the prompt itself.

    eps_uncond, eps_pos: [B, ...]; eps_neg: [B, K, ...]; weights: [B, K] (>= 0 pushes away).
    Returns eps_uncond + scale (d_pos - sum_k w_k perp_k(d_neg_k)).
    """
    d_pos = (eps_pos - eps_uncond).flatten(1)  # [B, D]
    d_neg = (eps_neg - eps_uncond[:, None]).flatten(2)  # [B, K, D]
    along = (d_neg * d_pos[:, None]).sum(-1, keepdim=True) / (d_pos * d_pos).sum(-1, keepdim=True)[:, None].clamp_min(1e-12)
    perp = d_neg - along * d_pos[:, None]
    guided = d_pos - (weights.to(perp.dtype)[..., None] * perp).sum(1)
    return eps_uncond + scale * guided.reshape(eps_uncond.shape)


def sds_gradient(eps_hat: Tensor, eps: Tensor, weight: Tensor, clip: float = 0.0) -> Tensor:
    """w(t) (eps_hat - eps) [B, ...] in float32, non-finite entries zeroed, optionally clamped to [-clip, clip]."""
    difference = eps_hat.float() - eps.float()
    grad = per_sample(weight.float(), difference) * difference
    grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
    if clip > 0:
        grad = grad.clamp(-clip, clip)
    return grad
