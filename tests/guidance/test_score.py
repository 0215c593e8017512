"""Diffusion math and gradient injection, against diffusers' scheduler and hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from lift3d.guidance.inject import inject_gradient
from lift3d.guidance.score import (
    add_noise,
    classifier_free_guidance,
    perp_neg_guidance,
    predict_x0,
    scaled_linear_alphas_cumprod,
    sds_gradient,
    timestep_weight,
    to_epsilon,
    training_target,
)


def _scheduler(prediction_type: str = "epsilon"):
    from diffusers import DDPMScheduler

    return DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, prediction_type=prediction_type)


def test_schedule_matches_diffusers():
    ours = scaled_linear_alphas_cumprod(1000, 0.00085, 0.012).float()
    torch.testing.assert_close(ours, _scheduler().alphas_cumprod, rtol=1e-6, atol=1e-7)


def test_add_noise_and_targets_match_diffusers():
    scheduler = _scheduler()
    torch.manual_seed(0)
    x0, noise = torch.randn(3, 4, 5, 5), torch.randn(3, 4, 5, 5)
    t = torch.tensor([0, 400, 999])
    alpha_bar = scheduler.alphas_cumprod[t]
    x_t = add_noise(x0, noise, alpha_bar)
    torch.testing.assert_close(x_t, scheduler.add_noise(x0, noise, t))
    torch.testing.assert_close(training_target(x0, noise, alpha_bar, "v_prediction"), scheduler.get_velocity(x0, noise, t))
    # every parameterization of the true (x0, noise) maps back to the true noise and x0
    for kind in ("epsilon", "v_prediction", "sample"):
        eps = to_epsilon(training_target(x0, noise, alpha_bar, kind), x_t, alpha_bar, kind)
        torch.testing.assert_close(eps, noise, rtol=1e-4, atol=2e-4)
    torch.testing.assert_close(predict_x0(x_t, noise, alpha_bar), x0, rtol=1e-4, atol=2e-4)
    with pytest.raises(ValueError, match="prediction_type"):
        to_epsilon(x0, x_t, alpha_bar, "flow")


def test_timestep_weights_by_hand():
    a = torch.tensor([0.25, 0.81])
    torch.testing.assert_close(timestep_weight(a, "sds"), torch.tensor([0.75, 0.19]))
    torch.testing.assert_close(timestep_weight(a, "uniform"), torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(timestep_weight(a, "fantasia3d"), torch.tensor([0.5 * 0.75, 0.9 * 0.19]))
    with pytest.raises(ValueError, match="weighting"):
        timestep_weight(a, "magic")


def test_perp_neg_by_hand():
    u = torch.zeros(1, 2)
    pos = torch.tensor([[1.0, 0.0]])
    parallel = torch.tensor([[[3.0, 0.0]]])  # along the positive direction: no effect
    orthogonal = torch.tensor([[[0.0, 2.0]]])  # fully perpendicular: subtracted with its weight
    mixed = torch.tensor([[[5.0, 1.0]]])  # only its perpendicular part [0, 1] counts
    w = torch.tensor([[0.5]])
    torch.testing.assert_close(perp_neg_guidance(u, pos, parallel, w, 7.0), classifier_free_guidance(u, pos, 7.0))
    torch.testing.assert_close(perp_neg_guidance(u, pos, orthogonal, w, 7.0), torch.tensor([[7.0, -7.0]]))
    torch.testing.assert_close(perp_neg_guidance(u, pos, mixed, w, 2.0), torch.tensor([[2.0, -1.0]]))
    # two negatives add; zero weights give plain CFG
    both = torch.cat([orthogonal, mixed], dim=1)
    torch.testing.assert_close(perp_neg_guidance(u, pos, both, torch.tensor([[1.0, 1.0]]), 1.0), torch.tensor([[1.0, -3.0]]))
    torch.testing.assert_close(perp_neg_guidance(u, pos, both, torch.zeros(1, 2), 3.0), torch.tensor([[3.0, 0.0]]))


def test_sds_gradient_weight_clip_and_nan():
    eps_hat = torch.tensor([[1.0, 4.0, float("nan"), float("inf")], [2.0, -3.0, 0.5, 0.0]]).reshape(2, 1, 1, 4)
    eps = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]).reshape(2, 1, 1, 4)
    w = torch.tensor([0.5, 2.0])
    grad = sds_gradient(eps_hat, eps, w)
    expected = torch.tensor([[0.5, 1.5, 0.0, 0.0], [2.0, -6.0, 1.0, 0.0]]).reshape(2, 1, 1, 4)
    assert torch.equal(grad, expected)
    assert torch.equal(sds_gradient(eps_hat, eps, w, clip=1.2), expected.clamp(-1.2, 1.2))


def test_injected_gradient_is_exact():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    grad = torch.randn(2, 4, 3, 3)
    loss = inject_gradient(x, grad)
    torch.testing.assert_close(loss, 0.5 * grad.square().sum())
    (3.0 * loss).backward()
    assert torch.equal(x.grad, 3.0 * grad)
    with pytest.raises(ValueError, match="shape"):
        inject_gradient(x, grad[:1])


def test_injected_gradient_is_exact_under_grad_scaling():
    torch.manual_seed(0)
    x = torch.nn.Parameter(torch.randn(2, 4, 3, 3))
    grad = torch.randn(2, 4, 3, 3) * 1e-3
    optimizer = torch.optim.SGD([x], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14)
    scaler.scale(inject_gradient(x, grad)).backward()
    assert torch.equal(x.grad, grad * 2.0**14)  # scaled on the way back ...
    scaler.unscale_(optimizer)
    assert torch.equal(x.grad, grad)  # ... and bit-exact after unscaling


def test_injected_gradient_follows_input_dtype():
    x = torch.randn(1, 4, 2, 2).half().requires_grad_()
    grad = torch.randn(1, 4, 2, 2)
    inject_gradient(x, grad).backward()
    assert x.grad.dtype == torch.float16 and torch.equal(x.grad, grad.half())
