"""Densification: clone/split/prune/reset bookkeeping, optimizer-state surgery, the 3DGS schedule."""

import math

import pytest
import torch

from lift3d.gaussians.model import PARAMETER_NAMES, GaussianModel
from lift3d.gaussians.ops import duplicate, remove, reset_opacities, split_gaussians
from lift3d.gaussians.strategies import DefaultStrategy
from lift3d.rotations import quaternion_to_matrix


def _model(n: int = 6, seed: int = 0) -> GaussianModel:
    model = GaussianModel({"sh_degree": 1})
    g = torch.Generator().manual_seed(seed)
    model.initialize(torch.randn(n, 3, generator=g), torch.rand(n, 3, generator=g))
    with torch.no_grad():
        model.opacity_logits.copy_(torch.randn(n, generator=g))
        model.quats.copy_(torch.randn(n, 4, generator=g))
    return model


def _adam_after_a_step(model: GaussianModel, fused: bool = False) -> torch.optim.Adam:
    groups = [{"params": [getattr(model, name)], "name": name, "lr": 0.01 * (i + 1)} for i, name in enumerate(PARAMETER_NAMES)]
    optimizer = torch.optim.Adam(groups, fused=fused)  # fused: what optimizer.fused=auto builds on CUDA
    loss = sum((p * torch.arange(p.numel()).reshape(p.shape)).sum() for p in model.parameters())
    loss.backward()
    optimizer.step()
    return optimizer


def _states(model, optimizer):
    return {name: {k: v.clone() for k, v in optimizer.state[getattr(model, name)].items()} for name in PARAMETER_NAMES}


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_duplicate_and_remove_carry_the_optimizer_state(fused):
    model = _model()
    optimizer = _adam_after_a_step(model, fused)
    before = {name: getattr(model, name).detach().clone() for name in PARAMETER_NAMES}
    states = _states(model, optimizer)
    mask = torch.tensor([True, False, True, False, False, False])
    duplicate(model, optimizer, mask)
    assert len(model) == 8
    for i, name in enumerate(PARAMETER_NAMES):
        p = getattr(model, name)
        assert optimizer.param_groups[i]["params"] == [p] and optimizer.param_groups[i]["lr"] == pytest.approx(0.01 * (i + 1))
        assert torch.equal(p[:6], before[name]) and torch.equal(p[6:], before[name][mask])
        for key in ("exp_avg", "exp_avg_sq"):
            state = optimizer.state[p][key]
            assert torch.equal(state[:6], states[name][key]) and not state[6:].any()
        assert torch.equal(optimizer.state[p]["step"], states[name]["step"])
    assert len(optimizer.state) == len(PARAMETER_NAMES)  # the old parameters left the optimizer

    drop = torch.tensor([False, True, False, False, True, False, False, True])
    remove(model, optimizer, drop)
    assert len(model) == 5
    kept_rows = torch.tensor([0, 2, 3, 5, 6])  # indices into the 8 after duplication
    assert torch.equal(model.means, torch.cat([before["means"], before["means"][mask]])[kept_rows])
    full = torch.cat([states["means"]["exp_avg"], torch.zeros(2, 3)])
    assert torch.equal(optimizer.state[model.means]["exp_avg"], full[kept_rows])
    # the optimizer keeps working on the new parameters
    model.means.grad = torch.ones_like(model.means)
    before_step = model.means.detach().clone()
    optimizer.step()
    assert not torch.equal(model.means, before_step)


def test_split_samples_children_from_the_parent():
    torch.manual_seed(0)
    model = _model(3)
    with torch.no_grad():
        model.log_scales.copy_(torch.log(torch.tensor([[0.1, 0.2, 0.3]])).expand(3, 3))
    optimizer = _adam_after_a_step(model)
    parent_mean, parent_quat = model.means[1].detach().clone(), model.quats[1].detach().clone()
    sh_before, scale_before = model.sh0[1].detach().clone(), model.scales[1].detach().clone()
    split_gaussians(model, optimizer, torch.tensor([False, True, False]), into=2, shrink=1.6)
    assert len(model) == 4
    children = slice(2, 4)
    assert torch.allclose(model.scales[children], scale_before.expand(2, 3) / 1.6)
    assert torch.equal(model.quats[children], parent_quat.expand(2, 4))
    assert torch.equal(model.sh0[children], sh_before.expand(2, 1, 3))
    assert not torch.equal(model.means[2], model.means[3])
    assert ((model.means[children] - parent_mean).norm(dim=-1) < 4 * 0.3).all()
    assert not optimizer.state[model.means]["exp_avg"][children].any()

    # statistically: offsets are drawn from the parent Gaussian N(mean, R S^2 R^T)
    big = _model(1)
    with torch.no_grad():
        big.log_scales.copy_(torch.log(torch.tensor([[0.5, 0.1, 0.2]])))
    rot = quaternion_to_matrix(big.quats)[0]
    mean = big.means[0].detach().clone()
    split_gaussians(big, None, torch.tensor([True]), into=20000, shrink=1.6)
    offsets = (big.means - mean).detach()
    covariance = offsets.T @ offsets / len(offsets)
    expected = rot @ torch.diag(torch.tensor([0.25, 0.01, 0.04])) @ rot.T
    assert torch.allclose(covariance, expected, atol=0.01)


