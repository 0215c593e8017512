"""GPU twins of the renderer tests: the Triton field, sync-free sample budgets and the recipe on CUDA."""

import json

import pytest
import torch

from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.runs.runner import run_experiment
from tests.render.volume.test_rendering import _rays, make_renderer
from tests.systems.test_reconstruct_nerf import TINY

pytestmark = pytest.mark.gpu


def test_budgeted_training_render_matches_exact_on_cuda():
    torch.manual_seed(0)
    field = find("implicit-volume")({"radius": 1.0, "density_bias": 1.0}).cuda()
    assert field.encoding._use_triton(torch.rand(4, 3, device="cuda"))  # the Triton path passed its self-check
    o, d = (t.cuda() for t in _rays(2048))
    exact = make_renderer(field, randomized=False, sample_budget="never", occupancy={"resolution": 32}).cuda().train()
    budget = make_renderer(field, randomized=False, sample_budget="auto", occupancy={"resolution": 32}).cuda().train()
    for renderer in (exact, budget):  # the renderer refers to its parts without owning them (the system does)
        renderer.parts.material.cuda()
        renderer.parts.background.cuda()
    reference = exact.render_rays(o, d)
    budget.render_rays(o, d)
    torch.cuda.synchronize()
    budget.render_rays(o, d)  # the counts of the first calls are read back by now
    torch.cuda.synchronize()
    fitted = budget.render_rays(o, d)
    assert fitted["ray_valid"].all()
    torch.testing.assert_close(fitted["rgb"], reference["rgb"], atol=1e-5, rtol=1e-5)
    fitted["rgb"].sum().backward()
    assert field.encoding.table.grad.abs().sum() > 0


def test_reconstruct_nerf_on_cuda(tmp_path, data_dir):
    overrides = [f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}", *TINY, "trainer.max_steps=300",
                 "trainer.val_check_interval=300", "trainer.accelerator=gpu"]
    cfg = load_config(recipe_config("reconstruct-nerf"), overrides=overrides)
    run_dir = run_experiment("train", cfg, [], overrides)
    metrics = json.loads((run_dir / "save" / "metrics.json").read_text())
    assert metrics["val"]["psnr"] > 25.0


def test_fused_linear_relu_under_autocast_matches_the_two_ops_on_cuda():
    from lift3d.fields.mlp import MLP

    torch.manual_seed(0)
    mlp = MLP(32, 4, 64, 1).cuda()
    x = torch.randn(100000, 32, device="cuda").half()
    results = []
    for fused in (True, False):
        mlp.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            y = mlp(x) if fused else mlp.layers[1](torch.relu(mlp.layers[0](x)))
        assert y.dtype == torch.float16
        y.float().square().sum().backward()
        results.append((y.float(), mlp.layers[0].weight.grad.clone(), mlp.layers[0].bias.grad.clone(),
                        mlp.layers[1].weight.grad.clone()))
    for a, b in zip(*results, strict=False):
        torch.testing.assert_close(a, b, atol=2e-3 * float(b.abs().max()), rtol=1e-2)


def test_reused_encoding_gives_the_same_training_render_and_gradients_on_cuda():
    torch.manual_seed(0)
    field = find("implicit-volume")({"radius": 1.0, "density_bias": 1.0}).cuda()
    o, d = (t.cuda() for t in _rays(4096))
    results = []
    for reuse in ("auto", "never"):
        renderer = make_renderer(field, randomized=False, reuse_encoding=reuse, occupancy={"resolution": 32}).cuda().train()
        renderer.parts.material.cuda()
        renderer.parts.background.cuda()
        field.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            out = renderer.render_rays(o, d)
        out["rgb"].float().sum().backward()
        results.append((out["rgb"].detach().float(), field.encoding.table.grad.clone(), field.mlp.layers[0].weight.grad.clone()))
    # the same inputs to the MLP; cuBLAS may still round one of 12,288 values 1 ulp apart (seen once on a GPU)
    torch.testing.assert_close(results[0][0], results[1][0], atol=2e-7, rtol=0)
    for a, b in zip(results[0][1:], results[1][1:], strict=False):  # atomics add in another order: float rounding only
        torch.testing.assert_close(a, b, atol=1e-5 * float(b.abs().max()), rtol=1e-4)
