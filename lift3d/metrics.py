"""Image quality metrics as pure functions on [B, H, W, C] tensors in 0..1."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def psnr(prediction: Tensor, target: Tensor) -> Tensor:
    """Peak signal-to-noise ratio in dB per image [B] (peak 1.0)."""
    mse = ((prediction - target) ** 2).flatten(1).mean(dim=1)
    return -10.0 * torch.log10(mse.clamp_min(1e-10))


def _gaussian_window(size: int, sigma: float, channels: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    coords = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def ssim(prediction: Tensor, target: Tensor, window_size: int = 11, sigma: float = 1.5) -> Tensor:
    """Structural similarity per image [B] (Gaussian window 11, sigma 1.5, as 3DGS and most papers)."""
    x = prediction.permute(0, 3, 1, 2)
    y = target.permute(0, 3, 1, 2)
    channels = x.shape[1]
    window = _gaussian_window(window_size, sigma, channels, x.device, x.dtype)
    pad = window_size // 2

    def blur(t: Tensor) -> Tensor:
        return F.conv2d(t, window, padding=pad, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    sigma_x = blur(x * x) - mu_x**2
    sigma_y = blur(y * y) - mu_y**2
    sigma_xy = blur(x * y) - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * sigma_xy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sigma_x + sigma_y + c2))
    return ssim_map.flatten(1).mean(dim=1)
