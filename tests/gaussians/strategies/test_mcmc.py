"""MCMC densification: the relocation formula (PyTorch twin vs the closed form; GPU: vs gsplat's kernel), relocation
and addition with their optimizer bookkeeping, the budget, the position noise and the regularizer gradients."""

import importlib.util
import math

import pytest
import torch

from lift3d.gaussians.model import PARAMETER_NAMES, GaussianModel
from lift3d.gaussians.strategies.mcmc import MCMCStrategy, binomial_table, relocation, relocation_torch
from lift3d.registry import find


def _model(n: int = 50, seed: int = 0) -> GaussianModel:
    model = GaussianModel({"sh_degree": 1})
    g = torch.Generator().manual_seed(seed)
    model.initialize(torch.randn(n, 3, generator=g), torch.rand(n, 3, generator=g))
    with torch.no_grad():
        model.opacity_logits.copy_((torch.randn(n, generator=g) * 2).clamp(-3, 4))
        model.quats.copy_(torch.randn(n, 4, generator=g))
    return model


def _adam(model: GaussianModel, lr: float = 0.01) -> torch.optim.Adam:
    groups = [{"params": [getattr(model, name)], "name": name, "lr": lr} for name in PARAMETER_NAMES]
    optimizer = torch.optim.Adam(groups)
    sum((p * p).sum() for p in model.parameters()).backward()
    optimizer.step()
    return optimizer


def _closed_form(opacity: float, n: int) -> tuple[float, float]:
    """(o', s'/s) of Eq. 9 in float64 with the binomial sums written out."""
    new = 1.0 - (1.0 - opacity) ** (1.0 / n)
    denominator = sum(math.comb(i - 1, k) * (-1) ** k / math.sqrt(k + 1) * new ** (k + 1)
                      for i in range(1, n + 1) for k in range(i))
    return new, opacity / denominator


def test_relocation_twin_matches_the_closed_form():
    binoms = binomial_table(51)
    g = torch.Generator().manual_seed(0)
    opacities = torch.rand(200, generator=g) * 0.98 + 0.01
    scales = torch.rand(200, 3, generator=g) + 0.01
    ratios = torch.randint(1, 40, (200,), generator=g)
    new_opacities, new_scales = relocation_torch(opacities, scales, ratios, binoms)
    for i in range(0, 200, 7):
        o, factor = _closed_form(float(opacities[i]), int(ratios[i]))
        assert float(new_opacities[i]) == pytest.approx(o, rel=1e-5)
        assert torch.allclose(new_scales[i], scales[i] * factor, rtol=1e-4)
    # one copy changes nothing; the copies' summed opacity is the original one's at the center
    same_o, same_s = relocation_torch(opacities, scales, torch.ones(200, dtype=torch.int64), binoms)
    assert torch.allclose(same_o, opacities, rtol=1e-6) and torch.allclose(same_s, scales, rtol=1e-5)
    assert torch.allclose(1 - (1 - new_opacities) ** ratios.float(), opacities, rtol=1e-4)
    # ratios beyond the table are clamped, as gsplat's kernel does
    clamped, _ = relocation_torch(opacities[:3], scales[:3], torch.tensor([80, 80, 80]), binoms)
    assert torch.allclose(clamped, relocation_torch(opacities[:3], scales[:3], torch.tensor([51, 51, 51]), binoms)[0])


def test_relocate_moves_dead_gaussians_onto_live_ones():
    model = _model()
    with torch.no_grad():
        model.opacity_logits[:10] = -10.0  # dead
    optimizer = _adam(model)
    strategy = MCMCStrategy({"min_opacity": 0.005})
    before = {name: getattr(model, name).detach().clone() for name in PARAMETER_NAMES}
    moved = strategy.relocate(model, optimizer, torch.Generator().manual_seed(0))
    assert moved == 10 and len(model) == 50
    assert bool((model.opacities[:10] > 0.005).all())
    live_means = before["means"][10:]
    for i in range(10):  # each dead one now sits on a live one
        assert bool((model.means[i] == live_means).all(-1).any())
    state = optimizer.state[model.means]["exp_avg"]
    assert not state[:10].any()
    assert len(optimizer.state) == len(PARAMETER_NAMES)
    # a drawn Gaussian and its copy share the reduced opacity: together they stay close to the original's
    changed = (~torch.isclose(model.opacity_logits[10:], before["opacity_logits"][10:])).nonzero()[:, 0] + 10
    assert len(changed) > 0
    i = int(changed[0])
    copies = int((model.means == model.means[i]).all(-1).sum())
    original = torch.sigmoid(before["opacity_logits"][i])
    assert float(1 - (1 - model.opacities[i].detach()) ** copies) == pytest.approx(float(original), rel=1e-4)


def test_add_grows_by_the_rate_up_to_the_cap():
    model = _model(100)
    optimizer = _adam(model)
    strategy = MCMCStrategy({"max_gaussians": 112, "grow_rate": 0.05})
    assert strategy.add(model, optimizer, torch.Generator().manual_seed(0)) == 5 and len(model) == 105
    assert strategy.add(model, optimizer, torch.Generator().manual_seed(1)) == 5 and len(model) == 110
    assert strategy.add(model, optimizer, torch.Generator().manual_seed(2)) == 2 and len(model) == 112
    assert strategy.add(model, optimizer, torch.Generator().manual_seed(3)) == 0 and len(model) == 112
    for name in PARAMETER_NAMES:
        p = getattr(model, name)
        assert optimizer.state[p]["exp_avg"].shape == p.shape and not optimizer.state[p]["exp_avg"][100:].any()


