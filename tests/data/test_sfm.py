"""Structure from motion with pycolmap: photos rendered at known poses, poses thrown away, poses recovered."""

import json
import math
import shutil

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_matrix, orbit_c2w
from lift3d.cli import main
from lift3d.data.formats.transforms import read_transforms_json
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.sfm import SfmOptions, prepare_capture, triangulate_points
from tests.sfm_scene import pose_errors, render_photos, write_photos


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """20 JPGs of the sample toy on a textured floor, and the cameras that took them (thrown away)."""
    root = tmp_path_factory.mktemp("capture")
    cameras = write_photos(root / "images", n_views=20, resolution=200)
    return root, cameras


def test_sfm_recovers_every_camera(photos, capsys):
    root, cameras = photos
    assert main(["poses", str(root)]) == 0
    out = capsys.readouterr()
    assert "poses written to" in out.out and "registered 20 of 20" in out.err
    module = PosedImagesDataModule({"root": str(root), "normalize": "none", "holdout_every": 0})
    assert module.capture.format == "colmap" and len(module.capture.frames) == 20
    import pycolmap

    assert len(pycolmap.Reconstruction(root / "sparse" / "0").cameras) == 1  # photos of one size and no EXIF: one camera
    names = [f.image.name for f in module.capture.frames]
    order = [int(n.removeprefix("photo_").removesuffix(".jpg")) for n in names]
    recovered = np.stack([f.c2w for f in module.capture.frames])
    rotation, position, extent = pose_errors(recovered, cameras.c2w.double().numpy()[order])
    assert rotation < 1.0 and position < 0.02 * extent, (rotation, position, extent)
    assert module.points is not None and len(module.points) > 100
    # a second run reuses the model
    assert main(["poses", str(root)]) == 0
    assert "already has poses" in capsys.readouterr().out


def test_reconstruct_a_photo_folder(photos, capsys):
    root, _ = photos
    run = root.parent / "runs"
    assert main(["reconstruct", str(root), "trainer.max_steps=30", "trainer.val_check_interval=30",
                 "data.n_orbit_views=2", f"output_root={run}", "system.gaussians.sh_degree=0"]) == 0
    metrics = json.loads(next(run.rglob("metrics.json")).read_text())
    assert metrics["val"]["views"] == 3 and math.isfinite(metrics["val"]["psnr"])
    scene = json.loads(next(run.rglob("scene.json")).read_text())
    assert scene["format"] == "colmap" and scene["splits"]["val"] == ["photo_000.jpg", "photo_008.jpg", "photo_016.jpg"]
    assert "sfm" in capsys.readouterr().err  # the Gaussians started from the SfM points


def test_photos_with_nothing_in_common_say_so(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for i in range(3):
        imageio.imwrite(tmp_path / f"noise_{i}.png", rng.integers(0, 255, (300, 400, 3), dtype=np.uint8))
    assert main(["poses", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "registered only 0 of 3 photos" in err and "no two of the 3 photos share matches (noise_0.png, noise_1.png" in err
    assert "take overlapping photos of one subject" in err and "Traceback" not in err


def test_bad_inputs(tmp_path, capsys):
    assert main(["poses", str(tmp_path)]) == 2
    assert "holds no photos" in capsys.readouterr().err
    fake = tmp_path / "clip.mp4"
    fake.write_text("not a video")
    assert main(["poses", str(fake)]) == 2
    assert "cannot read the video" in capsys.readouterr().err
    assert main(["poses", str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_video_goes_through_the_same_path(tmp_path):
    n, size = 24, 200
    c2w = orbit_c2w(n, 35.0, 4.0)
    focal = 0.5 * size / math.tan(0.5 * 0.69)
    K = intrinsics_matrix(*(torch.full((n,), v) for v in (focal, focal, size / 2, size / 2)))
    frames = render_photos(Cameras(c2w, K, size, size))
    video = tmp_path / "orbit.mp4"
    imageio.mimwrite(video, list(frames), fps=8, quality=9, macro_block_size=8)
    options = SfmOptions(num_threads=1)  # one thread: the same poses every run (with all cores, one CI run in many
    scene = prepare_capture(video, options, video_frames=n)  # registered this synthetic orbit 81 degrees off)
    assert scene == tmp_path / "orbit" and options.matcher == "sequential"
    import pycolmap

    assert len(pycolmap.Reconstruction(scene / "sparse" / "0").cameras) == 1  # one video, one camera
    module = PosedImagesDataModule({"root": str(scene), "normalize": "none", "holdout_every": 0})
    assert len(module.capture.frames) == n
    order = [int(f.image.stem.removeprefix("frame_")) for f in module.capture.frames]
    rotation, position, extent = pose_errors(np.stack([f.c2w for f in module.capture.frames]), c2w.double().numpy()[order])
    print(f"video poses: rotation {rotation:.3f} deg, position {position / extent:.2%} of the extent")
    assert rotation < 1.0 and position < 0.02 * extent, (rotation, position, extent)


def test_points_triangulated_at_known_poses(photos, tmp_path, monkeypatch):
    root, cameras = photos
    scene = tmp_path / "posed"
    shutil.copytree(root / "images", scene / "images")
    K = cameras.intrinsics[0]
    frames = [{"file_path": f"images/photo_{i:03d}.jpg", "transform_matrix": cameras.c2w[i].tolist()}
              for i in range(len(cameras))]
    meta = {"fl_x": float(K[0, 0]), "fl_y": float(K[1, 1]), "cx": float(K[0, 2]), "cy": float(K[1, 2]), "frames": frames}
    (scene / "transforms.json").write_text(json.dumps(meta))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    points, colors = triangulate_points(read_transforms_json(scene))
    assert len(points) > 100 and colors.dtype == np.uint8
    # the toy and its floor: points on or above the floor plane, near the origin
    assert np.percentile(points[:, 2], 5) > -1.0 and np.percentile(np.linalg.norm(points[:, :2], axis=1), 95) < 3.6
    assert (tmp_path / "cache" / "lift3d" / "triangulated").is_dir()
