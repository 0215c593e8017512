"""Gaussians sharded over the GPUs (``system.shard_gaussians``): scenes bigger than one GPU.

Each rank owns a contiguous shard of the Gaussians with their optimizer state and densification statistics
(``shard_rows``), renders its own views through the all-to-all exchange of the projected Gaussians each view needs
(``rasterize(..., distributed=True)``: gsplat's on CUDA, ``render.splats.distributed`` on the CPU), and densifies its
own shard (``Strategy.sharded``: statistics of its own Gaussians, splits drawn as one model would, the Gaussian budget
counted over every shard). The shards are evened out after densification, checkpoints hold the whole model (gathered
to rank 0 as it writes; a resumed run slices it for however many ranks it has), and when training ends rank 0 takes
the whole model back, so evaluation, test renders and exports run as for one GPU and write one file.

Before the model moves to its GPUs, the run estimates each GPU's memory (``gaussian_memory``): ``auto`` shards when a
whole copy would not fit, and a layout that would not fit either way stops with one line naming the ways out.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import Tensor

from lift3d.distributed import all_gather_rows, gather_to_zero, max_over_ranks
from lift3d.gaussians.model import PARAMETER_NAMES
from lift3d.systems.gaussian_memory import check_fits, device_budget, estimate
from lift3d.systems.shard_rows import gather_checkpoint, keep_shard, rebalance, slice_checkpoint

log = logging.getLogger("lift3d")
SHARD_MODES = ("auto", "true", "false")  # system.shard_gaussians


def checkpoint_count(path: str | None) -> int:
    """How many Gaussians a checkpoint holds (0: none given), read without loading the rest."""
    if not path:
        return 0
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["state_dict"]
        return len(weights.get("gaussians.means", ()))
    except Exception:  # noqa: BLE001  (the restore reports a bad checkpoint in its own words)
        return 0


class ShardedGaussians:
    """Mixin of the Gaussian systems (through ``ReplicatedGaussians``): shards the Gaussians when asked or needed and
    keeps the shards working through training, checkpoints and evaluation. Needs ``gaussians``, ``renderer``,
    ``densify`` and ``cfg.shard_gaussians``."""

    sharded = False
    training_layout: tuple[int, int, int] = (1, 0, 0)  # views a step on each rank, their width and height (the runner's)

    def set_training_layout(self, views: int, width: int, height: int) -> None:
        """What each rank renders a step (the runner's, from the data config): the memory estimate's renders."""
        self.training_layout = (max(int(views), 1), int(width), int(height))

    # ----------------------------------------------------------------------------------- before the model moves
    def configure_model(self) -> None:
        """Before training, with the model still on the CPU: estimate each GPU's memory, shard when asked (or when a
        whole copy would not fit), and stop with one line when the layout cannot fit."""
        super().configure_model()
        trainer = self._trainer
        if trainer is None or self.sharded or trainer.state.fn != "fit":
            return
        ranks, device = trainer.world_size, trainer.strategy.root_device
        count = len(self.gaussians) or checkpoint_count(trainer.ckpt_path)
        cap = int(getattr(self.densify.cfg, "max_gaussians", 0) or 0)
        peak, sh_degree = max(count, cap), self.gaussians.cfg.sh_degree
        views, width, height = self._layout()
        own = self.memory_budget(device)
        budget = -max_over_ranks(-(own if own is not None else math.inf))  # the smallest over the ranks (inf: none)
        budget = None if math.isinf(budget) else int(budget)
        mode = str(self.cfg.shard_gaussians).strip().lower()
        whole = estimate(peak, sh_degree, views, width, height, ranks)
        shard = mode == "true" or (mode == "auto" and budget is not None and whole.total > budget)
        if shard and ranks == 1:
            log.info("system.shard_gaussians=%s: one process holds every Gaussian (sharding needs several GPUs)", mode)
            shard = False
        need = estimate(peak, sh_degree, views, width, height, ranks, sharded=shard) if shard else whole
        cap_key = "system.densify.max_gaussians"
        check_fits(need, budget, device, ranks, shard, sh_degree, cap_key, peak)
        if shard:
            self.start_sharding(trainer.global_rank, ranks)

    def memory_budget(self, device: torch.device) -> int | None:
        """The bytes this rank may use on ``device`` (None: unchecked, e.g. the CPU)."""
        return device_budget(device)

    def _layout(self) -> tuple[int, int, int]:
        views, width, height = self.training_layout
        scene = getattr(self, "scene", None)
        if (not width or not height) and scene is not None and scene.cameras is not None:
            width, height = scene.cameras.width, scene.cameras.height
        return views, width or 512, height or 512

    def start_sharding(self, index: int, ranks: int) -> None:
        """Keep shard ``index`` of ``ranks`` of the Gaussians (all of them on a resume: the checkpoint is sliced as it
        loads) and switch rendering, densification and DDP's start-up broadcast to shards."""
        self._refuse_with_shards(self.trainer.callbacks)
        total = len(self.gaussians)
        if total:
            keep_shard(self.gaussians, index, ranks)
        self.sharded, self.renderer.distributed, self.densify.sharded = True, True, True
        self._ddp_params_and_buffers_to_ignore = [f"gaussians.{name}" for name in PARAMETER_NAMES]
        c = self.densify.cfg
        if hasattr(c, "grow_rate"):  # MCMC: its budget and its mean-over-Gaussians regularizers per shard
            c.max_gaussians = math.ceil(c.max_gaussians / ranks)
            c.opacity_reg, c.scale_reg = c.opacity_reg / ranks, c.scale_reg / ranks
        if index == 0:
            log.info("the Gaussians are sharded over %d ranks (system.shard_gaussians=%s)%s", ranks,
                     self.cfg.shard_gaussians, f": about {math.ceil(total / ranks)} each" if total else "")

    def check_launch(self, ranks: int, callbacks: list[Any]) -> None:
        """Refuse sharding asked for outright (``system.shard_gaussians=true``) with a part of the run it cannot serve,
        in the launching process, before the other ranks start (``auto`` decides later, in ``configure_model``)."""
        if ranks > 1 and str(self.cfg.shard_gaussians).strip().lower() == "true":
            self._refuse_with_shards(callbacks)

    def _refuse_with_shards(self, callbacks: list[Any]) -> None:
        refused = self.refused_with_shards(callbacks)
        if refused:
            from lift3d.config import ConfigError

            raise ConfigError(f"{refused} does not go with sharded Gaussians: set system.shard_gaussians=false")

    def refused_with_shards(self, callbacks: list[Any]) -> str | None:
        """What of this run (with the trainer's ``callbacks``) cannot work with sharded Gaussians (None: nothing):
        every render is then collective, so a render by one rank alone would wait forever."""
        if self.densify.needs_absgrad:
            return "system.densify.absgrad=true (gsplat's distributed rendering has no absolute gradients)"
        if hasattr(self, "edit_views"):
            return "lift3d edit (its dataset update renders training views outside the collective step)"
        if any(type(callback).__name__ == "ViewerCallback" for callback in callbacks):
            return "the live viewer (--viewer: it renders on the first GPU alone)"
        return None

    # ----------------------------------------------------------------------------------- training
    def shard_gradients(self, parameters: list[Tensor]) -> list[Tensor]:
        """The parameters whose gradients are averaged over the ranks: sharded Gaussians' gradients are already the sums
        over every rank's views (the exchange sends them home), so they are divided by the ranks here instead."""
        if not self.sharded:
            return parameters
        own = {id(p) for p in self.gaussians.parameters()}
        ranks = self.trainer.world_size
        for p in parameters:
            if id(p) in own and p.grad is not None:
                p.grad.div_(ranks)
        return [p for p in parameters if id(p) not in own]

    def all_views(self, values: Tensor) -> Tensor:
        """Per-view rows of every rank's views, in rank order (the cameras a shard's statistics come from)."""
        return all_gather_rows(values) if self.sharded else values

    def even_out_shards(self, step: int) -> None:
        """After densification (every ``refine_every`` steps, the same steps on every rank): move Gaussians from the
        largest shards to the smallest, with their optimizer state and statistics."""
        every = getattr(self.densify.cfg, "refine_every", 0)
        if not self.sharded or not every or step % every:
            return
        optimizers = self._all_optimizers()
        names = [name for name in ("grad2d", "count") if getattr(self.densify, name, None) is not None]
        present = max_over_ranks(len(names))
        statistics = [getattr(self.densify, n) for n in ("grad2d", "count")] if present else []
        if present and len(names) < 2:
            statistics = list(self.densify.prepare_stats(len(self.gaussians), self.gaussians.means.device))
        moved, statistics = rebalance(self.gaussians, optimizers[0] if optimizers else None, statistics)
        if moved and statistics:
            self.densify.grad2d, self.densify.count = statistics
        if moved and self.trainer.is_global_zero:
            log.debug("step %d: %d Gaussians moved between shards", step, moved)

    # ----------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.sharded:
            optimizers = self._all_optimizers()
            gather_checkpoint(checkpoint, self.gaussians, optimizers[0] if optimizers else None,
                              statistics=checkpoint.get("part:densify"))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.sharded and self._trainer is not None:
            slice_checkpoint(checkpoint, self.trainer.global_rank, self.trainer.world_size,
                             statistics=checkpoint.get("part:densify"))
        super().on_load_checkpoint(checkpoint)

    # ----------------------------------------------------------------------------------- after training
    def on_fit_end(self) -> None:
        """Rank 0 takes the whole model back (evaluation, test renders and exports as on one GPU); the others let
        theirs go."""
        if self.sharded:
            self.unshard()
        super().on_fit_end()

    def unshard(self) -> None:
        g = self.gaussians
        device = g.means.device
        whole = {name: gather_to_zero(p) for name, p in g.parameters_dict().items()}
        # the Gaussians stay out of Lightning's start-up broadcast (a validate after fit syncs module states from rank 0):
        # rank 0 holds the whole model now and the others none
        self.sharded, self.renderer.distributed, self.densify.sharded = False, False, False
        if self.trainer.is_global_zero:
            g.set_parameters({name: values.to(device) for name, values in whole.items()})
            log.info("training ended: the %d Gaussians of every shard are back on %s", len(g), device)
        else:
            g.set_parameters({name: values.to(device) for name, values in g.empty_parameters(0).items()})

    def _evaluate(self, batch: dict[str, Any], batch_idx: int, split: str) -> dict[int, Tensor]:
        """Sharded: every rank renders rank 0's evaluation views with it (each view needs every shard), rank 0 keeps them."""
        if self.sharded and not self.trainer.is_global_zero:
            self.render_views(batch)
            return {}
        return super()._evaluate(batch, batch_idx, split)
