"""DeepFloyd IF guidance with a tiny random-weight IF stage I loaded from disk: loading and its errors, the SDS
gradient against an independent computation made straight with diffusers / transformers, and the T5 prompt
embeddings cached on disk so a second run never loads the encoder (which is freed after use)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from lift3d.config import ConfigError
from lift3d.guidance.deepfloyd_if import DeepFloydIFGuidance, epsilon_channels, pixel_input
from lift3d.guidance.loading import ModelLoadError
from tests.tiny_deepfloyd import T5_DIM, tiny_if_path
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)


def make(tmp_path, **overrides) -> DeepFloydIFGuidance:
    cfg = {"pretrained_model_name_or_path": str(tiny_if_path()), "prompt": "a cat", "prompt_cache_dir": str(tmp_path / "cache"),
           **overrides}
    return DeepFloydIFGuidance(cfg)


def views(elevation: list[float], azimuth: list[float]) -> dict:
    return {"elevation_deg": torch.tensor(elevation), "azimuth_deg": torch.tensor(azimuth), "step": 0}


def test_loads_the_pixel_space_unet_frozen_with_the_if_schedule(tmp_path):
    from diffusers import DDPMScheduler
    from diffusers.models.attention_processor import AttnAddedKVProcessor2_0

    guidance = make(tmp_path)
    assert guidance.vae is None and guidance.unet.config.in_channels == 3 and guidance.unet.config.out_channels == 6
    assert not any(p.requires_grad for p in guidance.unet.parameters())
    assert list(guidance.state_dict()) == []  # frozen weights never enter a checkpoint
    scheduler = DDPMScheduler.from_pretrained(tiny_if_path(), subfolder="scheduler")
    assert torch.equal(guidance.alphas_cumprod, scheduler.alphas_cumprod.float())  # the cosine schedule, not SD's
    assert all(isinstance(p, AttnAddedKVProcessor2_0) for p in guidance.unet.attn_processors.values())
    assert guidance.prompts.model_key.endswith("#t5-max-length=77")


def test_load_errors_name_the_model_and_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="not a DeepFloyd IF stage I model: its UNet takes 4 input channels"):
        DeepFloydIFGuidance({"pretrained_model_name_or_path": str(tiny_sd_path()), "prompt": "a cat"})
    with pytest.raises(ModelLoadError) as info:
        DeepFloydIFGuidance({"pretrained_model_name_or_path": str(tmp_path / "no" / "such" / "if"), "prompt": "a cat"})
    message = str(info.value)
    assert "does not exist" in message and "unet/, scheduler/, text_encoder/ and tokenizer/ (IF has no VAE)" in message
    assert "\n" not in message


def test_config_errors_are_one_line(tmp_path):
    from lift3d.systems.base import BaseSystem

    with pytest.raises(ValueError, match="RGB pixels"):
        make(tmp_path, latent_input=True)
    with pytest.raises(ValueError, match="fuse_qkv"):
        make(tmp_path, fuse_qkv=True)
    with pytest.raises(ConfigError, match="deepfloyd-if.text_encoder_dtype must be one of auto, fp32.*; got 'int8'"):
        BaseSystem().build_part("deepfloyd-if", {"pretrained_model_name_or_path": str(tiny_if_path()), "prompt": "a",
                                                 "text_encoder_dtype": "int8"})


def test_epsilon_is_the_first_half_of_a_learned_variance_output():
    out = torch.arange(2 * 6 * 2 * 2, dtype=torch.float32).reshape(2, 6, 2, 2)
    assert torch.equal(epsilon_channels(out, 3), out[:, :3]) and torch.equal(epsilon_channels(out[:, :3], 3), out[:, :3])
    with pytest.raises(ValueError, match="5 channels"):
        epsilon_channels(out[:, :5], 3)
    rgb = torch.rand(1, 64, 64, 3)
    assert torch.allclose(pixel_input(rgb, 64), rgb.permute(0, 3, 1, 2) * 2 - 1)


def independent_sds_grad_rgb(path, rgb, t, noise, texts, scale):
    """d/d rgb of the SDS surrogate, straight from diffusers/transformers: resize to 64, map to [-1, 1], noise, one
    UNet call per branch, the first 3 output channels as epsilon (IFPipeline's split), CFG, w(t) = 1 - alpha_bar."""
    from diffusers import DDPMScheduler, UNet2DConditionModel
    from transformers import AutoTokenizer, T5EncoderModel

    tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
    encoder = T5EncoderModel.from_pretrained(path, subfolder="text_encoder")
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet")
    scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")

    def embed(items):
        tokens = tokenizer(items, padding="max_length", max_length=77, truncation=True, add_special_tokens=True,
                           return_tensors="pt")
        return encoder(tokens.input_ids, attention_mask=tokens.attention_mask)[0]

    rgb = rgb.detach().clone().requires_grad_(True)
    x = F.interpolate(rgb.permute(0, 3, 1, 2), (64, 64), mode="bilinear", align_corners=False) * 2 - 1
    with torch.no_grad():
        x_t = scheduler.add_noise(x.detach(), noise, t)
        eps_u = unet(x_t, t, encoder_hidden_states=embed([""] * len(texts))).sample.split(3, dim=1)[0]
        eps_c = unet(x_t, t, encoder_hidden_states=embed(texts)).sample.split(3, dim=1)[0]
        a = scheduler.alphas_cumprod[t].reshape(-1, 1, 1, 1)
        grad = (1 - a) * (eps_u + scale * (eps_c - eps_u) - noise)
    (grad * x).sum().backward()
    return rgb.grad


def test_sds_gradient_matches_independent_computation(tmp_path):
    guidance = make(tmp_path, guidance_scale=20.0).to("cpu")
    torch.manual_seed(0)
    rgb = torch.rand(2, 32, 32, 3, requires_grad=True)
    t, noise = torch.tensor([300, 700]), torch.randn(2, 3, 64, 64)
    out = guidance(rgb, views([10.0, 10.0], [0.0, 90.0]), timesteps=t, noise=noise)
    out["loss_sds"].backward()
    expected = independent_sds_grad_rgb(tiny_if_path(), rgb, t, noise, ["a cat, front view", "a cat, side view"], 20.0)
    assert expected.abs().max() > 0
    torch.testing.assert_close(rgb.grad, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_cached_t5_embeddings_are_reused_without_loading_the_encoder(tmp_path, monkeypatch):
    import transformers

    loaded: list[weakref.ref] = []
    load = transformers.T5EncoderModel.from_pretrained.__func__

    def tracked(cls, *args, **kwargs):
        model = load(cls, *args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(transformers.T5EncoderModel, "from_pretrained", classmethod(tracked))
    first = make(tmp_path).to("cpu")  # embeds on the device it will run on, before any step
    assert first.prompts.encoder_calls == 1 and len(loaded) == 1
    assert first._placed is None  # embedded before the UNet was placed on the device (the GPU test checks the memory)
    gc.collect()
    assert loaded[0]() is None  # the encoder was released once the prompts were embedded
    files = sorted((tmp_path / "cache").glob("*.safetensors"))
    assert len(files) == 7  # negative, plain and five view prompts
    table = first.prompts.embeddings(torch.device("cpu"), torch.float32)
    assert table["front"].shape == (77, T5_DIM)

    def refuse(*args, **kwargs):
        raise AssertionError("the T5 encoder was loaded although every embedding is cached")

    monkeypatch.setattr(transformers.T5EncoderModel, "from_pretrained", refuse)
    second = make(tmp_path).to("cpu")
    out = second(torch.rand(1, 16, 16, 3), views([0.0], [180.0]))
    assert torch.isfinite(out["loss_sds"]) and second.prompts.encoder_calls == 0
    again = second.prompts.embeddings(torch.device("cpu"), torch.float32)
    assert all(torch.equal(table[k], again[k]) for k in table)

    # the token length is part of the key: another length is a cache miss, not a wrong-shaped hit
    monkeypatch.setattr(transformers.T5EncoderModel, "from_pretrained", classmethod(tracked))
    shorter = make(tmp_path, text_max_length=32).to("cpu")
    assert shorter.prompts.encoder_calls == 1
    assert shorter.prompts.embeddings(torch.device("cpu"), torch.float32)["plain"].shape == (32, T5_DIM)


def test_a_sentencepiece_tokenizer_without_sentencepiece_says_what_to_install(tmp_path, monkeypatch):
    """IF's own tokenizer folder holds only spiece.model: reading it needs the sentencepiece package."""
    import importlib.util
    import json
    import shutil

    folder = tmp_path / "if"
    shutil.copytree(tiny_if_path(), folder)
    shutil.rmtree(folder / "tokenizer")
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "spiece.model").write_bytes(b"\0" * 64)  # unreadable without (and with) sentencepiece
    (folder / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentencepiece" else real_find_spec(name, *a))
    guidance = DeepFloydIFGuidance({"pretrained_model_name_or_path": str(folder), "prompt": "a cat",
                                    "prompt_cache_dir": str(tmp_path / "cache")})
    with pytest.raises(ModelLoadError, match=r"\(tokenizer\).*pip install sentencepiece") as info:
        guidance.to("cpu")
    assert "\n" not in str(info.value)

