"""Putting a captured scene in lift3d's frame: +z up, centered where the cameras look, at a known scale.

Pure functions on camera-to-world matrices (OpenGL axes) and points. The transform is a similarity
``x -> scale * R @ (x - center)``, returned as one 4x4 matrix so it can be recorded and inverted.
"""

from __future__ import annotations

import numpy as np


def rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The smallest rotation [3, 3] taking unit vector ``a`` onto unit vector ``b`` (Rodrigues)."""
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    v, c = np.cross(a, b), float(np.dot(a, b))
    if c < -1.0 + 1e-9:  # opposite: half a turn about any axis perpendicular to a
        axis = np.cross(a, [1.0, 0.0, 0.0] if abs(a[0]) < 0.9 else [0.0, 1.0, 0.0])
        axis /= np.linalg.norm(axis)
        return 2.0 * np.outer(axis, axis) - np.eye(3)
    vx = np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])
    return np.eye(3) + vx + vx @ vx / (1.0 + c)


def focus_point(c2w: np.ndarray) -> tuple[np.ndarray, bool]:
    """The point nearest (least squares) to every camera's optical axis, and whether it is a sound center:
    the axes are not nearly parallel and the point lies in front of most cameras (an inward-looking capture)."""
    origins, forwards = c2w[:, :3, 3], -c2w[:, :3, 2]
    forwards = forwards / np.linalg.norm(forwards, axis=1, keepdims=True)
    projectors = np.eye(3)[None] - forwards[:, :, None] * forwards[:, None, :]
    A, b = projectors.sum(0), (projectors @ origins[:, :, None]).sum(0)[:, 0]
    smallest = float(np.linalg.eigvalsh(A)[0]) / len(c2w)
    if smallest < 0.02:  # axes within ~8 degrees of parallel: forward-facing, no common focus
        return origins.mean(0), False
    point = np.linalg.solve(A, b)
    in_front = float((((point - origins) * forwards).sum(1) > 0).mean())
    return point, in_front >= 0.8


def normalizing_transform(c2w: np.ndarray, camera_distance: float = 4.0) -> tuple[np.ndarray, dict[str, object]]:
    """A 4x4 similarity that turns the cameras' mean up direction to +z, moves their focus point (or, for a
    forward-facing capture, their mean position) to the origin and scales their mean distance from it to
    ``camera_distance``; and a record of what it did."""
    up = c2w[:, :3, 1].mean(0)
    if np.linalg.norm(up) < 1e-6:
        up = np.array([0.0, 0.0, 1.0])
    R = rotation_between(up, np.array([0.0, 0.0, 1.0]))
    center, focused = focus_point(c2w)
    distance = float(np.linalg.norm(c2w[:, :3, 3] - center, axis=1).mean())
    scale = camera_distance / distance if distance > 1e-9 else 1.0
    T = np.eye(4)
    T[:3, :3] = scale * R
    T[:3, 3] = -scale * R @ center
    record = {"center": center.tolist(), "scale": scale, "up": (up / np.linalg.norm(up)).tolist(),
              "center_is": "focus point of the cameras" if focused else "mean camera position (forward-facing capture)"}
    return T, record


def transform_poses(T: np.ndarray, c2w: np.ndarray) -> np.ndarray:
    """Camera-to-world matrices [N, 4, 4] moved by the similarity ``T`` (rotation columns stay unit length)."""
    scale = np.cbrt(np.linalg.det(T[:3, :3]))
    out = T[None] @ c2w
    out[:, :3, :3] /= scale
    return out


def transform_points(T: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Points [N, 3] moved by the similarity ``T``."""
    return points @ T[:3, :3].T + T[:3, 3]
