"""SDS with a tiny random-weight Stable Diffusion loaded from disk, checked against an independent
computation made directly with diffusers / transformers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lift3d.cameras import Cameras, intrinsics_from_fovy, spherical_to_c2w
from lift3d.guidance.sds import StableDiffusionGuidance
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)


def make(tmp_path, prediction_type: str = "epsilon", **overrides) -> StableDiffusionGuidance:
    cfg = {"pretrained_model_name_or_path": str(tiny_sd_path(prediction_type)), "prompt": "a cat", "resolution": 64,
           "prompt_cache_dir": str(tmp_path / "cache"), **overrides}
    return StableDiffusionGuidance(cfg)


def views(elevation: list[float], azimuth: list[float]) -> dict:
    el, az = torch.tensor(elevation), torch.tensor(azimuth)
    c2w = spherical_to_c2w(torch.deg2rad(el), torch.deg2rad(az), torch.full_like(el, 2.0))
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.full_like(el, 0.8), 16, 16), 16, 16)
    return {"elevation_deg": el, "azimuth_deg": az, "cameras": cameras, "step": 0}


def independent_sds_grad(path, latents, t, noise, texts, scale, prediction_type="epsilon"):
    """w(t) (eps_cfg - eps) computed straight from diffusers/transformers, one UNet call per branch."""
    from diffusers import DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer")
    encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder")
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet")
    scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")

    def embed(items):
        ids = tokenizer(items, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        return encoder(ids)[0]

    with torch.no_grad():
        x_t = scheduler.add_noise(latents, noise, t)
        a = scheduler.alphas_cumprod[t].reshape(-1, 1, 1, 1)
        out_u = unet(x_t, t, encoder_hidden_states=embed([""] * len(texts))).sample
        out_c = unet(x_t, t, encoder_hidden_states=embed(texts)).sample
        if prediction_type == "v_prediction":  # x0 = sqrt(a) x_t - sqrt(1-a) v, then eps from x0
            out_u, out_c = ((x_t - a**0.5 * (a**0.5 * x_t - (1 - a) ** 0.5 * o)) / (1 - a) ** 0.5 for o in (out_u, out_c))
        eps_hat = out_u + scale * (out_c - out_u)
        return (1 - a) * (eps_hat - noise)


def test_loaded_frozen_and_out_of_state_dicts(tmp_path):
    from lift3d.systems.base import BaseSystem

    guidance = make(tmp_path)
    assert guidance.dtype == torch.float32 and guidance.unet.dtype == torch.float32
    assert not any(p.requires_grad for p in guidance.unet.parameters())
    assert not any(p.requires_grad for p in guidance.vae.parameters())
    assert list(guidance.parameters()) == [] and list(guidance.state_dict()) == []
    system = BaseSystem()
    system.add_unsaved_part("guidance", guidance)
    assert list(system.state_dict()) == []


def test_cfg_is_one_unet_call_on_uncond_and_cond(tmp_path):
    guidance = make(tmp_path)
    calls = []
    guidance.unet.register_forward_hook(lambda m, args, kwargs, out: calls.append(kwargs["encoder_hidden_states"].clone()),
                                        with_kwargs=True)
    out = guidance(torch.rand(3, 8, 8, 3), views([0, 0, 0], [0, 90, 180]))
    assert len(calls) == 1 and calls[0].shape[0] == 6
    table = guidance.prompts.embeddings(torch.device("cpu"), torch.float32)
    for i, name in enumerate(["front", "side", "back"]):
        assert torch.equal(calls[0][i], table["uncond"]) and torch.equal(calls[0][3 + i], table[name])
    assert out["timesteps"].shape == (3,) and torch.isfinite(out["loss_sds"]) and out["grad_norm"] > 0


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_latent_gradient_matches_independent_computation(tmp_path, prediction_type):
    guidance = make(tmp_path, prediction_type, latent_input=True, guidance_scale=7.5)
    torch.manual_seed(0)
    latents = torch.randn(2, 8, 8, 4, requires_grad=True)
    t, noise = torch.tensor([100, 700]), torch.randn(2, 4, 8, 8)
    out = guidance(latents, views([0, 10], [0, 100]), timesteps=t, noise=noise)
    out["loss_sds"].backward()
    expected = independent_sds_grad(str(tiny_sd_path(prediction_type)), latents.detach().permute(0, 3, 1, 2), t, noise,
                                    ["a cat, front view", "a cat, side view"], 7.5, prediction_type)
    scale = float(expected.abs().max())
    torch.testing.assert_close(latents.grad.permute(0, 3, 1, 2), expected, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(out["grad_norm"], expected.norm(), rtol=1e-4, atol=1e-6)


def test_rgb_gradient_flows_through_the_vae(tmp_path):
    from diffusers import AutoencoderKL

    guidance = make(tmp_path, guidance_scale=100.0)
    torch.manual_seed(1)
    rgb = torch.rand(1, 16, 16, 3, requires_grad=True)
    t, noise = torch.tensor([500]), torch.randn(1, 4, 8, 8)
    guidance(rgb, views([0], [0]), timesteps=t, noise=noise)["loss_sds"].backward()
    vae = AutoencoderKL.from_pretrained(tiny_sd_path(), subfolder="vae")
    image = F.interpolate(rgb.permute(0, 3, 1, 2), (64, 64), mode="bilinear", align_corners=False) * 2 - 1
    latents = vae.encode(image).latent_dist.mean * vae.config.scaling_factor
    grad = independent_sds_grad(str(tiny_sd_path()), latents.detach(), t, noise, ["a cat, front view"], 100.0)
    (expected,) = torch.autograd.grad(latents, rgb, grad)
    torch.testing.assert_close(rgb.grad, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_exact_gradient_with_and_without_grad_scaler(tmp_path):
    guidance = make(tmp_path, latent_input=True)
    torch.manual_seed(2)
    start = torch.randn(1, 8, 8, 4)
    t, noise = torch.tensor([300]), torch.randn(1, 4, 8, 8)
    grads = []
    for scale in (None, 2.0**12):
        latents = torch.nn.Parameter(start.clone())
        loss = guidance(latents, views([0], [0]), timesteps=t, noise=noise)["loss_sds"]
        if scale is None:
            loss.backward()
        else:
            optimizer = torch.optim.SGD([latents], lr=1.0)
            scaler = torch.amp.GradScaler("cpu", init_scale=scale)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        grads.append(latents.grad.clone())
    assert grads[0].abs().sum() > 0 and torch.equal(grads[0], grads[1])


def test_perp_neg_batches_negatives_in_the_same_call(tmp_path):
    guidance = make(tmp_path, perp_neg=True, latent_input=True)
    sizes = []
    guidance.unet.register_forward_hook(lambda m, args, out: sizes.append(args[0].shape[0]))
    out = guidance(torch.randn(2, 8, 8, 4), views([0, 0], [30, 150]))
    assert sizes == [10] and torch.isfinite(out["loss_sds"])


def test_timestep_ranges_anneal(tmp_path):
    linear = make(tmp_path, timestep_sampling="linear", anneal_steps=100, min_step_percent=0.2, max_step_percent=0.8)
    seen = []
    for step in (0, 50, 100, 1000):
        linear.update_step(0, step)
        seen.append(linear.sample_timesteps(3, torch.device("cpu")).tolist())
    assert seen == [[800] * 3, [500] * 3, [200] * 3, [200] * 3]
    ramp = make(tmp_path, max_step_percent=[0, 0.98, 0.5, 100])  # scheduled: [start_step, start, end, end_step]
    ramp.update_step(0, 0)
    assert ramp.timestep_range() == (20, 980)
    ramp.update_step(0, 100)
    assert ramp.timestep_range() == (20, 500)
    assert int(ramp.sample_timesteps(1000, torch.device("cpu")).max()) <= 500


def test_nan_safe_and_clipped(tmp_path):
    guidance = make(tmp_path, latent_input=True, grad_clip=1e-3)
    latents = torch.randn(1, 8, 8, 4, requires_grad=True)
    guidance(latents, views([0], [0]))["loss_sds"].backward()
    assert 0 < latents.grad.abs().max() <= 1e-3
    broken = make(tmp_path, latent_input=True)
    broken.unet.register_forward_hook(lambda m, args, out: (out[0] * float("nan"),))
    latents.grad = None
    out = broken(latents, views([0], [0]))
    out["loss_sds"].backward()
    assert torch.isfinite(out["loss_sds"]) and torch.isfinite(latents.grad).all()


def test_images_for_validation(tmp_path):
    out = make(tmp_path)(torch.rand(2, 16, 16, 3), views([0, 0], [0, 90]), return_images=True)
    for key in ("noisy", "denoised"):
        image = out["images"][key]
        assert image.shape == (2, 64, 64, 3) and image.min() >= 0 and image.max() <= 1


def test_bad_inputs_say_what_to_fix(tmp_path):
    guidance = make(tmp_path)
    with pytest.raises(ValueError, match="latent_input"):
        guidance(torch.rand(1, 8, 8, 4), views([0], [0]))
    with pytest.raises(ValueError, match="multiple of 8"):
        make(tmp_path, resolution=60)
    with pytest.raises(ValueError, match="cpu_offload"):
        make(tmp_path, cpu_offload="disk")
    with pytest.raises(ValueError, match="weighting"):
        make(tmp_path, weighting="snr")
