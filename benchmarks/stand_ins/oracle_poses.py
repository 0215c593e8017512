"""An oracle twin of VGGT: the ``PosePredictor`` interface (``lift3d.data.learned_poses``) answered with the true
cameras and depth of the built-in sample toy on its textured floor (``tests.sfm_scene``'s photos), plus noise of a
stated size, in VGGT's conventions (OpenCV world-to-camera, the first photo's camera as the world, an arbitrary
scale). It proves the path after the network: poses -> dense start -> training with pose refinement.

Noise, per photo: the camera turned about its own center by ``rotation_deg`` (a random axis; the angle's standard
deviation), its center moved by ``position`` x the cameras' extent (standard deviation per axis), its focal length
scaled by 1 + ``focal`` x N(0, 1), and each depth pixel scaled by 1 + ``depth`` x N(0, 1). Photos named in ``exact``
keep their true camera (held-out photos: their scores then measure the scene, not their own pose error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lift3d.cameras import Cameras
from lift3d.data.images import load_rgba
from lift3d.data.learned_poses import PosePrediction
from lift3d.data.sample_scene import toy_distance
from tests.sfm_scene import FLOOR_RADIUS, FLOOR_Z

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def true_depth(cameras: Cameras) -> np.ndarray:
    """[C, H, W] z-depth of the toy on its floor disc (0 where a ray sees neither)."""
    origins, directions = cameras.rays()
    o, d = origins.reshape(-1, 3), directions.reshape(-1, 3)
    toy, _ = toy_distance(o, d)
    dz = torch.where(d[:, 2].abs() < 1e-6, torch.full_like(d[:, 2], 1e-6), d[:, 2])
    t_floor = (FLOOR_Z - o[:, 2]) / dz
    on_floor = (t_floor > 0) & ((o[:, :2] + t_floor[:, None] * d[:, :2]).norm(dim=-1) < FLOOR_RADIUS)
    t = torch.minimum(toy, torch.where(on_floor, t_floor, torch.full_like(t_floor, float("inf"))))
    forward = (-cameras.c2w[:, :3, 2]).repeat_interleave(cameras.width * cameras.height, 0)  # OpenGL looks down -z
    z = t * (d * forward).sum(-1)
    return torch.where(torch.isfinite(z), z, torch.zeros_like(z)).reshape(len(cameras), cameras.height, cameras.width).numpy()


def rotation(axis_angle: np.ndarray) -> np.ndarray:
    """The rotation matrix of an axis-angle vector (Rodrigues)."""
    angle = float(np.linalg.norm(axis_angle))
    if angle < 1e-12:
        return np.eye(3)
    k = axis_angle / angle
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K


@dataclass
class OraclePredictor:
    """True cameras (``cameras``, one per name of ``names``) and depth, with noise (see the module's docstring)."""

    cameras: Cameras
    names: list[str]
    rotation_deg: float = 0.0
    position: float = 0.0
    focal: float = 0.0
    depth: float = 0.0
    exact: set[str] = field(default_factory=set)
    seed: int = 0
    scale: float = 0.37  # the world's arbitrary scale (VGGT's is its own)

    def record(self) -> dict[str, Any]:
        return {"method": "oracle", "noise": {"rotation_deg": self.rotation_deg, "position": self.position,
                                              "focal": self.focal, "depth": self.depth}, "exact": sorted(self.exact)}

    def predict(self, folder: Path, names: list[str]) -> PosePrediction:
        rng = np.random.default_rng(self.seed)
        order = [self.names.index(name) for name in names]
        cameras = Cameras(self.cameras.c2w[order], self.cameras.intrinsics[order], self.cameras.width, self.cameras.height)
        depth = true_depth(cameras)
        c2w = cameras.c2w.double().numpy() @ GL_TO_CV  # OpenCV camera axes
        centers = c2w[:, :3, 3]
        extent = float(np.linalg.norm(centers - centers.mean(0), axis=1).max())
        K = cameras.intrinsics.double().numpy().copy()
        R = np.swapaxes(c2w[:, :3, :3], 1, 2)  # world-to-camera rotations
        for i, name in enumerate(names):
            if name in self.exact:
                continue
            axis = rng.normal(size=3)
            turn = rotation(axis / np.linalg.norm(axis) * np.radians(self.rotation_deg) * rng.normal())
            R[i] = turn @ R[i]
            centers[i] = centers[i] + self.position * extent * rng.normal(size=3)
            K[i, :2, :2] *= 1.0 + self.focal * rng.normal()
            depth[i] *= (1.0 + self.depth * rng.normal(size=depth[i].shape)).clip(0.5, 1.5)
        # VGGT's world: the first photo's camera, at its own scale
        w2c = np.concatenate([R @ R[0].T, self.scale * (R @ (centers[0] - centers)[..., None])], -1)
        colors = np.stack([load_rgba(folder / name)[..., :3] for name in names])
        sizes = np.array([[cameras.width, cameras.height]] * len(names))
        return PosePrediction(list(names), sizes, K, w2c, (self.scale * depth).astype(np.float32),
                              np.where(depth > 0, 10.0, 0.0).astype(np.float32), colors, K.copy())
