"""Prompt processing: text embeddings (cached on disk), view-dependent prompts, Perp-Neg weights.

View directions follow stable-dreamfusion's thresholds: a view is ``front`` within half of
``front_angle_deg`` of azimuth 0, ``back`` within the same half-width of 180, ``side`` between, and
``overhead`` / ``bottom`` within ``overhead_angle_deg`` of the poles (overriding azimuth). Azimuth is
measured from +x towards +y (``lift3d.cameras``), so the object's front faces +x.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lift3d.cameras import c2w_to_spherical
from lift3d.config import bounded
from lift3d.saving import atomic_write_bytes

log = logging.getLogger(__name__)

DIRECTIONS = ("front", "side", "back", "overhead", "bottom")
NEGATIVE_DIRECTIONS = ("front", "side", "back")  # the Perp-Neg negatives, centered at azimuth 0, 90, 180
TextEncoderFactory = Callable[[torch.device, torch.dtype], Callable[[list[str]], Tensor]]


@dataclass
class PromptConfig:
    """Text conditioning of a Stable Diffusion guidance."""

    prompt: str = ""  # what to make, e.g. "a DSLR photo of a hamburger"
    negative_prompt: str = ""  # the unconditional text ("" is Stable Diffusion's usual empty prompt)
    view_dependent_prompting: bool = True  # append ", front view" / side / back / overhead / bottom by camera angle
    # width of the front (and back) azimuth arc, as stable-dreamfusion's --angle_front
    front_angle_deg: float = bounded(60.0, low=0, high=360)
    # views this close to a pole are overhead / bottom, as --angle_overhead
    overhead_angle_deg: float = bounded(30.0, low=0, high=90)
    view_interpolation: bool = False  # blend front->side->back embeddings by azimuth instead of switching
    perp_neg: bool = False  # Perp-Neg: steer away from the other views' prompts (their perpendicular part only)
    perp_neg_weight: float = bounded(2.0, low=0)  # strength of a negative view prompt far from the current view
    perp_neg_decay: float = bounded(2.0, low=0)  # a negative's weight is perp_neg_weight * exp(-decay * closeness to that view)
    prompt_cache_dir: str = ""  # embedding cache ("": $LIFT3D_CACHE/text_embeddings or ~/.cache/lift3d/...; "none": off)


def view_prompt(prompt: str, direction: str) -> str:
    """The prompt for views from ``direction`` (one of ``DIRECTIONS``), stable-dreamfusion style."""
    return f"{prompt}, {direction} view"


def wrap_degrees(angle: Tensor) -> Tensor:
    """Angles in degrees wrapped to (-180, 180]."""
    wrapped = torch.remainder(angle + 180.0, 360.0) - 180.0
    return torch.where(wrapped == -180.0, torch.full_like(wrapped, 180.0), wrapped)


def _polar_override(elevation_deg: Tensor, overhead_angle: float) -> tuple[Tensor, Tensor]:
    return elevation_deg >= 90.0 - overhead_angle, elevation_deg <= -(90.0 - overhead_angle)


def view_direction(elevation_deg: Tensor, azimuth_deg: Tensor, front_angle: float, overhead_angle: float) -> Tensor:
    """Index [B] into ``DIRECTIONS`` of each view."""
    azimuth = wrap_degrees(azimuth_deg.float()).abs()
    index = torch.ones_like(azimuth, dtype=torch.long)  # side
    index = torch.where(azimuth < front_angle / 2, 0, index)
    index = torch.where(azimuth > 180.0 - front_angle / 2, 2, index)
    overhead, bottom = _polar_override(elevation_deg.float(), overhead_angle)
    return torch.where(overhead, 3, torch.where(bottom, 4, index))


def view_weights(
    elevation_deg: Tensor, azimuth_deg: Tensor, front_angle: float, overhead_angle: float, interpolate: bool
) -> Tensor:
    """Convex weights [B, 5] over ``DIRECTIONS``: one-hot, or a front->side->back blend linear in azimuth."""
    if not interpolate:
        return torch.nn.functional.one_hot(view_direction(elevation_deg, azimuth_deg, front_angle, overhead_angle), 5).float()
    azimuth = wrap_degrees(azimuth_deg.float()).abs()
    r_front = (azimuth / 90.0).clamp(0, 1)  # 0 at front, 1 at side
    r_back = ((azimuth - 90.0) / 90.0).clamp(0, 1)  # 0 at side, 1 at back
    front_half = azimuth <= 90.0
    zeros = torch.zeros_like(azimuth)
    weights = torch.stack(
        [
            torch.where(front_half, 1 - r_front, zeros),
            torch.where(front_half, r_front, 1 - r_back),
            torch.where(front_half, zeros, r_back),
            zeros,
            zeros,
        ],
        dim=-1,
    )
    overhead, bottom = _polar_override(elevation_deg.float(), overhead_angle)
    polar = torch.nn.functional.one_hot(torch.where(overhead, 3, 4), 5).float()
    return torch.where((overhead | bottom)[:, None], polar, weights)


def perp_neg_weights(elevation_deg: Tensor, azimuth_deg: Tensor, overhead_angle: float, weight: float, decay: float) -> Tensor:
    """Weights [B, 3] of the negative prompts ``NEGATIVE_DIRECTIONS`` (zero for overhead/bottom views).

    closeness = max(0, 1 - |azimuth - center| / 90) with centers 0, 90, 180; weight * exp(-decay * closeness).
    A view's own direction gets a small weight that has no effect: its perpendicular part is ~0.
    """
    azimuth = wrap_degrees(azimuth_deg.float()).abs()
    centers = torch.arange(3, device=azimuth.device) * 90.0  # 0, 90, 180 (made on the device: no host copy)
    closeness = (1 - (azimuth[:, None] - centers).abs() / 90.0).clamp_min(0)
    weights = weight * torch.exp(-decay * closeness)
    overhead, bottom = _polar_override(elevation_deg.float(), overhead_angle)
    return torch.where((overhead | bottom)[:, None], torch.zeros_like(weights), weights)


def default_cache_dir() -> Path:
    root = os.environ.get("LIFT3D_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "lift3d")
    return Path(root).expanduser() / "text_embeddings"


class EmbeddingCache:
    """Text embeddings on disk, one safetensors file per (model, text)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, model_key: str, text: str) -> Path:
        digest = hashlib.sha256(f"{model_key}\n{text}".encode()).hexdigest()[:40]
        return self.folder / f"{digest}.safetensors"

    def load(self, model_key: str, text: str) -> Tensor | None:
        from safetensors import safe_open

        path = self.path(model_key, text)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as handle:
                meta = handle.metadata() or {}
                if meta.get("model") != model_key or meta.get("text") != text:
                    return None
                return handle.get_tensor("embedding")
        except Exception as error:  # a truncated or foreign file is a miss, not a crash
            log.warning("ignoring unreadable cached text embedding %s: %s", path, error)
            return None

    def save(self, model_key: str, text: str, embedding: Tensor) -> None:
        from safetensors.torch import save

        data = save({"embedding": embedding.detach().float().cpu().contiguous()}, metadata={"model": model_key, "text": text})
        atomic_write_bytes(self.path(model_key, text), data)


