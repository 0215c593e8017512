"""A test-only system for DDP runs: the fit-image system that records, per rank, what it saw and wrote."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lift3d.registry import find, register
from lift3d.saving import OutputSaver

FitImageSystem = find("test-fit-image")  # imported before this plugin (see tests/configs/fit-image-ddp.yaml)


@dataclass
class DDPProbeConfig(FitImageSystem.Config):
    probe_dir: str = ""  # where each rank writes rank<r>.json (outside the run folder)
    test_video: str = "mp4"  # the test video's format: mp4 (needs imageio-ffmpeg) or gif (Pillow only: a machine without ffmpeg)


class RecordingSaver(OutputSaver):
    """An OutputSaver that notes the name of every file it writes, for the probe."""

    written: list[str] = []
    video_suffix = ".mp4"

    def path(self, name: str) -> Path:
        RecordingSaver.written.append(name)
        return super().path(name)

    def video(self, name: str, frames: list, fps: int = 30) -> Path:
        """The test video in the probe's format (``system.test_video``) whatever name the system gives it."""
        return super().video(str(Path(name).with_suffix(self.video_suffix)), frames, fps)


@register("test-ddp-probe")
class DDPProbeSystem(FitImageSystem):
    Config = DDPProbeConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.seen: list[dict[str, Any]] = []

    @property
    def saver(self) -> OutputSaver:
        saver = RecordingSaver(self._save_dir)
        saver.video_suffix = f".{self.cfg.test_video}"
        return saver

    def training_step(self, batch: dict[str, Any], batch_idx: int):
        position = batch["cameras"].c2w[0, :3, 3]
        self.seen.append({"step": int(self.global_step), "view": [round(float(v), 6) for v in position]})
        return super().training_step(batch, batch_idx)

    def on_train_end(self) -> None:
        rank = self.trainer.global_rank
        params = torch.cat([p.detach().reshape(-1) for p in self.parameters()]).double()
        record = {"rank": rank, "world_size": self.trainer.world_size, "pid": os.getpid(), "seen": self.seen,
                  "param_sum": float(params.sum()), "param_abs_sum": float(params.abs().sum()),
                  "written": RecordingSaver.written}
        Path(self.cfg.probe_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.cfg.probe_dir) / f"rank{rank}.json").write_text(json.dumps(record))
