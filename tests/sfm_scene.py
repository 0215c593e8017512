"""Photos for structure-from-motion tests: the built-in sample toy standing on a textured floor (SIFT needs
texture that the plain white background lacks), rendered at known poses."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from lift3d.cameras import Cameras
from lift3d.data.sample_scene import render_toy, sample_cameras

FLOOR_Z, FLOOR_RADIUS = -0.9, 3.5


def _cell_hash(cell: torch.Tensor, seed: float) -> torch.Tensor:
    """A pseudo-random value in 0..1 per integer cell [M, 2] (the usual sine hash)."""
    value = torch.sin(cell[:, 0] * 12.9898 + cell[:, 1] * 78.233 + seed) * 43758.5453
    return value - torch.floor(value)


def floor_colour(xy: torch.Tensor) -> torch.Tensor:
    """A random mosaic of coloured tiles at two scales on the floor points [M, 2]: corners SIFT can match."""
    fine, coarse = torch.floor(xy / 0.11), torch.floor(xy / 0.37)
    channels = [0.6 * _cell_hash(fine, 1.0 + c) + 0.4 * _cell_hash(coarse, 7.0 + c) for c in range(3)]
    return torch.stack(channels, -1)


def render_photos(cameras: Cameras) -> np.ndarray:
    """RGB photos [C, H, W, 3] uint8 of the toy over the textured floor disc (sky grey)."""
    toy = render_toy(cameras, supersample=2)
    origins, directions = cameras.rays()
    t = (FLOOR_Z - origins[..., 2]) / torch.where(directions[..., 2].abs() < 1e-6, torch.full_like(directions[..., 2], 1e-6), directions[..., 2])
    hit = origins + t[..., None] * directions
    on_floor = (t > 0) & (hit[..., :2].norm(dim=-1) < FLOOR_RADIUS)
    background = torch.where(on_floor[..., None], floor_colour(hit[..., :2].reshape(-1, 2)).reshape(hit.shape), torch.tensor(0.6))
    rgb = toy[..., :3] * toy[..., 3:] + background * (1 - toy[..., 3:])
    return (rgb.clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()


def write_photos(folder, n_views: int = 20, resolution: int = 200) -> Cameras:
    """``n_views`` JPGs of the scene from the sample scene's training orbit, into ``folder``; their cameras."""
    cameras = sample_cameras("train", resolution)[:30]  # the views above ~15 degrees: the floor is not edge-on
    cameras = cameras[torch.linspace(0, len(cameras) - 1, n_views).round().long()]
    folder.mkdir(parents=True, exist_ok=True)
    for i, photo in enumerate(render_photos(cameras)):
        Image.fromarray(photo).save(folder / f"photo_{i:03d}.jpg", quality=95)
    return cameras


def similarity_align(source: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(s, R, t) minimising |s R source + t - target|^2 over points [N, 3] (Umeyama's closed form)."""
    mu_s, mu_t = source.mean(0), target.mean(0)
    a, b = source - mu_s, target - mu_t
    U, S, Vt = np.linalg.svd(b.T @ a / len(source))
    D = np.eye(3)
    D[2, 2] = np.sign(np.linalg.det(U @ Vt))
    R = U @ D @ Vt
    s = float(np.trace(np.diag(S) @ D) / (a**2).sum(1).mean())
    return s, R, mu_t - s * R @ mu_s
