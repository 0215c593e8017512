"""GPU checks of the SDS fast path (run on the device: pytest -m gpu tests/guidance/test_perf_gpu.py).

CPU twins: test_options.py (each option keeps the gradient; compile falls back cleanly)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tests.guidance.test_gpu import CUDA, cuda_views, make

pytestmark = pytest.mark.gpu


def step(guidance, views: dict) -> None:
    rgb = torch.rand(2, 16, 16, 3, device=CUDA, requires_grad=True)
    out = guidance(rgb, views)  # timesteps and noise drawn on the device, as in training
    out["loss_sds"].backward()


@pytest.mark.parametrize("options", [{}, {"compile": True, "cuda_graphs": True}], ids=["eager", "compiled-cudagraphs"])
def test_sds_step_has_no_host_sync(tmp_path, options):
    """After warm-up an SDS step never waits for the GPU (no .item(), no Python-side NaN checks, no D2H copies)."""
    guidance = make(tmp_path, **options)
    views = cuda_views([0, 10], [0, 100])  # the batch arrives on the device (Lightning copies it before the step)
    for _ in range(3):  # compile, record CUDA graphs, embed prompts
        step(guidance, views)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            step(guidance, views)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if options:
        assert not guidance._unet_fn.failed and not guidance._encode_fn.failed  # really compiled, no silent fallback


def test_training_batches_are_pinned_and_upload_without_a_sync():
    """The random-view loader pins its batches (Cameras included), so Lightning's copy to the GPU is asynchronous."""
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from lift3d.data.random_views import RandomViewsDataModule

    data = RandomViewsDataModule({"height": 16, "width": 16, "batch_size": 2})
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch["cameras"].c2w.is_pinned() and batch["light_positions"].is_pinned()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moved = move_data_to_device(batch, torch.device(CUDA))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(moved["cameras"].c2w.cpu(), batch["cameras"].c2w)


class ForbidSyncs(Callback):
    """CUDA sync debug mode "error" from the start of step ``first`` to the start of step ``last``: the steps
    in between (render, guidance, backward, optimizer, Lightning's end-of-step bookkeeping) must not sync."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.checked = first, last, False

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.first:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        elif trainer.global_step == self.last:
            torch.cuda.set_sync_debug_mode("default")
            self.checked = True

    def on_train_end(self, trainer, module) -> None:
        torch.cuda.set_sync_debug_mode("default")


def test_dreamfusion_training_steps_have_no_host_sync(tmp_path):
    """The whole dreamfusion-sd step under Lightning with 16-mixed (fused Adam, grad scaler, sample budgets,
    the progress-bar loss) never waits for the GPU, so the CPU queues the next step while the GPU runs."""
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import build_parts, build_trainer
    from tests.test_recipes import NERF
    from tests.tiny_diffusion import tiny_sd_path

    overrides = [*NERF, "data.height=32", "data.width=32", "system.guidance.resolution=64", "trainer.max_steps=21",
                 "trainer.val_check_interval=0", "checkpoint.every_n_train_steps=0", "checkpoint.save_last=false",
                 "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=50", "trainer.accelerator=gpu",
                 "trainer.devices=1", f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}",
                 "system.guidance.prompt=a cube", "system.guidance.prompt_cache_dir=none"]
    cfg = load_config(recipe_config("dreamfusion-sd"), overrides=overrides)
    assert cfg.trainer.precision == "16-mixed"
    trainer = build_trainer(cfg, tmp_path, train=True)
    check = ForbidSyncs(17, 20)  # after step 16's occupancy update; the loss check runs every 100 steps
    trainer.callbacks.append(check)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(tmp_path / "save")
    trainer.fit(system, datamodule=datamodule)
    assert check.checked and trainer.global_step == 21
    assert trainer.optimizers[0].defaults["fused"] is True
