"""Image quality metrics as pure functions on [B, H, W, C] tensors in 0..1."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def psnr(prediction: Tensor, target: Tensor) -> Tensor:
    """Peak signal-to-noise ratio in dB per image [B] (peak 1.0)."""
    mse = ((prediction - target) ** 2).flatten(1).mean(dim=1)
    return -10.0 * torch.log10(mse.clamp_min(1e-10))


_windows: dict[tuple, Tensor] = {}


def _gaussian_window(size: int, sigma: float, channels: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The [channels, 1, size, size] normalised Gaussian kernel, built once per shape, device and dtype (a training
    loss calls SSIM every step; rebuilding it cost seven small kernel launches each time)."""
    key = (size, sigma, channels, device, dtype)
    window = _windows.get(key)
    if window is None:
        coords = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
        g = torch.exp(-(coords**2) / (2 * sigma**2))
        g = g / g.sum()
        window = _windows[key] = (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()
    return window


def ssim(prediction: Tensor, target: Tensor, window_size: int = 11, sigma: float = 1.5) -> Tensor:
    """Structural similarity per image [B] (Gaussian window 11, sigma 1.5, as 3DGS and most papers).

    The five local means (x, y, x^2, y^2, xy) are one grouped convolution over the stacked maps."""
    x = prediction.permute(0, 3, 1, 2)
    y = target.permute(0, 3, 1, 2)
    channels = x.shape[1]
    maps = torch.cat([x, y, x * x, y * y, x * y], dim=1)
    window = _gaussian_window(window_size, sigma, 5 * channels, maps.device, maps.dtype)
    mu_x, mu_y, mean_xx, mean_yy, mean_xy = F.conv2d(maps, window, padding=window_size // 2, groups=5 * channels).split(channels, 1)
    sigma_x = mean_xx - mu_x**2
    sigma_y = mean_yy - mu_y**2
    sigma_xy = mean_xy - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * sigma_xy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sigma_x + sigma_y + c2))
    return ssim_map.flatten(1).mean(dim=1)
