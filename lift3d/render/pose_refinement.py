"""Camera pose refinement: a learnt rigid correction of each training photo's pose (gsplat's ``pose_opt``, nerfstudio's
camera optimizer), for captures whose poses come from structure from motion and are off by a fraction of a degree.

Each training photo ``i`` gets a 6-vector ``delta_i = (t, w)``, zero to start with: ``w`` an axis-angle rotation
(radians) about the camera's own center, ``t`` a shift of that center in units of the scene extent, both in world
axes. The corrected camera-to-world is ``[exp(w) R | c + extent * t]`` for a given ``[R | c]`` (SO(3) x R^3, as
nerfstudio's default; a rotation about the camera center is the same family as gsplat's right-multiplied correction,
written in world axes so that OpenGL and OpenCV conventions never enter). Held-out photos have no correction: they
are rendered and scored at their given poses, so a better score means a better scene, not a pose fitted to the view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.cameras import Cameras
from lift3d.config import bounded, choice, scheduled
from lift3d.data.formats import is_photographed
from lift3d.rotations import so3_exp

ENABLED = ("auto", "true", "false")
# layouts of captures posed by structure from motion (photo folders and videos reach the systems as COLMAP models)


@dataclass
class PoseRefinementConfig:
    """Whether training photos' poses are refined, and how fast.

    ``enabled=auto`` is on for captures posed by structure from motion (COLMAP, nerfstudio / instant-ngp, photo
    folders, videos) and off for Blender-layout objects and generation. ``lr`` is in radians and scene extents per
    step at most; a schedule warms it up as the scene takes shape.
    """

    # auto (on for captures posed by structure from motion), true or false
    enabled: str = choice("false", among=ENABLED, fold_case=True)
    lr: Any = scheduled(1e-4, low=0)  # Adam learning rate of the corrections (a schedule warms it up from 0)
    # pull of the corrections towards zero (L2 in Adam's gradient, as gsplat's pose_opt_reg)
    weight_decay: float = bounded(1e-6, low=0)


# ----------------------------------------------------------------------------------- the math
def correct_c2w(c2w: Tensor, delta: Tensor, extent: float | Tensor = 1.0) -> Tensor:
    """Camera-to-world matrices [B, 4, 4] of ``c2w`` [B, 4, 4] corrected by ``delta`` [B, 6] (t, w): rotated by exp(w)
    about their own centers, centers shifted by ``extent`` x t (see the module docstring)."""
    rotation = so3_exp(delta[:, 3:].to(c2w.dtype))
    top = torch.cat([rotation @ c2w[:, :3, :3], c2w[:, :3, 3:] + (extent * delta[:, :3]).to(c2w.dtype)[..., None]], -1)
    return torch.cat([top, c2w[:, 3:]], dim=1)


def correct_viewmats(viewmats: Tensor, delta: Tensor, extent: float | Tensor = 1.0) -> Tensor:
    """``correct_c2w`` on world-to-camera matrices [B, 4, 4] (any camera axes: the correction acts in world axes),
    without an inverse: ``[A | b]`` becomes ``[A exp(w)^T | -A exp(w)^T (c + extent t)]`` with center ``c = -A^T b``."""
    A, b = viewmats[:, :3, :3], viewmats[:, :3, 3:]
    center = -(A.transpose(1, 2) @ b) + (extent * delta[:, :3]).to(viewmats.dtype)[..., None]
    rotated = A @ so3_exp(delta[:, 3:].to(viewmats.dtype)).transpose(1, 2)
    return torch.cat([torch.cat([rotated, -(rotated @ center)], -1), viewmats[:, 3:]], dim=1)


def correct_cameras(cameras: Cameras, delta: Tensor, extent: float | Tensor = 1.0) -> Cameras:
    """``cameras`` with each pose corrected by its row of ``delta`` [B, 6] (precomputed ``viewmats`` corrected too,
    so both stay the same cameras)."""
    viewmats = None if cameras.viewmats is None else correct_viewmats(cameras.viewmats, delta, extent)
    return Cameras(correct_c2w(cameras.c2w, delta, extent), cameras.intrinsics, cameras.width, cameras.height, viewmats)


def resolve_enabled(enabled: Any, capture_format: str | None) -> bool:
    """Whether pose refinement is on for a capture read as ``capture_format`` (None: no photo capture, e.g.
    generation) under ``pose_refinement.enabled``."""
    mode = str(enabled).strip().lower()
    if mode not in ENABLED:
        raise ValueError(f"pose_refinement.enabled must be auto, true or false, got {enabled!r}")
    if mode != "auto":
        return mode == "true"
    return capture_format is not None and is_photographed(capture_format)


# ----------------------------------------------------------------------------------- the state
class PoseCorrections(BaseModule):
    """One pose correction per training photo, ``delta`` [N, 6] (zero: the given pose; applied less their mean, see
    ``centered``), and ``extent``, the unit of its shifts. Empty (N = 0, and frozen: no gradient and no optimizer
    group) until ``resize`` gives it the number of training photos. Only training photos named by a batch's
    ``index`` are corrected; held-out photos keep their given poses."""

    Config = PoseRefinementConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.delta = nn.Parameter(torch.zeros(0, 6), requires_grad=False)
        self.register_buffer("extent", torch.ones(()))

    @property
    def active(self) -> bool:
        """Whether there are corrections to apply (refinement on, and sized to the training photos)."""
        return self.delta.shape[0] > 0

    def resize(self, n_photos: int, extent: float | None = None) -> None:
        """``n_photos`` zero corrections (a no-op when already that many: a resumed run keeps its own); ``extent``
        (when given) the unit of their shifts."""
        if extent is not None:
            self.extent.fill_(float(extent))
        if self.delta.shape[0] != n_photos:
            self.delta = nn.Parameter(torch.zeros(n_photos, 6, device=self.delta.device, dtype=self.delta.dtype),
                                      requires_grad=n_photos > 0)

    def setup_for(self, capture_format: str | None, n_photos: int, extent: float) -> bool:
        """Size the corrections for ``n_photos`` training photos read as ``capture_format`` in a scene of ``extent``
        when ``enabled`` says refinement is on for it; returns whether it is on."""
        on = resolve_enabled(self.cfg.enabled, capture_format) and n_photos > 0
        self.resize(n_photos if on else 0, extent if on else None)
        return on

    def param_group(self) -> dict[str, Any]:
        """The optimizer group of the corrections (empty when inactive)."""
        params = [self.delta] if self.active else []
        return {"params": params, "name": "pose_refinement", "lr": self.cfg.lr, "weight_decay": self.cfg.weight_decay}

    def forward(self, cameras: Cameras, index: Tensor | None) -> Cameras:
        """``cameras`` of training photos ``index`` [B] at their corrected poses; unchanged when inactive or without
        an index (validation and test views)."""
        if not self.active or index is None:
            return cameras
        return correct_cameras(cameras, self.centered(index.to(self.delta.device).long()), self.extent)

    def centered(self, index: Tensor | None = None) -> Tensor:
        """The corrections [B, 6] of training photos ``index`` [B] (all when None) less the mean correction: the
        training cameras as a whole cannot drift (their mean correction is zero), so they stay in the frame of the
        held-out photos, whose given poses are the scene's reference; without it the scene and every training pose
        could move together at no cost in the loss, and the held-out views would see the scene shifted."""
        delta = self.delta if index is None else self.delta.index_select(0, index)
        return delta - self.delta.mean(0)

    def corrected_c2w(self, c2w: Tensor) -> Tensor:
        """All training poses [N, 4, 4] (in photo order) corrected: what the refinement learnt."""
        if not self.active:
            return c2w
        return correct_c2w(c2w, self.centered().detach().to(c2w.device), self.extent.to(c2w.device))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Take the checkpoint's number of corrections (a run evaluated or exported without set-up has none yet); a
        checkpoint written before pose refinement existed loads with none."""
        state_dict.setdefault(prefix + "delta", torch.zeros(0, 6))
        state_dict.setdefault(prefix + "extent", torch.ones(()))
        stored = state_dict[prefix + "delta"]
        if stored.shape != self.delta.shape:
            self.resize(stored.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
