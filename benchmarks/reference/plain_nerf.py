"""The reference of ``python -m benchmarks lego_nerf --reference plain``: the reconstruct-nerf recipe as a plain loop.

The project's own renderer, field and optimizer (the same config, seed, learning-rate schedule, occupancy-grid
updates, and the recipe's own loss, ``ReconstructNerfSystem.loss_terms``) driven by a bare ``for`` loop with no
Lightning and no CUDA graph, each kernel launched from Python: ray batches are gathered on the device from resident
rays (``ResidentRays``, what the recipe's data module does on CUDA), so the two runs differ only in the training
loop around the same kernels.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lift3d.data.resident import ResidentRays
from lift3d.systems.optim import apply_lr_schedules, build_optimizer


def train_plain(cfg: Any, datamodule: Any, device: torch.device, checkpoints: list[int], budget_s: float,
                score: Callable[[Any], dict], sync: Callable[[], None]) -> list[dict]:
    """Train a fresh system of ``cfg`` on ``datamodule``'s rays; at each checkpoint step (or when ``budget_s`` of
    training has passed, checked every 50 steps) stop the clock and record ``score(system)``."""
    import lightning as L

    from lift3d.runs.runner import build_parts

    L.seed_everything(cfg.seed, verbose=False)
    _, system = build_parts(cfg)
    system = system.to(device).train()
    optimizer = build_optimizer(system, system.cfg.optimizer, 0)
    datamodule._resident = ResidentRays(*datamodule._all_rays(), datamodule.train.rgba, device, datamodule._pick_rays,
                                        datamodule.base_seed)
    parts = system.updateables()
    results: list[dict] = []
    pending = sorted(checkpoints)
    train_s, step = 0.0, 0
    sync()
    mark = time.perf_counter()
    while pending:
        apply_lr_schedules(optimizer, step)
        for part in parts:
            part.update_step(0, step)
        batch = datamodule.on_after_batch_transfer({"step": step}, 0)
        terms, _, _ = system.loss_terms(batch)
        loss = system.weighted_sum(terms)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        over = step % 50 == 0 and train_s + time.perf_counter() - mark > budget_s
        if step >= pending[0] or over:
            sync()
            train_s += time.perf_counter() - mark
            record = {"target_steps": pending[0], "steps": step, "train_wall_s": round(train_s, 2),
                      "ms_per_step": round(1000 * train_s / step, 3), "stopped_by_time_budget": bool(over and step < pending[0]),
                      **{k: round(v, 4) for k, v in score(system).items()}}
            results.append(record)
            if step >= pending[0]:
                pending.pop(0)
            if over:
                break
            system.train()
            sync()
            mark = time.perf_counter()
    return results