def test_schedule_noise_and_regularizers():
    model = _model(40)
    with torch.no_grad():
        model.opacity_logits[:4] = -10.0
    optimizer = _adam(model, lr=1e-4)
    optimizer.zero_grad()
    strategy = find("densify-mcmc")({"max_gaussians": 44, "refine_start": 0, "refine_every": 10, "noise_lr": 5e5})
    means = model.means.detach().clone()
    assert strategy.after_backward(None, model, optimizer, 5, 1.0) == {}  # not a refine step
    moved = (model.means.detach() - means).norm(dim=-1)
    assert float(moved[:4].min()) > 0  # transparent ones get the noise
    assert float(moved[4:].max()) < float(moved[:4].min())  # opaque ones almost none
    expected = 0.01 * model.opacities * (1 - model.opacities) / 40
    assert torch.allclose(model.opacity_logits.grad, expected.detach())
    assert torch.allclose(model.log_scales.grad, (0.01 * model.scales / 120).detach())
    report = strategy.after_backward(None, model, optimizer, 10, 1.0)
    assert report == {"relocated": 4, "added": 2} and len(model) == 42
    # every rank draws the same: a second model from the same state makes the same moves
    twin = _model(40)
    with torch.no_grad():
        twin.opacity_logits[:4] = -10.0
    other = find("densify-mcmc")({"max_gaussians": 44, "refine_start": 0, "refine_every": 10, "noise_lr": 5e5})
    twin_optimizer = _adam(twin, lr=1e-4)
    twin_optimizer.zero_grad()
    other.after_backward(None, twin, twin_optimizer, 5, 1.0)
    other.after_backward(None, twin, twin_optimizer, 10, 1.0)
    assert torch.equal(twin.means, model.means)


def test_regularizers_keep_the_optimizer_out_of_a_captured_step():
    assert MCMCStrategy().edits_gradients  # graphed_splats then steps the optimizer after them
    assert not MCMCStrategy({"opacity_reg": 0.0, "scale_reg": 0.0}).edits_gradients


def test_bad_config_is_refused():
    from lift3d.config import ConfigError

    with pytest.raises(ConfigError, match="max_gaussians"):
        find("densify-mcmc")({"max_gaussians": 0})


def test_relocation_on_cuda_matches_the_twin():
    """Without CUDA ``relocation`` is the twin; on CUDA (GPU test below) it is gsplat's kernel."""
    binoms = binomial_table(51)
    opacities, scales, ratios = torch.tensor([0.3, 0.9]), torch.ones(2, 3), torch.tensor([2, 5])
    assert all(torch.equal(a, b) for a, b in zip(relocation(opacities, scales, ratios, binoms),
                                                 relocation_torch(opacities, scales, ratios, binoms)))


@pytest.mark.gpu
def test_relocation_twin_matches_gsplats_kernel():
    if not torch.cuda.is_available() or importlib.util.find_spec("gsplat") is None:
        raise RuntimeError("this test needs CUDA and gsplat (run it on the GPU machine with -m gpu)")
    from gsplat.relocation import compute_relocation

    binoms = binomial_table(51).cuda()
    g = torch.Generator().manual_seed(0)
    opacities = (torch.rand(5000, generator=g) * 0.98 + 0.01).cuda()
    scales = (torch.rand(5000, 3, generator=g) + 0.01).cuda()
    ratios = torch.randint(1, 60, (5000,), generator=g).cuda()
    theirs = compute_relocation(opacities, scales, ratios.clone().float(), binoms)
    ours = relocation_torch(opacities, scales, ratios, binoms)
    assert torch.allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-7)  # the kernel's 1 - (1 - o)^(1/n) rounds
    assert torch.allclose(ours[1], theirs[1], rtol=1e-3, atol=1e-6)
    through = relocation(opacities, scales, ratios, binoms)
    assert torch.allclose(through[1], theirs[1])


def test_recipe_trains_with_mcmc_within_its_budget(tmp_path, data_dir):
    """lego_tiny through the reconstruct-gaussians recipe with ``system.densify_type=densify-mcmc``: the 3DGS options
    of the recipe give way to MCMC's, the count grows to the budget and no further, and PSNR rises."""
    import csv
    import json

    from lift3d.cli import main

    code = main(["reconstruct", str(data_dir / "lego_tiny"), f"output_root={tmp_path}", "trainer.enable_progress_bar=false",
                 "use_timestamp=false", "system.gaussians.init_points=2000", "system.renderer.tile_size=4",
                 "system.gaussians.sh_degree=1", "data.val_split=train", "data.n_orbit_views=4", "trainer.max_steps=120",
                 "trainer.val_check_interval=120", "trainer.num_sanity_val_steps=1", "trainer.log_every_n_steps=10",
                 "checkpoint.every_n_train_steps=0", "system.export.formats=[]", "system.densify_type=densify-mcmc",
                 "system.densify.max_gaussians=2600", "system.densify.refine_start=20", "system.densify.refine_every=20",
                 "system.densify.grow_rate=0.1"])
    assert code == 0
    run_dir = tmp_path / "reconstruct-gaussians" / "lego_tiny"
    record = json.loads((run_dir / "save" / "metrics.json").read_text())
    assert record["val"]["psnr"] > record["history"][0]["psnr"] + 8.0, record["history"]
    with open(run_dir / "csv_logs" / "metrics.csv") as handle:
        counts = [float(r["train/gaussians"]) for r in csv.DictReader(handle) if r.get("train/gaussians")]
    assert max(counts) == 2600 and counts[0] == 2000
