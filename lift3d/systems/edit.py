"""Recipes ``edit-gaussians`` and ``edit-nerf``: edit a finished reconstruction with a text instruction
(Instruct-NeRF2NeRF; Instruct-GS2GS for Gaussians).

The run starts from the reconstruction's checkpoint (``system.geometry_convert_from``) and keeps training
on its own photos, while every ``edit_every`` steps an editor (``instruct-pix2pix``, or the offline
``analytic-edit``) re-edits the next training view from the current render, conditioned on that view's
original photo; the edited image replaces the view's target in the data module's store (the scene summary's
``edit_targets``: ``PosedImagesDataModule.editable_targets``). One mechanism serves both representations: the system
renders a view and writes the store; image batches (Gaussians) and ray batches (NeRF) read from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.config import ConfigError, bounded, step_count
from lift3d.data.summary import SceneSummary
from lift3d.registry import register
from lift3d.rng import step_generator
from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansConfig, ReconstructGaussiansSystem
from lift3d.systems.reconstruct_nerf import ReconstructNerfConfig, ReconstructNerfSystem
from lift3d.systems.stages import load_previous_stage, take_field, take_gaussians

log = logging.getLogger(__name__)
EDIT_STREAM = 31  # the random stream of the editor's draws (noise, timestep): the same on every DDP rank


@dataclass
class EditOptions:
    """What an editing run adds to its reconstruction recipe."""

    geometry_convert_from: str = ""  # the reconstruction's checkpoint to start from (lift3d edit sets it)
    editor_type: str = "instruct-pix2pix"  # the editor: instruct-pix2pix, or analytic-edit (offline color transform)
    editor: dict = field(default_factory=dict)  # its config (prompt, guidance scales, ...)
    edit_every: int = step_count(10)  # re-edit training views every N steps (Instruct-NeRF2NeRF's edit_rate)
    edit_count: int = bounded(1, low=1)  # views edited each time, taken in turn through the training views
    # write a photo | render | new target grid of every N-th edit into save/edits/ (0: never)
    save_edits_every: int = bounded(10, low=0)


class IterativeEditing:
    """The iterative dataset update, mixed into a reconstruction system (anything with ``render_views``)."""

    cfg: Any
    scene: SceneSummary | None  # BaseSystem's

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)  # type: ignore[call-arg]
        self._init_editing()

    def setup(self, stage: str) -> None:
        self.setup_editing(stage)  # first: the reconstruction's weights, so nothing is initialized from scratch
        super().setup(stage)  # type: ignore[misc]

    def _init_editing(self) -> None:
        self._targets: Any = None  # the data module's EditedTargets
        self._cameras: Cameras | None = None  # the training views' cameras
        self._sizes: list[tuple[int, int]] | None = None  # each photo's (width, height) when a mixed-size capture pads them
        self._background: Tensor | None = None
        self._edits_done = 0
        self._pending_edit_state: dict[str, Any] | None = None

    @property
    def editor(self) -> Any:
        """The editor, built on first use (loading its weights) and kept out of the checkpoints."""
        return self.lazy_unsaved_part("editor", self.cfg.editor_type, self.cfg.editor)

    def setup_editing(self, stage: str) -> None:
        """Before training: take the data's target store (the scene's ``edit_targets``), start from the reconstruction
        (not when resuming: the checkpoint has the weights) and build the editor so a missing model fails before step 0."""
        if stage != "fit" or self._trainer is None:
            return
        scene = self.scene
        if scene is None or scene.edit_targets is None or scene.cameras is None or scene.background is None:
            raise ConfigError(f"{self.registered_name} trains on posed photos: set data_type: posed-images")
        self._targets = scene.edit_targets()
        self._cameras, self._background = scene.cameras, scene.background
        if scene.mixed_sizes:
            self._sizes = list(scene.image_sizes)
        if self._pending_edit_state is not None:
            self._restore_edit_state(self._pending_edit_state)
        if self.cfg.geometry_convert_from and self.trainer.ckpt_path is None:
            previous_cfg, previous = load_previous_stage(self.cfg.geometry_convert_from)
            self.convert_from(previous, previous_cfg)
        self.editor  # noqa: B018  (built for its side effect)

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------------ the dataset update
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        step = self.true_global_step
        if self._targets is not None and self.cfg.edit_every > 0 and step % self.cfg.edit_every == 0:
            self.edit_views(step)

    def render_for_edit(self, cameras: Cameras, background: Tensor) -> Tensor:
        """The current render [1, H, W, 3] of a training view, as the editor sees it."""
        return self.render_views({"cameras": cameras, "background": background})["rgb"]

    @torch.no_grad()
    def edit_views(self, step: int) -> None:
        """Re-edit the next ``edit_count`` training views from their current renders into the target store."""
        editor, n = self.editor, len(self._targets)
        was_training = self.training
        self.eval()
        try:
            for _ in range(self.cfg.edit_count):
                view = self._edits_done % n
                cameras = self._cameras[view].to(self.device)
                render = self.render_for_edit(cameras, self._background[None].to(self.device)).float().clamp(0, 1)
                photo = self._targets.photo(view)[None].to(self.device)
                size = self._sizes[view] if self._sizes is not None else None
                if size is not None:  # the editor sees the photo, not the padding that makes its batch one size
                    render, photo = render[:, : size[1], : size[0]], photo[:, : size[1], : size[0]]
                generator = step_generator(torch.initial_seed() % (2**31), step * n + view, EDIT_STREAM)
                edited = editor.edit(render, photo, generator)
                self._targets.update(view, edited[0].cpu(), size)
                self._edits_done += 1
                every = self.cfg.save_edits_every
                if every > 0 and (self._edits_done - 1) % every == 0 and self.trainer.is_global_zero:
                    target = self._targets.images([view])[0]  # the edit as stored (masked photos keep their background)
                    if size is not None:
                        target = target[: size[1], : size[0]]
                    self.saver.grid(f"edits/it{step:06d}-view{view:03d}.png", [("rgb", photo[0]), ("rgb", render[0]),
                                                                             ("rgb", target)])
        finally:
            self.train(was_training)
        self.log_step("train/edits", float(self._edits_done))

    # ------------------------------------------------------------------------------ checkpoints
    def _edit_state(self) -> dict[str, Any]:
        return {"edits_done": self._edits_done, "rgb": self._targets.rgb, "edits": self._targets.edits}

    def _restore_edit_state(self, state: dict[str, Any]) -> None:
        self._edits_done = int(state["edits_done"])
        if self._targets is not None and state["rgb"].shape == self._targets.rgb.shape:
            self._targets.rgb.copy_(state["rgb"])
            self._targets.edits.copy_(state["edits"])
        self._pending_edit_state = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self._targets is not None:  # the edited views so far: a resumed run goes on from them
            checkpoint["lift3d_edit"] = self._edit_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if "lift3d_edit" in checkpoint:
            self._pending_edit_state = checkpoint["lift3d_edit"]
            if self._targets is not None:
                self._restore_edit_state(self._pending_edit_state)


@dataclass
class EditGaussiansConfig(ReconstructGaussiansConfig, EditOptions):
    """reconstruct-gaussians with an editor."""


@register("edit-gaussians")
class EditGaussiansSystem(IterativeEditing, ReconstructGaussiansSystem):
    """Instruct-GS2GS-style editing of a 3D Gaussian reconstruction."""

    Config = EditGaussiansConfig

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        theirs = take_gaussians(self, previous)
        if theirs is None:
            raise ConfigError(f"system.geometry_convert_from: a {previous_cfg.system_type} run has no Gaussians to edit; "
                              "edit-gaussians starts from a reconstruct-gaussians run")
        theirs.update_step(0, previous.true_global_step)
        self.gaussians.loaded_sh_degree = theirs.active_sh_degree  # the trained SH bands render from step 0
        log.info("editing %d Gaussians from %s", len(self.gaussians), self.cfg.geometry_convert_from)


@dataclass
class EditNerfConfig(ReconstructNerfConfig, EditOptions):
    """reconstruct-nerf with an editor."""


@register("edit-nerf")
class EditNerfSystem(IterativeEditing, ReconstructNerfSystem):
    """Instruct-NeRF2NeRF: editing a NeRF reconstruction."""

    Config = EditNerfConfig

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        """Copy every part whose parameters match in names and shapes (the field at least; the occupancy grid
        with the renderer)."""
        copied = take_field(self, previous, previous_cfg, "edit-nerf continues a reconstruct-nerf run with the same "
                            "field settings", error=ConfigError)
        log.info("editing the NeRF of %s (took %s)", self.cfg.geometry_convert_from, ", ".join(copied))

    def render_for_edit(self, cameras: Cameras, background: Tensor) -> Tensor:
        return self.renderer(cameras, background=background)["rgb"]  # no normals: the editor sees color only

    def on_fit_end(self) -> None:
        super().on_fit_end()
        self.export_at_fit_end()
