"""The four ways a posed-images data module builds a training batch: whole images or rays, each from the host
(the loader draws them) or from copies resident on the training device (``lift3d.data.resident``); and the
edited targets an editing run trains on instead of the photos.

Every path draws the same views, pixels and backgrounds for a step (its generator), so a run's batches do not
depend on where they were built.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from lift3d.cameras import Cameras
from lift3d.data.base import step_loader
from lift3d.data.capture import SceneFormatError
from lift3d.data.edited_targets import EditedTargets
from lift3d.data.resident import KeptPixels, ResidentImages, ResidentRays, fits_on_device
from lift3d.data.scene import PosedScene
from lift3d.rng import step_generator


class TrainingBatches:
    """Training batches of a posed-images data module (mixed into ``PosedImagesDataModule``, which sets the
    attributes below and provides ``cfg``, ``background``, ``trainer``, ``base_seed``, ``start_step``, ``max_steps``)."""

    cfg: Any
    train: PosedScene
    background: Tensor
    targets: EditedTargets | None  # set by editable_targets(): training colors then come from it
    _rays: tuple[Tensor, Tensor] | None  # every training pixel's ray, made on first use (host ray batches)
    _kept_pixels: KeptPixels | None  # the pixels a ray batch may draw (None: every pixel): not padding, not ignored
    _resident: ResidentImages | ResidentRays | None  # the photos on the training device (images_on_device)
    _shared_seed: int = 0  # the run's seed on every rank, for the step's one order of the photos under DDP

    def editable_targets(self) -> EditedTargets:
        """The store of training targets an editing run rewrites (created on first call from the photos on the
        training background); from then on every training batch reads its colors from it."""
        if self.targets is None:
            if self.cfg.random_background:
                raise SceneFormatError("editing a reconstruction needs a fixed training background (edited views are "
                                       "composited images): set data.random_background=false")
            self.targets = EditedTargets(*self._composite(self.train.rgba, self.background), self.background)
        return self.targets

    def _composite(self, rgba: Tensor, background: Tensor) -> tuple[Tensor, Tensor]:
        rgba = rgba.float() / 255.0
        alpha = rgba[..., 3:4]
        return rgba[..., :3] * alpha + background * (1 - alpha), alpha

    def _background_for(self, n: int, generator: torch.Generator) -> Tensor:
        if self.cfg.random_background:
            return torch.rand(n, 3, generator=generator)
        return self.background.expand(n, 3).clone()

    def _sample_images(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        """A whole-image training batch: cameras, ``rgb`` on its background, ``alpha``, ``background``, ``index``."""
        return self.finish_image_batch(self._pick_images(step, generator))

    def _pick(self, step: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The training views of ``step`` and their background colors: what every image batch is built from.

        Under DDP every rank draws the step's one shuffled order of the photos (the run's seed, not the rank's) and
        takes its own ``batch_size`` of it, so no photo is drawn twice in a step while there are enough of them, and
        the ranks together see what one process with ``ranks x batch_size`` views a step sees."""
        rank, ranks = self._rank_and_ranks()
        per_rank = self.cfg.batch_size
        if ranks == 1:
            index = torch.randperm(len(self.train), generator=generator)[:per_rank]
            return index, self._background_for(len(index), generator)
        shared = step_generator(self._shared_seed, step)
        order = torch.randperm(len(self.train), generator=shared)
        mine = torch.arange(rank * per_rank, (rank + 1) * per_rank)
        everyone = min(ranks * per_rank, len(self.train))
        return order[mine % len(order)], self._background_for(everyone, shared)[mine % everyone]

    def _rank_and_ranks(self) -> tuple[int, int]:
        """This process's rank and the number of ranks (0, 1 outside DDP)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _pick_images(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        """What the loader yields for an image batch: the photos as stored (uint8 RGBA, and the edited targets when
        there are any), composited only after the copy to the device (``on_after_batch_transfer``). A quarter of the
        bytes to copy, and no per-step float work on the host, which feeds the GPU one step at a time."""
        index, background = self._pick(step, generator)
        batch = {"cameras": self.train.cameras[index], "rgba": self.train.rgba[index],
                 "background": background, "index": index, "step": step}
        if self.train.keep is not None:
            batch["keep"] = self.train.keep[index]
        if self.targets is not None:
            batch["target_rgb"] = self.targets.rgb[index]
        return batch

    def finish_image_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``_pick_images``'s batch with ``rgb`` [B, H, W, 3] and ``alpha`` [B, H, W, 1] in 0..1 in place of the
        stored bytes (and ``loss_mask`` [B, H, W, 1] in place of the kept pixels), on whatever device the batch is on
        (other batches pass through)."""
        if "keep" in batch:
            batch = dict(batch)
            batch["loss_mask"] = batch.pop("keep")[..., None].float()
        if "rgba" not in batch:
            return batch
        batch = dict(batch)
        rgba, target = batch.pop("rgba"), batch.pop("target_rgb", None)
        rgb, alpha = self._composite(rgba, batch["background"][:, None, None, :])
        if target is not None:
            rgb = target.float() / 255.0
        return {**batch, "rgb": rgb, "alpha": alpha}

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Lightning's hook after the copy to the device: build a resident batch from its step, or composite the
        copied photos there."""
        if isinstance(batch, dict) and self._resident is not None and batch.keys() == {"step"}:
            if isinstance(self._resident, ResidentRays):
                return self._resident_rays(batch["step"])
            return self.finish_image_batch(self._resident_batch(batch["step"]))
        return self.finish_image_batch(batch) if isinstance(batch, dict) else batch

    def _training_device(self) -> torch.device | None:
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else None

    def _use_resident_images(self, device: torch.device | None) -> bool:
        """Whether batches are built on the training device from resident photos (images_on_device); with "auto",
        on CUDA where the photos (and, for ray batches, every pixel's ray) fit in a quarter of its memory."""
        mode = self.cfg.images_on_device
        if mode == "never" or device is None or (mode == "auto" and device.type != "cuda"):
            return False
        per_pixel = ResidentRays.BYTES_PER_PIXEL if self.cfg.batch_mode == "rays" else 4
        return mode == "always" or fits_on_device(self.train.rgba[..., 0].numel() * per_pixel, device)

    def _resident_batch(self, step: int) -> dict[str, Any]:
        """The image batch of ``step`` gathered on the device from the resident photos: the same views and
        backgrounds as the loader's host batches (``_pick`` with the step's generator), with no copy per step."""
        r = self._resident
        assert isinstance(r, ResidentImages)
        index, background = r.pick(step)
        batch = {"cameras": Cameras(r.c2w.index_select(0, index), r.intrinsics.index_select(0, index),
                                    self.train.cameras.width, self.train.cameras.height, r.viewmats.index_select(0, index)),
                 "background": background, "index": index, "step": step}
        if self.targets is not None:  # an editing run rewrites these on the host: copied per step
            batch["target_rgb"] = self.targets.rgb[index.cpu()].to(r.rgba.device)
        if r.keep is not None:
            batch["keep"] = r.keep.index_select(0, index)
        if r.composited is not None and self.targets is None:
            rgb, alpha = r.composited
            return self.finish_image_batch({**batch, "rgb": rgb.index_select(0, index), "alpha": alpha.index_select(0, index)})
        return {**batch, "rgba": r.rgba.index_select(0, index)}

    def _all_rays(self) -> tuple[Tensor, Tensor]:
        if self._rays is None:
            origins, directions = self.train.cameras.rays()
            self._rays = (origins.reshape(-1, 3).contiguous(), directions.reshape(-1, 3).contiguous())
        return self._rays

    def _pick_rays(self, step: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The training pixels of ``step`` (flat indices into every photo's pixels, drawn among the kept ones: never
        padding or ignored pixels) and their background color [1, 3]: what every ray batch is built from."""
        kept = self._kept_pixels
        pick = torch.randint(0, self.train.rgba[..., 0].numel() if kept is None else len(kept), (self.cfg.rays_per_batch,),
                             generator=generator)
        return (pick if kept is None else kept.flat(pick)), self._background_for(1, generator)

    def _sample_rays(self, step: int, generator: torch.Generator) -> dict[str, Any]:
        origins, directions = self._all_rays()
        pick, background = self._pick_rays(step, generator)
        # a real [N, 3] tensor, not an expanded view: the loader pins batches on CUDA, which refuses overlapping memory
        background = background.expand(len(pick), 3).contiguous()
        rgb, alpha = self._composite(self.train.rgba.reshape(-1, 4)[pick], background)
        if self.targets is not None:
            rgb = self.targets.pixels(pick)
        return {"rays_o": origins[pick], "rays_d": directions[pick], "rgb": rgb, "alpha": alpha, "background": background,
                "index": self._photo_of(pick), "step": step}

    def _photo_of(self, pick: Tensor) -> Tensor:
        """The training photo [N] of each flat pixel index ``pick`` [N] (every photo spans the padded H x W)."""
        height, width = self.train.rgba.shape[1:3]
        return torch.div(pick, height * width, rounding_mode="floor")

    def _resident_rays(self, step: int) -> dict[str, Any]:
        """The ray batch of ``step`` gathered on the device from the resident rays and colors: the same pixels,
        background and values as the loader's host batches (``_sample_rays``), with no copy per step."""
        r = self._resident
        assert isinstance(r, ResidentRays)
        pick, background = r.pick(step)
        background = background.expand(len(pick), 3)
        rgb, alpha = self._composite(r.rgba.index_select(0, pick), background)
        if self.targets is not None:  # an editing run rewrites these on the host: copied per step
            rgb = self.targets.pixels(pick.cpu()).to(rgb.device)
        return {"rays_o": r.origins.index_select(0, pick), "rays_d": r.directions.index_select(0, pick), "rgb": rgb,
                "alpha": alpha, "background": background, "index": self._photo_of(pick), "step": step}

    def train_dataloader(self) -> DataLoader:
        # the run's seed, the same on every rank (the runner seeds rank r with seed + r); read once, here: a resume
        # later restores rank 0's checkpointed generators
        self._shared_seed = self.base_seed - self._rank_and_ranks()[0]
        device = self._training_device()
        if self._use_resident_images(device):
            assert device is not None
            if self.cfg.batch_mode == "rays":
                self._resident = ResidentRays(*self._all_rays(), self.train.rgba, device, self._pick_rays, self.base_seed)
                self._rays = None  # the device holds every ray now: no host copy kept
            else:
                fixed = None if self.cfg.random_background else self.background
                self._resident = ResidentImages(self.train, device, self._pick, self.base_seed, self._composite, fixed)
            return step_loader(lambda step, generator: {"step": step}, self.base_seed, self.start_step(), self.max_steps())
        self._resident = None
        sample = self._pick_images if self.cfg.batch_mode == "image" else self._sample_rays
        return step_loader(sample, self.base_seed, self.start_step(), self.max_steps())
