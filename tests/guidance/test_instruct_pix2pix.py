"""The editors: InstructPix2Pix loaded from a tiny random-weight folder through the real path (its 3-way guidance
and a DDIM edit checked against independent UNet/VAE calls), load errors, and the analytic color editor."""

from __future__ import annotations

import pytest
import torch

from lift3d.guidance.editing import AnalyticEditor
from lift3d.guidance.instruct_pix2pix import InstructPix2PixEditor, edit_size, edit_timesteps
from lift3d.guidance.loading import ModelLoadError
from lift3d.registry import find
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (fixture)
from tests.tiny_instruct_pix2pix import tiny_instruct_pix2pix_path

SCALES = {"guidance_scale": 6.0, "image_guidance_scale": 1.7}


@pytest.fixture(scope="module")
def editor():
    return find("instruct-pix2pix")({"pretrained_model_name_or_path": str(tiny_instruct_pix2pix_path()),
                                     "prompt": "make it bronze", "diffusion_steps": 3, **SCALES})


def _unet(editor, x, t, image_latents, context):
    """One plain UNet call: noisy latents + image latents on the channel axis, one text context."""
    return editor.models.unet(torch.cat([x, image_latents], dim=1), torch.tensor([t]), encoder_hidden_states=context).sample


def test_the_editor_loads_an_8_channel_unet_and_keeps_shape_and_range(editor):
    assert isinstance(editor, InstructPix2PixEditor) and editor.models.unet.config.in_channels == 8
    render, photo = torch.rand(1, 20, 28, 3), torch.rand(1, 20, 28, 3)
    edited = editor.edit(render, photo, torch.Generator().manual_seed(0))
    assert edited.shape == (1, 20, 28, 3) and edited.min() >= 0 and edited.max() <= 1
    assert torch.isfinite(edited).all() and edited.std() > 0
    again = editor.edit(render, photo, torch.Generator().manual_seed(0))
    assert torch.equal(edited, again)  # the generator fixes timestep and noise


def test_three_way_guidance_matches_separate_unet_calls(editor):
    torch.manual_seed(1)
    x, image_latents = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
    t = 417
    context = editor.text_context()
    text, empty = context[0:1].expand(2, -1, -1), context[1:2].expand(2, -1, -1)
    eps_text = _unet(editor, x, t, image_latents, text)
    eps_image = _unet(editor, x, t, image_latents, empty)
    eps_uncond = _unet(editor, x, t, torch.zeros_like(image_latents), empty)
    expected = eps_uncond + 6.0 * (eps_text - eps_image) + 1.7 * (eps_image - eps_uncond)
    torch.testing.assert_close(editor.guided_noise(x, t, image_latents), expected, atol=1e-5, rtol=1e-4)
    # the instruction is the tokenizer + text encoder's embedding of the prompt; the other two the empty prompt's
    assert not torch.allclose(context[0], context[1]) and torch.equal(context[1], context[2])


def test_a_one_step_edit_is_the_denoised_estimate_of_the_noised_render(editor):
    editor.cfg.diffusion_steps = 1
    try:
        torch.manual_seed(2)
        render, photo = torch.rand(1, 16, 16, 3), torch.rand(1, 16, 16, 3)
        noise, t = torch.randn(1, 4, 2, 2), 600
        edited = editor.edit(render, photo, timestep=t, noise=noise)
        vae, a = editor.models.vae, editor.alphas_cumprod[t]
        latents = vae.encode(render.permute(0, 3, 1, 2) * 2 - 1).latent_dist.mean * vae.config.scaling_factor
        photo_latents = vae.encode(photo.permute(0, 3, 1, 2) * 2 - 1).latent_dist.mode()  # unscaled, as InstructPix2Pix
        x = a.sqrt() * latents + (1 - a).sqrt() * noise
        context = editor.text_context()
        eps = [_unet(editor, x, t, lat, context[i : i + 1]) for i, lat in
               enumerate((photo_latents, photo_latents, torch.zeros_like(photo_latents)))]
        guided = eps[2] + 6.0 * (eps[0] - eps[1]) + 1.7 * (eps[1] - eps[2])
        x0 = (x - (1 - a).sqrt() * guided) / a.sqrt()
        expected = (vae.decode(x0 / vae.config.scaling_factor).sample * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
        torch.testing.assert_close(edited, expected, atol=1e-5, rtol=1e-4)
    finally:
        editor.cfg.diffusion_steps = 3


def test_timesteps_and_sizes():
    assert edit_timesteps(800, 4) == [800, 600, 400, 200]
    assert edit_timesteps(3, 20) == [3, 2, 1, 0]  # fewer noise levels than steps: no repeats
    assert edit_size(400, 400, 512) == (400, 400) and edit_size(1000, 600, 512) == (512, 304) and edit_size(20, 28, 0) == (16, 24)


def test_load_errors_name_the_editor_key(tmp_path):
    with pytest.raises(ModelLoadError, match="system.editor.pretrained_model_name_or_path=/path/to/folder"):
        InstructPix2PixEditor({"pretrained_model_name_or_path": str(tmp_path / "missing"), "local_files_only": True})
    with pytest.raises(ModelLoadError, match="takes 4 input channels, InstructPix2Pix's takes 8"):
        InstructPix2PixEditor({"pretrained_model_name_or_path": str(tiny_sd_path())})


def test_analytic_editor_applies_the_color_matrix_and_blends_the_render():
    matrix = [[0.2, 0.5, 0.1], [0.0, 0.9, 0.0], [0.3, 0.0, 0.4]]
    offset = [0.05, -0.1, 0.2]
    photo, render = torch.rand(2, 5, 6, 3), torch.rand(2, 5, 6, 3)
    editor = AnalyticEditor({"matrix": matrix, "offset": offset})
    r, g, b = photo.unbind(-1)
    expected = torch.stack([0.2 * r + 0.5 * g + 0.1 * b + 0.05, 0.9 * g - 0.1, 0.3 * r + 0.4 * b + 0.2], -1).clamp(0, 1)
    torch.testing.assert_close(editor.edit(render, photo), expected)
    blended = AnalyticEditor({"matrix": matrix, "offset": offset, "render_blend": 0.25}).edit(render, photo)
    torch.testing.assert_close(blended, 0.75 * expected + 0.25 * render)
    with pytest.raises(ValueError, match="3x3 matrix"):
        AnalyticEditor({"matrix": [[1, 0], [0, 1]]})
