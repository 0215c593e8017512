"""Lens undistortion to a pinhole camera with OpenCV: radial-tangential (``opencv``) and ``fisheye`` lenses.

Each distinct lens gets one remap table; the new pinhole camera keeps the focal length OpenCV chooses
for a view with no invalid pixels (``alpha=0`` / ``balance=0``), and the image is then cropped to the
largest rectangle of valid pixels, so no black border is ever trained on. Pixel centers: lift3d and
COLMAP put them at i + 0.5, OpenCV at i, so principal points shift by half a pixel on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lift3d.data.capture import Lens


@dataclass(frozen=True)
class Undistortion:
    """A remap from a distorted image to its pinhole version, and that version's lens."""

    map_x: np.ndarray  # [H, W] float32 source x for every output pixel (OpenCV pixel coordinates)
    map_y: np.ndarray  # [H, W] float32
    crop: tuple[int, int, int, int]  # x0, y0, x1, y1 of the valid rectangle in the remapped image
    lens: Lens  # the pinhole lens of the cropped result

    def apply(self, image: np.ndarray) -> np.ndarray:
        """``image`` [H, W, C] uint8 (the distorted photo) -> the cropped pinhole image."""
        import cv2

        # the crop keeps pixels whose source lies inside the photo; replicate its edge for the bilinear taps there
        out = cv2.remap(image, self.map_x, self.map_y, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        x0, y0, x1, y1 = self.crop
        return out[y0:y1, x0:x1]


def _opencv_matrix(lens: Lens) -> np.ndarray:
    K = lens.matrix()
    K[0, 2] -= 0.5
    K[1, 2] -= 0.5
    return K


def valid_crop(valid: np.ndarray) -> tuple[int, int, int, int]:
    """The rectangle (x0, y0, x1, y1) left after peeling border rows and columns off ``valid`` [H, W] (bool)
    until none holds an invalid pixel; each round peels the side with the most invalid pixels."""
    y0, y1, x0, x1 = 0, valid.shape[0], 0, valid.shape[1]
    while y1 - y0 > 1 and x1 - x0 > 1:
        sides = {
            "top": int((~valid[y0, x0:x1]).sum()), "bottom": int((~valid[y1 - 1, x0:x1]).sum()),
            "left": int((~valid[y0:y1, x0]).sum()), "right": int((~valid[y0:y1, x1 - 1]).sum()),
        }
        side, worst = max(sides.items(), key=lambda item: item[1])
        if worst == 0:
            break
        if side == "top":
            y0 += 1
        elif side == "bottom":
            y1 -= 1
        elif side == "left":
            x0 += 1
        else:
            x1 -= 1
    return x0, y0, x1, y1


def plan_undistortion(lens: Lens) -> Undistortion:
    """The remap tables and pinhole lens that undistort images taken with ``lens``."""
    import cv2

    size = (lens.width, lens.height)
    K = _opencv_matrix(lens)
    D = np.asarray(lens.coeffs, dtype=np.float64)
    if lens.kind == "fisheye":
        D = np.pad(D, (0, 4 - len(D)))[:4]
        new_K = cv2.fisheye.estimateNewCameraMatrixForUndistortRectify(K, D, size, np.eye(3), balance=0.0)
        map_x, map_y = cv2.fisheye.initUndistortRectifyMap(K, D, np.eye(3), new_K, size, cv2.CV_32FC1)
    elif lens.kind == "opencv":
        new_K, _ = cv2.getOptimalNewCameraMatrix(K, D, size, 0.0, size)
        map_x, map_y = cv2.initUndistortRectifyMap(K, D, None, new_K, size, cv2.CV_32FC1)
    else:
        raise ValueError(f"a {lens.kind} lens has no distortion to remove")
    # valid where the source position lies inside the photo (with a half-pixel margin for interpolation)
    valid = (map_x >= -0.5) & (map_x <= lens.width - 0.5) & (map_y >= -0.5) & (map_y <= lens.height - 0.5)
    x0, y0, x1, y1 = valid_crop(valid)
    pinhole = Lens(x1 - x0, y1 - y0, float(new_K[0, 0]), float(new_K[1, 1]),
                   float(new_K[0, 2]) + 0.5 - x0, float(new_K[1, 2]) + 0.5 - y0)
    return Undistortion(map_x, map_y, (x0, y0, x1, y1), pinhole)


def distort_points(lens: Lens, points: np.ndarray) -> np.ndarray:
    """Pixel positions [N, 2] (lift3d convention) where the distorted camera sees the normalized image-plane
    points [N, 2] (x/z, y/z, OpenCV axes) — OpenCV's projection, for tests and diagnostics."""
    import cv2

    object_points = np.concatenate([points, np.ones((len(points), 1))], axis=1)[:, None, :].astype(np.float64)
    K, zero = _opencv_matrix(lens), np.zeros(3)
    D = np.asarray(lens.coeffs, dtype=np.float64)
    if lens.kind == "fisheye":
        projected, _ = cv2.fisheye.projectPoints(object_points, zero, zero, K, np.pad(D, (0, 4 - len(D)))[:4])
    else:
        projected, _ = cv2.projectPoints(object_points, zero, zero, K, D)
    return projected.reshape(-1, 2) + 0.5
