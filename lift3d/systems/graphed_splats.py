"""The Gaussian-splatting training step (render, loss, backward) replayed as one CUDA graph.

A 3DGS step keeps the GPU busy for less time than launching its kernels one by one from Python takes, and
gsplat reads its tile-intersection count on the host in every render, so the host cannot queue the next step
ahead. Here the render puts its intersections into fixed slots (``lift3d.render.splats.tiles``), sized from
every training view with some headroom whenever the Gaussians change (densification replaces their tensors, so the
graph is captured again then anyway), and the step is captured with ``CapturedStep``. A render that needs more
slots than there are drops its last pairs; the peak is checked every ``CHECK_EVERY`` steps (one host read) and
the slots grow at once, with a warning, when that happened.

Where the trainer would do nothing to the gradients between backward and the optimizer (no clipping, no
scheduler, no skipping of non-finite steps), Adam's step is captured too (``capturable`` groups, learning rates as
device tensors that ``apply_lr_schedules`` fills): the step is then one launch. Densification then follows the
update, as in gsplat's trainer. Lightning still calls ``optimizer.step(closure)`` every step: the optimizer's
``step`` is then wrapped (``_skip_after_replay``) to run the closure (the training step, its hooks) and return when
the replay already updated the parameters, instead of Adam's bookkeeping over parameters that have no gradients
(host time that counts where the step is bound by its host). The densification statistics of the step (where the
strategy ``captures_statistics``: 3DGS's) and the intersection peak are accumulated inside the graph too, where no
loss mask edits what counts as seen.
With ``system.optimizer.visible_adam`` that captured update is Adam on the Gaussians the step's views drew only
(``lift3d.systems.visible_adam``, gsplat's ``visible_adam``).

Under a resolution schedule (``system.resolution_schedule``, ``lift3d.gaussians.resolution_schedule``) the
step trains on the batch downscaled: a few sizes, each for a stretch of steps, each captured once (slots sized for
it). The batch is rescaled in place, so what the system reads of it after the step (the loss mask) matches the
render. Steps that are not replayed (the first, the CPU) train at full size.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import torch
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.gaussians.resolution_schedule import scaled_batch
from lift3d.render.splats.renderer import choose_backend
from lift3d.systems.captured_step import CapturedStep
from lift3d.systems.replicas import graphs_under_ddp
from lift3d.systems.visible_adam import supports as visible_adam_supports
from lift3d.systems.visible_adam import visibility, visible_adam_step

log = logging.getLogger("lift3d.systems.graphed_splats")
CHECK_EVERY = 100  # steps between reads of the intersection peak
SLOT_GRAIN = 1 << 16  # slot counts are rounded up to this, so small changes do not force a new capture
DRAWN_OPACITY = 1.0 / 255.0  # gsplat skips Gaussians below this opacity
GRAPHED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)  # optimizers whose step is captured with the graph
# the eager steps around the captured ones (Lightning's, which finds no gradients; the first step) are expected
warnings.filterwarnings("ignore", message=".*capturable=True.*step\\(\\) is running without CUDA graph capture.*")


class GraphedSplatStep:
    """The captured step of a Gaussian system with ``gaussians``, ``renderer`` (``splat-rasterizer``), ``densify`` (a
    ``Strategy``), ``scene`` (its ``SceneSummary`` or None), ``loss_terms(cameras, background, target, **options) ->
    (terms, render)`` and ``cfg.cuda_graphs`` / ``cfg.isect_headroom`` / ``cfg.resolution_schedule``."""

    def __init__(self, system: Any) -> None:
        self.system = system
        self.step: CapturedStep | None = None
        self.capacity = 0  # intersection slots of the captured render
        self.resized_after_overflow = 0  # how often a check found a render that needed more slots
        self._peak: Tensor | None = None  # the most intersections a replayed render had since the slots were sized
        self._slots_size: tuple[int, int] | None = None  # the image size the slots were sized for
        self._param_ids: tuple[int, ...] = ()
        self._size: tuple[int, int] | None = None
        self._views: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # every training view at each size
        self._off = False
        self._replayed = False
        self._updated = False  # the last replay also ran the optimizer's step
        self._rendered_eagerly = False

    # ----------------------------------------------------------------------------------- when
    def applies(self, batch: dict[str, Any]) -> bool:
        """Whether this step is replayed: gsplat on a GPU (under DDP unless LIFT3D_DDP_CUDA_GRAPHS=0), 32-bit precision, and
        batches of one size (posed photos of several sizes arrive padded to one; batches that change size would mean
        a capture per change: the step then runs eagerly). The
        first such step runs eagerly: it builds gsplat's kernels outside any capture, or finds that they cannot
        build, and the renderer then falls back to PyTorch (no capture) as it does without this option."""
        self._replayed = self._updated = False
        system = self.system
        rgb, cameras = batch.get("rgb"), batch.get("cameras")
        if self._off or not system.cfg.cuda_graphs or rgb is None or cameras is None or not rgb.is_cuda:
            return False
        if getattr(system, "sharded", False):  # a sharded render is collective: its exchange sizes change every step
            return False
        trainer = system._trainer
        if trainer is None or (trainer.world_size != 1 and not graphs_under_ddp()) or trainer.accumulate_grad_batches != 1:
            return False
        if str(trainer.precision) not in ("32-true", "32"):
            return False
        options = system.renderer.cfg
        if options.absgrad or choose_backend(options.backend, rgb.device) != "gsplat":
            return False
        size = (cameras.width, cameras.height)
        if self._size is not None and size != self._size:
            log.info("training batches change size: the training step runs kernel by kernel (no CUDA graph)")
            self._off, self.step = True, None
            return False
        self._size = size
        if not self._rendered_eagerly:
            self._rendered_eagerly = True
            return False
        return True

    # ----------------------------------------------------------------------------------- how
    def run(self, batch: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Replay the step on ``batch`` (capturing it first when the Gaussians, slots or options changed) ->
        (loss terms, render with ``means2d_grad``), the gradients waiting for ``assign_gradients``."""
        system = self.system
        schedule = system.cfg.resolution_schedule
        if schedule:
            batch.update(scaled_batch(batch, schedule, system.true_global_step))
        cameras = batch["cameras"]
        inputs = {"c2w": cameras.c2w, "intrinsics": cameras.intrinsics, "viewmats": cameras.w2c_opencv(),
                  "rgb": batch["rgb"]}
        if batch.get("background") is not None:
            inputs["background"] = batch["background"]
        if batch.get("loss_mask") is not None:  # padding of photos of several sizes, ignored pixels
            inputs["loss_mask"] = batch["loss_mask"]
        per_photo = [getattr(getattr(system, part, None), "active", False) for part in ("appearance", "pose_refinement")]
        if any(per_photo):  # per-photo appearance or pose corrections: the batch's photos
            inputs["index"] = batch["index"]
        params = [p for p in system.parameters() if p.requires_grad]
        ids = tuple(id(p) for p in params)
        if self.step is None:
            self.step = CapturedStep(params, hint="set system.cuda_graphs=false to train with the step launched "
                                     "kernel by kernel", rewarm_steps=1)
        elif ids != self._param_ids:
            self.step.set_params(params)
        width, height = cameras.width, cameras.height
        resized = (width, height) != self._slots_size
        if ids != self._param_ids or resized or system.true_global_step % CHECK_EVERY == 0:
            peak = 0 if resized else self._overflow()
            if ids != self._param_ids or resized or peak:
                self._size_slots(cameras, at_least=peak)
        self._param_ids = ids
        capacity = self.capacity
        drawn: dict[str, Tensor] = {}  # the captured render, for what follows the backward pass
        densify = system.densify
        stats = "loss_mask" not in inputs and densify.captures_statistics(system.true_global_step)
        statistics = densify.prepare_stats(len(system.gaussians), cameras.device) if stats else ()

        def compute(static: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            views = Cameras(static["c2w"], static["intrinsics"], width, height, static["viewmats"])
            photos = {"index": static["index"]} if "index" in static else {}
            terms, out = system.loss_terms(views, static.get("background"), static["rgb"], static.get("loss_mask"),
                                           isect_capacity=capacity, **photos)
            kept = {k: out[k] for k in ("rgb", "radii", "means2d", "isect_count")}
            drawn.update(kept)
            return system.weighted_sum(terms), {**{f"term:{k}": v for k, v in terms.items()}, **kept}

        weights = tuple((name, system.loss_weight(name)) for name in ("l1", "ssim"))
        optimizer = self._graphed_optimizer(params)
        state = () if optimizer is None else _state_pointers(optimizer, params)
        visible_only = optimizer is not None and self.visible_adam and visible_adam_supports(optimizer)
        peak = self._peak

        def update() -> None:  # after the backward pass, inside the graph
            torch.maximum(peak, drawn["isect_count"], out=peak)
            if stats:  # the render's means2d gradient, as the strategy's update reads it eagerly
                densify.update({"rgb": drawn["rgb"], "radii": drawn["radii"], "means2d": drawn["means2d"],
                                "means2d_grad": drawn["means2d"].grad})
            if visible_only:
                visible_adam_step(optimizer, visibility(drawn["radii"]))
            elif optimizer is not None:
                optimizer.step()

        buffers = (peak.data_ptr(),) + tuple(t.data_ptr() for t in statistics)
        key = (capacity, system.gaussians.active_sh_degree, weights, width, height, state, visible_only, buffers)
        outputs = self.step.run(key, inputs, compute, update=update)
        self._replayed, self._updated = True, optimizer is not None
        terms = {k[len("term:"):]: v for k, v in outputs.items() if k.startswith("term:")}
        out = {k: outputs[k] for k in ("rgb", "radii", "means2d")}
        if not stats:  # else the replay has added it to the statistics already (and the outputs carry no gradient)
            out["means2d_grad"] = outputs["grad:means2d"]
        return terms, out

    def assign_gradients(self) -> bool:
        """After a replayed step: give the parameters its gradients, or none when the replay already used them to
        update the parameters (True); else False (backward runs as usual)."""
        if not self._replayed or self.step is None:
            return False
        if not self._updated:
            self.step.assign_gradients()
        return True

    # ----------------------------------------------------------------------------------- optimizer
    def _graphed_optimizer(self, params: list[Tensor]) -> torch.optim.Optimizer | None:
        """The optimizer to capture with the step, made capturable (learning rates as device tensors), or None
        when the trainer acts between backward and its step, or it has not yet stepped every parameter on the
        parameter's device (fused Adam keeps its step counts there; the unfused one, on the host, cannot be captured)."""
        system = self.system
        trainer = system.trainer
        optimizers = system._all_optimizers()
        if len(optimizers) != 1 or trainer.lr_scheduler_configs or trainer.gradient_clip_val:
            return None
        if getattr(trainer, "world_size", 1) > 1:  # DDP: the gradients are averaged over the ranks between backward and the step
            return None
        optimizer = optimizers[0]
        if not isinstance(optimizer, GRAPHED_OPTIMIZERS) or system.cfg.nonfinite_loss == "skip":
            return None
        # e.g. MCMC's regularizers join the gradients after backward
        if system.densify.edits_gradients:
            return None
        if any(group.get("differentiable") for group in optimizer.param_groups):
            return None
        grouped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        # an empty parameter (per-photo appearance while it is off: no photos) never gets a gradient or Adam's state,
        # and has nothing to update
        if any(id(p) not in grouped or not _steps_on_device(optimizer.state.get(p, {}), p) for p in params if p.numel()):
            return None
        for group in optimizer.param_groups:
            group["capturable"] = True
            if not torch.is_tensor(group["lr"]):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=params[0].device)
        if not getattr(optimizer.step, "skips_after_replay", False):
            optimizer.step = _skip_after_replay(optimizer, self)
        return optimizer

    @property
    def visible_adam(self) -> bool:
        """Whether a captured Adam update skips the Gaussians outside the step's views (``system.optimizer.visible_adam``)."""
        return bool(getattr(getattr(self.system.cfg, "optimizer", None), "visible_adam", False))

    @property
    def optimizer_captured(self) -> bool:
        """Whether the last replay also ran the optimizer's step."""
        return self._updated

    @property
    def captures(self) -> int:
        return 0 if self.step is None else self.step.captures

    # ----------------------------------------------------------------------------------- slots
    def _training_views(self, cameras: Cameras) -> tuple[Tensor, Tensor]:
        """World-to-camera matrices and intrinsics of every training view on the GPU at the batch's size (the
        training set's photos downscaled alike, under a resolution schedule); the batch's views when the system's scene
        has no training cameras or its photos have another shape."""
        size = (cameras.width, cameras.height)
        if size not in self._views:
            scene = self.system.scene
            every = scene.cameras if scene is not None else None
            if every is None or abs(every.width * cameras.height - every.height * cameras.width) > \
                    max(every.width, every.height):
                return cameras.w2c_opencv(), cameras.intrinsics
            every = every.to(cameras.device)
            if (every.width, every.height) != size:
                every = every.resized(*size)
            self._views[size] = (every.w2c_opencv(), every.intrinsics)
        return self._views[size]

    def _size_slots(self, cameras: Cameras, at_least: int = 0) -> None:
        """Slots for the current Gaussians: ``isect_headroom`` x the most any training view needs, or than
        ``at_least`` (one host read)."""
        from lift3d.render.splats.gsplat_backend import view_intersections

        system, options = self.system, self.system.renderer.cfg
        g = system.gaussians
        viewmats, intrinsics = self._training_views(cameras)
        # every Gaussian that can be drawn at its largest footprint (gsplat's shrinks with the opacity, and an opacity
        # reset would otherwise size the slots for footprints that grow back within a hundred steps)
        opacities = g.opacities.detach()
        largest = torch.where(opacities >= DRAWN_OPACITY, torch.ones_like(opacities), opacities)
        counts = view_intersections(g.means, g.quats, g.scales, largest, viewmats, intrinsics, cameras.width,
                                    cameras.height, near_plane=options.near_plane, far_plane=options.far_plane,
                                    eps2d=options.eps2d)
        # a batch of B views renders into one set of slots: the B views that need the most
        most = max(int(counts.topk(min(len(cameras), len(counts))).values.sum()) if len(counts) else 0, at_least)
        self.capacity = max(math.ceil(most * system.cfg.isect_headroom / SLOT_GRAIN), 1) * SLOT_GRAIN
        self._slots_size = (cameras.width, cameras.height)
        self._peak = torch.zeros((), dtype=torch.int64, device=cameras.device)

    def _overflow(self) -> int:
        """The peak intersection count since the slots were sized when it exceeded them (warned), else 0."""
        if self._peak is None:
            return 0
        peak = int(self._peak)
        if peak <= self.capacity:
            return 0
        self.resized_after_overflow += 1
        log.warning("step %d: a render needed %d tile intersections, %d slots held them (the rest were dropped from "
                    "that render); more slots from now on (system.isect_headroom sets the margin)",
                    self.system.true_global_step, peak, self.capacity)
        return peak


