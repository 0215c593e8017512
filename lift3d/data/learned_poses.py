"""Camera poses for photos that have none, from a network that predicts them (VGGT), written as the COLMAP model
structure from motion writes, so that everything downstream reads it unchanged.

A predictor (``PosePredictor``: ``lift3d.generators.vggt.VggtPredictor``, or a stand-in with the same interface)
returns a ``PosePrediction``: each photo's camera (intrinsics at the photo's own size, OpenCV world-to-camera in
the first photo's frame) and a depth map with its confidence and colors. ``run_learned_poses`` writes
``sparse/0`` beside the photos: one PINHOLE camera per photo, the poses, and a point cloud unprojected from the
confident depth (``depth_points``), subsampled to a budget larger than SfM's sparse points, which the Gaussians start
from. A record beside the model (``lift3d_poses.json``, tied to the model by a hash of its ``images.bin``) says where
the poses came from; ``learned_pose_overrides`` reads it so training refines learned poses by default.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lift3d.data.capture import SceneFormatError
from lift3d.data.colmap_model import (
    ColmapCamera,
    ColmapImage,
    ColmapModel,
    ColmapPoint,
    find_model,
    write_model_binary,
)
from lift3d.data.formats.photos import photo_folder
from lift3d.data.transforms_json import IMAGE_SUFFIXES
from lift3d.rotations import matrix_to_quaternion_np

log = logging.getLogger("lift3d.poses")
POSE_METHODS = ("auto", "sfm", "vggt")  # how photos get poses: auto picks vggt where its weights are, else sfm
RECORD = "lift3d_poses.json"  # beside the model: where its poses came from
MODEL_FILES = tuple(f"{name}.{ext}" for name in ("cameras", "images", "points3D") for ext in ("bin", "txt"))


@dataclass
class PosePrediction:
    """What a pose network says of N photos. The depth grid may differ from the photos (VGGT's is its input:
    resized, cropped or padded); ``depth_intrinsics`` place it, and its pixels that show no photo have confidence 0."""

    names: list[str]  # photo file names inside the photo folder
    sizes: np.ndarray  # [N, 2] int: each photo's (width, height), upright
    intrinsics: np.ndarray  # [N, 3, 3] in the photo's own pixels (pixel centers at i + 0.5)
    w2c: np.ndarray  # [N, 3, 4] world-to-camera, OpenCV axes (x right, y down, z forward)
    depth: np.ndarray  # [N, h, w] float32 z-depth on the depth grid
    confidence: np.ndarray  # [N, h, w] float32, 0 where the grid shows no photo
    colors: np.ndarray  # [N, h, w, 3] uint8: the photo's color at each depth pixel
    depth_intrinsics: np.ndarray  # [N, 3, 3] of the depth grid


class PosePredictor(Protocol):
    """A network (or a stand-in) that poses photos in one pass."""

    def predict(self, folder: Path, names: list[str]) -> PosePrediction: ...

    def record(self) -> dict[str, Any]:
        """What to note beside the model: the method, the weights and their license."""
        ...


@dataclass
class LearnedPoseOptions:
    """How predicted poses become a COLMAP model (``lift3d poses --method vggt`` flags map onto these)."""

    min_confidence: float = 5.0  # depth pixels kept for points need at least this confidence (VGGT's demo: 5)
    points: int = 0  # points in the cloud the Gaussians start from (0: 100000 with a CUDA GPU, 20000 without)
    seed: int = 0  # which confident pixels the subsample keeps
    force: bool = False  # predict again even when the folder has poses
    stage_seconds: dict[str, float] = field(default_factory=dict)  # filled in: seconds per stage


def point_budget(options: LearnedPoseOptions) -> int:
    """The cloud's size: ``options.points``, else a default for the machine's trainer."""
    if options.points > 0:
        return options.points
    import torch

    return 100_000 if torch.cuda.is_available() else 20_000


# ----------------------------------------------------------------------------------------------- points
def depth_points(prediction: PosePrediction, min_confidence: float, budget: int, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """World points [P, 3] float32 and colors [P, 3] uint8 unprojected from depth pixels of at least
    ``min_confidence``, at most ``budget`` of them (an even random subsample). When no pixel is that confident,
    the most confident quarter of the photo pixels is used (and the log says so)."""
    depth, confidence = prediction.depth, prediction.confidence
    usable = (confidence > 0) & (depth > 0) & np.isfinite(depth)
    chosen = np.flatnonzero(usable & (confidence >= min_confidence))
    if len(chosen) == 0 and usable.any():
        cut = np.quantile(confidence[usable], 0.75)
        chosen = np.flatnonzero(usable & (confidence >= cut))
        log.warning("no depth pixel reaches confidence %.3g; using the most confident quarter (>= %.3g) for points",
                    min_confidence, cut)
    if len(chosen) == 0:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8)
    if len(chosen) > budget:
        chosen = np.sort(np.random.default_rng(seed).choice(chosen, budget, replace=False))
    view, row, col = np.unravel_index(chosen, depth.shape)
    z = depth[view, row, col].astype(np.float64)
    K = prediction.depth_intrinsics[view]
    camera = np.stack([(col + 0.5 - K[:, 0, 2]) / K[:, 0, 0] * z, (row + 0.5 - K[:, 1, 2]) / K[:, 1, 1] * z, z], -1)
    R, t = prediction.w2c[view, :, :3], prediction.w2c[view, :, 3]
    world = np.einsum("nji,nj->ni", R, camera - t)  # R^T (x - t)
    return world.astype(np.float32), prediction.colors[view, row, col].astype(np.uint8)


# ----------------------------------------------------------------------------------------------- the model
def prediction_model(prediction: PosePrediction, points: np.ndarray, colors: np.ndarray) -> ColmapModel:
    """A COLMAP model of the prediction: one PINHOLE camera per photo, its pose, the points (without tracks)."""
    cameras, images = {}, {}
    for i, (name, (width, height), K, w2c) in enumerate(zip(prediction.names, prediction.sizes, prediction.intrinsics,
                                                             prediction.w2c), start=1):
        params = np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2]], np.float64)
        cameras[i] = ColmapCamera(i, "PINHOLE", int(width), int(height), params)
        images[i] = ColmapImage(i, matrix_to_quaternion_np(w2c[:, :3]), np.asarray(w2c[:, 3], np.float64), i, name)
    cloud = {i: ColmapPoint(i, p.astype(np.float64), c, 0.0) for i, (p, c) in enumerate(zip(points, colors), start=1)}
    return ColmapModel(cameras, images, cloud)


def _fingerprint(model: Path) -> str:
    return hashlib.sha1((model / "images.bin").read_bytes()).hexdigest() if (model / "images.bin").is_file() else ""


def write_prediction(scene: Path, prediction: PosePrediction, points: np.ndarray, colors: np.ndarray,
                     record: dict[str, Any]) -> Path:
    """``scene/sparse/0`` (binary, a model there before is replaced) and the record beside it; the model folder."""
    model = scene / "sparse" / "0"
    model.mkdir(parents=True, exist_ok=True)
    for name in (*MODEL_FILES, RECORD):
        (model / name).unlink(missing_ok=True)
    write_model_binary(prediction_model(prediction, points, colors), model)
    record = {**record, "photos": len(prediction.names), "points": len(points), "model_hash": _fingerprint(model)}
    (model / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return model


def read_record(scene: Path) -> dict[str, Any] | None:
    """The record of a model whose poses a network predicted (None: SfM's, another tool's, or a model rewritten
    since: the record names the ``images.bin`` it was written with)."""
    model = find_model(scene)
    if model is None or not (model / RECORD).is_file():
        return None
    try:
        record = json.loads((model / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("model_hash") != _fingerprint(model):
        return None
    return record


def learned_pose_overrides(scene: Path, config: Path) -> list[str]:
    """Config overrides for training on ``scene`` with the recipe ``config``: camera pose refinement on when a network
    predicted the poses and the recipe can refine them (a user's override, given later, still wins)."""
    record = read_record(scene)
    if record is None:
        return []
    from omegaconf import OmegaConf

    from lift3d.config.layers import load_yaml_layers, merge_layers

    merged = merge_layers([node for _, node in load_yaml_layers(Path(config))])
    if OmegaConf.select(merged, "system.pose_refinement", default=None) is None:
        return []
    log.info("poses predicted by %s: training refines them (system.pose_refinement.enabled=false keeps them as they are)",
             record.get("method", "a network"))
    return ["system.pose_refinement.enabled=true"]


# ----------------------------------------------------------------------------------------------- the command
def photo_names(images: Path) -> list[str]:
    """The photos of a folder, by name (as structure from motion takes them)."""
    return sorted(p.name for p in images.iterdir() if p.suffix in IMAGE_SUFFIXES)


def run_learned_poses(path: Path, predictor: PosePredictor, options: LearnedPoseOptions | None = None,
                      video_frames: int = 0) -> Path:
    """The scene folder of ``path`` with a COLMAP model of ``predictor``'s poses: a video's frames (extracted) or a
    photo folder; ``path`` itself when it already has poses (unless forced) or holds nothing lift3d knows."""
    from lift3d.data.formats.video import FORMAT as VIDEO
    from lift3d.data.sfm import has_poses

    options = options or LearnedPoseOptions()
    if VIDEO.detect(path):
        from lift3d.data.video import extract_frames, frames_folder

        scene = frames_folder(path)
        if options.force or photo_folder(scene) is None:
            extract_frames(path, scene / "images", video_frames)
        path = scene
    if not path.is_dir() or (has_poses(path) and not options.force):
        return path
    images = photo_folder(path)
    if images is None:
        return path
    names = photo_names(images)
    if len(names) < 2:
        raise SceneFormatError(f"{images} holds {len(names)} photo: a scene needs at least two photos of it")
    start = time.perf_counter()
    prediction = predictor.predict(images, names)
    options.stage_seconds["prediction"] = time.perf_counter() - start
    start = time.perf_counter()
    points, colors = depth_points(prediction, options.min_confidence, point_budget(options), options.seed)
    record = {**predictor.record(), "min_confidence": options.min_confidence}
    model = write_prediction(path, prediction, points, colors, record)
    options.stage_seconds["writing"] = time.perf_counter() - start
    log.info("%s posed %d photos; %d points from the confident depth; model in %s", record.get("method", "the network"),
             len(names), len(points), model)
    return path
