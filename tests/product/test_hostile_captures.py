"""Photos, captures and videos as attackers and broken tools make them, through the CLI: decompression bombs (a PNG
header claiming 100,000 x 100,000 pixels, a genuine 20,000 x 20,000 PNG in a photo folder), JPEGs cut off mid-scan,
copies of one photo, zero camera matrices in transforms.json and COLMAP models, and videos over the frame limits.
Each refusal: exit 2, one line naming the file and the fix, no traceback, in seconds."""

from __future__ import annotations

import json
import logging
import shutil

import imageio.v2 as imageio
import numpy as np
import pytest

from lift3d.data.sfm_photos import usable_photos
from tests.hostile import forged_png, huge_png, jpeg_bytes, png_bytes, refused


@pytest.fixture
def photos(tmp_path):
    """A folder of five ordinary JPEGs (no poses)."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(5):
        (folder / f"img_{i}.jpg").write_bytes(jpeg_bytes(seed=i))
    return folder


def test_decompression_bombs_in_a_photo_folder_are_refused_by_name(photos, capsys):
    (photos / "scan.png").write_bytes(huge_png(20_000, 20_000))  # genuine, and 400 megapixels
    assert (photos / "scan.png").stat().st_size < 2**20
    for command in ("poses", "reconstruct"):
        refused([command, str(photos)], capsys, "scan.png", "20000 x 20000 px", "downscale", "LIFT3D_MAX_PHOTO_PIXELS")
    (photos / "scan.png").unlink()
    (photos / "bomb.png").write_bytes(forged_png(100_000, 100_000))
    refused(["poses", str(photos)], capsys, "bomb.png", "100000 x 100000 px", "10,000,000,000 pixels")


def test_a_posed_scene_or_a_single_photo_with_a_bomb_is_refused(tmp_path, data_dir, capsys):
    scene = tmp_path / "lego"
    shutil.copytree(data_dir / "lego_tiny", scene)
    scene.chmod(0o755)
    for path in scene.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (scene / "train" / "r_0.png").write_bytes(forged_png(100_000, 100_000))
    refused(["reconstruct", str(scene), "trainer.max_steps=1"], capsys, "r_0.png", "100000 x 100000 px")
    (tmp_path / "photo.png").write_bytes(huge_png(20_000, 20_000))
    refused(["generate", "--image", str(tmp_path / "photo.png")], capsys, "photo.png", "LIFT3D_MAX_PHOTO_PIXELS")


def test_photos_cut_short_are_left_out_by_name_at_the_start(photos, capsys, monkeypatch, caplog):
    data = (photos / "img_1.jpg").read_bytes()
    (photos / "img_1.jpg").write_bytes(data[: len(data) // 2])  # a copy that stopped mid-scan
    monkeypatch.setattr(logging.getLogger("lift3d"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="lift3d.sfm"):
        kept = usable_photos(photos, sorted(p.name for p in photos.iterdir()))
    assert kept == ["img_0.jpg", "img_2.jpg", "img_3.jpg", "img_4.jpg"]
    assert "1 of 5 photos are cut short (truncated files) and are left out: img_1.jpg" in caplog.text
    # a JPEG with a trailer after its end (as motion photos carry) is whole
    (photos / "img_2.jpg").write_bytes((photos / "img_2.jpg").read_bytes() + b"\0\0ftypmp42" + bytes(300))
    assert "img_2.jpg" in usable_photos(photos, ["img_0.jpg", "img_2.jpg"])
    for name in ("img_0.jpg", "img_3.jpg", "img_4.jpg"):
        data = (photos / name).read_bytes()
        (photos / name).write_bytes(data[: len(data) * 2 // 3])
    (photos / "img_2.jpg").unlink()
    refused(["poses", str(photos)], capsys, "0 whole photo(s)", "cut short", "img_0.jpg")


def test_copies_of_one_photo_are_called_identical(photos, capsys):
    for i in range(1, 5):
        shutil.copy(photos / "img_0.jpg", photos / f"img_{i}.jpg")
    refused(["poses", str(photos)], capsys, "identical", "no parallax", "different spots")


def test_zero_camera_matrices_are_refused_by_frame(tmp_path, data_dir, capsys):
    scene = tmp_path / "ngp"
    (scene / "images").mkdir(parents=True)
    frames = []
    for i in range(3):
        (scene / "images" / f"f{i}.png").write_bytes(png_bytes(32, 24, seed=i))
        c2w = np.eye(4)
        c2w[2, 3] = 3.0 + i
        frames.append({"file_path": f"images/f{i}.png", "transform_matrix": c2w.tolist()})
    frames[1]["transform_matrix"] = np.zeros((4, 4)).tolist()  # what a failed solve or a broken exporter writes
    (scene / "transforms.json").write_text(json.dumps({"camera_angle_x": 0.8, "frames": frames}))
    refused(["reconstruct", str(scene), "trainer.max_steps=1"], capsys, "images/f1.png", "degenerate", "singular")

    frames[1]["transform_matrix"] = np.eye(4).tolist()
    (scene / "transforms.json").write_text(json.dumps({"fl_x": 0.0, "cx": 16, "cy": 12, "frames": frames}))
    refused(["reconstruct", str(scene), "trainer.max_steps=1"], capsys, "degenerate", "focal length 0")

    colmap = tmp_path / "colmap"
    shutil.move(scene / "images", colmap / "images")
    model = colmap / "sparse" / "0"
    model.mkdir(parents=True)
    (model / "cameras.txt").write_text("# Camera list\n1 PINHOLE 32 24 30 30 16 12\n")
    (model / "images.txt").write_text("# Image list\n1 1 0 0 0 0 0 3 1 f0.png\n\n2 0 0 0 0 0 0 4 1 f1.png\n\n"
                                      "3 1 0 0 0 0 0 5 1 f2.png\n\n")
    (model / "points3D.txt").write_text("# 3D point list\n")
    refused(["reconstruct", str(colmap), "trainer.max_steps=1"], capsys, "f1.png", "degenerate", "quaternion")
    (model / "images.txt").write_text((model / "images.txt").read_text().replace("2 0 0 0 0", "2 1 0 0 0"))
    (model / "cameras.txt").write_text("# Camera list\n1 PINHOLE 32 24 0 0 16 12\n")
    refused(["reconstruct", str(colmap), "trainer.max_steps=1"], capsys, "degenerate", "focal length 0")


def test_videos_over_the_frame_limits_are_refused_from_their_header(tmp_path, capsys, monkeypatch):
    frames = [(np.random.default_rng(i).random((64, 96, 3)) * 255).astype(np.uint8) for i in range(16)]
    imageio.mimwrite(tmp_path / "clip.mp4", frames, fps=8, macro_block_size=16)
    monkeypatch.setenv("LIFT3D_MAX_VIDEO_FRAME_PIXELS", "1000")
    refused(["poses", str(tmp_path / "clip.mp4")], capsys, "clip.mp4", "96 x 64 px", "LIFT3D_MAX_VIDEO_FRAME_PIXELS")
    monkeypatch.delenv("LIFT3D_MAX_VIDEO_FRAME_PIXELS")
    monkeypatch.setenv("LIFT3D_MAX_VIDEO_FRAMES", "5")
    refused(["poses", str(tmp_path / "clip.mp4")], capsys, "clip.mp4", "16 frames", "LIFT3D_MAX_VIDEO_FRAMES")
    assert not (tmp_path / "clip").exists()
