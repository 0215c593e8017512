"""Random cameras around the origin for text-to-3D: per-step views, light positions, orbit evaluation."""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lift3d.cameras import (
    Cameras,
    c2w_to_spherical,
    fov_from_focal,
    intrinsics_from_fovy,
    look_at,
    normalize,
    spherical_to_position,
)
from lift3d.config import bounded, choice, step_count
from lift3d.data.base import BaseDataModule, step_loader, view_loader
from lift3d.data.summary import SceneSummary
from lift3d.registry import register

log = logging.getLogger(__name__)


@dataclass
class RandomViewsConfig:
    """Ranges are in degrees (angles) and scene units (distances)."""

    # keys renamed to one spelling per idea: the old name still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"n_view": "n_views", "eval_fovy": "eval_fovy_deg",
                                         "eval_elevation": "eval_elevation_deg"}

    height: Any = bounded(64, low=1)  # render height, or a list: one per resolution milestone stage
    width: Any = bounded(64, low=1)  # render width, or a list like height
    batch_size: Any = bounded(1, low=1)  # views per step, or a list like height
    resolution_milestones: list = step_count([], kind="milestones")  # steps at which the next height/width/batch applies
    elevation_range: list = bounded([-10.0, 60.0], low=-90, high=90, lengths=(2,))  # degrees above the xy-plane
    azimuth_range: list = bounded([-180.0, 180.0], lengths=(2,))  # degrees from +x towards +y
    camera_distance_range: list = bounded([1.5, 2.0], above=0, lengths=(2,))  # distance from the origin
    fovy_range: list = bounded([40.0, 70.0], above=0, below=180, lengths=(2,))  # vertical field of view, degrees
    batch_uniform_azimuth: bool = True  # stratify azimuths over a batch so views cover the circle
    # views per object: > 1 yields groups of n_views consecutive views 360/n_views degrees apart in azimuth (random
    # base) sharing elevation, distance, fovy and perturbations, as MVDream trains on (4); batch_size must be a multiple
    n_views: int = bounded(1, low=1)
    # camera distance = camera_distance_range value / tan(fovy / 2): the object fills the same part of every view
    # (threestudio's relative_radius for MVDream)
    relative_distance: bool = False
    camera_perturb: float = bounded(0.1, low=0)  # std of noise added to camera positions
    center_perturb: float = bounded(0.2, low=0)  # std of noise added to the look-at target
    up_perturb: float = bounded(0.02, low=0)  # std of noise added to the up vector
    light_position_perturb: float = bounded(1.0, low=0)  # std of noise on the light direction (dreamfusion strategy)
    light_distance_range: list = bounded([0.8, 1.5], low=0, lengths=(2,))  # light distance from the origin
    light_sample_strategy: str = choice("dreamfusion", "magic3d")  # dreamfusion (near the camera) or magic3d (camera hemisphere)
    eval_height: int = bounded(256, low=1)  # validation/test render height
    eval_width: int = bounded(256, low=1)  # validation/test render width
    eval_batch_size: int = bounded(1, low=1)  # views per evaluation batch
    eval_elevation_deg: float = bounded(15.0, low=-90, high=90)  # elevation of the evaluation orbit, degrees
    eval_camera_distance: float = bounded(1.5, above=0)  # distance of the evaluation orbit
    eval_fovy_deg: float = bounded(70.0, above=0, below=180)  # field of view of evaluation views, degrees
    n_val_views: int = bounded(4, low=1)  # views per validation check (evenly spaced in azimuth)
    n_test_views: int = bounded(120, low=1)  # views of the test orbit video
    # posed-image scene folder: its train cameras set the elevation, distance and fovy ranges (and the eval orbit's
    # distance and fovy)
    reference_scene: str = ""
    reference_eval_split: str = ""  # with reference_scene: validate on this split's views, scored against its images
    reference_background: list = bounded([1.0, 1.0, 1.0], low=0, high=1, lengths=(3,))  # RGB the reference images are scored on


def _stage(values: Any, stage: int) -> int:
    if isinstance(values, (list, tuple)):
        return int(values[min(stage, len(values) - 1)])
    return int(values)


