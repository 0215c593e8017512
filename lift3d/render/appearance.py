"""Per-photo appearance: a color transform per training photo, applied to the render before the photometric loss.

Photos of a real capture differ in exposure, white balance and tone (auto-exposure, several cameras, clouds).
A model that must match every photo with one radiance either averages them (a flat, blurred color) or bakes the
differences into floaters in front of the cameras. Each training photo ``i`` gets an affine color transform
``rgb' = M_i rgb + b_i`` (3x3 matrix and offset, NeRF-W / nerfstudio / gsplat's ``app_opt`` in their simplest
form), stored as its offset from the identity so that weight decay pulls it back to the identity; the scene is
then learnt in the look of the average photo.

Held-out photos have no transform of their own, so evaluation fits one per held-out photo on part of it
(``held_out_scores``): see its docstring for the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.config import bounded, choice
from lift3d.data.formats import is_object_centric
from lift3d.metrics import psnr, ssim

ENABLED = ("auto", "true", "false")
EVAL_MODES = ("left-half", "mean")


@dataclass
class AppearanceConfig:
    """Whether training photos get their own color transform, and how held-out photos are then scored.

    ``enabled=auto`` (what the reconstruct recipes set) is on for real captures (COLMAP, nerfstudio / instant-ngp,
    photo folders, videos) and off for Blender-layout objects. ``eval=left-half`` fits an affine transform on a
    held-out photo's left half and scores the right half; ``mean`` scores the whole render as is (the mean transform).
    """

    # auto (on for real captures, off for Blender-layout objects), true or false
    enabled: str = choice("false", among=ENABLED, fold_case=True)
    # held-out scoring when on: left-half (fit on the left, score the right) or mean
    eval: str = choice("left-half", among=EVAL_MODES)
    fit_ridge: float = bounded(1e-3, low=0)  # left-half fit: pull towards the identity, per pixel (keeps flat halves well posed)


# ----------------------------------------------------------------------------------- the math
def identity_affine(n: int, device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """``n`` identity transforms [n, 3, 4] (matrix | offset)."""
    return torch.eye(3, 4, device=device, dtype=dtype).expand(n, 3, 4).clone()


def apply_affine(rgb: Tensor, affine: Tensor) -> Tensor:
    """``M rgb + b`` of every pixel of each view: rgb [B, ..., 3] (images [B, H, W, 3] or rays [N, 3]),
    affine [B, 3, 4] (one per view or ray) -> [B, ..., 3]."""
    flat = rgb.reshape(rgb.shape[0], -1, 3)
    out = torch.baddbmm(affine[:, None, :, 3], flat, affine[:, :, :3].transpose(1, 2))
    return out.reshape(rgb.shape)


def clip_straight_through(rgb: Tensor) -> Tensor:
    """``rgb`` clipped to 0..1 as a camera clips its colors, with gradients passed as if unclipped: a pixel pushed
    past 1 by a bright photo's gain matches that photo's saturated 1, while a render above 1 that should be darker
    still gets a gradient (a plain clamp would give it none)."""
    return rgb + (rgb.clamp(0.0, 1.0) - rgb).detach()


def fit_affine(prediction: Tensor, target: Tensor, ridge: float = 1e-3) -> Tensor:
    """The affine transform [3, 4] that maps ``prediction`` [P, 3] closest to ``target`` [P, 3] in least squares,
    ``ridge`` x P pulling it towards the identity (closed form, float64)."""
    x = torch.cat([prediction.double(), torch.ones_like(prediction[:, :1], dtype=torch.float64)], dim=1)  # [P, 4]
    y = target.double()
    prior = identity_affine(1, prediction.device, torch.float64)[0].T  # [4, 3]
    strength = ridge * max(x.shape[0], 1)
    normal = x.T @ x + strength * torch.eye(4, dtype=torch.float64, device=x.device)
    solution = torch.linalg.solve(normal, x.T @ y + strength * prior)  # [4, 3]
    return solution.T.to(prediction.dtype)


def held_out_scores(prediction: Tensor, target: Tensor, mode: str = "left-half", ridge: float = 1e-3,
                    mask: Tensor | None = None) -> Tensor:
    """PSNR and SSIM [B, 2] of renders ``prediction`` [B, H, W, 3] of held-out photos ``target`` [B, H, W, 3] when
    training photos had their own color transforms, over the pixels of ``mask`` [B, H, W, 1] when given (a photo's
    own pixels in a padded batch, less ignored ones). The protocol (``mode``):

    - ``left-half`` (NeRF-W's): an affine color transform is fitted in closed form (least squares of render against
      photo, a ``ridge`` pull towards the identity) on the left half of each held-out photo (the columns left of
      the middle of its pixels), applied to the render, and PSNR / SSIM are computed on the right half only: no
      pixel scored informed the fit.
    - ``mean``: the mean training transform, which is the identity (``PhotoAppearance`` centers them), that is the
      render as it is, scored on the whole photo; nothing of the held-out photo is used.

    Renders are clipped to 0..1 before the fit and after the transform, as the plain scores are."""
    if mode not in EVAL_MODES:
        raise ValueError(f"appearance.eval must be one of {', '.join(EVAL_MODES)}, got {mode!r}")
    prediction, target = prediction.clamp(0, 1).float(), target.float()
    if mode == "mean":
        return torch.stack([psnr(prediction, target, mask), ssim(prediction, target, mask=mask)], dim=-1)
    keep = torch.ones_like(prediction[..., :1], dtype=torch.bool) if mask is None else mask.bool()
    columns = torch.arange(prediction.shape[2], device=prediction.device)
    scores = []
    for p, t, k in zip(prediction, target, keep):
        used = columns[k.any(dim=0)[:, 0]]
        if len(used) < 2:
            raise ValueError("appearance.eval=left-half needs held-out photos at least 2 pixels wide")
        middle = (int(used[0]) + int(used[-1]) + 1) // 2
        left = k[:, :middle, 0]
        affine = fit_affine(p[:, :middle][left], t[:, :middle][left], ridge)
        right = apply_affine(p[None, :, middle:], affine[None]).clamp(0, 1)  # scored alone: no SSIM window sees the left
        kept = None if mask is None else k[None, :, middle:]
        scores.append(torch.cat([psnr(right, t[None, :, middle:], kept), ssim(right, t[None, :, middle:], mask=kept)]))
    return torch.stack(scores)


def resolve_enabled(enabled: Any, capture_format: str | None) -> bool:
    """Whether appearance is on for a capture read as ``capture_format`` (None: no photo capture, e.g. generation)
    under ``appearance.enabled``."""
    mode = str(enabled).strip().lower()
    if mode not in ENABLED:
        raise ValueError(f"appearance.enabled must be auto, true or false, got {enabled!r}")
    if mode != "auto":
        return mode == "true"
    return capture_format is not None and not is_object_centric(capture_format)


# ----------------------------------------------------------------------------------- the state
class PhotoAppearance(BaseModule):
    """One affine color transform per training photo, as its offset ``delta`` [N, 3, 4] from the identity (zero:
    the identity; weight decay on the optimizer group ``appearance`` pulls it back there). Empty (N = 0) until
    ``resize`` is called with the number of training photos, and then the identity everywhere: an empty one
    changes nothing and has no parameters to optimize."""

    Config = AppearanceConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.delta = nn.Parameter(torch.zeros(0, 3, 4))

    @property
    def active(self) -> bool:
        """Whether there are transforms to apply (appearance on, and sized to the training photos)."""
        return self.delta.shape[0] > 0

    def resize(self, n_photos: int) -> None:
        """``n_photos`` identity transforms (a no-op when already that many: a resumed run keeps its own)."""
        if self.delta.shape[0] != n_photos:
            self.delta = nn.Parameter(torch.zeros(n_photos, 3, 4, device=self.delta.device, dtype=self.delta.dtype))

    def setup_for(self, capture_format: str | None, n_photos: int) -> bool:
        """Size the transforms for a training set of ``n_photos`` photos read as ``capture_format`` when
        ``enabled`` says appearance is on for it; returns whether it is on."""
        on = resolve_enabled(self.cfg.enabled, capture_format) and n_photos > 0
        self.resize(n_photos if on else 0)
        return on

    def affines(self, index: Tensor) -> Tensor:
        """The transforms [B, 3, 4] of training photos ``index`` [B]: the identity plus each photo's offset less the
        mean offset. The mean transform is the identity by construction, so the scene keeps the look of the average
        photo (without it, every transform and the scene's colors could drift together with no change in the loss)."""
        centered = self.delta.index_select(0, index.to(self.delta.device).long()) - self.delta.mean(0)
        return centered + torch.eye(3, 4, device=self.delta.device)

    def forward(self, rgb: Tensor, index: Tensor | None) -> Tensor:
        """Renders ``rgb`` [B, ..., 3] of training photos ``index`` [B] in those photos' look (clipped to 0..1 as the
        camera did, gradients passed straight through); unchanged when inactive or without an index."""
        if not self.active or index is None:
            return rgb
        return clip_straight_through(apply_affine(rgb, self.affines(index)))


    def scores(self, prediction: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor | None:
        """Held-out PSNR / SSIM [B, 2] under ``eval`` over ``mask`` (see ``held_out_scores``); None when inactive
        (the plain scores apply)."""
        if not self.active:
            return None
        return held_out_scores(prediction, target, self.cfg.eval, self.cfg.fit_ridge, mask)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Take the checkpoint's number of transforms (a run evaluated or exported without set-up has none yet); a
        checkpoint written before per-photo appearance existed loads with none."""
        if prefix + "delta" not in state_dict:
            state_dict[prefix + "delta"] = torch.zeros(0, 3, 4)
        stored = state_dict.get(prefix + "delta")
        if stored is not None and stored.shape != self.delta.shape:
            self.resize(stored.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
