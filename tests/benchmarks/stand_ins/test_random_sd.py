"""The random-weight SD folder the GPU benchmarks use loads through the normal guidance path and runs a step."""

from __future__ import annotations

import torch

from benchmarks.stand_ins.random_sd import write_random_sd21
from lift3d.guidance.sds import StableDiffusionGuidance
from tests.guidance.test_sds import views
from tests.tiny_diffusion import one_thread  # noqa: F401  (autouse fixture)


def test_tiny_random_sd_folder_runs_an_sds_step(tmp_path):
    folder = write_random_sd21(tmp_path / "sd", tiny=True)
    assert write_random_sd21(folder, tiny=True) == folder  # complete folders are reused
    guidance = StableDiffusionGuidance({"pretrained_model_name_or_path": str(folder), "prompt": "a cat", "resolution": 64,
                                        "prompt_cache_dir": "none", "local_files_only": True})
    rgb = torch.rand(1, 16, 16, 3, requires_grad=True)
    out = guidance(rgb, views([0], [30]))
    out["loss_sds"].backward()
    assert rgb.grad is not None and torch.isfinite(rgb.grad).all() and rgb.grad.abs().sum() > 0
    assert guidance.unet.config.block_out_channels == [8, 16, 16, 16]  # the tiny SD-2.1-shaped config, as written