def _uniform(low_high: list, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    low, high = float(low_high[0]), float(low_high[1])
    return low + (high - low) * torch.rand(shape, generator=generator)


def sample_random_views(cfg: RandomViewsConfig, step: int, generator: torch.Generator) -> dict[str, Any]:
    """One training batch of random views at ``step`` (a pure function of cfg, step and generator)."""
    stage = bisect.bisect_right(list(cfg.resolution_milestones), step)
    height, width, batch = _stage(cfg.height, stage), _stage(cfg.width, stage), _stage(cfg.batch_size, stage)
    views = int(cfg.n_views)
    if views < 1 or batch % views:
        raise ValueError(f"data.batch_size ({batch}) must be a multiple of data.n_views ({views})")
    objects = batch // views

    def per_object(values: Tensor) -> Tensor:  # one draw per object, shared by its views
        return values.repeat_interleave(views, dim=0)

    elevation_deg = per_object(_uniform(cfg.elevation_range, (objects,), generator))
    low, high = cfg.azimuth_range
    if cfg.batch_uniform_azimuth:
        base = low + (high - low) * (torch.rand(objects, generator=generator) + torch.arange(objects)) / objects
    else:
        base = _uniform(cfg.azimuth_range, (objects,), generator)
    azimuth_deg = per_object(base) + torch.arange(views).repeat(objects) * (360.0 / views)
    if views > 1:
        azimuth_deg = torch.remainder(azimuth_deg + 180.0, 360.0) - 180.0  # fixed offsets around the circle
    distance = per_object(_uniform(cfg.camera_distance_range, (objects,), generator))
    fovy_deg = per_object(_uniform(cfg.fovy_range, (objects,), generator))
    if cfg.relative_distance:
        distance = distance / torch.tan(torch.deg2rad(fovy_deg) / 2)

    position = spherical_to_position(torch.deg2rad(elevation_deg), torch.deg2rad(azimuth_deg), distance)
    position = position + per_object(torch.randn(objects, 3, generator=generator)) * cfg.camera_perturb
    center = per_object(torch.randn(objects, 3, generator=generator)) * cfg.center_perturb
    up = torch.tensor([0.0, 0.0, 1.0]) + per_object(torch.randn(objects, 3, generator=generator)) * cfg.up_perturb
    c2w = look_at(position, center, up)

    light_distance = _uniform(cfg.light_distance_range, (batch,), generator)
    if cfg.light_sample_strategy == "dreamfusion":
        direction = normalize(position + torch.randn(batch, 3, generator=generator) * cfg.light_position_perturb)
    elif cfg.light_sample_strategy == "magic3d":
        # a random direction in the hemisphere facing the camera, tilted up to 60 degrees from it
        local_z = normalize(position)
        local_x = normalize(torch.stack([local_z[:, 1], -local_z[:, 0], torch.zeros(batch)], dim=-1) + 1e-6)
        local_y = torch.cross(local_z, local_x, dim=-1)
        rot = torch.stack([local_x, local_y, local_z], dim=-1)
        azimuth = torch.rand(batch, generator=generator) * math.pi * 2
        polar = torch.rand(batch, generator=generator) * math.pi / 3
        local = torch.stack([torch.sin(polar) * torch.cos(azimuth), torch.sin(polar) * torch.sin(azimuth), torch.cos(polar)], -1)
        direction = (rot @ local[..., None])[..., 0]
    else:
        raise ValueError(f"unknown light_sample_strategy '{cfg.light_sample_strategy}' (dreamfusion or magic3d)")
    light_positions = direction * light_distance[:, None]

    intrinsics = intrinsics_from_fovy(torch.deg2rad(fovy_deg), width, height)
    return {
        "cameras": Cameras(c2w, intrinsics, width, height),
        "elevation_deg": elevation_deg,
        "azimuth_deg": azimuth_deg,
        "distance": distance,
        "fovy_deg": fovy_deg,
        "light_positions": light_positions,
        "step": step,
    }


def orbit_views(n_views: int, elevation_deg: float, distance: float, fovy_deg: float, width: int,
                height: int) -> list[dict[str, Any]]:
    """Single-view dicts evenly spaced around a full turn, for validation grids and test videos."""
    views = []
    for index in range(n_views):
        azimuth = torch.tensor([index * 360.0 / n_views - 180.0])
        elevation = torch.tensor([float(elevation_deg)])
        dist = torch.tensor([float(distance)])
        position = spherical_to_position(torch.deg2rad(elevation), torch.deg2rad(azimuth), dist)
        c2w = look_at(position, torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]))
        intrinsics = intrinsics_from_fovy(torch.deg2rad(torch.tensor([float(fovy_deg)])), width, height)
        views.append(
            {
                "cameras": Cameras(c2w, intrinsics, width, height),
                "elevation_deg": elevation,
                "azimuth_deg": azimuth,
                "distance": dist,
                "fovy_deg": torch.tensor([float(fovy_deg)]),
                "light_positions": position.clone(),
                "index": torch.tensor([index]),
            }
        )
    return views


