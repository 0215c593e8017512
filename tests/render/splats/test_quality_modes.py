"""The rasterizer's quality options: the antialiased mode (Mip-Splatting's 2D filter) and ``absgrad`` (AbsGS).

CPU: the PyTorch rasterizer against the formulas (the compensation against sqrt(det(cov2d) / det(cov2d + eps I)) and
an antialiased render against a classic one with compensated opacities; absgrad against a per-pixel split of the
backward). GPU (``-m gpu``): both against gsplat's kernels.
"""


import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.render.splats.project import covariance_3d, project_gaussians
from lift3d.render.splats.renderer import SplatRenderer, Splats, rasterize
from tests.conftest import require_gpu_and_gsplat


def _scene(n: int = 40, seed: int = 0, device="cpu") -> Splats:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g) * 0.5
    scales = torch.rand(n, 3, generator=g) * 0.05 + 0.002  # some well below a pixel: the filter matters
    opacities = torch.rand(n, generator=g) * 0.9 + 0.05
    return Splats(means.to(device), torch.randn(n, 4, generator=g).to(device), scales.to(device), opacities.to(device),
                  (0.5 * torch.randn(n, 4, 3, generator=g)).to(device))


def _cameras(width: int, height: int, device="cpu") -> Cameras:
    eyes = torch.tensor([[0.3, -3.0, 1.0], [2.5, 1.5, 1.5]])
    c2w = look_at(eyes, torch.zeros(2, 3), torch.tensor([0.0, 0.0, 1.0]))
    return Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.8, 0.7]), width, height), width, height).to(device)


def test_compensation_is_the_mip_splatting_filter():
    scene, cameras = _scene(), _cameras(32, 24)
    viewmats, Ks = cameras.w2c_opencv(), cameras.intrinsics
    covars = covariance_3d(scene.quats, scene.scales)
    eps = 0.3
    proj = project_gaussians(scene.means, covars, scene.opacities, viewmats, Ks, 32, 24, eps2d=eps, antialiased=True)
    plain = project_gaussians(scene.means, covars, scene.opacities, viewmats, Ks, 32, 24, eps2d=0.0)
    a, b, c = plain.conics.double().unbind(-1)  # the undilated covariance is the inverse of its conic
    det_inv = a * c - b * b
    cov_a, cov_b, cov_c = c / det_inv, -b / det_inv, a / det_inv
    expected = torch.sqrt((cov_a * cov_c - cov_b**2) / ((cov_a + eps) * (cov_c + eps) - cov_b**2))
    assert proj.compensations is not None and proj.compensations.shape == (2, 40)
    assert torch.allclose(proj.compensations.double(), expected, rtol=1e-3, atol=1e-5)
    assert float(proj.compensations.min()) < 0.5  # the scene has sub-pixel Gaussians, which the filter dims


def test_antialiased_render_is_classic_with_compensated_opacities():
    scene, cameras = _scene(), _cameras(32, 24)
    out = rasterize(scene, cameras, backend="torch", rasterize_mode="antialiased", tile_size=8)
    covars = covariance_3d(scene.quats, scene.scales)
    proj = project_gaussians(scene.means, covars, scene.opacities, cameras.w2c_opencv(), cameras.intrinsics, 32, 24,
                             antialiased=True)
    for view in range(2):  # one view at a time: each has its own compensation
        dimmed = Splats(scene.means, scene.quats, scene.scales, scene.opacities * proj.compensations[view], scene.sh)
        one = rasterize(dimmed, cameras[view:view + 1], backend="torch", tile_size=8)
        assert torch.allclose(out["rgb"][view], one["rgb"][0], atol=2e-5)
    classic = rasterize(scene, cameras, backend="torch", tile_size=8)
    assert float((classic["alpha"] - out["alpha"]).abs().max()) > 0.01  # the mode changes the picture


def test_antialiased_gradients_flow_through_the_compensation():
    scene, cameras = _scene(12), _cameras(16, 16)
    scales = scene.scales.clone().requires_grad_()
    out = rasterize(Splats(scene.means, scene.quats, scales, scene.opacities, scene.sh), cameras, backend="torch",
                    rasterize_mode="antialiased", tile_size=8)
    out["rgb"].sum().backward()
    assert scales.grad is not None and torch.isfinite(scales.grad).all() and scales.grad.abs().sum() > 0


def test_unknown_rasterize_mode_is_refused():
    from lift3d.config import ConfigError

    with pytest.raises(ValueError, match="rasterize_mode"):
        rasterize(_scene(4), _cameras(8, 8), backend="torch", rasterize_mode="mip")
    with pytest.raises(ConfigError, match="rasterize_mode must be one of classic, antialiased"):
        SplatRenderer({"rasterize_mode": "aa"})


