"""What a photo recipe keeps of its capture for exports (``CapturedViews``): the training views, whose rendered depths
a TSDF mesh is fused from, and the similarity the data module applied to the capture's poses, so meshes are written
back in the capture's own frame and units (COLMAP's, a phone app's) rather than in the normalized training frame."""

from __future__ import annotations

from typing import Any

import torch

from lift3d.cameras import Cameras
from lift3d.data.summary import SceneSummary
from lift3d.export import ExportSources
from lift3d.export.tsdf_sources import in_capture_frame

BUFFERS = {  # name -> its value before training (and in checkpoints written before the system kept it)
    "train_c2w": lambda: torch.zeros(0, 4, 4),
    "train_intrinsics": lambda: torch.zeros(0, 3, 3),
    "train_size": lambda: torch.zeros(2, dtype=torch.long),
    "world_from_capture": lambda: torch.eye(4, dtype=torch.float64),
}


class CapturedViews:
    """Mixin of the photo recipes (``BaseSystem`` subclasses): keeps the training views and the capture's frame in
    buffers (so checkpoints carry them to ``lift3d export``) and writes exported meshes in the capture's frame."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, empty in BUFFERS.items():
            self.register_buffer(name, empty())

    def set_scene(self, scene: SceneSummary | None) -> None:
        """Keep the training views and the similarity the data module applied to the capture's poses."""
        super().set_scene(scene)  # type: ignore[misc]
        if scene is None or scene.cameras is None:
            return
        cameras, device = scene.cameras, self.train_c2w.device
        self.train_c2w = cameras.c2w.detach().float().to(device)
        self.train_intrinsics = cameras.intrinsics.detach().float().to(device)
        self.train_size = torch.tensor([cameras.width, cameras.height], device=device)
        if scene.world_from_capture is not None:
            self.world_from_capture = scene.world_from_capture.to(torch.float64).to(device)

    def training_cameras(self) -> Cameras | None:
        """The views the run was fitted to (None for a run that has not trained)."""
        if len(self.train_c2w) == 0:
            return None
        width, height = (int(v) for v in self.train_size.tolist())
        return Cameras(self.train_c2w, self.train_intrinsics, width, height)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Size the view buffers as the checkpoint's; a checkpoint written before the system kept them loads with
        their empty values (no training views, the capture's frame taken as the training frame)."""
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
        state = checkpoint["state_dict"]
        for name, empty in BUFFERS.items():
            if name not in state:
                state[name] = empty()
            setattr(self, name, torch.zeros_like(state[name], device=getattr(self, name).device))

    def in_capture_frame(self, sources: ExportSources) -> ExportSources:
        """``sources`` whose mesh (and the color function baking it) is in the capture's frame and units."""
        return in_capture_frame(sources, self.world_from_capture.cpu().numpy())
