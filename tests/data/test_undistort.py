"""Lens undistortion: a grid photographed through a distorting lens (rendered here with an independent
implementation of the lens models) comes back as the pinhole image of the same grid."""

import json

import numpy as np
import pytest
from PIL import Image

from lift3d.data.capture import Lens
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.undistort import distort_points, plan_undistortion, valid_crop

W, H = 160, 120
OPENCV = Lens(W, H, 110.0, 112.0, 81.3, 58.6, "opencv", (-0.21, 0.06, 0.0015, -0.001))
FISHEYE = Lens(W, H, 70.0, 70.0, 79.6, 60.2, "fisheye", (0.08, -0.03, 0.01, -0.002))


def distort(lens: Lens, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lens models written out (normalized undistorted -> normalized distorted coordinates)."""
    if lens.kind == "fisheye":
        k1, k2, k3, k4 = lens.coeffs
        r = np.hypot(x, y)
        theta = np.arctan(r)
        theta_d = theta * (1 + k1 * theta**2 + k2 * theta**4 + k3 * theta**6 + k4 * theta**8)
        scale = np.where(r > 1e-12, theta_d / np.maximum(r, 1e-12), 1.0)
        return x * scale, y * scale
    k1, k2, p1, p2 = lens.coeffs
    r2 = x * x + y * y
    radial = 1 + k1 * r2 + k2 * r2 * r2
    return x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x), y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y


def undistort(lens: Lens, xd: np.ndarray, yd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``distort`` by Newton's method with a numerical Jacobian (independent of OpenCV)."""
    x, y = xd.copy(), yd.copy()
    for _ in range(30):
        fx, fy = distort(lens, x, y)
        rx, ry = fx - xd, fy - yd
        e = 1e-6
        ax, ay = distort(lens, x + e, y)
        bx, by = distort(lens, x, y + e)
        j11, j21, j12, j22 = (ax - fx) / e, (ay - fy) / e, (bx - fx) / e, (by - fy) / e
        det = j11 * j22 - j12 * j21
        x, y = x - (j22 * rx - j12 * ry) / det, y - (-j21 * rx + j11 * ry) / det
    return x, y


def grid(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A smooth grid pattern on the normalized image plane, as gray levels in 0..1."""
    return 0.5 + 0.25 * np.sin(9 * x) * np.cos(9 * y) + 0.2 * np.cos(23 * x + 5 * y)


def photo_through(lens: Lens) -> np.ndarray:
    """The grid as the distorting lens sees it (pixel centers at i + 0.5)."""
    v, u = np.mgrid[0:H, 0:W] + 0.5
    x, y = undistort(lens, (u - lens.cx) / lens.fx, (v - lens.cy) / lens.fy)
    return grid(x, y)


@pytest.mark.parametrize("lens", [OPENCV, FISHEYE], ids=["opencv", "fisheye"])
def test_undistorted_photo_is_the_pinhole_grid(lens):
    plan = plan_undistortion(lens)
    photo = (photo_through(lens) * 255 + 0.5).astype(np.uint8)
    out = plan.apply(np.repeat(photo[..., None], 3, -1))[..., 0].astype(np.float64) / 255
    pin = plan.lens
    assert out.shape == (pin.height, pin.width) and pin.kind == "pinhole"
    v, u = np.mgrid[0:pin.height, 0:pin.width] + 0.5
    expected = grid((u - pin.cx) / pin.fx, (v - pin.cy) / pin.fy)
    error = out - expected
    psnr = -10 * np.log10((error**2).mean())
    assert psnr > 33, psnr  # interpolation and 8-bit rounding only
    assert pin.width >= 0.6 * W and pin.height >= 0.6 * H  # a crop, not a sliver


@pytest.mark.parametrize("lens", [OPENCV, FISHEYE], ids=["opencv", "fisheye"])
def test_opencv_projection_agrees_with_the_lens_model(lens):
    rng = np.random.default_rng(0)
    points = rng.uniform(-0.5, 0.5, (50, 2))
    xd, yd = distort(lens, points[:, 0], points[:, 1])
    ours = np.stack([xd * lens.fx + lens.cx, yd * lens.fy + lens.cy], -1)
    assert np.abs(distort_points(lens, points) - ours).max() < 1e-6


def test_valid_crop_removes_every_invalid_pixel():
    valid = np.ones((40, 50), bool)
    valid[:3] = False
    valid[:, -2:] = False
    valid[20, 0] = False
    x0, y0, x1, y1 = valid_crop(valid)
    assert valid[y0:y1, x0:x1].all() and (x0, y0, x1, y1) == (1, 3, 48, 40)


def test_the_loader_undistorts_and_says_so(tmp_path, caplog):
    (tmp_path / "images").mkdir()
    photo = (photo_through(OPENCV) * 255 + 0.5).astype(np.uint8)
    frames = []
    for i in range(3):
        Image.fromarray(photo).save(tmp_path / "images" / f"{i}.png")
        c2w = np.eye(4)
        c2w[:3, 3] = [np.cos(i), np.sin(i), 0.5]
        frames.append({"file_path": f"images/{i}.png", "transform_matrix": c2w.tolist()})
    fx, fy, cx, cy = OPENCV.fx, OPENCV.fy, OPENCV.cx, OPENCV.cy
    k1, k2, p1, p2 = OPENCV.coeffs
    meta = {"camera_model": "OPENCV", "fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "k1": k1, "k2": k2, "p1": p1, "p2": p2,
            "frames": frames}
    (tmp_path / "transforms.json").write_text(json.dumps(meta))
    with caplog.at_level("INFO", logger="lift3d.data"):
        module = PosedImagesDataModule({"root": str(tmp_path), "holdout_every": 0})
    plan = plan_undistortion(OPENCV)
    assert "undistorted opencv" in caplog.text and f"cropped to the {plan.lens.width}x{plan.lens.height}" in caplog.text
    K = module.train.cameras.intrinsics[0].numpy()
    assert np.allclose(K, plan.lens.matrix(), atol=1e-4)
    assert (module.train.cameras.width, module.train.cameras.height) == (plan.lens.width, plan.lens.height)
    ignored = PosedImagesDataModule({"root": str(tmp_path), "holdout_every": 0, "undistort": False})
    assert (ignored.train.cameras.width, ignored.train.cameras.height) == (W, H)
