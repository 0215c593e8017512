"""The pure-PyTorch rasterizer against a brute-force per-pixel reference, and its gradients against
plain autograd and finite differences."""

import logging

import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.render.splats import composite as splat_composite
from lift3d.render.splats import renderer as splat
from lift3d.render.splats.renderer import Splats, rasterize
from lift3d.sh import sh_to_color
from tests.splat_reference import render_reference

F64 = torch.float64


def _cameras(n: int, width: int, height: int, dtype=F64) -> Cameras:
    eyes = torch.tensor([[0.3, -3.0, 1.0], [2.5, 1.5, 1.5], [-2.0, 2.0, -0.8]])[:n]
    c2w = look_at(eyes, torch.zeros(n, 3), torch.tensor([0.0, 0.0, 1.0])).to(dtype)
    return Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.8, 0.7, 0.9])[:n], width, height).to(dtype), width, height)


def _scene(n: int, seed: int, opaque: bool = False, dtype=F64, sh_k: int = 16) -> Splats:
    g = torch.Generator().manual_seed(seed)
    means = 0.5 * torch.randn(n, 3, generator=g, dtype=dtype)
    if opaque:  # a thin slab of large, nearly opaque Gaussians: pixels stop early
        means[:, 1] *= 0.2
    scales = (0.25 if opaque else 0.05) + 0.2 * torch.rand(n, 3, generator=g, dtype=dtype)
    low, span = (0.6, 0.39) if opaque else (0.02, 0.97)
    opacities = low + span * torch.rand(n, generator=g, dtype=dtype)
    return Splats(means, torch.randn(n, 4, generator=g, dtype=dtype), scales, opacities,
                  0.4 * torch.randn(n, sh_k, 3, generator=g, dtype=dtype))


def _reference(scene: Splats, cameras: Cameras, background: torch.Tensor, degree: int) -> tuple[np.ndarray, ...]:
    """rgb [C, H, W, 3], alpha [C, H, W], depth [C, H, W] and the number of early-stopped pixels."""
    out_rgb, out_alpha, out_depth, stopped = [], [], [], 0
    w2c = cameras.w2c_opencv()
    for c in range(len(cameras)):
        colors = sh_to_color(degree, scene.sh, scene.means - cameras.c2w[c, :3, 3])  # view-dependent color per Gaussian
        z = (scene.means @ w2c[c, :3, :3].T + w2c[c, :3, 3])[:, 2:]
        rgbz, alpha, s = render_reference(scene.means.numpy(), scene.quats.numpy(), scene.scales.numpy(),
                                          scene.opacities.numpy(), torch.cat([colors, z], 1).numpy(), w2c[c].numpy(),
                                          cameras.intrinsics[c].numpy(), cameras.width, cameras.height,
                                          list(background[c].tolist()) + [0.0])
        out_rgb.append(rgbz[..., :3])
        out_alpha.append(alpha)
        out_depth.append(np.where(alpha > 0, rgbz[..., 3] / np.maximum(alpha, 1e-6), 0.0))
        stopped += s
    return np.stack(out_rgb), np.stack(out_alpha), np.stack(out_depth), stopped


@pytest.fixture
def small_blocks(monkeypatch):
    """Force several depth blocks per tile so early stopping crosses block boundaries."""
    monkeypatch.setattr(splat_composite, "BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(splat_composite, "MIN_BLOCK", 5)


@pytest.mark.parametrize("opaque,tile_size,chunk", [(False, 16, 1 << 22), (False, 4, 2000), (True, 8, 3000), (True, 4, 1 << 22)])
def test_matches_the_brute_force_reference(opaque, tile_size, chunk, small_blocks):
    cameras = _cameras(2, 23, 18)
    scene = _scene(30 if opaque else 50, seed=3, opaque=opaque)
    background = torch.tensor([[0.2, 0.5, 0.9], [1.0, 1.0, 1.0]], dtype=F64)
    out = rasterize(scene, cameras, background=background, sh_degree=2, backend="torch", tile_size=tile_size,
                    chunk_elements=chunk)
    rgb, alpha, depth, stopped = _reference(scene, cameras, background, degree=2)
    assert np.abs(out["rgb"].numpy() - rgb).max() < 1e-10
    assert np.abs(out["alpha"][..., 0].numpy() - alpha).max() < 1e-10
    assert np.abs(out["depth"][..., 0].numpy() - depth).max() < 1e-8
    assert alpha.max() > 0.5 and alpha.min() < 0.01  # objects and empty space in view
    if opaque:
        assert stopped > 50  # the transmittance stop is exercised


def test_float32_matches_the_reference_closely():
    cameras = _cameras(1, 32, 24, torch.float32)
    scene = _scene(60, seed=5, dtype=torch.float32)
    background = torch.tensor([[0.3, 0.3, 0.3]])
    out = rasterize(scene, cameras, background=background, sh_degree=3, backend="torch")
    scene64 = Splats(*(t.double() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)))
    rgb, alpha, _, _ = _reference(scene64, _cameras(1, 32, 24), background.double(), degree=3)
    assert np.abs(out["rgb"].numpy() - rgb).max() < 2e-5
    assert np.abs(out["alpha"][..., 0].numpy() - alpha).max() < 2e-5


