"""GPU twins of the renderer tests: the Triton field, sync-free sample budgets and the recipe on CUDA."""

import json

import pytest
import torch

from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.runner import run_experiment
from tests.test_reconstruct_nerf import TINY
from tests.test_volume_rendering import _rays, make_renderer

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
    trial = run_experiment("train", cfg, [], overrides)
    metrics = json.loads((trial / "save" / "metrics.json").read_text())
    assert metrics["val"]["psnr"] > 25.0