def _skip_after_replay(optimizer: torch.optim.Optimizer, graphs: GraphedSplatStep) -> Any:
    """``optimizer.step`` for this instance: run the closure (Lightning's training step, backward and hooks) and, when
    that step's replay already updated the parameters, return its loss without the optimizer's own pass; otherwise
    the optimizer's step as usual (on the gradients the closure left)."""
    original = optimizer.step

    def step(closure: Any = None) -> Any:
        if closure is None:
            return original()
        with torch.enable_grad():
            loss = closure()
        if graphs.optimizer_captured:
            return loss
        original()
        return loss

    step.skips_after_replay = True  # type: ignore[attr-defined]
    return step


def _state_pointers(optimizer: torch.optim.Optimizer, params: list[Tensor]) -> tuple[int, ...]:
    """Where the optimizer's state and learning rates live: a captured step reads and writes these addresses."""
    state = [t.data_ptr() for p in params for t in optimizer.state[p].values() if torch.is_tensor(t)]
    return tuple(state + [group["lr"].data_ptr() for group in optimizer.param_groups])


def _steps_on_device(state: dict[str, Any], param: Tensor) -> bool:
    """Adam has stepped ``param`` and counts its steps on ``param``'s device, as a captured update needs."""
    step = state.get("step")
    return "exp_avg" in state and torch.is_tensor(step) and step.device == param.device
