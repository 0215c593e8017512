"""SSIM and PSNR against direct computations."""

import torch
import torch.nn.functional as F

from lift3d.metrics import psnr, ssim


def _ssim_by_five_blurs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """SSIM as written in the 3DGS reference: five separate depthwise Gaussian blurs (window 11, sigma 1.5)."""
    x, y = x.permute(0, 3, 1, 2).double(), y.permute(0, 3, 1, 2).double()
    c = x.shape[1]
    coords = torch.arange(11, dtype=torch.float64) - 5
    g = torch.exp(-(coords**2) / (2 * 1.5**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :]).expand(c, 1, 11, 11)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window, padding=5, groups=c)

    mu_x, mu_y = blur(x), blur(y)
    sx, sy, sxy = blur(x * x) - mu_x**2, blur(y * y) - mu_y**2, blur(x * y) - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    m = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sx + sy + c2))
    return m.flatten(1).mean(1)


def test_ssim_equals_five_separate_blurs_with_its_gradient():
    torch.manual_seed(0)
    target = torch.rand(2, 24, 31, 3)
    prediction = (target + 0.2 * torch.randn_like(target)).clamp(0, 1).requires_grad_(True)
    value = ssim(prediction, target)
    reference_input = prediction.detach().clone().requires_grad_(True)
    reference = _ssim_by_five_blurs(reference_input, target)
    assert torch.allclose(value.double(), reference, atol=1e-6)
    value.sum().backward()
    reference.sum().backward()
    assert torch.allclose(prediction.grad, reference_input.grad.float(), atol=1e-6)
    assert torch.allclose(ssim(target, target), torch.ones(2), atol=1e-6)
    assert ssim(target[:, :, :, :1], target[:, :, :, :1]).shape == (2,)  # one channel, another cached window


def test_psnr_of_a_known_error():
    target = torch.zeros(1, 4, 4, 3)
    assert torch.allclose(psnr(target + 0.1, target), torch.tensor([20.0]), atol=1e-4)