def match_reference_cameras(cfg: RandomViewsConfig) -> RandomViewsConfig:
    """``cfg`` with its elevation, distance and fovy ranges (and the eval orbit's distance and fovy) taken
    from the train cameras of ``cfg.reference_scene``, so random views look like the references."""
    from lift3d.data.formats.blender import read_cameras

    cameras = read_cameras(cfg.reference_scene, "train")
    elevation, _, distance = c2w_to_spherical(cameras.c2w)
    elevation = torch.rad2deg(elevation)
    fovy = torch.rad2deg(fov_from_focal(cameras.intrinsics[:, 1, 1], cameras.height))
    matched = dataclasses.replace(
        cfg,
        elevation_range=[float(elevation.min()), float(elevation.max())],
        camera_distance_range=[float(distance.min()), float(distance.max())],
        fovy_range=[float(fovy.min()), float(fovy.max())],
        eval_camera_distance=float(distance.mean()),
        eval_fovy_deg=float(fovy.mean()),
    )
    log.info(
        "random views match %s: elevation %.1f..%.1f deg, distance %.3f..%.3f, fovy %.1f..%.1f deg",
        cfg.reference_scene, *matched.elevation_range, *matched.camera_distance_range, *matched.fovy_range,
    )
    return matched


def reference_views(cfg: RandomViewsConfig) -> list[dict[str, Any]]:
    """Single-view dicts of ``cfg.reference_eval_split`` at the eval size, with ground-truth ``rgb``
    (composited on ``reference_background``) for scoring, and the view angles guidance uses."""
    import torch.nn.functional as F

    from lift3d.data.formats.blender import read_transforms

    scene = read_transforms(cfg.reference_scene, cfg.reference_eval_split, 1, cfg.n_val_views)
    rgba = scene.rgba.float().permute(0, 3, 1, 2) / 255.0
    if rgba.shape[-2:] != (cfg.eval_height, cfg.eval_width):
        rgba = F.interpolate(rgba, (cfg.eval_height, cfg.eval_width), mode="bilinear", align_corners=False, antialias=True)
    background = torch.tensor([float(v) for v in cfg.reference_background])
    rgba = rgba.permute(0, 2, 3, 1)
    rgb = rgba[..., :3] * rgba[..., 3:] + background * (1 - rgba[..., 3:])
    cameras = scene.cameras.resized(cfg.eval_width, cfg.eval_height)
    elevation, azimuth, distance = c2w_to_spherical(cameras.c2w)
    fovy = torch.rad2deg(fov_from_focal(cameras.intrinsics[:, 1, 1], cameras.height))
    return [
        {
            "cameras": cameras[i],
            "rgb": rgb[i : i + 1],
            "background": background[None],
            "elevation_deg": torch.rad2deg(elevation[i : i + 1]),
            "azimuth_deg": torch.rad2deg(azimuth[i : i + 1]),
            "distance": distance[i : i + 1],
            "fovy_deg": fovy[i : i + 1],
            "light_positions": cameras.positions[i : i + 1].clone(),
            "index": torch.tensor([i]),
        }
        for i in range(len(cameras))
    ]


@register("random-views")
class RandomViewsDataModule(BaseDataModule):
    """Random cameras on a sphere for training; evenly spaced orbit views for validation and test."""

    Config = RandomViewsConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        if self.cfg.reference_eval_split and not self.cfg.reference_scene:
            raise ValueError("data.reference_eval_split needs data.reference_scene, the scene folder whose views are scored: add "
                             "data.reference_scene=PATH, e.g. data.reference_scene=lift3d:sample_scene")
        if self.cfg.reference_scene:
            self.cfg = match_reference_cameras(self.cfg)
        sizes = self.cfg.batch_size if isinstance(self.cfg.batch_size, (list, tuple)) else [self.cfg.batch_size]
        if any(int(size) % self.cfg.n_views for size in sizes):
            from lift3d.config import ConfigError

            raise ConfigError(f"data.batch_size ({list(sizes)}) must be a multiple of data.n_views ({self.cfg.n_views}): "
                             "each object is seen from n_views views")

    def scene_summary(self) -> SceneSummary:
        """No photos: an object at the origin seen from random views."""
        return SceneSummary(object_centric=True)

    def _sample(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        return sample_random_views(self.cfg, step, generator)

    def train_dataloader(self) -> DataLoader:
        return step_loader(self._sample, self.base_seed, self.start_step(), self.max_steps())

    def _orbit(self, n_views: int) -> DataLoader:
        cfg = self.cfg
        views = orbit_views(n_views, cfg.eval_elevation_deg, cfg.eval_camera_distance, cfg.eval_fovy_deg, cfg.eval_width,
                            cfg.eval_height)
        return view_loader(views, cfg.eval_batch_size)

    def val_dataloader(self) -> DataLoader:
        if self.cfg.reference_eval_split:
            return view_loader(reference_views(self.cfg), self.cfg.eval_batch_size)
        return self._orbit(self.cfg.n_val_views)

    def test_dataloader(self) -> DataLoader:
        return self._orbit(self.cfg.n_test_views)

    def predict_dataloader(self) -> DataLoader:
        return self._orbit(self.cfg.n_test_views)
