"""Image-to-3D views: random novel views around the object, plus the one reference view and its photo.

Every training batch is a random-views batch (``lift3d.data.random_views``) with the reference added:
``ref_cameras`` (one camera), ``ref_rgb [1, H, W, 3]`` (the cut-out composited on ``reference_background``),
``ref_mask [1, H, W, 1]`` and ``ref_background [1, 3]``. The reference comes from a photo (``image``: cut
out, centered, scaled; its camera at ``elevation_deg``/``azimuth_deg``/``distance``/``fovy_deg``) or, for
the offline twin, from a posed scene's train frame (``reference_scene`` + ``reference_frame``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lift3d.cameras import Cameras, c2w_to_spherical, fov_from_focal, intrinsics_from_fovy, look_at, spherical_to_position
from lift3d.config import bounded, choice
from lift3d.data.random_views import RandomViewsConfig, RandomViewsDataModule, sample_random_views
from lift3d.data.reference_image import BACKGROUND_REMOVAL
from lift3d.data.summary import ReferenceView, SceneSummary
from lift3d.registry import register

log = logging.getLogger("lift3d.data")


@dataclass
class SingleImageConfig(RandomViewsConfig):
    """The reference photo and its assumed camera, on top of the random novel views."""

    image: str = ""  # the reference photo (RGBA: its alpha is the object; RGB: the background is removed)
    # auto (alpha, else rembg if installed, else plain color), alpha, rembg, plain, none
    background_removal: str = choice("auto", among=BACKGROUND_REMOVAL)
    # the object is centered and scaled to this share of the reference image's side (0: as is)
    object_size: float = bounded(0.8, low=0, high=1)
    reference_size: int = bounded(256, low=1)  # side of the (square) reference image in pixels
    # the photo's camera elevation above the object's horizon (lift3d generate --elevation)
    elevation_deg: float = bounded(0.0, low=-90, high=90)
    azimuth_deg: float = 0.0  # the photo's camera azimuth (the object's front)
    distance: float = bounded(2.5, above=0)  # the photo's camera distance from the object's center
    # the photo's vertical field of view, degrees (Zero123's training renders)
    fovy_deg: float = bounded(49.1, above=0, below=180)
    # no image: this train frame of reference_scene is the reference (the offline twin)
    reference_frame: int = bounded(-1, low=0, allowed=(-1,), example=0)


def photo_reference(cfg: SingleImageConfig) -> ReferenceView:
    """The reference of ``cfg.image``: cut out, centered, at the configured camera."""
    from lift3d.data.images import load_rgba
    from lift3d.data.reference_image import cut_out, recenter

    path = Path(cfg.image).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"the reference image {path} does not exist")
    rgba = recenter(cut_out(load_rgba(path), cfg.background_removal), cfg.reference_size, cfg.object_size)
    elevation, azimuth = torch.deg2rad(torch.tensor([cfg.elevation_deg])), torch.deg2rad(torch.tensor([cfg.azimuth_deg]))
    position = spherical_to_position(elevation, azimuth, torch.tensor([cfg.distance]))
    c2w = look_at(position, torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]))
    size = cfg.reference_size
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.deg2rad(torch.tensor([cfg.fovy_deg])), size, size), size, size)
    return ReferenceView(torch.from_numpy(rgba).float() / 255.0, cameras, cfg.elevation_deg, cfg.azimuth_deg, cfg.distance)


def scene_reference(cfg: SingleImageConfig) -> ReferenceView:
    """The reference of the offline twin: train frame ``reference_frame`` of ``reference_scene``, as posed."""
    import torch.nn.functional as F

    from lift3d.data.formats.blender import read_transforms

    scene = read_transforms(cfg.reference_scene, "train")
    if not 0 <= cfg.reference_frame < len(scene):
        raise ValueError(f"data.reference_frame must be in 0..{len(scene) - 1} for {cfg.reference_scene}, "
                         f"got {cfg.reference_frame}")
    i, size = cfg.reference_frame, cfg.reference_size
    rgba = scene.rgba[i].float().permute(2, 0, 1)[None] / 255.0
    rgba = F.interpolate(rgba, (size, size), mode="bilinear", align_corners=False, antialias=True)[0].permute(1, 2, 0)
    cameras = scene.cameras[i].resized(size, size)
    elevation, azimuth, distance = (float(torch.rad2deg(v)) if k < 2 else float(v)
                                    for k, v in enumerate(c2w_to_spherical(cameras.c2w[0])))
    return ReferenceView(rgba.contiguous(), cameras, elevation, azimuth, distance)


@register("single-image")
class SingleImageDataModule(RandomViewsDataModule):
    """Random novel views with the reference view and photo in every batch."""

    Config = SingleImageConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.image:
            self.reference = photo_reference(c)
        elif c.reference_scene and c.reference_frame >= 0:
            self.reference = scene_reference(c)
        else:
            raise ValueError("data.image is empty: give the reference photo (lift3d generate --image PHOTO)")
        background = torch.tensor([float(v) for v in c.reference_background])
        self._ref_batch = {
            "ref_cameras": self.reference.cameras,
            "ref_rgb": self.reference.composited(background)[None].contiguous(),
            "ref_mask": self.reference.rgba[None, ..., 3:].contiguous(),
            "ref_background": background[None],
        }
        fov = float(torch.rad2deg(fov_from_focal(self.reference.cameras.intrinsics[0, 1, 1], self.reference.cameras.height)))
        log.info("reference view: elevation %.1f, azimuth %.1f deg, distance %.2f, fovy %.1f deg, %dx%d",
                 self.reference.elevation_deg, self.reference.azimuth_deg, self.reference.distance, fov,
                 self.reference.cameras.width, self.reference.cameras.height)

    def scene_summary(self) -> SceneSummary:
        """Random views of an object, with the reference view and the background its photo is composited on."""
        background = torch.tensor([float(v) for v in self.cfg.reference_background])
        return SceneSummary(object_centric=True, reference=self.reference, background=background)

    def _sample(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        batch = sample_random_views(self.cfg, step, generator)
        batch.update(self._ref_batch)
        return batch