def _loss_grads(scene: Splats, cameras: Cameras, background: torch.Tensor, **kw) -> list[torch.Tensor]:
    params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh, background)]
    out = rasterize(Splats(*params[:5]), cameras, background=params[5], sh_degree=3, backend="torch", **kw)
    g = torch.Generator().manual_seed(0)
    loss = sum((out[k] * torch.rand(out[k].shape, generator=g, dtype=out[k].dtype)).sum() for k in ("rgb", "alpha", "depth"))
    loss.backward()
    return [p.grad for p in params] + [out["means2d"].grad]


@pytest.mark.parametrize("opaque", [False, True])
def test_hand_derived_gradients_equal_autograd(opaque, small_blocks):
    cameras = _cameras(3, 29, 21)
    scene = _scene(40, seed=7, opaque=opaque)
    background = torch.rand(3, 3, dtype=F64)
    reference = _loss_grads(scene, cameras, background, tile_size=8, chunk_elements=3000)  # plain autograd below
    splat_mode = {"mode": "autograd"}
    original = splat.rasterize_torch
    splat.rasterize_torch = lambda *a, **k: original(*a, **{**k, **splat_mode})
    try:
        autograd = _loss_grads(scene, cameras, background, tile_size=8, chunk_elements=3000)
    finally:
        splat.rasterize_torch = original
    partial = _loss_grads(scene, cameras, background, tile_size=8, chunk_elements=3000, save_elements=4000)
    names = ["means", "quats", "scales", "opacities", "sh", "background", "means2d"]
    for name, a, b, c in zip(names, reference, autograd, partial):
        scale = b.abs().max()
        assert scale > 0, name
        assert (a - b).abs().max() <= 1e-9 * scale, name  # everything kept for backward
        assert (c - b).abs().max() <= 1e-9 * scale, name  # some blocks recomputed in backward


def test_gradients_match_finite_differences():
    cameras = _cameras(1, 12, 10)
    scene = _scene(6, seed=11)
    scene.scales *= 2.0
    background = torch.tensor([[0.4, 0.2, 0.7]], dtype=F64)
    weights = torch.rand(1, 10, 12, 5, dtype=F64, generator=torch.Generator().manual_seed(1))

    def f(means, quats, log_scales, logit_opacities, sh):
        out = rasterize(Splats(means, quats, log_scales.exp(), torch.sigmoid(logit_opacities), sh), cameras,
                        background=background, sh_degree=1, backend="torch", tile_size=4)
        return (torch.cat([out["rgb"], out["alpha"], out["depth"]], -1) * weights).sum()

    inputs = (scene.means, scene.quats, scene.scales.log(), torch.logit(scene.opacities), scene.sh[:, :4])
    assert torch.autograd.gradcheck(f, [t.clone().requires_grad_() for t in inputs], eps=1e-6, atol=1e-6, rtol=1e-4)


def test_nothing_visible_gives_the_background():
    cameras = _cameras(1, 16, 16)
    scene = _scene(5, seed=1)
    scene.means += torch.tensor([0.0, -20.0, 0.0], dtype=F64)  # behind the camera
    out = rasterize(scene, cameras, background=torch.tensor([0.1, 0.2, 0.3], dtype=F64), backend="torch")
    assert torch.equal(out["alpha"], torch.zeros_like(out["alpha"])) and torch.equal(out["depth"], torch.zeros_like(out["depth"]))
    assert torch.allclose(out["rgb"], torch.tensor([0.1, 0.2, 0.3], dtype=F64).expand_as(out["rgb"]))
    assert out["radii"].shape == (1, 5, 2) and not out["radii"].any()


def test_front_end_options(caplog):
    cameras = _cameras(2, 20, 14)
    scene = _scene(30, seed=2)
    plain = rasterize(scene, cameras, backend="torch")
    image = torch.rand(2, 14, 20, 3, dtype=F64)
    over_image = rasterize(scene, cameras, background=image, backend="torch")
    assert torch.allclose(over_image["rgb"], plain["rgb"] + (1 - plain["alpha"]) * image)
    colors = torch.rand(30, 3, dtype=F64)
    flat = rasterize(scene, cameras, colors=colors, backend="torch")
    assert not torch.allclose(flat["rgb"], plain["rgb"])
    assert torch.allclose(flat["alpha"], plain["alpha"])  # colors do not change coverage
    colors_only = rasterize(scene, cameras, backend="torch", with_depth=False)
    assert "depth" not in colors_only and torch.equal(colors_only["rgb"], plain["rgb"])
    half = rasterize(scene, cameras, width=10, height=7, backend="torch")
    assert half["rgb"].shape == (2, 7, 10, 3)
    with pytest.raises(ValueError, match="backend must be one of"):
        rasterize(scene, cameras, backend="cuda-magic")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        rasterize(scene, cameras, backend="gsplat")
    splat._logged.clear()
    with caplog.at_level(logging.INFO, logger="lift3d.render.splats.renderer"):
        rasterize(scene, cameras, backend="auto")
        rasterize(scene, cameras, backend="auto")
    messages = [r.getMessage() for r in caplog.records if "splat rasterizer" in r.getMessage()]
    assert messages == ["splat rasterizer: pure PyTorch (no CUDA device)"]


def test_densification_gradient_is_on_means2d():
    cameras = _cameras(1, 24, 24, torch.float32)
    scene = _scene(20, seed=4, dtype=torch.float32)
    scene.means.requires_grad_()
    out = rasterize(scene, cameras, backend="torch")
    out["rgb"].sum().backward()
    grad = out["means2d"].grad
    assert grad.shape == (1, 20, 2)
    visible = (out["radii"] > 0).all(-1)
    assert (grad[~visible] == 0).all() and grad[visible].abs().sum() > 0