def test_reset_caps_opacity_and_clears_only_its_state():
    model = _model()
    optimizer = _adam_after_a_step(model)
    means = model.means
    reset_opacities(model, optimizer, 0.01)
    assert model.means is means  # other parameters are untouched (and keep their gradients)
    assert (model.opacities <= 0.01 + 1e-6).all()
    assert not optimizer.state[model.opacity_logits]["exp_avg"].any()
    assert optimizer.state[model.means]["exp_avg"].any()


def _render_stats(n: int, grad: torch.Tensor, visible: torch.Tensor, size=(1, 8, 10)) -> dict:
    """A fake render output whose means2d already carries a gradient."""
    B, H, W = size
    means2d = torch.zeros(B, n, 2, requires_grad=True)
    means2d.grad = grad
    radii = visible[..., None].int().expand(B, n, 2) * 3
    return {"means2d": means2d, "radii": radii, "rgb": torch.zeros(B, H, W, 3)}


def test_gradient_statistics_follow_gsplat_normalization():
    strategy = DefaultStrategy()
    grad = torch.tensor([[[0.001, 0.0], [0.0, 0.002], [0.5, 0.5]]])
    visible = torch.tensor([[True, True, False]])
    strategy.update(_render_stats(3, grad, visible, size=(1, 8, 10)))
    strategy.update(_render_stats(3, grad, torch.tensor([[True, False, False]]), size=(1, 8, 10)))
    # pixel gradient x (W/2, H/2) x number of views, accumulated while visible
    assert torch.allclose(strategy.grad2d, torch.tensor([2 * 0.001 * 5, 0.002 * 4, 0.0]))
    assert torch.equal(strategy.count, torch.tensor([2.0, 1.0, 0.0]))
    two_views = DefaultStrategy()
    two_views.update(_render_stats(1, torch.tensor([[[0.001, 0.0]], [[0.001, 0.0]]]), torch.tensor([[True], [True]]),
                                   size=(2, 8, 10)))
    assert torch.allclose(two_views.grad2d, torch.tensor([2 * 0.001 * 5 * 2]))


def test_defaults_are_those_of_3dgs():
    c = DefaultStrategy().cfg
    assert (c.refine_start, c.refine_stop, c.refine_every, c.reset_every) == (500, 15000, 100, 3000)
    assert (c.grow_grad2d, c.min_opacity, c.grow_scale3d, c.prune_scale3d) == (0.0002, 0.005, 0.01, 0.1)


def test_schedule_clones_small_splits_large_prunes_and_resets():
    strategy = DefaultStrategy({"refine_start": 10, "refine_every": 10, "refine_stop": 40, "reset_every": 30})
    model = _model(4)
    with torch.no_grad():
        model.log_scales.copy_(torch.log(torch.tensor([[0.001], [0.5], [0.001], [0.001]])).expand(4, 3))
        model.opacity_logits.copy_(torch.logit(torch.tensor([0.5, 0.5, 0.5, 0.001])))
    optimizer = _adam_after_a_step(model)
    grad = torch.tensor([[[0.001, 0.0], [0.001, 0.0], [1e-6, 0.0], [0.0, 0.0]]])  # x5 normalized: 0.005, 0.005, 5e-6, 0
    strategy.update(_render_stats(4, grad, torch.ones(1, 4, dtype=torch.bool)))
    assert strategy.step(model, optimizer, 10, extent=1.0) == {}  # refine only after refine_start
    report = strategy.step(model, optimizer, 20, extent=1.0)
    # Gaussian 0 (small) cloned, 1 (large: > 0.01 x extent) split in two, 3 pruned (opacity 0.001)
    assert report == {"cloned": 1, "split": 1, "pruned": 1}
    assert len(model) == 4 - 1 + 1 + 2 - 1
    assert strategy.grad2d is None  # statistics restart after refining
    assert all(len(getattr(model, name)) == len(model) for name in PARAMETER_NAMES)
    assert all(optimizer.state[getattr(model, name)]["exp_avg"].shape[0] == len(model) for name in PARAMETER_NAMES)
    report = strategy.step(model, optimizer, 30, extent=1.0)
    assert report.get("reset") == 1 and (model.opacities <= 0.01 + 1e-6).all()
    n = len(model)
    strategy.update(_render_stats(n, torch.ones(1, n, 2), torch.ones(1, n, dtype=torch.bool)))
    assert strategy.step(model, optimizer, 40, extent=1.0) == {}  # nothing from refine_stop on
    assert len(model) == n


