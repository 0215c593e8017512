"""SSIM and PSNR against direct computations."""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from lift3d.metrics import psnr, ssim
from tests.conftest import run_in_triton_interpreter


def _ssim_by_five_blurs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """SSIM as written in the 3DGS reference: five separate depthwise Gaussian blurs (window 11, sigma 1.5)."""
    x, y = x.permute(0, 3, 1, 2).double(), y.permute(0, 3, 1, 2).double()
    c = x.shape[1]
    coords = torch.arange(11, dtype=torch.float64, device=x.device) - 5
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


BLUR_CHECK = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from lift3d.metrics.ssim_triton import SeparableBlur
    torch.manual_seed(0)
    for shape, taps in (((1, 15, 40, 70), [0.05, 0.1, 0.2, 0.3, 0.2, 0.1, 0.05]), ((2, 2, 9, 5), [0.1, 0.3, 0.6])):
        taps = torch.tensor(taps)  # the second set is not symmetric: the gradient must reverse it
        k = len(taps)
        window = (taps[:, None] * taps[None, :]).expand(shape[1], 1, k, k)
        maps = torch.rand(shape, requires_grad=True)
        weights = torch.randn(shape)
        want = F.conv2d(maps, window, padding=k // 2, groups=shape[1])
        (want_grad,) = torch.autograd.grad((want * weights).sum(), maps)
        got = SeparableBlur.apply(maps, taps)
        (got_grad,) = torch.autograd.grad((got * weights).sum(), maps)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got_grad, want_grad, atol=1e-6, rtol=1e-5)
    print("ok")
    """
)


def test_the_triton_blur_and_its_gradient_equal_the_convolution_in_the_interpreter():
    """SSIM's fast path on CUDA, run by Triton's interpreter on the CPU: ragged blocks, a window wider than the
    image, and taps that are not symmetric (the gradient reverses them)."""
    run_in_triton_interpreter(BLUR_CHECK, "the Triton blur")


@pytest.mark.gpu
def test_ssim_on_cuda_takes_the_triton_blur_inside_a_cuda_graph_as_accurate_as_the_convolution():
    """Replayed as a CUDA graph, SSIM on CUDA blurs with the Triton kernels (forward and backward), and its value and
    gradient are as close to a float64 reference as the float32 convolution's."""
    from unittest import mock

    from lift3d.metrics import ssim_triton as metrics_triton

    assert metrics_triton.available(torch.device("cuda"))
    torch.manual_seed(0)
    prediction = torch.rand(1, 400, 400, 3, device="cuda", requires_grad=True)
    target = torch.rand(1, 400, 400, 3, device="cuda")
    (want_grad,) = torch.autograd.grad(_ssim_by_five_blurs(prediction, target).sum(), prediction)
    want = _ssim_by_five_blurs(prediction, target).sum().detach()
    with mock.patch.object(metrics_triton, "available", lambda device: False):
        conv = ssim(prediction, target).sum()
        (conv_grad,) = torch.autograd.grad(conv, prediction)
    static = prediction.detach().clone().requires_grad_(True)
    ssim(static, target).sum().backward()  # compiles the kernels before the capture
    static.grad = None
    with mock.patch.object(metrics_triton, "separable_blur", wraps=metrics_triton.separable_blur) as blur:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            value = ssim(static, target).sum()
            value.backward()
    assert blur.call_count == 2  # the forward blur and its gradient
    graph.replay()
    value_error, conv_error = abs(float(value.detach()) - float(want)), abs(float(conv.detach()) - float(want))
    grad_error = float((static.grad.double() - want_grad).abs().max())
    conv_grad_error = float((conv_grad.double() - want_grad).abs().max())
    assert value_error <= 4 * conv_error + 1e-7, (value_error, conv_error)
    assert grad_error <= 4 * conv_grad_error + 1e-12, (grad_error, conv_grad_error)
