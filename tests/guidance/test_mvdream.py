"""MVDream guidance with a tiny random-weight MVDream-shaped model loaded from disk: the multi-view
attention against attention over hand-concatenated tokens, the camera conditioning against MVDream's own
camera formulas, the rescaled CFG against diffusers' rescale, and the SDS gradient against an independent
computation made straight with diffusers (its own attention processor written here)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lift3d.cameras import Cameras, intrinsics_from_fovy, spherical_to_c2w
from lift3d.guidance.loading import ModelLoadError
from lift3d.guidance.multiview import MultiViewAttnProcessor, mvdream_camera, rescale_guidance
from lift3d.guidance.mvdream import MVDreamGuidance
from lift3d.guidance.score import timestep_weight
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)
from tests.tiny_mvdream import tiny_mvdream_path


def make(tmp_path, **overrides) -> MVDreamGuidance:
    cfg = {"pretrained_model_name_or_path": str(tiny_mvdream_path()), "prompt": "a cat", "resolution": 64,
           "prompt_cache_dir": str(tmp_path / "cache"), **overrides}
    return MVDreamGuidance(cfg)


def four_views(base_azimuth: list[float], elevation: float = 10.0, distance: float = 2.0) -> dict:
    """Batches of objects x 4 views 90 degrees apart."""
    az = torch.tensor([b + 90.0 * k for b in base_azimuth for k in range(4)])
    el = torch.full_like(az, elevation)
    c2w = spherical_to_c2w(torch.deg2rad(el), torch.deg2rad(az), torch.full_like(az, distance))
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.full_like(az, 0.8), 16, 16), 16, 16)
    return {"elevation_deg": el, "azimuth_deg": az, "distance": torch.full_like(az, distance), "cameras": cameras, "step": 0}


# ----------------------------------------------------------------------------------------- loading
def test_loads_through_the_real_path_with_the_multiview_processor_on_self_attention(tmp_path):
    guidance = make(tmp_path)
    unet = guidance.unet
    assert unet.config.class_embed_type == "projection" and unet.config.projection_class_embeddings_input_dim == 16
    processors = unet.attn_processors
    self_attention = [name for name in processors if name.endswith("attn1.processor")]
    assert self_attention and all(isinstance(processors[name], MultiViewAttnProcessor) for name in self_attention)
    assert not any(isinstance(p, MultiViewAttnProcessor) for name, p in processors.items() if name not in self_attention)
    assert not any(p.requires_grad for p in unet.parameters()) and list(guidance.state_dict()) == []


def test_load_errors_say_what_to_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="not an MVDream model.*projection_class_embeddings_input_dim=16"):
        make(tmp_path, pretrained_model_name_or_path=str(tiny_sd_path()))
    with pytest.raises(ModelLoadError, match="system.guidance.pretrained_model_name_or_path is empty"):
        make(tmp_path, pretrained_model_name_or_path="")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_mvdream_path(), broken)
    shutil.rmtree(broken / "vae")
    expected = r"local folder .*broken \(its 'vae/' part\).*system\.guidance\.pretrained_model_name_or_path="
    with pytest.raises(ModelLoadError, match=expected):
        make(tmp_path, pretrained_model_name_or_path=str(broken))
    with pytest.raises(ValueError, match="perp_neg"):
        make(tmp_path, perp_neg=True)


# ----------------------------------------------------------------------------------------- attention
def test_multiview_attention_equals_attention_over_the_concatenated_tokens():
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    torch.manual_seed(0)
    attn = Attention(query_dim=16, heads=2, dim_head=8)
    objects, views, tokens = 2, 4, 5
    x = torch.randn(objects * views, tokens, 16)
    attn.set_processor(MultiViewAttnProcessor(AttnProcessor2_0(), views))
    out = attn(x)
    expected = []
    for b in range(objects):
        joined = torch.cat([x[b * views + v] for v in range(views)], dim=0)  # [V*N, C]
        q, k, v = (proj(joined).reshape(-1, 2, 8).transpose(0, 1) for proj in (attn.to_q, attn.to_k, attn.to_v))
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(-1, 16)
        result = attn.to_out[0](mixed)
        expected += [result[i * tokens:(i + 1) * tokens] for i in range(views)]
    torch.testing.assert_close(out, torch.stack(expected), rtol=1e-5, atol=1e-6)
    attn.set_processor(MultiViewAttnProcessor(AttnProcessor2_0(), 1))
    assert not torch.allclose(attn(x), out, atol=1e-4)  # per-image attention differs: the views do interact


def test_each_view_sees_the_others_only_within_its_object(tmp_path):
    guidance = make(tmp_path, latent_input=True)
    torch.manual_seed(1)
    x = torch.randn(8, 4, 8, 8)
    t = torch.full((8,), 500)
    context = torch.randn(8, 77, 32)
    camera = mvdream_camera(four_views([0.0, 30.0])["cameras"].c2w)
    changed = x.clone()
    changed[2] += 1.0  # a view of the first object
    with torch.no_grad():
        a, b = (guidance.unet(v, t, encoder_hidden_states=context, class_labels=camera).sample for v in (x, changed))
    assert not torch.allclose(a[0], b[0], atol=1e-5)  # another view of the same object changes view 0
    torch.testing.assert_close(a[4:], b[4:])  # the second object does not see it


# ----------------------------------------------------------------------------------------- cameras
def mvdream_reference_camera(elevation_deg: float, azimuth_deg: float) -> np.ndarray:
    """MVDream's camera_utils.create_camera_to_world_matrix + convert_opengl_to_blender, flattened."""
    el, az = math.radians(elevation_deg), math.radians(azimuth_deg)
    position = np.array([math.cos(el) * math.sin(az), math.sin(el), math.cos(el) * math.cos(az)])
    forward = -position / np.linalg.norm(position)
    right = np.cross(forward, [0.0, 1.0, 0.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    c2w = np.eye(4)
    c2w[:3, :3] = np.stack([right, up, -forward], axis=1)
    c2w[:3, 3] = position
    flip_yz = np.array([[1, 0, 0, 0], [0, 0, -1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=float)
    return (flip_yz @ c2w).flatten()


def test_camera_condition_by_hand_and_against_mvdreams_formulas():
    # lift3d camera at elevation 0, azimuth 0, distance 2: at +x looking at the origin, +z up. Columns:
    # right (0, 1, 0), up (0, 0, 1), backward (1, 0, 0), position scaled to the unit sphere (1, 0, 0)
    c2w = spherical_to_c2w(torch.zeros(1), torch.zeros(1), torch.full((1,), 2.0))
    expected = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]], dtype=torch.float32)
    torch.testing.assert_close(mvdream_camera(c2w), expected, atol=1e-6, rtol=0)
    # any view: lift3d's azimuth a is MVDream's a + 90 (MVDream's azimuth 0 looks from -y); distance drops out
    for elevation, azimuth, distance in [(15.0, 0.0, 3.0), (30.0, 120.0, 1.2), (-10.0, -75.0, 7.0)]:
        c2w = spherical_to_c2w(torch.deg2rad(torch.tensor([elevation])), torch.deg2rad(torch.tensor([azimuth])),
                               torch.tensor([distance]))
        reference = torch.from_numpy(mvdream_reference_camera(elevation, azimuth + 90.0)).float()
        torch.testing.assert_close(mvdream_camera(c2w)[0], reference, atol=1e-5, rtol=0)


def test_the_camera_reaches_the_time_embedding_as_class_labels(tmp_path):
    guidance = make(tmp_path, latent_input=True)
    seen = []
    guidance.unet.class_embedding.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    batch = four_views([20.0])
    guidance(torch.randn(4, 8, 8, 4), batch)
    (labels,) = seen
    assert labels.shape == (8, 16)
    torch.testing.assert_close(labels, mvdream_camera(batch["cameras"].c2w).repeat(2, 1))
    # diffusers' projection class embedding is MVDream's camera_embed: Linear(16, D) - SiLU - Linear(D, D)
    layer = guidance.unet.class_embedding
    torch.testing.assert_close(layer(labels), layer.linear_2(F.silu(layer.linear_1(labels))))


# ----------------------------------------------------------------------------------------- rescaled CFG
def test_rescale_matches_diffusers_per_sample_and_groups_views():
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import rescale_noise_cfg

    torch.manual_seed(2)
    guided, cond = torch.randn(8, 4, 6, 6) * 3, torch.randn(8, 4, 6, 6)
    torch.testing.assert_close(rescale_guidance(guided, cond, 0.7), rescale_noise_cfg(guided, cond, 0.7), rtol=1e-5, atol=1e-6)
    assert torch.equal(rescale_guidance(guided, cond, 0.0), guided)
    full = rescale_guidance(guided, cond, 1.0, group=4)
    for b in range(2):  # the std over each object's 4 views together matches the conditional estimate's
        torch.testing.assert_close(full[4 * b:4 * b + 4].std(), cond[4 * b:4 * b + 4].std(), rtol=1e-5, atol=0)
        ratio = full[4 * b:4 * b + 4] / guided[4 * b:4 * b + 4]
        torch.testing.assert_close(ratio, torch.full_like(ratio, float(ratio.flatten()[0])))  # one factor per object


def test_recon_weighting_is_the_gradient_of_the_x0_reconstruction_loss():
    torch.manual_seed(3)
    alpha_bar = torch.tensor([0.9, 0.3, 0.02])
    x = torch.randn(3, 4, 2, 2, requires_grad=True)
    noise, eps_hat = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    a = alpha_bar.reshape(-1, 1, 1, 1)
    x_t = a.sqrt() * x.detach() + (1 - a).sqrt() * noise
    x0_hat = (x_t - (1 - a).sqrt() * eps_hat) / a.sqrt()
    (0.5 * (x - x0_hat).square().sum()).backward()
    torch.testing.assert_close(x.grad, timestep_weight(alpha_bar, "recon").reshape(-1, 1, 1, 1) * (eps_hat - noise))


# ----------------------------------------------------------------------------------------- the SDS gradient
class ConcatenatedSelfAttention:
    """An independent multi-view self-attention processor: each object's views' tokens in one sequence."""

    def __init__(self, views: int) -> None:
        self.views = views

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        n, tokens, channels = hidden_states.shape
        x = hidden_states.reshape(n // self.views, self.views * tokens, channels)
        heads = attn.heads
        q, k, v = (proj(x).unflatten(-1, (heads, -1)).transpose(1, 2) for proj in (attn.to_q, attn.to_k, attn.to_v))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return attn.to_out[1](attn.to_out[0](out)).reshape(n, tokens, -1)


def independent_mvdream_grad(path, latents, t, noise, camera, scale, rescale):
    """threestudio's MVDream guidance step (x0-reconstruction loss, recon_std_rescale) straight from diffusers."""
    from diffusers import DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(path, subfolder="tokenizer")
    encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder")
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet")
    unet.set_attn_processor({name: ConcatenatedSelfAttention(4) if name.endswith("attn1.processor") else p
                             for name, p in unet.attn_processors.items()})
    scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")
    n = latents.shape[0]

    def embed(text):
        ids = tokenizer([text] * n, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        return encoder(ids)[0]

    from lift3d.guidance.mvdream import NEGATIVE_PROMPT

    with torch.no_grad():
        x_t = scheduler.add_noise(latents, noise, t)
        out_c = unet(x_t, t, encoder_hidden_states=embed("a cat"), class_labels=camera).sample
        out_u = unet(x_t, t, encoder_hidden_states=embed(NEGATIVE_PROMPT), class_labels=camera).sample
        eps = out_u + scale * (out_c - out_u)
        a = scheduler.alphas_cumprod[t].reshape(-1, 1, 1, 1)
        recon = (x_t - (1 - a).sqrt() * eps) / a.sqrt()
        recon_cond = (x_t - (1 - a).sqrt() * out_c) / a.sqrt()
        factor = recon_cond.view(-1, 4, *recon.shape[1:]).std([1, 2, 3, 4], keepdim=True) + 1e-8
        factor = factor / (recon.view(-1, 4, *recon.shape[1:]).std([1, 2, 3, 4], keepdim=True) + 1e-8)
        adjusted = recon * factor.squeeze(1).repeat_interleave(4, dim=0)
        recon = rescale * adjusted + (1 - rescale) * recon
    return latents - recon  # the gradient of 0.5 ||latents - recon||^2


def test_sds_gradient_matches_an_independent_computation(tmp_path):
    guidance = make(tmp_path, latent_input=True, guidance_scale=7.5, guidance_rescale=0.5)
    torch.manual_seed(4)
    latents = torch.randn(8, 8, 8, 4, requires_grad=True)
    t = torch.tensor([300] * 4 + [800] * 4)
    noise = torch.randn(8, 4, 8, 8)
    batch = four_views([0.0, 45.0])
    out = guidance(latents, batch, timesteps=t, noise=noise)
    out["loss_sds"].backward()
    camera = mvdream_camera(batch["cameras"].c2w)
    expected = independent_mvdream_grad(str(tiny_mvdream_path()), latents.detach().permute(0, 3, 1, 2), t, noise, camera,
                                        7.5, 0.5)
    scale = float(expected.abs().max())
    torch.testing.assert_close(latents.grad.permute(0, 3, 1, 2), expected, rtol=1e-4, atol=1e-5 * scale)


def test_timesteps_are_shared_by_the_views_of_an_object_and_batches_must_hold_whole_objects(tmp_path):
    guidance = make(tmp_path, latent_input=True)
    t = guidance.sample_timesteps(12, torch.device("cpu")).reshape(3, 4)
    assert (t == t[:, :1]).all()
    out = guidance(torch.randn(8, 8, 8, 4), four_views([0.0, 10.0]))
    assert out["timesteps"].shape == (8,) and torch.isfinite(out["loss_sds"])
    with pytest.raises(ValueError, match="multiple of 4.*data.n_views=4"):
        guidance(torch.randn(3, 8, 8, 4), four_views([0.0]))
    # single evaluation views (validation panels) are denoised one at a time
    single = {key: value[:1] if torch.is_tensor(value) else value for key, value in four_views([0.0]).items()}
    single["cameras"] = four_views([0.0])["cameras"][0]
    images = guidance(torch.randn(1, 8, 8, 4), single, timesteps=torch.tensor([500]))
    assert torch.isfinite(images["loss_sds"])


@pytest.mark.parametrize("options", [{"attention": "default"}, {"fuse_qkv": True}, {"attention_slicing": True}])
def test_attention_options_keep_the_views_together(tmp_path, options):
    torch.manual_seed(5)
    x_t, t, batch = torch.randn(4, 4, 8, 8), torch.full((4,), 400), four_views([15.0])
    reference = make(tmp_path, latent_input=True).predict_noise(x_t, t, batch)
    other = make(tmp_path, latent_input=True, **options)
    processors = other.unet.attn_processors.items()
    assert all(isinstance(p, MultiViewAttnProcessor) for n, p in processors if n.endswith("attn1.processor"))
    torch.testing.assert_close(other.predict_noise(x_t, t, batch), reference, rtol=1e-4, atol=1e-4)
