"""GPU checks of the text-to-3D recipes (run on the device: pytest -m gpu tests/test_recipes_gpu.py).

CPU twins: test_recipes.py (each recipe with the tiny SD, resume) and test_recipes_analytic.py
(analytic-prior distillation). Here the same runs take the CUDA paths: 16-mixed precision for the NeRF
recipes, gsplat (when installed) for the Gaussians, the guidance in fp16."""

from __future__ import annotations

import pytest
import torch

from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from tests.test_recipes import CASES, TINY
from tests.test_recipes_analytic import GAUSSIANS, NERF, start_and_final_psnr
from tests.tiny_diffusion import tiny_sd_path

pytestmark = pytest.mark.gpu
ON_GPU = ["trainer.accelerator=gpu", "trainer.devices=1"]


@pytest.mark.parametrize("method", list(CASES))
def test_generate_runs_each_recipe_on_the_gpu(method, tmp_path):
    name, extra, exports, _ = CASES[method]
    model = f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}"
    command = ["generate", "a small red cube", "--method", method, f"output_root={tmp_path}", model, *TINY, *extra, *ON_GPU]
    assert main(command) == 0
    run_dir = tmp_path / name / "a_small_red_cube"
    assert load_checkpoint(run_dir / "ckpts" / "last.ckpt")["global_step"] == 2
    assert (run_dir / "save" / "it2-val" / "0000.png").is_file() and (run_dir / "save" / "it2-test.mp4").is_file()
    for export in exports:
        assert (run_dir / "save" / export).stat().st_size > 0, export


@pytest.mark.parametrize("recipe, extra", [("dreamfusion-analytic", NERF), ("gaussian-sds-analytic", GAUSSIANS)])
def test_analytic_distillation_reconstructs_the_sample_scene_on_the_gpu(recipe, extra, tmp_path):
    assert torch.cuda.is_available()
    start, final = start_and_final_psnr(recipe, [*extra, *ON_GPU], tmp_path)
    assert final > start + 5.0, (start, final)
