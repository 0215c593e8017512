"""What a reconstruction system does for per-photo appearance (``lift3d.render.appearance``): size the transforms
for the training photos when the capture calls for them, and score held-out photos under the stated protocol.

A system with ``self.appearance`` (a ``PhotoAppearance``) mixes this in before ``BaseSystem``, calls
``setup_appearance(self.scene)`` from ``setup`` and applies ``self.appearance(rgb, self.appearance_index(batch))``
to its training renders before the photometric loss.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

from lift3d.data.summary import SceneSummary
from lift3d.render.appearance import PhotoAppearance, resolve_enabled

log = logging.getLogger("lift3d.systems.appearance")


def photo_index(system: Any, batch: dict[str, Any], needed: bool, warned: str, consequence: str,
                logger: logging.Logger) -> Tensor | None:
    """The training photo of each view or ray of ``batch`` (``index``), or None; when a part that is on (``needed``)
    finds none, ``logger`` warns once per system (the flag attribute ``warned``) of the ``consequence``."""
    index = batch.get("index")
    if index is None and needed and not getattr(system, warned):
        setattr(system, warned, True)
        logger.warning("training batches carry no photo index: %s", consequence)
    return index


class AppearanceHooks:
    """Mixin: per-photo appearance for a ``BaseSystem`` with an ``appearance`` part."""

    appearance: PhotoAppearance
    _val_scores: list[Tensor]
    _warned_no_index = False

    def setup_appearance(self, scene: SceneSummary | None) -> None:
        """Size the transforms for ``scene``'s training photos when ``appearance.enabled`` says so (a run without
        data, e.g. an export from a checkpoint, or without photos takes them from the checkpoint)."""
        if scene is None or scene.cameras is None:
            return
        fmt, n_photos = scene.capture_format, scene.n_photos
        if resolve_enabled(self.appearance.cfg.enabled, fmt) and not scene.batches_name_their_photos:
            log.warning("per-photo appearance is off: this data module's ray batches do not say which photo each ray "
                        "comes from (data.batch_mode=image trains with it)")
            self.appearance.resize(0)
            return
        if self.appearance.setup_for(fmt, n_photos):
            log.info("per-photo appearance on (%s capture): %d color transforms; held-out photos scored with "
                     "appearance.eval=%s", fmt or "this", n_photos, self.appearance.cfg.eval)

    def appearance_index(self, batch: dict[str, Any]) -> Tensor | None:
        """The training photo of each view or ray of ``batch`` (``index``), or None (warned once) when a batch
        with appearance on carries none."""
        return photo_index(self, batch, self.appearance.active, "_warned_no_index", "per-photo appearance is not applied", log)

    def _score(self, out: dict[str, Tensor], batch: dict[str, Any]) -> None:
        """Held-out scores under ``appearance.eval`` when appearance is on, else the plain scores."""
        gt = batch.get("rgb")
        if self.appearance.active and torch.is_tensor(gt) and gt.ndim == 4 and "rgb" in out:
            scores = self.appearance.scores(out["rgb"], gt, batch.get("loss_mask"))
            if scores is not None:
                self._val_scores.append(scores.detach())
                return
        super()._score(out, batch)  # type: ignore[misc]
