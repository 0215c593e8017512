"""The multi-view pieces of MVDream: self-attention across the views of one object, the camera
conditioning, and the std-rescaled classifier-free guidance, as a diffusers attention processor and
pure functions.

MVDream (Shi et al. 2023) is Stable Diffusion 2.1 with two changes: every transformer block's
self-attention (``attn1``) attends over the tokens of all views of one object together (MVDream's
``rearrange(x, "(b f) l c -> b (f l) c")`` around ``attn1``), and the timestep embedding gets
``camera_embed(c2w.flatten())``, a Linear(16, 1280) - SiLU - Linear(1280, 1280) MLP of the flattened 4x4
camera-to-world matrix. diffusers' ``UNet2DConditionModel(class_embed_type="projection",
projection_class_embeddings_input_dim=16)`` adds exactly that MLP (``TimestepEmbedding``: linear_1, SiLU,
linear_2) to the time embedding, with the camera passed as ``class_labels``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

CAMERA_DIM = 16  # MVDream's camera_dim: a flattened 4x4 matrix


def mvdream_camera(c2w: Tensor) -> Tensor:
    """MVDream's camera conditioning [B, 16] of cameras ``c2w`` [B, 4, 4].

    MVDream renders its training views with ``camera_utils.get_camera(..., blender_coord=True)``: the
    camera-to-world matrix with OpenGL camera axes (x right, y up, looking down -z) in a +z-up world,
    the camera on the unit sphere, flattened row-major; ``normalize_camera`` scales the translation to
    unit length, so the distance to the object is not part of the condition. lift3d's ``c2w`` has the
    same axes and world up (``lift3d.cameras``), so only the normalization applies: lift3d's azimuth
    ``a`` (from +x towards +y) is MVDream's azimuth ``a + 90`` (MVDream's 0 looks from -y), as in
    threestudio's MVDream guidance, which passes its cameras the same way.
    """
    camera = c2w.float().reshape(-1, 4, 4).clone()
    translation = camera[:, :3, 3]
    camera[:, :3, 3] = translation / (translation.norm(dim=-1, keepdim=True) + 1e-8)
    return camera.flatten(1)


def per_object_timesteps(sample: Callable[[int, torch.device], Tensor], n: int, views: int, device: torch.device,
                         guidance: str) -> Tensor:
    """Timesteps [n] for ``n`` renders, objects of ``views`` consecutive views: one ``sample``d timestep per object,
    shared by its views (as MVDream is trained and sampled)."""
    if n % views:
        raise ValueError(f"the {guidance} guidance denoises {views} views of one object together: the batch of {n} renders "
                         f"must be a multiple of {views} (set data.n_views={views} and data.batch_size to a multiple of it)")
    return sample(n // views, device).repeat_interleave(views)


def rescale_guidance(guided: Tensor, cond: Tensor, rescale: float, group: int = 1) -> Tensor:
    """The classifier-free-guided estimate ``guided`` [B, ...] rescaled towards the standard deviation
    of the conditional one ``cond`` [B, ...] ("Common Diffusion Noise Schedules and Sample Steps are
    Flawed", Lin et al. 2023, eq. 15-16): ``rescale * guided * std(cond) / std(guided) + (1 - rescale) * guided``.

    The std is taken over each group of ``group`` consecutive samples together (MVDream rescales its
    x0 estimate over the 4 views of one object; ``group=1`` is diffusers' per-sample ``guidance_rescale``).
    """
    if rescale == 0:
        return guided
    if guided.shape[0] % group:
        raise ValueError(f"rescale_guidance: batch {guided.shape[0]} is not a multiple of the group size {group}")
    n = guided.shape[0] // group
    std_cond = cond.float().reshape(n, -1).std(dim=1) + 1e-8
    std_guided = guided.float().reshape(n, -1).std(dim=1) + 1e-8
    factor = (std_cond / std_guided).repeat_interleave(group).reshape(-1, *([1] * (guided.ndim - 1)))
    return rescale * guided * factor.to(guided.dtype) + (1 - rescale) * guided


class MultiViewAttnProcessor:
    """A diffusers attention processor for self-attention across views: hidden states [B*V, N, C] of
    B objects seen from V views are folded to [B, V*N, C], attended by the wrapped processor (SDPA,
    xformers, sliced, fused: whatever the attention options installed), and unfolded.

    ``num_views`` is read at each call: 1 is ordinary per-image self-attention.
    """

    def __init__(self, inner: Any, num_views: int = 4) -> None:
        self.inner, self.num_views = inner, int(num_views)

    def __call__(self, attn: Any, hidden_states: Tensor, encoder_hidden_states: Tensor | None = None,
                 attention_mask: Tensor | None = None, temb: Tensor | None = None, **kwargs: Any) -> Tensor:
        views = self.num_views
        if temb is not None:  # only some processors take it (SlicedAttnProcessor does not)
            kwargs["temb"] = temb
        if views <= 1 or encoder_hidden_states is not None or hidden_states.ndim != 3:
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, **kwargs)
        bv, n, c = hidden_states.shape
        if bv % views:
            raise ValueError(f"multi-view attention: a batch of {bv} images is not a multiple of {views} views")
        folded = hidden_states.reshape(bv // views, views * n, c)
        out = self.inner(attn, folded, None, attention_mask, **kwargs)
        return out.reshape(bv, n, out.shape[-1])


def self_attention_names(unet: torch.nn.Module) -> list[str]:
    """The processor names of the UNet's self-attention layers (``...attn1.processor``)."""
    return [name for name in unet.attn_processors if name.endswith("attn1.processor")]


def install_multiview_attention(unet: Any, num_views: int = 4) -> int:
    """Wrap every ``attn1`` processor of ``unet`` in a ``MultiViewAttnProcessor`` (re-wrapping the
    current inner one if already wrapped: call it again after changing the attention kernel); the count."""
    processors = dict(unet.attn_processors)
    names = self_attention_names(unet)
    if not names:
        raise ValueError("the UNet has no self-attention layers (attn1) to run across views")
    for name in names:
        current = processors[name]
        inner = current.inner if isinstance(current, MultiViewAttnProcessor) else current
        processors[name] = MultiViewAttnProcessor(inner, num_views)
    unet.set_attn_processor(processors)
    return len(names)


def set_num_views(unet: Any, num_views: int) -> None:
    """Views per object for the next UNet calls (``num_views`` consecutive images are one object)."""
    for processor in unet.attn_processors.values():
        if isinstance(processor, MultiViewAttnProcessor):
            processor.num_views = int(num_views)
