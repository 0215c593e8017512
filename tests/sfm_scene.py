"""Photos for structure-from-motion tests: the built-in sample toy standing on a textured floor (SIFT needs
texture that the plain white background lacks), rendered at known poses, and how far recovered poses are
from the true ones."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from lift3d.cameras import Cameras, intrinsics_matrix
from lift3d.data.sample_scene import CAMERA_ANGLE_X, render_toy, sample_cameras

FLOOR_Z, FLOOR_RADIUS = -0.9, 3.5
MIXED_VIEWS = 24  # the first of the sample scene's training views the mixed photo set picks from


def _cell_hash(cell: torch.Tensor, seed: float) -> torch.Tensor:
    """A pseudo-random value in 0..1 per integer cell [M, 2] (the usual sine hash)."""
    value = torch.sin(cell[:, 0] * 12.9898 + cell[:, 1] * 78.233 + seed) * 43758.5453
    return value - torch.floor(value)


def floor_color(xy: torch.Tensor) -> torch.Tensor:
    """A random mosaic of colored tiles at two scales on the floor points [M, 2]: corners SIFT can match."""
    fine, coarse = torch.floor(xy / 0.11), torch.floor(xy / 0.37)
    channels = [0.6 * _cell_hash(fine, 1.0 + c) + 0.4 * _cell_hash(coarse, 7.0 + c) for c in range(3)]
    return torch.stack(channels, -1)


def render_photos(cameras: Cameras) -> np.ndarray:
    """RGB photos [C, H, W, 3] uint8 of the toy over the textured floor disc (sky gray)."""
    toy = render_toy(cameras, supersample=2)
    origins, directions = cameras.rays()
    dz = directions[..., 2]
    t = (FLOOR_Z - origins[..., 2]) / torch.where(dz.abs() < 1e-6, torch.full_like(dz, 1e-6), dz)
    hit = origins + t[..., None] * directions
    on_floor = (t > 0) & (hit[..., :2].norm(dim=-1) < FLOOR_RADIUS)
    background = torch.where(on_floor[..., None], floor_color(hit[..., :2].reshape(-1, 2)).reshape(hit.shape), torch.tensor(0.6))
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
    """(s, R, t) minimizing |s R source + t - target|^2 over points [N, 3] (Umeyama's closed form)."""
    mu_s, mu_t = source.mean(0), target.mean(0)
    a, b = source - mu_s, target - mu_t
    U, S, Vt = np.linalg.svd(b.T @ a / len(source))
    D = np.eye(3)
    D[2, 2] = np.sign(np.linalg.det(U @ Vt))
    R = U @ D @ Vt
    s = float(np.trace(np.diag(S) @ D) / (a**2).sum(1).mean())
    return s, R, mu_t - s * R @ mu_s


def pose_errors(recovered: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """(max rotation error in degrees, max position error, extent) after a similarity alignment of the
    recovered camera-to-world matrices [N, 4, 4] onto the true ones."""
    s, R, t = similarity_align(recovered[:, :3, 3], truth[:, :3, 3])
    positions = s * recovered[:, :3, 3] @ R.T + t
    extent = max(np.linalg.norm(a - b) for a in truth[:, :3, 3] for b in truth[:, :3, 3])
    rotations = R[None] @ recovered[:, :3, :3]
    cosines = (np.trace(np.swapaxes(truth[:, :3, :3], 1, 2) @ rotations, axis1=1, axis2=2) - 1) / 2
    angles = np.degrees(np.arccos(np.clip(cosines, -1, 1)))
    return float(angles.max()), float(np.linalg.norm(positions - truth[:, :3, 3], axis=1).max()), float(extent)


@dataclass
class TruePhoto:
    """What took a test photo: camera-to-world (OpenGL axes), focal length in pixels, upright size."""

    c2w: np.ndarray
    focal: float
    width: int
    height: int


def _exif(make: str, model: str, focal_35mm: int, orientation: int = 1) -> Image.Exif:
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = make, model
    if orientation != 1:
        exif[0x0112] = orientation
    # the Exif sub-IFD as a dict: on Pillow 10.0 (the lowest admitted) get_ifd() of a new Exif hands out a copy
    exif[0x8769] = {0x920A: 4.2, 0xA405: focal_35mm}  # the lens's real focal length in mm, as phones write it
    return exif


def write_mixed_photos(folder, n_views: int = 21, side: int = 240) -> dict[str, TruePhoto]:
    """Photos as a phone and a second camera take them, by turns along the orbit: the phone's landscape
    crops (side x 3/4 side) and portrait crops of one focal length, the portraits stored sideways with an EXIF
    orientation as phones store them, both with EXIF make, model and 35 mm focal length; the second camera
    wider (another focal length) at 5/6 side x 5/8 side with no EXIF. Returns each file's truth."""
    cameras = sample_cameras("train", side)[:MIXED_VIEWS]  # views above ~32 degrees: lower ones see the floor edge-on
    picks = torch.linspace(0, len(cameras) - 1, n_views).round().long()
    phone_focal = 0.5 * side / math.tan(0.5 * CAMERA_ANGLE_X)
    crop = (side - side * 3 // 4) // 2  # rows (landscape) or columns (portrait) cut off each side
    diagonal = math.hypot(side, side * 3 // 4)
    focal_35mm = round(phone_focal / diagonal * math.hypot(36, 24))
    folder.mkdir(parents=True, exist_ok=True)
    truth: dict[str, TruePhoto] = {}
    phone = [int(i) for k, i in enumerate(picks) if k % 3 != 2]
    for k, (index, photo) in enumerate(zip(phone, render_photos(cameras[torch.tensor(phone)]))):
        c2w = cameras.c2w[index].double().numpy()
        name = f"phone_{index:03d}.jpg"
        if k % 2 == 0:  # landscape
            upright = photo[crop:side - crop]
            Image.fromarray(upright).save(folder / name, quality=95, exif=_exif("Lift3D", "Phone", focal_35mm))
        else:  # portrait, stored sideways: orientation 6 says "turn 90 degrees clockwise to view"
            upright = photo[:, crop:side - crop]
            stored = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)
            stored.save(folder / name, quality=95, exif=_exif("Lift3D", "Phone", focal_35mm, orientation=6))
        truth[name] = TruePhoto(c2w, phone_focal, upright.shape[1], upright.shape[0])
    width, height = side * 5 // 6, side * 5 // 8
    focal = 0.75 * width  # a wider lens than the phone's (~67 degrees across)
    second = [int(i) for k, i in enumerate(picks) if k % 3 == 2]
    n = len(second)
    K = intrinsics_matrix(torch.full((n,), focal), torch.full((n,), focal), torch.full((n,), width / 2),
                          torch.full((n,), height / 2))
    for index, photo in zip(second, render_photos(Cameras(cameras.c2w[torch.tensor(second)], K, width, height))):
        name = f"second_{index:03d}.jpg"
        Image.fromarray(photo).save(folder / name, quality=95)
        truth[name] = TruePhoto(cameras.c2w[index].double().numpy(), focal, width, height)
    return truth


def reconstruction_c2w(reconstruction) -> dict[str, np.ndarray]:
    """Camera-to-world (OpenGL axes) of each registered image of a pycolmap reconstruction, by name."""
    poses = {}
    for image_id in reconstruction.reg_image_ids():
        image = reconstruction.image(image_id)
        w2c = np.eye(4)
        w2c[:3] = image.cam_from_world().matrix()
        poses[image.name] = np.linalg.inv(w2c) @ np.diag([1.0, -1.0, -1.0, 1.0])
    return poses
