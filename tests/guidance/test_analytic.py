"""The analytic prior: the exact posterior mean against brute force, view-conditional sets, and SDS
driven by it alone pulling random images onto the reference images."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lift3d.cameras import Cameras
from lift3d.data.posed_images import read_transforms
from lift3d.guidance.analytic import AnalyticGuidance, posterior_mean
from tests.tiny_diffusion import one_thread  # noqa: F401  (autouse fixture)


def brute_force_mean(x_t, references, alpha_bar, allowed=None):
    """E[y | x_t] in float64 from explicit Gaussian likelihoods N(x_t; sqrt(a) y_i, (1 - a) I)."""
    out = []
    for b in range(x_t.shape[0]):
        a = alpha_bar[b].double()
        normal = torch.distributions.Normal(a.sqrt() * references.double(), (1 - a).sqrt())
        log_likelihood = normal.log_prob(x_t[b].double()).sum(-1)
        if allowed is not None:
            log_likelihood = torch.where(allowed[b], log_likelihood, torch.tensor(-math.inf, dtype=torch.float64))
        out.append(torch.softmax(log_likelihood, 0) @ references.double())
    return torch.stack(out)


def test_posterior_mean_matches_brute_force():
    torch.manual_seed(0)
    references = torch.rand(5, 12) * 2 - 1
    x_t = torch.randn(4, 12)
    alpha_bar = torch.tensor([0.9, 0.5, 0.1, 0.02])
    allowed = torch.rand(4, 5) > 0.4
    allowed[:, 0] = True
    log_prior = torch.where(allowed, 0.0, float("-inf"))
    torch.testing.assert_close(posterior_mean(x_t, references, alpha_bar).double(), brute_force_mean(x_t, references, alpha_bar),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        posterior_mean(x_t, references, alpha_bar, log_prior).double(), brute_force_mean(x_t, references, alpha_bar, allowed),
        rtol=1e-4, atol=1e-5
    )
    # limits: almost no noise -> the nearest reference; almost all noise -> the plain average
    near = references[2:3] + 0.01
    torch.testing.assert_close(posterior_mean(near * 0.99995**0.5, references, torch.tensor([0.99995])), references[2:3])
    torch.testing.assert_close(posterior_mean(torch.randn(1, 12), references, torch.tensor([1e-9])),
                               references.mean(0, keepdim=True), atol=1e-4, rtol=0)


def scene_guidance(**overrides) -> AnalyticGuidance:
    cfg = {"root": "", "max_views": 12, "downscale": 8, **overrides}
    return AnalyticGuidance(cfg)


@pytest.fixture(scope="module")
def lego(data_dir):
    scene = read_transforms(data_dir / "lego", "train", 8, 12)
    return data_dir / "lego", scene


def test_references_read_from_a_posed_image_folder(lego):
    root, scene = lego
    guidance = scene_guidance(root=str(root), background=[0.0, 1.0, 0.0])
    assert guidance.reference_rgb.shape == (12, 3, 50, 50)
    rgba = scene.rgba[0].float() / 255
    expected = rgba[..., :3] * rgba[..., 3:] + torch.tensor([0.0, 1.0, 0.0]) * (1 - rgba[..., 3:])
    torch.testing.assert_close(guidance.reference_rgb[0].permute(1, 2, 0), expected)
    resized = guidance.references_at(20, 20)
    assert resized.shape == (12, 3 * 20 * 20) and resized.min() >= -1 and resized.max() <= 1
    with pytest.raises(ValueError, match="guidance.root is empty"):
        scene_guidance()


def test_conditional_set_is_the_views_near_the_camera(lego):
    root, scene = lego
    guidance = scene_guidance(root=str(root), view_angle_deg=40.0)
    c2w = scene.cameras.c2w
    log_prior = guidance.conditional_log_prior({"cameras": Cameras(c2w, scene.cameras.intrinsics, 50, 50)}, 12)
    directions = F.normalize(c2w[:, :3, 3], dim=-1)
    angles = torch.rad2deg(torch.acos((directions @ directions.T).clamp(-1, 1)))
    assert torch.equal(log_prior == 0, angles <= 40.0 + 1e-3)
    narrow = scene_guidance(root=str(root), view_angle_deg=0.0)  # still keeps the nearest reference
    single = narrow.conditional_log_prior({"cameras": Cameras(c2w, scene.cameras.intrinsics, 50, 50)}, 12) == 0
    assert torch.equal(single, torch.eye(12, dtype=torch.bool))


def test_cfg_interpolates_between_all_views_and_near_views(lego):
    root, scene = lego
    batch = {"cameras": Cameras(scene.cameras.c2w[:2], scene.cameras.intrinsics[:2], 16, 16)}
    x_t, t = torch.randn(2, 3, 16, 16), torch.tensor([600, 900])
    eps = {}
    for scale in (0.0, 1.0, 3.0):
        eps[scale] = scene_guidance(root=str(root), view_angle_deg=0.0, guidance_scale=scale).predict_noise(x_t, t, batch)
    guidance = scene_guidance(root=str(root), view_angle_deg=0.0)
    references, a = guidance.references_at(16, 16), guidance.alphas_cumprod[t]
    own = posterior_mean(x_t.flatten(1), references, a, torch.where(torch.eye(12, dtype=torch.bool)[:2], 0.0, float("-inf")))
    everything = posterior_mean(x_t.flatten(1), references, a)
    s, sigma = a.sqrt().reshape(2, 1, 1, 1), (1 - a).sqrt().reshape(2, 1, 1, 1)
    torch.testing.assert_close(eps[0.0], (x_t - s * everything.reshape(x_t.shape)) / sigma)
    torch.testing.assert_close(eps[1.0], (x_t - s * own.reshape(x_t.shape)) / sigma)
    torch.testing.assert_close(eps[3.0], eps[0.0] + 3 * (eps[1.0] - eps[0.0]), rtol=1e-4, atol=1e-4)


def distill(guidance: AnalyticGuidance, c2w: torch.Tensor, steps: int = 300, size: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimize a random image batch [B,size,size,3] with the guidance's SDS gradient alone: (start, end)."""
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.randn(c2w.shape[0], size, size, 3))
    start = torch.sigmoid(logits).detach().clone()
    optimizer = torch.optim.Adam([logits], lr=0.05)
    batch = {"cameras": Cameras(c2w, torch.eye(3).expand(c2w.shape[0], 3, 3).clone(), size, size)}
    for step in range(steps):
        guidance.update_step(0, step)
        optimizer.zero_grad()
        guidance(torch.sigmoid(logits), batch)["loss_sds"].backward()
        optimizer.step()
    return start, torch.sigmoid(logits).detach()


