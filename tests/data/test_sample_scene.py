"""The built-in sample scene ships with the package, is small, and is what the generator renders."""

import json

import numpy as np
import torch
from PIL import Image

from lift3d.data.posed_images import read_transforms
from lift3d.data.sample_scene import N_TRAIN, N_VAL, RESOLUTION, render_toy, sample_cameras, sample_scene_path


def test_shipped_files_are_a_small_valid_scene():
    root = sample_scene_path()
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 400_000, size
    train, val = read_transforms(root, "train"), read_transforms(root, "val")
    assert train.rgba.shape == (N_TRAIN, RESOLUTION, RESOLUTION, 4) and val.rgba.shape == (N_VAL, RESOLUTION, RESOLUTION, 4)
    alpha = train.rgba[..., 3].float() / 255
    assert 0.1 < float(alpha.mean()) < 0.6 and (alpha == 0).any() and (alpha == 1).any()  # an object with a silhouette
    assert torch.allclose(train.cameras.c2w, sample_cameras("train").c2w, atol=1e-6)
    assert torch.allclose(val.cameras.intrinsics, sample_cameras("val").intrinsics, atol=1e-4)
    meta = json.loads((root / "transforms_train.json").read_text())
    assert len(meta["frames"]) == N_TRAIN


def test_generator_reproduces_the_shipped_images():
    cameras = sample_cameras("train")[torch.tensor([0, 17])]
    rendered = (render_toy(cameras).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy().astype(int)
    for k, i in enumerate((0, 17)):
        shipped = np.asarray(Image.open(sample_scene_path() / "train" / f"r_{i}.png").convert("RGBA")).astype(int)
        diff = np.abs(rendered[k] - shipped)
        # a ray that grazes a silhouette can hit or miss by one ulp on another CPU (seen: 3 of 16k values),
        # so a few edge values may flip; anything more is a different image
        assert (diff > 2).sum() <= 8 and diff.mean() < 0.05, ((diff > 2).sum(), diff.mean())