def _absgrad_reference(scene: Splats, cameras: Cameras, weights: torch.Tensor) -> torch.Tensor:
    """sum over pixels of |d (weights_p . rgb_p) / d means2d|: one backward per pixel."""
    params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)]
    out = rasterize(Splats(*params), cameras, backend="torch", tile_size=8)
    B, H, W = out["rgb"].shape[:3]
    total = torch.zeros_like(out["means2d"])
    pixel_terms = (out["rgb"] * weights).sum(-1)
    for b in range(B):
        for y in range(H):
            for x in range(W):
                (g,) = torch.autograd.grad(pixel_terms[b, y, x], out["means2d"], retain_graph=True)
                total += g.abs()
    return total


def test_absgrad_is_the_per_pixel_absolute_gradient_summed():
    scene, cameras = _scene(20, seed=3), _cameras(12, 10)
    weights = torch.randn(2, 10, 12, 3, generator=torch.Generator().manual_seed(1))
    params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)]
    out = rasterize(Splats(*params), cameras, backend="torch", tile_size=8, absgrad=True)
    (out["rgb"] * weights).sum().backward()
    absgrad = out["means2d"].absgrad
    expected = _absgrad_reference(scene, cameras, weights)
    assert absgrad.shape == out["means2d"].shape
    assert torch.allclose(absgrad, expected, rtol=1e-3, atol=1e-6)
    assert float(absgrad.sum()) > float(out["means2d"].grad.abs().sum()) * 1.01  # opposite pixels do not cancel
    assert torch.all(absgrad >= out["means2d"].grad.abs() - 1e-6)


def test_renderer_config_passes_the_options():
    scene, cameras = _scene(10), _cameras(16, 16)
    renderer = SplatRenderer({"backend": "torch", "rasterize_mode": "antialiased", "absgrad": True, "tile_size": 8})
    params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)]
    out = renderer(Splats(*params), cameras)
    out["rgb"].sum().backward()
    assert getattr(out["means2d"], "absgrad", None) is not None
    reference = rasterize(scene, cameras, backend="torch", rasterize_mode="antialiased", tile_size=8)
    assert torch.allclose(out["rgb"].detach(), reference["rgb"], atol=1e-6)


# ----------------------------------------------------------------------------------------------- GPU: against gsplat


def _render(scene: Splats, cameras: Cameras, backend: str, weights: torch.Tensor, **options):
    params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)]
    out = rasterize(Splats(*params), cameras, backend=backend, **options)
    (out["rgb"] * weights).sum().backward()
    return out, params


@pytest.mark.gpu
def test_antialiased_mode_matches_gsplat():
    device = require_gpu_and_gsplat()
    scene, cameras = _scene(3000, seed=5, device=device), _cameras(160, 120, device)
    weights = torch.randn(2, 120, 160, 3, device=device)
    ours, ours_params = _render(scene, cameras, "torch", weights, rasterize_mode="antialiased")
    theirs, their_params = _render(scene, cameras, "gsplat", weights, rasterize_mode="antialiased")
    difference = (ours["rgb"] - theirs["rgb"]).abs()
    assert float(difference.max()) < 1.0 / 255.0 + 1e-4 and float((difference > 1e-4).float().mean()) < 1e-3
    for a, b in zip(ours_params, their_params):
        assert torch.allclose(a.grad, b.grad, rtol=2e-2, atol=2e-3 * float(b.grad.abs().max()))
    fixed = rasterize(scene, cameras, backend="gsplat", rasterize_mode="antialiased", isect_capacity=1 << 20)
    assert torch.allclose(fixed["rgb"], theirs["rgb"].detach(), atol=1e-5)


@pytest.mark.gpu
def test_absgrad_matches_gsplat():
    device = require_gpu_and_gsplat()
    scene, cameras = _scene(3000, seed=6, device=device), _cameras(160, 120, device)
    weights = torch.randn(2, 120, 160, 3, device=device)
    ours, _ = _render(scene, cameras, "torch", weights, absgrad=True)
    theirs, _ = _render(scene, cameras, "gsplat", weights, absgrad=True)
    a, b = ours["means2d"].absgrad, theirs["means2d"].absgrad
    visible = (theirs["radii"] > 0).all(-1)
    assert torch.allclose(a[visible], b[visible], rtol=2e-2, atol=1e-3 * float(b.abs().max()))
