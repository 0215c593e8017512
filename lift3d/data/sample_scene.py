"""The built-in sample scene: a procedural textured toy that lift3d ray-casts itself, in the Blender layout.

``lift3d reconstruct`` with no path reconstructs it. The files ship in ``lift3d/assets/sample_scene``;
``python -m lift3d.data.sample_scene [OUT_DIR]`` regenerates them (deterministically). The toy: a
checkered box, a striped ball with a band, a ringed post and a small bead, lit by one baked light, so
its look does not depend on the view. World +z is up; cameras orbit at distance 4 like NeRF-synthetic.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from lift3d.cameras import Cameras, intrinsics_matrix, look_at, normalize

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # the package's own data files
ASSET_SCHEME = "lift3d:"  # configs name a package asset as lift3d:NAME (e.g. data.root=lift3d:sample_scene)
SAMPLE_SCENE = ASSETS / "sample_scene"
RESOLUTION = 64  # image side in pixels
N_TRAIN, N_VAL = 40, 8  # views per split
DISTANCE = 4.0  # camera distance from the origin
CAMERA_ANGLE_X = 0.6911112070083618  # horizontal field of view (radians), as NeRF-synthetic
LIGHT = (0.5, -0.4, 0.77)  # direction towards the baked light

INF = float("inf")


def sample_scene_path() -> Path:
    """Folder of the shipped sample scene (transforms_{train,val}.json + PNGs)."""
    return SAMPLE_SCENE


def resolve_asset(value: str | Path) -> Path:
    """A data path from a config: ``lift3d:NAME`` is the package asset NAME wherever lift3d is installed now (so a
    run's config survives reinstalling lift3d elsewhere); any other value is the path it names."""
    text = str(value)
    if not text.startswith(ASSET_SCHEME):
        return Path(text).expanduser()
    name = text[len(ASSET_SCHEME):].strip("/")
    path = ASSETS / name
    if not name or ".." in Path(name).parts or not path.exists():
        from lift3d.config import ConfigError

        known = ", ".join(f"{ASSET_SCHEME}{p.name}" for p in sorted(ASSETS.iterdir()) if p.is_dir() and p.name != "html")
        raise ConfigError(f"{text} names no asset of lift3d (its data assets: {known})")
    return path


def asset_name(value: str) -> str | None:
    """``lift3d:NAME`` for a path inside the package's assets (``.../site-packages/lift3d/assets/sample_scene`` ->
    ``lift3d:sample_scene``), else None: what a run's parsed.yaml records instead of the install path."""
    if not value or value.startswith(ASSET_SCHEME):
        return None
    try:
        path = Path(value).expanduser().resolve()
        relative = path.relative_to(ASSETS.resolve())
    except (ValueError, OSError, RuntimeError):
        return None
    return f"{ASSET_SCHEME}{relative.as_posix()}" if relative.parts and path.exists() else None


# ----------------------------------------------------------------------------------- ray casting
def _sphere(o: Tensor, d: Tensor, center: tuple, radius: float) -> Tensor:
    oc = o - torch.tensor(center)
    b = (oc * d).sum(-1)
    disc = b * b - ((oc * oc).sum(-1) - radius * radius)
    t = -b - torch.sqrt(disc.clamp_min(0))
    return torch.where((disc > 0) & (t > 0), t, torch.full_like(t, INF))


def _box(o: Tensor, d: Tensor, lo: tuple, hi: tuple) -> Tensor:
    inv = 1.0 / torch.where(d.abs() < 1e-9, torch.full_like(d, 1e-9), d)
    t0, t1 = (torch.tensor(lo) - o) * inv, (torch.tensor(hi) - o) * inv
    near, far = torch.minimum(t0, t1).amax(-1), torch.maximum(t0, t1).amin(-1)
    return torch.where((near < far) & (near > 0), near, torch.full_like(near, INF))


def _cylinder(o: Tensor, d: Tensor, center_xy: tuple, radius: float, z0: float, z1: float) -> Tensor:
    """Vertical capped cylinder; the cap is hit when the side is not."""
    ox, oy = o[..., 0] - center_xy[0], o[..., 1] - center_xy[1]
    a = d[..., 0] ** 2 + d[..., 1] ** 2
    b = ox * d[..., 0] + oy * d[..., 1]
    disc = b * b - a * (ox * ox + oy * oy - radius * radius)
    t = (-b - torch.sqrt(disc.clamp_min(0))) / a.clamp_min(1e-12)
    z = o[..., 2] + t * d[..., 2]
    side = torch.where((disc > 0) & (t > 0) & (z >= z0) & (z <= z1), t, torch.full_like(t, INF))
    tc = (z1 - o[..., 2]) / torch.where(d[..., 2].abs() < 1e-9, torch.full_like(t, 1e-9), d[..., 2])
    px, py = ox + tc * d[..., 0], oy + tc * d[..., 1]
    cap = torch.where((tc > 0) & (px * px + py * py <= radius * radius), tc, torch.full_like(t, INF))
    return torch.minimum(side, cap)


def _shade(p: Tensor, kind: Tensor) -> Tensor:
    """Albedo x baked diffuse light of hit points ``p`` [M, 3] on primitive ``kind`` [M]."""
    x, y, z = p.unbind(-1)
    normal = torch.zeros_like(p)
    albedo = torch.zeros_like(p)
    # 0: box base, checkered top, striped sides
    box = kind == 0
    on_top = box & (z > -0.51)
    checker = ((torch.floor(x * 2.5) + torch.floor(y * 2.5)) % 2 == 0)
    top = torch.where(checker[:, None], torch.tensor([0.16, 0.33, 0.72]), torch.tensor([0.92, 0.9, 0.82]))
    stripes = (torch.floor((z + 0.9) * 12) % 2 == 0)
    side = torch.where(stripes[:, None], torch.tensor([0.95, 0.55, 0.1]), torch.tensor([0.98, 0.85, 0.3]))
    albedo[box] = torch.where(on_top[box, None], top[box], side[box])
    box_normal = torch.zeros_like(p)
    box_normal[:, 2] = 1.0
    on_side = box & ~on_top
    axis_x = x.abs() > y.abs()
    box_normal[on_side] = torch.stack([torch.where(axis_x, torch.sign(x), torch.zeros_like(x)),
                                       torch.where(axis_x, torch.zeros_like(y), torch.sign(y)),
                                       torch.zeros_like(z)], -1)[on_side]
    normal[box] = box_normal[box]
    # 1: ball, red/white wedges and a green band
    ball = kind == 1
    q = p - torch.tensor([0.0, 0.0, 0.05])
    lon, lat = torch.atan2(q[:, 1], q[:, 0]), torch.asin((q[:, 2] / 0.55).clamp(-1, 1))
    wedge = torch.floor(lon / (2 * math.pi) * 10) % 2 == 0
    ball_albedo = torch.where(wedge[:, None], torch.tensor([0.85, 0.12, 0.15]), torch.tensor([0.95, 0.95, 0.95]))
    band = lat.abs() < 0.16
    ball_albedo = torch.where(band[:, None], torch.tensor([0.1, 0.65, 0.25]), ball_albedo)
    albedo[ball], normal[ball] = ball_albedo[ball], normalize(q)[ball]
    # 2: post, purple with white rings
    post = kind == 2
    rings = torch.floor((z + 0.5) * 8) % 3 == 0
    post_albedo = torch.where(rings[:, None], torch.tensor([0.95, 0.95, 0.95]), torch.tensor([0.45, 0.2, 0.6]))
    post_normal = torch.stack([x + 0.55, y - 0.5, torch.zeros_like(z)], -1)
    post_normal = torch.where((z > 0.399)[:, None], torch.tensor([0.0, 0.0, 1.0]), normalize(post_normal))
    albedo[post], normal[post] = post_albedo[post], post_normal[post]
    # 3: bead, yellow
    bead = kind == 3
    albedo[bead] = torch.tensor([0.95, 0.8, 0.15])
    normal[bead] = normalize(p - torch.tensor([0.5, -0.5, -0.35]))[bead]
    light = normalize(torch.tensor(LIGHT))
    return albedo * (0.35 + 0.65 * (normal @ light).clamp_min(0))[:, None]


def toy_distance(o: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """Distance [M] along unit rays (origins ``o``, directions ``d`` [M, 3]) to the toy (inf: missed) and the part
    hit [M] (0 box, 1 ball, 2 post, 3 bead)."""
    hits = torch.stack([
        _box(o, d, (-0.8, -0.8, -0.9), (0.8, 0.8, -0.5)),
        _sphere(o, d, (0.0, 0.0, 0.05), 0.55),
        _cylinder(o, d, (-0.55, 0.5), 0.12, -0.5, 0.4),
        _sphere(o, d, (0.5, -0.5, -0.35), 0.15),
    ], -1)  # fmt: skip
    return hits.min(-1)


def render_toy(cameras: Cameras, supersample: int = 4) -> Tensor:
    """Straight-alpha RGBA [C, H, W, 4] in 0..1 of the toy, antialiased with ``supersample``^2 rays a pixel."""
    big = cameras.resized(cameras.width * supersample, cameras.height * supersample)
    origins, directions = big.rays()
    o, d = origins.reshape(-1, 3), directions.reshape(-1, 3)
    t, kind = toy_distance(o, d)
    hit = torch.isfinite(t)
    color = torch.zeros_like(o)
    color[hit] = _shade(o[hit] + t[hit, None] * d[hit], kind[hit])
    C, s = len(cameras), supersample
    rgba = torch.cat([color, hit.float()[:, None]], -1).reshape(C, cameras.height, s, cameras.width, s, 4)
    coverage = rgba[..., 3:].sum(dim=(2, 4))
    rgb = rgba[..., :3].sum(dim=(2, 4)) / coverage.clamp_min(1)
    return torch.cat([rgb, coverage / (s * s)], -1)


# ----------------------------------------------------------------------------------- views and files
def sample_cameras(split: str, resolution: int = RESOLUTION) -> Cameras:
    """Training views spread over the upper 3/5 of the sphere; validation views at other azimuths."""
    if split == "train":
        i = torch.arange(N_TRAIN, dtype=torch.float64) + 0.5
        z = 1 - 0.8 * i / N_TRAIN  # from the top down to 11.5 degrees below the horizon
        azimuth = math.pi * (1 + 5**0.5) * i
        r = torch.sqrt(1 - z * z)
        directions = torch.stack([r * torch.cos(azimuth), r * torch.sin(azimuth), z], -1).float()
    else:
        azimuth = torch.arange(N_VAL, dtype=torch.float32) * (2 * math.pi / N_VAL) + 0.3
        elevation = torch.deg2rad(torch.tensor([15.0, 35.0] * (N_VAL // 2)))
        directions = torch.stack([torch.cos(elevation) * torch.cos(azimuth), torch.cos(elevation) * torch.sin(azimuth),
                                  torch.sin(elevation)], -1)
    eye = DISTANCE * directions
    c2w = look_at(eye, torch.zeros_like(eye), torch.tensor([0.0, 0.0, 1.0]).expand_as(eye))
    focal = 0.5 * resolution / math.tan(0.5 * CAMERA_ANGLE_X)
    n = len(c2w)
    K = intrinsics_matrix(torch.full((n,), focal), torch.full((n,), focal),
                          torch.full((n,), resolution / 2), torch.full((n,), resolution / 2))
    return Cameras(c2w, K, resolution, resolution)


def generate(out_dir: str | Path = SAMPLE_SCENE, resolution: int = RESOLUTION) -> Path:
    """Render both splits and write ``transforms_<split>.json`` and ``<split>/r_<i>.png`` under ``out_dir``."""
    out_dir = Path(out_dir)
    for split in ("train", "val"):
        cameras = sample_cameras(split, resolution)
        rgba = render_toy(cameras)
        (out_dir / split).mkdir(parents=True, exist_ok=True)
        frames = []
        for i in range(len(cameras)):
            image = (rgba[i].clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()
            Image.fromarray(image, "RGBA").save(out_dir / split / f"r_{i}.png", optimize=True)
            matrix = np.round(cameras.c2w[i].double().numpy(), 7).tolist()
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": matrix})
        meta = {"camera_angle_x": CAMERA_ANGLE_X, "frames": frames}
        (out_dir / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out_dir


if __name__ == "__main__":
    print(generate(sys.argv[1] if len(sys.argv) > 1 else SAMPLE_SCENE))
