"""VGGT as a pose predictor: photos of a scene -> each photo's camera and depth map in seconds, where structure from
motion takes minutes and fails on few photos, plain surfaces or little overlap.

``VggtPredictor`` loads the released weights (``lift3d.generators.vggt_files``: ``facebook/VGGT-1B``, CC-BY-NC-4.0,
or ``facebook/VGGT-1B-Commercial``, the VGGT license, which allows commercial use), prepares the photos as VGGT
expects (``lift3d.generators.vggt_images``), runs one forward pass (bfloat16 autocast on CUDA GPUs that have it,
float16 on others, float32 on the CPU; ``chunk`` photos at a time through the per-photo stages) and returns a
``lift3d.data.learned_poses.PosePrediction`` in the photos' own pixels, which ``run_learned_poses`` writes as a
COLMAP model.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from lift3d.data.learned_poses import PosePrediction
from lift3d.generators.vggt_files import license_of, load_network, require_weights
from lift3d.generators.vggt_heads import pose_to_cameras
from lift3d.generators.vggt_images import TARGET, prepare_photos
from lift3d.generators.vggt_model import VggtNetwork

log = logging.getLogger(__name__)


FOV_RANGE_DEG = (5.0, 160.0)  # fields of view outside this are clamped (a lens wider than that is not a pinhole)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bfloat16 on CUDA GPUs that have it (Ampere and later), float16 on older ones, None (float32) elsewhere."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@torch.no_grad()
def predict_prepared(network: VggtNetwork, images: torch.Tensor, chunk: int = 8) -> dict[str, torch.Tensor]:
    """The network's outputs for prepared photos [S, 3, H, W] (on the network's device), plus ``w2c`` [S, 3, 4] and
    ``intrinsics`` [S, 3, 3] in the model's pixels."""
    device = next(network.parameters()).device
    out = network(images.to(device), chunk=chunk, autocast_dtype=autocast_dtype(device))
    low, high = (math.radians(v) for v in FOV_RANGE_DEG)
    fov = out["pose"][:, 7:9]
    if bool(((fov < low) | (fov > high) | ~torch.isfinite(fov)).any()):
        log.warning("VGGT predicted fields of view outside %g..%g degrees for %d of %d photos: clamped (weights that are "
                    "not VGGT's, or photos it cannot read?)", *FOV_RANGE_DEG,
                    int(((fov < low) | (fov > high)).any(-1).sum()), len(fov))
        out["pose"] = torch.cat([out["pose"][:, :7], fov.nan_to_num(low).clamp(low, high)], -1)
    out["w2c"], out["intrinsics"] = pose_to_cameras(out["pose"], images.shape[-2], images.shape[-1])
    return out


class VggtPredictor:
    """Poses photos with VGGT (``lift3d.data.learned_poses.PosePredictor``)."""

    def __init__(self, weights: str | Path | None = None, device: str | torch.device | None = None, mode: str = "crop",
                 chunk: int = 8, resolution: int = TARGET) -> None:
        self.weights = require_weights(weights)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.mode, self.chunk, self.resolution = mode, chunk, resolution
        self._network: VggtNetwork | None = None
        self.seconds: dict[str, float] = {}

    @property
    def network(self) -> VggtNetwork:
        if self._network is None:
            start = time.perf_counter()
            self._network = load_network(self.weights, self.device)
            self.seconds["load"] = time.perf_counter() - start
        return self._network

    def release(self) -> None:
        """Drop the network (and on CUDA the memory it held), so that training after it has the GPU to itself."""
        self._network = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def record(self) -> dict[str, Any]:
        return {"method": "vggt", "weights": str(self.weights), "license": license_of(self.weights), "mode": self.mode}

    def predict(self, folder: Path, names: list[str]) -> PosePrediction:
        network = self.network
        start = time.perf_counter()
        photos = prepare_photos([folder / name for name in names], self.mode, self.resolution)
        H, W = photos.images.shape[-2:]
        log.info("VGGT on %d photos at %dx%d (%s, %s)", len(names), W, H, self.device,
                 autocast_dtype(self.device) or torch.float32)
        out = predict_prepared(network, photos.images, self.chunk)
        self.seconds["forward"] = time.perf_counter() - start
        model_K = out["intrinsics"].double().cpu().numpy()
        confidence = out["confidence"].float().cpu() * photos.valid  # 0 where the model saw padding
        colors = (photos.images.permute(0, 2, 3, 1) * 255 + 0.5).clamp(0, 255).to(torch.uint8)
        return PosePrediction(names=list(names), sizes=photos.sizes, intrinsics=photos.photo_intrinsics(model_K),
                              w2c=out["w2c"].double().cpu().numpy(), depth=out["depth"].float().cpu().numpy(),
                              confidence=confidence.numpy(), colors=colors.numpy(), depth_intrinsics=model_K)


def weights_note(weights: Path) -> str:
    """One line for the log: which weights, and their license."""
    return f"VGGT weights {weights} (license: {license_of(weights)})"



# ----------------------------------------------------------------------------------------------- choosing
def pose_method(method: str, weights: str | Path | None = None) -> tuple[str, Path | None]:
    """The method that poses photos, and VGGT's weights when it is VGGT: ``sfm``, ``vggt`` (weights required) or
    ``auto`` (VGGT when its weights are given or in the local Hugging Face cache, else structure from motion)."""
    from lift3d.data.capture import SceneFormatError
    from lift3d.data.learned_poses import POSE_METHODS
    from lift3d.generators.vggt_files import find_weights

    if method not in POSE_METHODS:
        raise SceneFormatError(f"the pose method must be one of {', '.join(POSE_METHODS)}, got {method!r}")
    if method == "sfm":
        return "sfm", None
    found = find_weights(weights) if method == "auto" else require_weights(weights)
    if found is None:
        log.info("no VGGT weights on this machine (--vggt-weights, LIFT3D_VGGT_WEIGHTS or the Hugging Face cache): "
                 "posing the photos by structure from motion")
        return "sfm", None
    log.info("%s: posing the photos with VGGT%s", weights_note(found),
             " (--method sfm: structure from motion instead)" if method == "auto" else "")
    return "vggt", found


def prepare_with_poses(path: Path, method: str = "auto", weights: str | Path | None = None, video_frames: int = 0,
                       sfm_options: Any = None, learned_options: Any = None, **predictor_options: Any) -> Path:
    """``lift3d.data.sfm.prepare_capture`` with the pose method chosen by ``pose_method``: the scene folder of a video
    or a photo folder, posed by structure from motion or by VGGT (``predictor_options`` go to ``VggtPredictor``)."""
    chosen, found = pose_method(method, weights)
    if chosen == "sfm":
        from lift3d.data.sfm import prepare_capture

        return prepare_capture(path, sfm_options, video_frames)
    from lift3d.data.learned_poses import run_learned_poses

    predictor = VggtPredictor(found, **predictor_options)
    try:
        return run_learned_poses(path, predictor, learned_options, video_frames)
    finally:
        predictor.release()
