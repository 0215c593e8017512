"""The analytic multi-view prior: the joint posterior mean over reference tuples against the single-view
posterior over concatenated images, the tuples of views 90 degrees apart, and the mvdream-analytic recipe
reconstructing the sample scene (held-out PSNR up by more than 5 dB)."""

from __future__ import annotations

import math

import pytest
import torch

from lift3d.cameras import spherical_to_position
from lift3d.guidance.analytic import posterior_mean
from lift3d.guidance.analytic_multiview import AnalyticMultiviewGuidance, joint_posterior_mean, reference_tuples
from tests.test_recipes_analytic import COMMON, NERF
from tests.tiny_diffusion import one_thread  # noqa: F401  (fixture)


def test_joint_posterior_equals_the_posterior_over_concatenated_views():
    torch.manual_seed(0)
    tuples = torch.randn(6, 4, 5)  # 6 tuples of 4 views of 5 pixels
    x_t = torch.randn(3, 4, 5)
    alpha_bar = torch.tensor([0.9, 0.5, 0.1])
    log_prior = torch.tensor([[0.0, -math.inf, 0.0, 0.0, -1.0, 0.0]] * 3)
    joint = joint_posterior_mean(x_t, tuples, alpha_bar[:, None].expand(-1, 4), log_prior)
    flat = posterior_mean(x_t.flatten(1), tuples.flatten(1), alpha_bar, log_prior).reshape(3, 4, 5)
    torch.testing.assert_close(joint, flat)
    # each estimate is a convex combination of tuples: one posterior weight vector for all four views
    weights = torch.linalg.lstsq(tuples.flatten(1).T, joint[0].flatten()[:, None]).solution[:, 0]
    assert weights[1].abs() < 1e-4 and torch.isclose(weights.sum(), torch.tensor(1.0), atol=1e-4)


def test_joint_posterior_with_a_noise_level_per_view_by_brute_force():
    torch.manual_seed(1)
    tuples, x_t = torch.randn(5, 4, 3), torch.randn(2, 4, 3)
    alpha_bar = torch.rand(2, 4) * 0.8 + 0.1
    got = joint_posterior_mean(x_t, tuples, alpha_bar)
    for b in range(2):  # p(m | x) ~ prod_v N(x_v; sqrt(a_v) y_mv, (1 - a_v) I)
        log_p = torch.stack([sum(-((x_t[b, v] - alpha_bar[b, v].sqrt() * tuples[m, v]) ** 2).sum() / (2 * (1 - alpha_bar[b, v]))
                                 for v in range(4)) for m in range(5)])
        torch.testing.assert_close(got[b], torch.einsum("m,mvd->vd", torch.softmax(log_p, 0), tuples))


def test_reference_tuples_are_views_90_degrees_apart():
    azimuth = torch.deg2rad(torch.arange(8) * 45.0)
    ring = spherical_to_position(torch.full((8,), 0.3), azimuth, torch.ones(8))
    tuples = reference_tuples(ring, 4, 5.0)
    assert torch.equal(tuples, (torch.arange(8)[:, None] + 2 * torch.arange(4)) % 8)
    # a ring of views 60 degrees apart has no views at 90-degree offsets within 10 degrees
    sparse = spherical_to_position(torch.zeros(6), torch.deg2rad(torch.arange(6) * 60.0), torch.ones(6))
    assert len(reference_tuples(sparse, 4, 10.0)) == 0 and len(reference_tuples(sparse, 4, 31.0)) == 6


def test_guidance_prefers_the_tuple_of_the_rendered_views_and_needs_whole_objects():
    azimuth = torch.deg2rad(torch.arange(8) * 45.0)
    positions = spherical_to_position(torch.zeros(8), azimuth, torch.full((8,), 2.0))
    c2w = torch.eye(4).repeat(8, 1, 1)
    c2w[:, :3, 3] = positions
    images = torch.rand(8, 4, 4, 3)
    guidance = AnalyticMultiviewGuidance({"view_angle_deg": 10.0, "guidance_scale": 1.0}, references=(images, c2w))
    assert guidance.tuple_index.shape == (8, 4)
    batch = {"elevation_deg": torch.zeros(4), "azimuth_deg": torch.tensor([45.0, 135.0, 225.0, 315.0])}
    prior = guidance.tuple_log_prior(batch, 4)
    assert torch.isfinite(prior).sum() == 1 and torch.isfinite(prior[0, 1])  # the tuple starting at reference 1
    # nearly clean renders of that tuple: the denoiser returns it, so the gradient vanishes
    clean = images[[1, 3, 5, 7]].permute(0, 3, 1, 2) * 2 - 1
    t = torch.full((4,), 20)
    a = guidance.alphas_cumprod[t].reshape(-1, 1, 1, 1)
    noise = torch.randn_like(clean)
    eps = guidance.predict_noise(a.sqrt() * clean + (1 - a).sqrt() * noise, t, batch)
    torch.testing.assert_close(eps, noise, atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        guidance.sample_timesteps(6, torch.device("cpu"))


STEPS = 100  # of one object x 4 views: 400 renders (the single-view twins render 200)


@pytest.mark.slow
def test_mvdream_with_the_analytic_prior_reconstructs_the_sample_scene(tmp_path):
    """As tests/test_recipes_analytic.py measures the single-view twins: mean val PSNR before and after."""
    import json

    from lift3d.config import load_config
    from lift3d.data.sample_scene import sample_scene_path
    from lift3d.metrics import psnr
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import build_parts, run_experiment

    recipe = recipe_config("mvdream-analytic")
    overrides = [f"data.reference_scene={sample_scene_path()}", f"output_root={tmp_path}", *COMMON, *NERF, "data.batch_size=4",
                 f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}",
                 f"system.guidance.max_step_percent=[0,0.98,0.3,{STEPS * 3 // 4}]"]
    cfg = load_config(recipe, overrides=overrides)
    datamodule, system = build_parts(cfg)
    torch.manual_seed(cfg.seed)
    views = list(datamodule.val_dataloader())
    assert len(views) == 8
    with torch.no_grad():
        start = sum(float(psnr(system.eval().render(v)["rgb"].clamp(0, 1), v["rgb"])) for v in views) / len(views)
    run_dir = run_experiment("train", cfg, [recipe], overrides)
    final = json.loads((run_dir / "save" / "metrics.json").read_text())["val"]
    assert final["step"] == STEPS and final["views"] == 8
    print(f"mvdream-analytic: val PSNR {start:.2f} -> {final['psnr']:.2f} dB")
    assert final["psnr"] > start + 5.0, (start, final["psnr"])