def release_memory(device: torch.device) -> None:
    """Return freed memory at once: collect cycles that may hold a released model, and hand its CUDA blocks back."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class PromptBatch:
    """Per-view text conditioning for one step."""

    cond: Tensor  # [B, L, D]
    uncond: Tensor  # [B, L, D]
    negatives: Tensor | None = None  # [B, 3, L, D] (front, side, back) with Perp-Neg
    negative_weights: Tensor | None = None  # [B, 3]


class PromptProcessor:
    """Embeds the prompt (plain and per view) and the negative prompt once; picks them per view."""

    def __init__(self, cfg: PromptConfig, model_key: str, text_encoder: TextEncoderFactory | None) -> None:
        if not cfg.prompt.strip():
            raise ValueError('guidance.prompt is empty: say what to make, e.g. guidance.prompt="a DSLR photo of a hamburger"')
        if cfg.perp_neg and not cfg.view_dependent_prompting:
            raise ValueError("guidance.perp_neg needs guidance.view_dependent_prompting=true "
                             "(its negatives are the view prompts)")
        self.cfg, self.model_key, self.text_encoder = cfg, model_key, text_encoder
        folder = cfg.prompt_cache_dir
        cache_dir = Path(folder).expanduser() if folder else default_cache_dir()
        self.cache = None if folder.lower() == "none" else EmbeddingCache(cache_dir)
        self._embeddings: dict[str, Tensor] | None = None
        self._on_device: dict[tuple[torch.device, torch.dtype], dict[str, Tensor]] = {}  # copies, made once
        self.encoder_calls = 0  # how many times the text encoder ran (cache misses)

    def texts(self) -> dict[str, str]:
        """Name -> text of every embedding needed."""
        texts = {"uncond": self.cfg.negative_prompt, "plain": self.cfg.prompt}
        if self.cfg.view_dependent_prompting:
            texts.update({d: view_prompt(self.cfg.prompt, d) for d in DIRECTIONS})
        return texts

    def embeddings(self, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        """Name -> embedding [L, D]: from the cache, else the text encoder (loaded once, then released)."""
        if self._embeddings is None:
            texts = self.texts()
            found = {name: self.cache.load(self.model_key, text) if self.cache else None for name, text in texts.items()}
            missing = [name for name, value in found.items() if value is None]
            if missing:
                if self.text_encoder is None:
                    raise RuntimeError(f"no text encoder to embed {[texts[m] for m in missing]} and no cached embeddings")
                encoder = self.text_encoder(device, dtype)
                encoded = encoder([texts[name] for name in missing])
                self.encoder_calls += 1
                del encoder  # the text encoder is only needed here: free its memory now, before the UNet runs
                release_memory(device)
                for name, embedding in zip(missing, encoded):
                    found[name] = embedding.float().cpu()
                    if self.cache:
                        self.cache.save(self.model_key, texts[name], found[name])
            self._embeddings = {name: value for name, value in found.items() if value is not None}
        key = (torch.device(device), dtype)
        if key not in self._on_device:
            self._on_device[key] = {name: value.to(device=device, dtype=dtype) for name, value in self._embeddings.items()}
        return self._on_device[key]

    @staticmethod
    def view_angles(batch: dict[str, Any], n: int) -> tuple[Tensor, Tensor]:
        """(elevation_deg, azimuth_deg) [n] from the batch, or from its cameras."""
        if "elevation_deg" in batch and "azimuth_deg" in batch:
            return tuple(torch.as_tensor(batch[key]).reshape(-1).float() for key in ("elevation_deg", "azimuth_deg"))
        if "cameras" in batch:
            elevation, azimuth, _ = c2w_to_spherical(batch["cameras"].c2w)
            return torch.rad2deg(elevation), torch.rad2deg(azimuth)
        raise KeyError("view-dependent prompting needs 'elevation_deg' and 'azimuth_deg' (or 'cameras') in the batch")

    def __call__(self, batch: dict[str, Any], n: int, device: torch.device, dtype: torch.dtype) -> PromptBatch:
        cfg = self.cfg
        table = self.embeddings(device, dtype)
        uncond = table["uncond"].expand(n, -1, -1)
        if not cfg.view_dependent_prompting:
            return PromptBatch(cond=table["plain"].expand(n, -1, -1), uncond=uncond)
        elevation, azimuth = self.view_angles(batch, n)
        if elevation.shape[0] != n:
            raise ValueError(f"the batch has {elevation.shape[0]} view angles but the guidance got {n} images")
        weights = view_weights(elevation, azimuth, cfg.front_angle_deg, cfg.overhead_angle_deg, cfg.view_interpolation)
        stacked = torch.stack([table[d] for d in DIRECTIONS])  # [5, L, D]
        cond = torch.einsum("bk,kld->bld", weights.to(device=device, dtype=dtype), stacked)
        if not cfg.perp_neg:
            return PromptBatch(cond=cond, uncond=uncond)
        negatives = torch.stack([table[d] for d in NEGATIVE_DIRECTIONS])[None].expand(n, -1, -1, -1)
        neg_weights = perp_neg_weights(elevation, azimuth, cfg.overhead_angle_deg, cfg.perp_neg_weight, cfg.perp_neg_decay)
        return PromptBatch(cond=cond, uncond=uncond, negatives=negatives, negative_weights=neg_weights.to(device))


def describe_views(elevation_deg: Tensor, azimuth_deg: Tensor, cfg: PromptConfig) -> list[str]:
    """The view-dependent prompt text of each view (for logs and tests)."""
    index = view_direction(elevation_deg, azimuth_deg, cfg.front_angle_deg, cfg.overhead_angle_deg)
    return [view_prompt(cfg.prompt, DIRECTIONS[int(i)]) for i in index]