def test_size_pruning_after_the_first_reset_and_the_cap():
    strategy = DefaultStrategy({"refine_start": 0, "refine_every": 10, "reset_every": 20, "grow_grad2d": 1e9})
    model = _model(3)
    with torch.no_grad():
        model.log_scales.copy_(torch.log(torch.tensor([[0.05], [0.5], [0.05]])).expand(3, 3))
        model.opacity_logits.fill_(2.0)
    strategy.update(_render_stats(3, torch.zeros(1, 3, 2), torch.ones(1, 3, dtype=torch.bool)))
    assert strategy.step(model, None, 10, extent=1.0)["pruned"] == 0  # before the first reset: kept
    strategy.update(_render_stats(3, torch.zeros(1, 3, 2), torch.ones(1, 3, dtype=torch.bool)))
    assert strategy.step(model, None, 30, extent=1.0)["pruned"] == 1  # larger than 0.1 x extent
    capped = DefaultStrategy({"refine_start": 0, "refine_every": 10, "max_gaussians": 5})
    model = _model(4)
    with torch.no_grad():
        model.log_scales.fill_(math.log(0.001))
        model.opacity_logits.fill_(2.0)
    capped.update(_render_stats(4, torch.tensor([[[1.0, 0], [2.0, 0], [3.0, 0], [4.0, 0]]]), torch.ones(1, 4, dtype=torch.bool)))
    means = model.means.detach().clone()
    assert capped.step(model, None, 10, extent=1.0)["cloned"] == 1
    assert torch.equal(model.means[4], means[3])  # the strongest gradient is the one grown


def test_absgrad_grows_by_the_absolute_gradient_with_its_own_threshold():
    from lift3d.config import ConfigError

    strategy = DefaultStrategy({"absgrad": True, "refine_start": 0, "refine_every": 10, "reset_every": 0})
    model = _model(3)
    with torch.no_grad():
        model.log_scales.fill_(math.log(0.001))
        model.opacity_logits.fill_(0.0)
    optimizer = _adam_after_a_step(model)
    out = _render_stats(3, torch.zeros(1, 3, 2), torch.ones(1, 3, dtype=torch.bool))  # opposite pixels canceled out
    out["means2d"].absgrad = torch.tensor([[[0.0002, 0.0], [0.0001, 0.0], [0.0, 0.0]]])  # x5: 0.001, 0.0005, 0
    strategy.update(out)
    assert torch.allclose(strategy.grad2d, torch.tensor([0.001, 0.0005, 0.0]))
    assert strategy.step(model, optimizer, 10, extent=1.0)["cloned"] == 1  # only 0.001 > 0.0008
    plain = DefaultStrategy({"absgrad": True})
    with pytest.raises(ConfigError, match="renderer.absgrad=true"):  # a renderer without absgrad says so
        plain.update(_render_stats(3, torch.ones(1, 3, 2), torch.ones(1, 3, dtype=torch.bool)))


def test_absgrad_statistics_from_the_torch_rasterizer():
    """End to end on the CPU: the torch rasterizer's means2d.absgrad feeds the statistics."""
    from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
    from lift3d.render.splats.renderer import SplatRenderer

    model = _model(30)
    c2w = look_at(torch.tensor([[0.0, -4.0, 0.5]]), torch.zeros(1, 3), torch.tensor([0.0, 0.0, 1.0]))
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.9]), 16, 12), 16, 12)
    out = SplatRenderer({"backend": "torch", "absgrad": True, "tile_size": 8})(model, cameras)
    (out["rgb"] - 0.5).square().sum().backward()
    strategy = DefaultStrategy({"absgrad": True})
    strategy.update(out)
    plain = DefaultStrategy()
    plain.update(out)
    visible = plain.count > 0
    assert bool(visible.any()) and torch.all(strategy.grad2d[visible] >= plain.grad2d[visible] - 1e-7)
