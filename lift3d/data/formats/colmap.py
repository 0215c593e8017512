"""COLMAP: a sparse model (``sparse/0`` or ``sparse/``) beside ``images/`` -> a ``Capture``.

Poses are converted from COLMAP's world-to-camera (OpenCV axes) to lift3d's camera-to-world (OpenGL axes);
lenses map to OpenCV's radial-tangential or fisheye models; the sparse points come along (they seed
the Gaussians). With ``downscale`` 2, 4 or 8, ``images_<d>/`` is used when the folder has it; another
downscale later picks its folder again from the frames already read (``rescale``), without re-reading the model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from lift3d.data.capture import Capture, Frame, Lens, SceneFormatError, check_camera
from lift3d.data.colmap_model import ColmapCamera, find_model, read_model
from lift3d.data.formats import CaptureFormat, register_format
from lift3d.rotations import quaternion_to_matrix_np

_GL_FROM_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def lens_from_colmap(camera: ColmapCamera) -> Lens:
    """lift3d's ``Lens`` of a COLMAP camera (COLMAP's pixel convention is lift3d's: centers at i + 0.5)."""
    p, w, h = camera.params, camera.width, camera.height
    model = camera.model
    if model == "SIMPLE_PINHOLE":
        return Lens(w, h, p[0], p[0], p[1], p[2])
    if model == "PINHOLE":
        return Lens(w, h, p[0], p[1], p[2], p[3])
    if model == "SIMPLE_RADIAL":
        return Lens(w, h, p[0], p[0], p[1], p[2], "opencv", (p[3], 0.0, 0.0, 0.0))
    if model == "RADIAL":
        return Lens(w, h, p[0], p[0], p[1], p[2], "opencv", (p[3], p[4], 0.0, 0.0))
    if model == "OPENCV":
        return Lens(w, h, p[0], p[1], p[2], p[3], "opencv", tuple(p[4:8]))
    if model == "FULL_OPENCV":
        return Lens(w, h, p[0], p[1], p[2], p[3], "opencv", tuple(p[4:12]))
    if model == "OPENCV_FISHEYE":
        return Lens(w, h, p[0], p[1], p[2], p[3], "fisheye", tuple(p[4:8]))
    if model == "SIMPLE_RADIAL_FISHEYE":
        return Lens(w, h, p[0], p[0], p[1], p[2], "fisheye", (p[3], 0.0, 0.0, 0.0))
    if model == "RADIAL_FISHEYE":
        return Lens(w, h, p[0], p[0], p[1], p[2], "fisheye", (p[3], p[4], 0.0, 0.0))
    raise SceneFormatError(f"COLMAP camera {camera.id} uses the {model} model, which lift3d does not undistort; "
                           "re-run COLMAP's mapper with --ImageReader.camera_model OPENCV (or PINHOLE / OPENCV_FISHEYE), "
                           "or undistort with `colmap image_undistorter` and point lift3d at its output")


def c2w_from_colmap(qvec: np.ndarray, tvec: np.ndarray) -> np.ndarray:
    """Camera-to-world [4, 4] with OpenGL camera axes from COLMAP's world-to-camera quaternion + translation."""
    w2c = np.eye(4)
    w2c[:3, :3] = quaternion_to_matrix_np(qvec)
    w2c[:3, 3] = tvec
    return np.linalg.inv(w2c) @ _GL_FROM_CV


def images_folder(root: Path, downscale: int) -> tuple[Path, int]:
    """The folder the model's image names are relative to, and the downscale still to apply on load:
    ``images_<d>/`` when asked for and present (already downscaled), else ``images/``, else ``root``."""
    if downscale > 1 and (root / f"images_{downscale}").is_dir():
        return root / f"images_{downscale}", 1
    return (root / "images" if (root / "images").is_dir() else root), downscale


def read_colmap(root: Path, downscale: int = 1) -> tuple[Capture, int]:
    """A ``Capture`` of the COLMAP scene in ``root``, and the downscale left to apply when images are read."""
    folder = find_model(root)
    if folder is None:
        raise SceneFormatError(f"no COLMAP model in {root}: expected sparse/0/ or sparse/ with cameras, images and "
                               "points3D (.bin or .txt)")
    model = read_model(folder)
    if not model.images:
        raise SceneFormatError(f"the COLMAP model in {folder} registers no images")
    registered = []
    lenses: dict[int, Lens] = {}
    for image in sorted(model.images.values(), key=lambda im: im.name):
        if image.camera_id not in model.cameras:
            raise SceneFormatError(f"{folder}: image {image.name} names camera {image.camera_id}, which the model lacks")
        if image.camera_id not in lenses:
            lenses[image.camera_id] = lens_from_colmap(model.cameras[image.camera_id])
        if np.isfinite(image.qvec).all() and np.linalg.norm(image.qvec) < 1e-6:
            raise SceneFormatError(f"{folder}: the camera of image {image.name} is degenerate (its rotation quaternion is "
                                   "zero, not a rotation); fix or remove that image in the model, or recover every pose "
                                   f"again with lift3d poses {root} --force")
        c2w = c2w_from_colmap(image.qvec, image.tvec)
        check_camera(c2w, lenses[image.camera_id], folder, image.name)
        registered.append(Frame(root / image.name, c2w, lenses[image.camera_id], name=image.name))
    points = colors = None
    if model.points:
        points = np.stack([p.xyz for p in model.points.values()]).astype(np.float32)
        colors = np.stack([p.rgb for p in model.points.values()]).astype(np.uint8)
    kind = "binary" if (folder / "cameras.bin").is_file() else "text"
    summary = (f"COLMAP model {folder} ({kind}): {len(model.images)} images, {len(model.cameras)} camera(s), "
               f"{len(model.points)} points")
    capture = Capture(root, "colmap", [], None, points, colors, [], unbounded=True, notes=[summary],
                      registered=registered)
    return rescale(capture, downscale)


def rescale(capture: Capture, downscale: int) -> tuple[Capture, int]:
    """The capture's frames with their images from the folder for ``downscale`` (registered images without a
    file there are missing), and the downscale left to apply when they are read."""
    image_dir, remaining = images_folder(capture.root, downscale)
    frames, missing = [], []
    for frame in capture.registered:
        path = image_dir / frame.name
        if path.is_file():
            frames.append(replace(frame, image=path))
        else:
            missing.append(frame.name)
    notes = [capture.notes[0].split("; images from ")[0] + f"; images from {image_dir}", *capture.notes[1:]]
    return replace(capture, frames=frames, missing=missing, notes=notes), remaining


def _named_files(root: Path) -> list[tuple[str, Path]]:
    """Every image the model names, in each folder a downscale may read it from."""
    model = read_model(find_model(root))
    folders = {images_folder(root, d)[0] for d in (1, 2, 4, 8)}
    return [(image.name, folder / image.name) for image in model.images.values() for folder in folders]


FORMAT = register_format(CaptureFormat(
    name="colmap",
    description="COLMAP (sparse/0/ or sparse/ beside images/)",
    detect=lambda path: find_model(path) is not None,
    read=read_colmap,
    priority=30,
    named_files=_named_files,
    rescale=rescale,
))
