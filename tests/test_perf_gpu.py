"""GPU checks of the SDS fast path (run on the device: pytest -m gpu tests/test_perf_gpu.py).

CPU twins: test_guidance_options.py (each option keeps the gradient; compile falls back cleanly)."""

from __future__ import annotations

import pytest
import torch

from tests.test_guidance_gpu import CUDA, cuda_views, make

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