def psnr_to_references(images: torch.Tensor, guidance: AnalyticGuidance) -> torch.Tensor:
    """PSNR [B, N] of each image against each reference at the image's size."""
    size = images.shape[1]
    references = (guidance.references_at(size, size).reshape(-1, 3, size, size).permute(0, 2, 3, 1) + 1) / 2
    mse = ((images[:, None] - references[None]) ** 2).mean(dim=(2, 3, 4))
    return -10 * torch.log10(mse)


def test_sds_with_the_analytic_prior_reconstructs_each_view(lego):
    root, scene = lego
    guidance = scene_guidance(root=str(root), view_angle_deg=5.0, guidance_scale=3.0)
    views = torch.tensor([0, 5, 9])
    start, images = distill(guidance, scene.cameras.c2w[views])
    psnr = psnr_to_references(images, guidance)
    assert psnr_to_references(start, guidance).max() < 12
    assert (psnr.argmax(-1) == views).all(), psnr  # each image became its own view ...
    assert (psnr[torch.arange(3), views] > 25).all(), psnr  # ... closely


def test_sds_with_a_wide_conditional_set_lands_on_one_of_its_members(lego):
    root, scene = lego
    guidance = scene_guidance(root=str(root), view_angle_deg=40.0, guidance_scale=1.0)
    c2w = scene.cameras.c2w[[0, 5]]
    _, images = distill(guidance, c2w)
    psnr = psnr_to_references(images, guidance)
    nearest = psnr.argmax(-1)
    allowed = guidance.conditional_log_prior({"cameras": Cameras(c2w, torch.eye(3).expand(2, 3, 3), 24, 24)}, 2) == 0
    assert (psnr.max(-1).values > 25).all(), psnr
    assert allowed[torch.arange(2), nearest].all()
