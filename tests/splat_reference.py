"""An independent, brute-force per-pixel Gaussian renderer in float64 NumPy (the tests' reference).

It follows the rules written in lift3d.render.splats.torch_backend's docstring one pixel and one Gaussian at a
time, without tiles, chunks or vectorised tricks, and shares no code with lift3d's rasterizer.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation


def project_one(mean, quat_wxyz, scale, w2c, K, width, height, eps2d=0.3):
    """(mean2d [2], cov2d [2, 2] dilated, depth) of one Gaussian, or None when behind the camera."""
    R = Rotation.from_quat([quat_wxyz[1], quat_wxyz[2], quat_wxyz[3], quat_wxyz[0]]).as_matrix()
    cov = R @ np.diag(np.asarray(scale) ** 2) @ R.T
    W, t = w2c[:3, :3], w2c[:3, 3]
    x, y, z = W @ mean + t
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    # Jacobian of the pinhole map at the center, clamped to 1.3x the field of view
    lim_xp, lim_xn = (width - cx) / fx + 0.15 * width / fx, cx / fx + 0.15 * width / fx
    lim_yp, lim_yn = (height - cy) / fy + 0.15 * height / fy, cy / fy + 0.15 * height / fy
    tx = z * min(max(x / z, -lim_xn), lim_xp)
    ty = z * min(max(y / z, -lim_yn), lim_yp)
    J = np.array([[fx / z, 0.0, -fx * tx / z**2], [0.0, fy / z, -fy * ty / z**2]])
    cov2d = J @ W @ cov @ W.T @ J.T + eps2d * np.eye(2)
    return np.array([fx * x / z + cx, fy * y / z + cy]), cov2d, z


def render_reference(means, quats, scales, opacities, colors, w2c, K, width, height, background,
                     eps2d=0.3, near=0.01, far=1e10):
    """rgb [H, W, D], alpha [H, W] of one camera and how many pixels stopped early (transmittance);
    ``colors`` [N, D] are the per-Gaussian colors."""
    items = []
    for i in range(len(means)):
        if opacities[i] < 1 / 255:
            continue
        mean2d, cov2d, z = project_one(means[i], quats[i], scales[i], w2c, K, width, height, eps2d)
        if not (near <= z <= far) or np.linalg.det(cov2d) <= 0:
            continue
        items.append((z, i, mean2d, np.linalg.inv(cov2d)))
    items.sort(key=lambda item: (item[0], item[1]))
    rgb = np.zeros((height, width, colors.shape[1]))
    alpha_out = np.zeros((height, width))
    stopped = 0
    for row in range(height):
        for col in range(width):
            p = np.array([col + 0.5, row + 0.5])
            T, out = 1.0, np.zeros(colors.shape[1])
            for _, i, mean2d, conic in items:
                d = mean2d - p
                sigma = 0.5 * d @ conic @ d
                alpha = min(0.999, opacities[i] * np.exp(-sigma))
                if sigma < 0 or alpha < 1 / 255:
                    continue
                if T * (1 - alpha) <= 1e-4:
                    stopped += 1
                    break
                out += colors[i] * alpha * T
                T *= 1 - alpha
            rgb[row, col] = out + T * np.asarray(background)
            alpha_out[row, col] = 1 - T
    return rgb, alpha_out, stopped
