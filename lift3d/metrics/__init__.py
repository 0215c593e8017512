"""Image quality metrics as pure functions on [B, H, W, C] tensors in 0..1.

A ``mask`` [B, H, W, 1] (1 = use the pixel) scores each image over its kept pixels only: padding and ignored
pixels (``loss_mask`` of a batch) count for nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def psnr(prediction: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
    """Peak signal-to-noise ratio in dB per image [B] (peak 1.0), over the pixels of ``mask`` when given."""
    if mask is None:
        mse = ((prediction - target) ** 2).flatten(1).mean(dim=1)
    else:
        mask = mask.to(prediction.dtype).expand_as(prediction)
        mse = (((prediction - target) ** 2) * mask).flatten(1).sum(dim=1) / mask.flatten(1).sum(dim=1).clamp_min(1.0)
    return -10.0 * torch.log10(mse.clamp_min(1e-10))


def masked_prediction(prediction: Tensor, target: Tensor, mask: Tensor | None) -> Tensor:
    """``prediction`` where ``mask`` is 1 and ``target`` elsewhere: pixels outside the mask then add no error and
    pass no gradient, also inside a windowed measure (SSIM) whose window straddles the mask's edge."""
    return prediction if mask is None else torch.lerp(target, prediction, mask.to(prediction.dtype))


_taps: dict[tuple, Tensor] = {}


def _gaussian_taps(size: int, sigma: float, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The [size] normalized 1-D Gaussian, built once per shape, device and dtype (a training loss calls SSIM every
    step; rebuilding it cost seven small kernel launches each time)."""
    key = (size, sigma, device, dtype)
    taps = _taps.get(key)
    if taps is None:
        coords = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
        g = torch.exp(-(coords**2) / (2 * sigma**2))
        taps = _taps[key] = g / g.sum()
    return taps


_windows: dict[tuple, Tensor] = {}


def _gaussian_window(size: int, sigma: float, channels: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The [channels, 1, size, size] normalized Gaussian kernel (the outer product of the 1-D one), built once."""
    key = (size, sigma, channels, device, dtype)
    window = _windows.get(key)
    if window is None:
        g = _gaussian_taps(size, sigma, device, dtype)
        window = _windows[key] = (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()
    return window


def gaussian_blur(maps: Tensor, window_size: int = 11, sigma: float = 1.5) -> Tensor:
    """Each channel of ``maps`` [B, C, H, W] blurred by the Gaussian window, zero-padded to the same size: two 1-D
    Triton passes on CUDA at 32 bits (``metrics.ssim_triton``), else one grouped convolution."""
    taps = _gaussian_taps(window_size, sigma, maps.device, maps.dtype)
    if maps.is_cuda and maps.dtype == torch.float32 and not torch.compiler.is_compiling():
        from lift3d.metrics import ssim_triton as metrics_triton

        if metrics_triton.available(maps.device):
            return metrics_triton.SeparableBlur.apply(maps, taps)
    window = _gaussian_window(window_size, sigma, maps.shape[1], maps.device, maps.dtype)
    return F.conv2d(maps, window, padding=window_size // 2, groups=maps.shape[1])


def ssim(prediction: Tensor, target: Tensor, window_size: int = 11, sigma: float = 1.5, mask: Tensor | None = None) -> Tensor:
    """Structural similarity per image [B] (Gaussian window 11, sigma 1.5, as 3DGS and most papers); with ``mask``,
    the mean over its pixels of the map of ``masked_prediction`` against ``target``.

    The five local means (x, y, x^2, y^2, xy) are one blur of the stacked maps."""
    prediction = masked_prediction(prediction, target, mask)
    x = prediction.permute(0, 3, 1, 2)
    y = target.permute(0, 3, 1, 2)
    channels = x.shape[1]
    maps = torch.cat([x, y, x * x, y * y, x * y], dim=1)
    mu_x, mu_y, mean_xx, mean_yy, mean_xy = gaussian_blur(maps, window_size, sigma).split(channels, 1)
    sigma_x = mean_xx - mu_x**2
    sigma_y = mean_yy - mu_y**2
    sigma_xy = mean_xy - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * sigma_xy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sigma_x + sigma_y + c2))
    if mask is None:
        return ssim_map.flatten(1).mean(dim=1)
    weight = mask.to(ssim_map.dtype).permute(0, 3, 1, 2).expand_as(ssim_map)
    return (ssim_map * weight).flatten(1).sum(dim=1) / weight.flatten(1).sum(dim=1).clamp_min(1.0)
