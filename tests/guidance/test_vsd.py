"""VSD: the LoRA model trains while the base UNet stays fixed; gradients and resumable state."""

from __future__ import annotations

import io

import pytest
import torch

from lift3d.guidance.vsd import VSDGuidance
from tests.guidance.test_sds import independent_sds_grad, make, views
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)


def make_vsd(tmp_path, prediction_type: str = "epsilon", **overrides) -> VSDGuidance:
    cfg = {"pretrained_model_name_or_path": str(tiny_sd_path(prediction_type)), "prompt": "a cat", "resolution": 64,
           "prompt_cache_dir": str(tmp_path / "cache"), "lora_lr": 1e-2, **overrides}
    return VSDGuidance(cfg)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_lora_trains_and_base_weights_do_not_change(tmp_path, prediction_type):
    guidance = make_vsd(tmp_path, prediction_type)
    before = {name: p.detach().clone() for name, p in guidance.unet.named_parameters()}
    base = [name for name in before if name not in guidance.trainable]
    assert any("lora_A" in n for n in guidance.trainable) and any(n.startswith("class_embedding.") for n in guidance.trainable)
    rgb = torch.rand(2, 16, 16, 3, requires_grad=True)
    for _ in range(3):
        out = guidance(rgb, views([0, 20], [0, 120]))
        out["loss_vsd"].backward()
    after = dict(guidance.unet.named_parameters())
    assert all(torch.equal(before[name], after[name]) for name in base)
    assert all(not after[name].requires_grad for name in base)
    changed = [name for name in guidance.trainable if not torch.equal(before[name], after[name])]
    assert any("lora_B" in n for n in changed) and "class_embedding.net.2.weight" in changed
    assert torch.isfinite(out["loss_lora"]) and torch.isfinite(out["loss_vsd"])
    assert torch.isfinite(rgb.grad).all() and rgb.grad.abs().sum() > 0


def test_fresh_vsd_gradient_is_cfg_minus_conditional_estimate(tmp_path):
    # the LoRA starts as the identity and the camera MLP at zero: eps_lora is the pretrained conditional estimate
    guidance = make_vsd(tmp_path, latent_input=True, guidance_scale=7.5)
    torch.manual_seed(3)
    latents = torch.randn(2, 8, 8, 4, requires_grad=True)
    t, noise = torch.tensor([250, 600]), torch.randn(2, 4, 8, 8)
    guidance(latents, views([0, 0], [0, 90]), timesteps=t, noise=noise)["loss_vsd"].backward()
    args = (str(tiny_sd_path()), latents.detach().permute(0, 3, 1, 2), t, noise, ["a cat, front view", "a cat, side view"])
    expected = independent_sds_grad(*args, 7.5) - independent_sds_grad(*args, 1.0)
    torch.testing.assert_close(latents.grad.permute(0, 3, 1, 2), expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_pretrained_estimate_ignores_the_trained_lora(tmp_path):
    guidance = make_vsd(tmp_path, latent_input=True)
    batch = views([0], [45])
    for _ in range(2):
        guidance(torch.randn(1, 8, 8, 4), batch)
    plain = make(tmp_path, latent_input=True, guidance_scale=guidance.cfg.guidance_scale)
    x_t, t = torch.randn(1, 4, 8, 8), torch.tensor([400])
    with torch.no_grad():
        torch.testing.assert_close(guidance.predict_noise(x_t, t, batch), plain.predict_noise(x_t, t, batch))
        assert not torch.allclose(guidance.reference_noise(x_t, t, x_t, batch), plain.predict_noise(x_t, t, batch))


def test_checkpoint_state_resumes_exactly(tmp_path):
    first = make_vsd(tmp_path, latent_input=True)
    batch = views([10], [30])
    latents = torch.randn(1, 8, 8, 4)
    for seed in (0, 1):
        torch.manual_seed(seed)
        first(latents, batch)
    buffer = io.BytesIO()
    torch.save(first.checkpoint_state(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    second = make_vsd(tmp_path, latent_input=True)
    second.load_checkpoint_state(state)
    assert all(torch.equal(first.trainable[n], second.trainable[n]) for n in first.trainable)
    for guidance in (first, second):
        torch.manual_seed(2)
        guidance(latents, batch)
    # equal after a further step only if the optimizer's moments were restored too
    assert all(torch.equal(first.trainable[n], second.trainable[n]) for n in first.trainable)
    with pytest.raises(KeyError, match="lora_rank"):
        make_vsd(tmp_path, lora_rank=2).load_checkpoint_state(state)


def test_vsd_rejects_options_that_break_lora(tmp_path):
    with pytest.raises(ValueError, match="fuse_qkv"):
        make_vsd(tmp_path, fuse_qkv=True)
    with pytest.raises(ValueError, match="sequential"):
        make_vsd(tmp_path, cpu_offload="sequential")


def test_distributed_sync_keeps_values_with_one_rank(tmp_path):
    import torch.distributed as dist

    guidance = make_vsd(tmp_path, latent_input=True)
    for i, param in enumerate(guidance.trainable.values()):
        param.grad = torch.full_like(param, float(i))
    params = {n: p.detach().clone() for n, p in guidance.trainable.items()}
    grads = {n: p.grad.clone() for n, p in guidance.trainable.items()}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        guidance._sync_for_ddp(grads=False)
        guidance._sync_for_ddp(grads=True)
    finally:
        dist.destroy_process_group()
    for name, param in guidance.trainable.items():
        assert torch.equal(param.detach(), params[name]) and torch.equal(param.grad, grads[name])
