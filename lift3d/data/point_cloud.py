"""PLY point clouds (x, y, z[, red, green, blue]) as arrays: the sparse points some captures bring along."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lift3d.data.capture import SceneFormatError


def read_point_cloud(path: str | Path, error: type[Exception] = SceneFormatError) -> tuple[np.ndarray, np.ndarray]:
    """Points [P, 3] float32 and colors [P, 3] float32 in 0..1 (gray when absent) of a PLY point cloud;
    ``error`` is raised for a file without x, y, z (callers name their own kind of error)."""
    from plyfile import PlyData

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"point cloud not found: {path}")
    vertex = PlyData.read(str(path))["vertex"]
    names = vertex.data.dtype.names or ()
    if not {"x", "y", "z"} <= set(names):
        raise error(f"{path}: a point cloud needs x, y, z vertex properties (found {', '.join(names)})")
    points = np.stack([vertex[a] for a in "xyz"], -1).astype(np.float32)
    if {"red", "green", "blue"} <= set(names):
        rgb = np.stack([vertex[a] for a in ("red", "green", "blue")], -1).astype(np.float32)
        colors = rgb / (255.0 if rgb.max() > 1.0 else 1.0)
    else:
        colors = np.full_like(points, 0.5)
    return points, colors
