"""What a reconstruction system does for camera pose refinement (``lift3d.render.pose_refinement``): size the
corrections for the training photos when the capture calls for them, give them their own optimizer group, and
move each training view of a batch to its corrected pose before rendering.

A system with ``self.pose_refinement`` (a ``PoseCorrections``) mixes this in before ``BaseSystem``, calls
``setup_pose_refinement(self.scene, extent)`` from ``setup`` and renders training batches through
``self.pose_refinement(cameras, self.pose_index(batch))``. Validation and test views carry no training index and
are rendered at their given poses.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import Tensor

from lift3d.data.summary import SceneSummary
from lift3d.render.pose_refinement import PoseCorrections
from lift3d.systems.appearance import photo_index

log = logging.getLogger("lift3d.systems.pose_refinement")


class PoseRefinementHooks:
    """Mixin: per-photo pose corrections for a ``BaseSystem`` with a ``pose_refinement`` part."""

    pose_refinement: PoseCorrections
    _warned_no_pose_index = False

    def setup_pose_refinement(self, scene: SceneSummary | None, extent: float) -> None:
        """Size the corrections for ``scene``'s training photos in a scene of ``extent`` when
        ``pose_refinement.enabled`` says so (a run without data, or without photos, takes them from the checkpoint)."""
        if scene is None or scene.cameras is None:
            return
        fmt = scene.capture_format
        if self.pose_refinement.setup_for(fmt, scene.n_photos, extent):
            log.info("camera pose refinement on (%s capture): %d training poses refined (lr %s); held-out photos keep "
                     "their given poses", fmt or "this", scene.n_photos, self.pose_refinement.cfg.lr)

    def configure_optimizers(self) -> Any:
        """The system's optimizer with the corrections in their own group (``pose_refinement.lr`` and
        ``weight_decay``), unless ``optimizer.params`` names ``pose_refinement`` itself."""
        optimizer_cfg = self.cfg.optimizer  # type: ignore[attr-defined]
        group = self.pose_refinement.param_group()
        if not group["params"] or "pose_refinement" in optimizer_cfg.params:
            return super().configure_optimizers()  # type: ignore[misc]
        options = {k: v for k, v in group.items() if k not in ("params", "name")}
        named = dict(optimizer_cfg.params)
        optimizer_cfg.params = {**named, "pose_refinement": options}
        try:
            return super().configure_optimizers()  # type: ignore[misc]
        finally:
            optimizer_cfg.params = named

    def pose_index(self, batch: dict[str, Any]) -> Tensor | None:
        """The training photo of each view of ``batch`` (``index``), or None (warned once) when a training batch
        with refinement on carries none."""
        return photo_index(self, batch, self.pose_refinement.active, "_warned_no_pose_index", "camera poses are not refined",
                           log)

    def log_pose_corrections(self) -> None:
        """The mean rotation (degrees) and shift (scene extents) of the corrections so far, on logging steps."""
        if not self.pose_refinement.active or not self._is_logging_step():  # type: ignore[attr-defined]
            return
        delta = self.pose_refinement.delta.detach()
        self.log_step("train/pose_rotation_deg", delta[:, 3:].norm(dim=-1).mean() * 57.29577951308232)  # type: ignore[attr-defined]
        self.log_step("train/pose_shift", delta[:, :3].norm(dim=-1).mean())  # type: ignore[attr-defined]

