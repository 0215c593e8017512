"""The offline proof of the text-to-3D loop: the dreamfusion and gaussian-sds recipes with the analytic
prior (the exact denoiser of the built-in sample scene's train views) in place of Stable Diffusion must
reconstruct the scene: PSNR on its held-out val views rises well above where the representation starts."""

from __future__ import annotations

import json

import torch

from lift3d.config import load_config
from lift3d.data.sample_scene import sample_scene_path
from lift3d.metrics import psnr
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_parts, run_experiment
from tests.tiny_diffusion import one_thread  # noqa: F401  (fixture)

SIZE = 32
COMMON = [
    f"data.height={SIZE}", f"data.width={SIZE}", f"data.eval_height={SIZE}", f"data.eval_width={SIZE}",
    "trainer.max_steps=200", "trainer.val_check_interval=200", "trainer.run_test_after_fit=false",
    "checkpoint.every_n_train_steps=0", "trainer.enable_progress_bar=false", "use_timestamp=false",
    "system.guidance.max_step_percent=[0,0.98,0.3,150]",  # the recipes' timestep annealing, compressed to 200 steps
]
NERF = [  # a small hash grid and a coarse march (fast on a CPU), so higher learning rates
    "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
    "system.field.encoding.base_resolution=4", "system.field.encoding.per_level_scale=2.0",
    "system.field.hidden_dim=16", "system.field.blob_density=5.0", "system.renderer.steps_per_diagonal=64",
    "system.renderer.occupancy.resolution=16", "system.renderer.occupancy.warmup_steps=32",
    "system.eval_normals=false", "system.loss.lambda_orient=0", "system.loss.lambda_sparsity=0",
    "system.optimizer.params.field\\.encoding.lr=0.05", "system.optimizer.params.field\\.mlp.lr=0.01",
]
GAUSSIANS = ["data.batch_size=2", "system.gaussians.init_points=2000", "system.renderer.tile_size=4",
             "system.export.formats=[]"]


def start_and_final_psnr(recipe: str, extra: list[str], tmp_path) -> tuple[float, float]:
    """Mean val PSNR of the untrained representation (as training initializes it) and after training."""
    overrides = [f"data.reference_scene={sample_scene_path()}", f"output_root={tmp_path}", *COMMON, *extra]
    cfg = load_config(recipe_config(recipe), overrides=overrides)
    datamodule, system = build_parts(cfg)
    torch.manual_seed(cfg.seed)  # what the runner's seed_everything does before set-up
    if hasattr(system, "initialize_gaussians"):
        system.initialize_gaussians()
    views = list(datamodule.val_dataloader())
    assert len(views) == 8  # the sample scene's val views, scored against their images
    with torch.no_grad():
        start = sum(float(psnr(system.eval().render(v)["rgb"].clamp(0, 1), v["rgb"])) for v in views) / len(views)
    run_dir = run_experiment("train", cfg, [recipe_config(recipe)], overrides)
    final = json.loads((run_dir / "save" / "metrics.json").read_text())["val"]
    assert final["step"] == 200 and final["views"] == 8
    print(f"{recipe}: val PSNR {start:.2f} -> {final['psnr']:.2f} dB")
    return start, final["psnr"]


def test_dreamfusion_with_the_analytic_prior_reconstructs_the_sample_scene(tmp_path):
    start, final = start_and_final_psnr("dreamfusion-analytic", NERF, tmp_path)
    assert final > start + 5.0, (start, final)


def test_gaussian_sds_with_the_analytic_prior_reconstructs_the_sample_scene(tmp_path):
    start, final = start_and_final_psnr("gaussian-sds-analytic", GAUSSIANS, tmp_path)
    assert final > start + 5.0, (start, final)
