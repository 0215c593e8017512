"""Photo sets as the world makes them, built from the sample scene's toy: COLMAP folders whose photos each have their
own size (COLMAP's undistorted dense layout) or come from two cameras, nerfstudio folders with per-frame sizes, and
photos with an occluder painted in and masked. Poses are the sample scene's training cameras."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lift3d.cameras import Cameras, intrinsics_matrix
from lift3d.data.colmap_model import ColmapCamera, ColmapImage, ColmapModel, write_model_binary
from lift3d.data.sample_scene import render_toy, sample_cameras
from lift3d.rotations import matrix_to_quaternion_np

GL_FROM_CV = np.diag([1.0, -1.0, -1.0, 1.0])
SIDE = 48  # the renders' side before cropping
N_VIEWS = 32  # views used (of the sample scene's 40 training cameras)
HOLDOUT = 4  # every 4th view (name order) is held out


def views(n: int = N_VIEWS) -> Cameras:
    """The first ``n`` of the sample scene's training cameras, rendering ``SIDE`` x ``SIDE``."""
    return sample_cameras("train", SIDE)[:n]


def render_rgb(cameras: Cameras) -> np.ndarray:
    """The toy on white, uint8 [N, H, W, 3] (photos have no alpha)."""
    rgba = render_toy(cameras, supersample=2)
    rgb = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])
    return (rgb.clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()


def crop_boxes(kind: str, n: int, rng: np.random.Generator) -> list[tuple[int, int, int, int]]:
    """(x0, y0, width, height) crops of the SIDE x SIDE renders: ``one``: the same for every view; ``dense``: every
    view its own size and offset (as ``colmap image_undistorter`` crops); ``orientations``: landscape and portrait."""
    boxes = []
    for i in range(n):
        if kind == "one":
            boxes.append((3, 3, SIDE - 6, SIDE - 6))
        elif kind == "dense":
            w, h = int(rng.integers(SIDE - 10, SIDE - 1)), int(rng.integers(SIDE - 10, SIDE - 1))
            boxes.append((int(rng.integers(0, SIDE - w + 1)), int(rng.integers(0, SIDE - h + 1)), w, h))
        else:
            boxes.append((0, 6, SIDE, SIDE - 12) if i % 2 else (6, 0, SIDE - 12, SIDE))
    return boxes


def _w2c(c2w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w2c = np.linalg.inv(c2w @ GL_FROM_CV)
    return matrix_to_quaternion_np(w2c[:3, :3]), w2c[:3, 3]


def write_colmap_scene(root: Path, kind: str, seed: int = 0) -> Path:
    """A COLMAP folder (``sparse/0`` binary + ``images/``; ``dense``: ``sparse/`` + ``stereo/`` as COLMAP's undistorter
    writes it) of the toy. ``one``, ``dense``, ``orientations``: crops of
    one render size, one PINHOLE camera per image with its principal point moved by the crop; ``two-cameras``: half
    the views from a second camera of another size and focal length (two cameras in the model)."""
    rng = np.random.default_rng(seed)
    cams = views()
    c2w = cams.c2w.double().numpy()
    (root / "images").mkdir(parents=True, exist_ok=True)
    cameras, images = {}, {}
    if kind == "two-cameras":
        K = cams.intrinsics.clone()
        second = intrinsics_matrix(torch.tensor(1.25 * float(K[0, 0, 0])), torch.tensor(1.25 * float(K[0, 0, 0])),
                                   torch.tensor(30.0), torch.tensor(20.0))
        first = Cameras(cams.c2w[0::2], K[0::2], SIDE, SIDE)
        other = Cameras(cams.c2w[1::2], second[None].expand(len(cams) // 2, 3, 3).clone(), 60, 40)
        photos = {**{2 * k: p for k, p in enumerate(render_rgb(first))},
                  **{2 * k + 1: p for k, p in enumerate(render_rgb(other))}}
        f1, f2 = float(K[0, 0, 0]), float(second[0, 0])
        cameras[1] = ColmapCamera(1, "PINHOLE", SIDE, SIDE, np.array([f1, f1, SIDE / 2, SIDE / 2]))
        cameras[2] = ColmapCamera(2, "PINHOLE", 60, 40, np.array([f2, f2, 30.0, 20.0]))
        for i in range(len(cams)):
            Image.fromarray(photos[i]).save(root / "images" / f"view_{i:02d}.png")
            images[i + 1] = ColmapImage(i + 1, *_w2c(c2w[i]), 1 + i % 2, f"view_{i:02d}.png")
    else:
        photos = render_rgb(cams)
        focal = float(cams.intrinsics[0, 0, 0])
        for i, (x0, y0, w, h) in enumerate(crop_boxes(kind, len(cams), rng)):
            Image.fromarray(photos[i, y0 : y0 + h, x0 : x0 + w]).save(root / "images" / f"view_{i:02d}.png")
            cameras[i + 1] = ColmapCamera(i + 1, "PINHOLE", w, h, np.array([focal, focal, SIDE / 2 - x0, SIDE / 2 - y0]))
            images[i + 1] = ColmapImage(i + 1, *_w2c(c2w[i]), i + 1, f"view_{i:02d}.png")
    if kind == "dense":  # as `colmap image_undistorter` writes it: the model straight in sparse/, beside stereo/
        write_model_binary(ColmapModel(cameras, images, {}), root / "sparse")
        (root / "stereo").mkdir()
        (root / "run-colmap-geometric.sh").write_text("# written by colmap image_undistorter\n")
    else:
        write_model_binary(ColmapModel(cameras, images, {}), root / "sparse" / "0")
    return root


def occluder(photo: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
    """``photo`` with a red box painted where the toy is (a different place in every view), and the mask that
    ignores it (255 = keep, 0 = ignore, as nerfstudio's mask_path)."""
    h, w = photo.shape[:2]
    side = w // 4
    x0, y0 = (i * 7) % (w - side), h - side - (i * 3) % 8  # walking through the lower part of the view
    painted, mask = photo.copy(), np.full((h, w), 255, np.uint8)
    painted[y0 : y0 + side, x0 : x0 + side] = (220, 30, 30)
    mask[max(y0 - 1, 0) : y0 + side + 1, max(x0 - 1, 0) : x0 + side + 1] = 0  # a margin, as masks are drawn
    return painted, mask


def write_nerfstudio_scene(root: Path, occluded: bool, per_frame_sizes: bool = False, masked: bool = True) -> Path:
    """A nerfstudio folder (``transforms.json`` with per-frame intrinsics, ``val_filenames``) of the toy. ``occluded``:
    the training photos carry a painted occluder and (``masked``) a ``mask_path`` that ignores it; held-out photos are
    clean.
    ``per_frame_sizes``: every frame its own crop, its ``w``/``h``/``cx``/``cy`` given per frame."""
    cams = views()
    photos = render_rgb(cams)
    focal = float(cams.intrinsics[0, 0, 0])
    (root / "images").mkdir(parents=True, exist_ok=True)
    boxes = crop_boxes("dense" if per_frame_sizes else "one", len(cams), np.random.default_rng(1))
    frames, val = [], []
    for i, (x0, y0, w, h) in enumerate(boxes):
        name = f"images/frame_{i:02d}.png"
        photo = photos[i, y0 : y0 + h, x0 : x0 + w]
        frame = {"file_path": name, "transform_matrix": cams.c2w[i].double().tolist(), "w": w, "h": h,
                 "cx": SIDE / 2 - x0, "cy": SIDE / 2 - y0}
        if i % HOLDOUT == 0:
            val.append(name)
        elif occluded:
            photo, mask = occluder(photo, i)
            Image.fromarray(mask).save(root / "images" / f"mask_{i:02d}.png")
            if masked:
                frame["mask_path"] = f"images/mask_{i:02d}.png"
        Image.fromarray(photo).save(root / name)
        frames.append(frame)
    meta = {"camera_model": "OPENCV", "fl_x": focal, "fl_y": focal, "frames": frames,
            "train_filenames": [f["file_path"] for f in frames if f["file_path"] not in val], "val_filenames": val}
    (root / "transforms.json").write_text(json.dumps(meta))
    return root
