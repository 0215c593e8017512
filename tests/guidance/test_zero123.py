"""Zero123 guidance with a tiny random-weight model: loading, camera conditioning, the SDS gradient, caching."""

import math

import pytest
import torch

from lift3d.guidance.loading import ModelLoadError
from lift3d.guidance.score import add_noise, classifier_free_guidance, timestep_weight
from lift3d.guidance.zero123 import Zero123Guidance, relative_camera
from tests.tiny_diffusion import tiny_sd_path
from tests.tiny_zero123 import tiny_zero123_path


def make(**overrides) -> Zero123Guidance:
    cfg = {"pretrained_model_name_or_path": str(tiny_zero123_path()), "resolution": 64, "guidance_scale": 3.0, **overrides}
    guidance = Zero123Guidance(cfg)
    image = torch.linspace(0, 1, 48 * 48 * 3).reshape(48, 48, 3)
    guidance.set_reference(image, elevation_deg=10.0, azimuth_deg=0.0, distance=2.0)
    return guidance


def test_relative_camera_matches_hand_computed_cases():
    el, az, dist = torch.tensor([30.0, 10.0]), torch.tensor([90.0, -180.0]), torch.tensor([2.5, 2.0])
    zero123 = relative_camera(el, az, dist, (0.0, 0.0, 2.0), "zero123")
    assert torch.allclose(zero123[0], torch.tensor([-math.pi / 6, 1.0, 0.0, 0.5]), atol=1e-6)
    assert torch.allclose(zero123[1], torch.tensor([-math.radians(10), 0.0, -1.0, 0.0]), atol=1e-6)
    stable = relative_camera(el, az, dist, (20.0, 90.0, 2.0), "stable-zero123")
    assert torch.allclose(stable[0], torch.tensor([-math.radians(10), 0.0, 1.0, math.radians(70)]), atol=1e-6)
    assert torch.allclose(stable[1, 3], torch.tensor(math.radians(70)))
    with pytest.raises(ValueError, match="camera_embedding"):
        relative_camera(el, az, dist, (0.0, 0.0, 2.0), "zero1234")


def test_loading_errors_name_the_model(tmp_path):
    with pytest.raises(ModelLoadError, match="someone/missing-zero123"):
        Zero123Guidance({"pretrained_model_name_or_path": "someone/missing-zero123", "local_files_only": True})
    with pytest.raises(ModelLoadError, match="not a Zero123 model: its UNet takes 4"):
        Zero123Guidance({"pretrained_model_name_or_path": str(tiny_sd_path())})
    with pytest.raises(ModelLoadError) as missing:  # a local copy is named by what Zero123 loads, not SD's parts
        Zero123Guidance({"pretrained_model_name_or_path": str(tmp_path / "zero123-copy"), "local_files_only": True})
    assert "image_encoder/" in str(missing.value) and "cc_projection/" in str(missing.value)
    assert "text_encoder" not in str(missing.value) and "tokenizer" not in str(missing.value)


def test_sds_gradient_matches_an_independent_computation():
    guidance = make(latent_input=True)
    models = guidance.models
    latents = torch.randn(2, 8, 8, 4)  # [B, h, w, 4] in latent-input mode
    batch = {"elevation_deg": torch.tensor([10.0, 40.0]), "azimuth_deg": torch.tensor([30.0, -120.0]),
             "distance": torch.tensor([2.0, 2.4])}
    t, noise = torch.tensor([300, 700]), torch.randn(2, 4, 8, 8)
    x = latents.clone().requires_grad_(True)
    out = guidance(x, batch, timesteps=t, noise=noise)
    out["loss_sds"].backward()

    with torch.no_grad():  # the same step written out with the models directly
        reference = guidance._reference_rgb.permute(2, 0, 1)[None]
        clip_in = torch.nn.functional.interpolate(reference, (32, 32), mode="bicubic", align_corners=False,
                                                  antialias=True).clamp(0, 1)
        mean = torch.tensor([0.48145466, 0.4578275, 0.40821073])[:, None, None]
        std = torch.tensor([0.26862954, 0.26130258, 0.27577711])[:, None, None]
        embedding = models.image_encoder((clip_in - mean) / std).image_embeds
        vae_in = torch.nn.functional.interpolate(reference, (64, 64), mode="bilinear", align_corners=False, antialias=True)
        concat = models.vae.encode(vae_in * 2 - 1).latent_dist.mode()
        camera = torch.stack([torch.deg2rad(torch.tensor([0.0, -30.0])), torch.sin(torch.deg2rad(torch.tensor([30.0, -120.0]))),
                              torch.cos(torch.deg2rad(torch.tensor([30.0, -120.0]))), torch.tensor([0.0, 0.4])], -1)
        token = models.cc_projection(torch.cat([embedding.expand(2, -1), camera], -1))[:, None]
        alpha_bar = guidance.alphas_cumprod[t]
        x_t = add_noise(latents.permute(0, 3, 1, 2), noise, alpha_bar)
        eps_c = models.unet(torch.cat([x_t, concat.expand(2, -1, -1, -1)], 1), t, encoder_hidden_states=token).sample
        eps_u = models.unet(torch.cat([x_t, torch.zeros_like(x_t)], 1), t, encoder_hidden_states=torch.zeros_like(token)).sample
        eps_hat = classifier_free_guidance(eps_u, eps_c, 3.0)
        expected = timestep_weight(alpha_bar, "sds")[:, None, None, None] * (eps_hat - noise)
    assert torch.allclose(x.grad, expected.permute(0, 2, 3, 1), atol=1e-4, rtol=1e-4)
    assert expected.abs().max() > 1e-3  # a real gradient, not zeros


def test_reference_conditioning_is_computed_once():
    guidance = make()
    calls = []
    encoder = guidance.models.image_encoder
    hook = encoder.register_forward_hook(lambda *args: calls.append(1))
    batch = {"elevation_deg": torch.tensor([0.0]), "azimuth_deg": torch.tensor([45.0]), "distance": torch.tensor([2.0])}
    for _ in range(3):
        guidance(torch.rand(1, 32, 32, 3, requires_grad=True), batch)["loss_sds"].backward()
    assert len(calls) == 1
    guidance.set_reference(torch.rand(16, 16, 3), 0.0, 0.0, 2.0)  # a new reference is encoded again
    guidance(torch.rand(1, 32, 32, 3), batch)
    assert len(calls) == 2
    hook.remove()


def test_missing_reference_is_a_clear_error():
    guidance = Zero123Guidance({"pretrained_model_name_or_path": str(tiny_zero123_path()), "resolution": 64})
    with pytest.raises(ValueError, match="set_reference"):
        guidance(torch.rand(1, 32, 32, 3), {"elevation_deg": torch.tensor([0.0]), "azimuth_deg": torch.tensor([0.0]),
                                            "distance": torch.tensor([2.0])})
