"""Random cameras around the origin for text-to-3D: per-step views, light positions, orbit evaluation."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at, normalize, spherical_to_position
from lift3d.data.base import BaseDataModule, step_loader, view_loader
from lift3d.registry import register


@dataclass
class RandomViewsConfig:
    """Ranges are in degrees (angles) and scene units (distances)."""

    height: Any = 64  # render height, or a list: one per resolution milestone stage
    width: Any = 64  # render width, or a list like height
    batch_size: Any = 1  # views per step, or a list like height
    resolution_milestones: list = field(default_factory=list)  # steps at which the next height/width/batch applies
    elevation_range: list = field(default_factory=lambda: [-10.0, 60.0])  # degrees above the xy-plane
    azimuth_range: list = field(default_factory=lambda: [-180.0, 180.0])  # degrees from +x towards +y
    camera_distance_range: list = field(default_factory=lambda: [1.5, 2.0])  # distance from the origin
    fovy_range: list = field(default_factory=lambda: [40.0, 70.0])  # vertical field of view, degrees
    batch_uniform_azimuth: bool = True  # stratify azimuths over a batch so views cover the circle
    camera_perturb: float = 0.1  # std of noise added to camera positions
    center_perturb: float = 0.2  # std of noise added to the look-at target
    up_perturb: float = 0.02  # std of noise added to the up vector
    light_position_perturb: float = 1.0  # std of noise on the light direction (dreamfusion strategy)
    light_distance_range: list = field(default_factory=lambda: [0.8, 1.5])  # light distance from the origin
    light_sample_strategy: str = "dreamfusion"  # dreamfusion (near the camera) or magic3d (camera hemisphere)
    eval_height: int = 256  # validation/test render height
    eval_width: int = 256  # validation/test render width
    eval_batch_size: int = 1  # views per evaluation batch
    eval_elevation: float = 15.0  # elevation of the evaluation orbit, degrees
    eval_camera_distance: float = 1.5  # distance of the evaluation orbit
    eval_fovy: float = 70.0  # field of view of evaluation views, degrees
    n_val_views: int = 4  # views per validation check (evenly spaced in azimuth)
    n_test_views: int = 120  # views of the test orbit video


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
    elevation_deg = _uniform(cfg.elevation_range, (batch,), generator)
    if cfg.batch_uniform_azimuth:
        low, high = cfg.azimuth_range
        azimuth_deg = low + (high - low) * (torch.rand(batch, generator=generator) + torch.arange(batch)) / batch
    else:
        azimuth_deg = _uniform(cfg.azimuth_range, (batch,), generator)
    distance = _uniform(cfg.camera_distance_range, (batch,), generator)
    fovy_deg = _uniform(cfg.fovy_range, (batch,), generator)

    position = spherical_to_position(torch.deg2rad(elevation_deg), torch.deg2rad(azimuth_deg), distance)
    position = position + torch.randn(batch, 3, generator=generator) * cfg.camera_perturb
    center = torch.randn(batch, 3, generator=generator) * cfg.center_perturb
    up = torch.tensor([0.0, 0.0, 1.0]) + torch.randn(batch, 3, generator=generator) * cfg.up_perturb
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


def orbit_views(n_views: int, elevation_deg: float, distance: float, fovy_deg: float, width: int, height: int) -> list[dict[str, Any]]:
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


@register("random-views")
class RandomViewsDataModule(BaseDataModule):
    """Random cameras on a sphere for training; evenly spaced orbit views for validation and test."""

    Config = RandomViewsConfig

    def _sample(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        return sample_random_views(self.cfg, step, generator)

    def train_dataloader(self) -> DataLoader:
        return step_loader(self._sample, self.base_seed, self.start_step(), self.max_steps())

    def _orbit(self, n_views: int) -> DataLoader:
        cfg = self.cfg
        views = orbit_views(n_views, cfg.eval_elevation, cfg.eval_camera_distance, cfg.eval_fovy, cfg.eval_width, cfg.eval_height)
        return view_loader(views, cfg.eval_batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._orbit(self.cfg.n_val_views)

    def test_dataloader(self) -> DataLoader:
        return self._orbit(self.cfg.n_test_views)

    def predict_dataloader(self) -> DataLoader:
        return self._orbit(self.cfg.n_test_views)
