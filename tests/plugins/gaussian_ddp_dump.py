"""Test-only Gaussian systems for DDP runs: each rank dumps its Gaussians, optimizer state and densification
events when training ends, so a test can compare the ranks bit for bit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lift3d.registry import find, register


def dumping(base: type, name: str) -> type:
    """``base`` with ``system.dump_dir``: every rank writes ``rank<r>.pt`` there when training ends."""

    @dataclass
    class DumpConfig(base.Config):
        dump_dir: str = ""  # where each rank writes rank<r>.pt (outside the run folder)

    class DumpingSystem(base):
        Config = DumpConfig

        def __init__(self, cfg: Any = None) -> None:
            super().__init__(cfg)
            self.events: list[list[int]] = []  # [step, cloned, split, pruned, reset, count after] per densification
            densify = self.densify.after_backward

            def recorded(out: Any, model: Any, optimizer: Any, step: int, extent: float) -> dict[str, int]:
                report = densify(out, model, optimizer, step, extent)
                if report:
                    self.events.append([step, *(report.get(k, 0) for k in ("cloned", "split", "pruned", "reset")), len(model)])
                return report

            self.densify.after_backward = recorded

        def on_train_end(self) -> None:
            optimizer = self._all_optimizers()[0]
            names = {id(p): n for n, p in self.named_parameters()}
            state = {names[id(p)]: {k: v.clone() for k, v in optimizer.state[p].items() if torch.is_tensor(v)}
                     for group in optimizer.param_groups for p in group["params"] if p in optimizer.state}
            record = {"rank": self.trainer.global_rank, "world_size": self.trainer.world_size,
                      "params": {n: p.detach().clone() for n, p in self.gaussians.named_parameters()},
                      "optimizer": state, "events": torch.tensor(self.events, dtype=torch.int64).reshape(-1, 6),
                      "step": self.true_global_step,
                      "captures": getattr(getattr(self, "_graphs", None), "captures", 0)}  # CUDA-graph captures of the step
            Path(self.cfg.dump_dir).mkdir(parents=True, exist_ok=True)
            torch.save(record, Path(self.cfg.dump_dir) / f"rank{self.trainer.global_rank}.pt")

    DumpingSystem.__name__ = DumpingSystem.__qualname__ = f"Dumping{base.__name__}"
    return register(name)(DumpingSystem)


dumping(find("reconstruct-gaussians"), "test-reconstruct-gaussians-dump")
dumping(find("gaussian-sds"), "test-gaussian-sds-dump")
