"""The optimizer builder: per-group options and the fused-kernel choice (``optimizer.fused``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lift3d.systems import optim
from lift3d.systems.optim import OptimizerConfig, build_optimizer


def two_part_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleDict({"encoding": nn.Linear(4, 3), "mlp": nn.Linear(3, 2)})


def config(fused: str, **args) -> OptimizerConfig:
    return OptimizerConfig(name="Adam", args={"lr": 0.01, "eps": 1e-15, **args}, params={"encoding": {"lr": 0.1}}, fused=fused)


def train(fused: str, steps: int = 5) -> list[torch.Tensor]:
    model = two_part_model()
    optimizer = build_optimizer(model, config(fused))
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        optimizer.zero_grad()
        model["mlp"](model["encoding"](x)).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_auto_keeps_torch_default_for_cpu_parameters():
    optimizer = build_optimizer(two_part_model(), config("auto"))
    assert not optimizer.defaults.get("fused")
    assert [g["name"] for g in optimizer.param_groups] == ["encoding", "default"]


def test_fused_kernel_makes_the_same_updates():
    """``always`` builds the fused Adam (CPU has one too): the same parameters after a few steps."""
    assert build_optimizer(two_part_model(), config("always")).defaults["fused"] is True
    for fused, plain in zip(train("always"), train("never")):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_explicit_optimizer_args_win_over_auto():
    optimizer = build_optimizer(two_part_model(), config("always", foreach=True))
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults.get("fused")


def test_bad_fused_settings_are_named():
    with pytest.raises(ValueError, match="optimizer.fused must be auto, always or never"):
        build_optimizer(two_part_model(), config("yes"))
    with pytest.raises(ValueError, match="RMSprop has no fused kernel"):
        build_optimizer(two_part_model(), OptimizerConfig(name="RMSprop", fused="always"))
    with pytest.raises(ValueError, match="cannot go with trainer.gradient_clip_val"):
        build_optimizer(two_part_model(), config("always"), clips_gradients=True)


def test_auto_fuses_cuda_parameters_unless_the_trainer_clips_gradients(monkeypatch):
    """Lightning's 16-mixed grad scaler refuses to clip for a fused optimizer; auto must not build one there."""
    groups = [{"params": list(two_part_model().parameters())}]
    monkeypatch.setattr(optim, "all_on_cuda", lambda params: True)  # as if the parameters were on a GPU
    assert optim.use_fused(torch.optim.Adam, groups, "auto") is True
    assert optim.use_fused(torch.optim.Adam, groups, "auto", clips_gradients=True) is False
    assert optim.use_fused(torch.optim.RMSprop, groups, "auto") is False  # no fused kernel: torch's default


@pytest.mark.gpu
def test_auto_fuses_on_cuda_and_the_scaled_step_does_not_sync():
    """On CUDA auto picks the fused Adam; GradScaler then hands it the inf check: no .item() in the step."""
    model = two_part_model().cuda()
    optimizer = build_optimizer(model, config("auto"))
    assert optimizer.defaults["fused"] is True
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(16, 4, device="cuda")
    for debug in ("default", "error"):  # the first step allocates state; the second must not wait for the GPU
        torch.cuda.set_sync_debug_mode(debug)
        try:
            optimizer.zero_grad()
            scaler.scale(model["mlp"](model["encoding"](x)).square().mean()).backward()
            scaler.step(optimizer)
            scaler.update()
        finally:
            torch.cuda.set_sync_debug_mode("default")
