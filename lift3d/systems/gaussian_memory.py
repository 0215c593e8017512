"""How much GPU memory a Gaussian run needs, checked before training: a clear one-line error instead of an
out-of-memory traceback, and the figure that decides whether ``system.shard_gaussians=auto`` shards.

The estimate counts, per Gaussian: its parameters (3 + 3 + 4 + 1 + 3 (degree + 1)^2 floats), their gradients and
Adam's two moments, the densification statistics, and per view rendered the projected 2D Gaussian and its gradient
and tile intersections (a sharded rank projects its Gaussians into the cameras of every rank and receives every
rank's Gaussians seen by its own); per pixel rendered the image, its loss (D-SSIM's blurred maps) and their
gradients. The constants are round upper figures of gsplat's buffers; ``HEADROOM`` covers the allocator's slack.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from lift3d.config import ConfigError

GIB = 1024**3
PROJECTED_BYTES = 200  # per Gaussian and view: 2D mean, conic, depth, radii, color, opacity, their gradients, intersections
PIXEL_BYTES = 256  # per pixel and view: rgb, alpha, depth, the target, D-SSIM's maps and the gradients of all
STATISTICS_BYTES = 12  # per Gaussian: densification gradient sums and counts
HEADROOM = 1.15  # the caching allocator's fragmentation and the kernels' scratch
MAX_SUGGESTED_GPUS = 64  # the most GPUs a refusal suggests sharding over
MEMORY_FRACTION_ENV = "LIFT3D_GPU_MEMORY_FRACTION"  # a share of each GPU this run may use (torch's per-process cap)


def parameter_floats(sh_degree: int) -> int:
    """Floats of one Gaussian: mean, log-scale, quaternion, opacity and its SH coefficients."""
    return 3 + 3 + 4 + 1 + 3 * (sh_degree + 1) ** 2


@dataclass
class MemoryEstimate:
    """Bytes one GPU holds for a run: its Gaussians' parameters and gradients, Adam's state, and the renders."""

    gaussians: int  # how many this GPU holds
    views: int  # views it renders a step
    width: int
    height: int
    parameters: int  # parameters and their gradients
    optimizer: int  # Adam's two moments and the densification statistics
    renders: int  # projected Gaussians, images, losses and their gradients

    @property
    def total(self) -> int:
        return int((self.parameters + self.optimizer + self.renders) * HEADROOM)

    def describe(self) -> str:
        return (f"{_count(self.gaussians)} Gaussians: {_gib(self.parameters)} of parameters and gradients, "
                f"{_gib(self.optimizer)} of Adam state, {_gib(self.renders)} of renders at {self.views} view"
                f"{'s' if self.views != 1 else ''} of {self.width}x{self.height}")


def estimate(gaussians: int, sh_degree: int, views: int, width: int, height: int, ranks: int = 1,
             sharded: bool = False) -> MemoryEstimate:
    """The memory of one GPU of ``ranks`` training ``gaussians`` Gaussians (all of them on each GPU, or an even
    ``sharded`` share) with ``views`` views of ``width`` x ``height`` a step on each GPU."""
    held = math.ceil(gaussians / ranks) if sharded else gaussians
    floats = parameter_floats(sh_degree) * 4
    seen = held * views * ranks + gaussians * views if sharded else held * views  # owner's projection + received
    return MemoryEstimate(held, views, width, height, parameters=2 * floats * held,
                          optimizer=2 * floats * held + STATISTICS_BYTES * held,
                          renders=PROJECTED_BYTES * seen + PIXEL_BYTES * views * width * height)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else str(n)


def device_budget(device: torch.device) -> int | None:
    """The bytes this process may still allocate on ``device`` (None: not a CUDA device): its free memory, within
    ``LIFT3D_GPU_MEMORY_FRACTION`` of the whole when that is set (applied here as torch's per-process cap)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    fraction = os.environ.get(MEMORY_FRACTION_ENV)
    if fraction:
        share = float(fraction)
        torch.cuda.set_per_process_memory_fraction(share, device)
        free = min(free, int(share * total) - torch.cuda.memory_reserved(device))
    return max(int(free), 0)


def fitting_count(sh_degree: int, views: int, width: int, height: int, budget: int, ranks: int = 1,
                  sharded: bool = False) -> int:
    """The most Gaussians (of all ranks together) that fit ``budget`` bytes per GPU under this layout (0: not even the
    renders fit)."""
    one = estimate(1_000_000, sh_degree, views, width, height, ranks, sharded)
    fixed = PIXEL_BYTES * views * width * height
    per_million = (one.parameters + one.optimizer + one.renders - fixed) * HEADROOM
    room = budget - fixed * HEADROOM
    return max(int(room / per_million * 1_000_000), 0) if per_million > 0 else 0


def gpus_to_shard_over(total: int, sh_degree: int, views: int, width: int, height: int, budget: int,
                       at_least: int) -> int | None:
    """The fewest GPUs (``at_least`` or more, up to ``MAX_SUGGESTED_GPUS``) over which ``total`` Gaussians sharded fit
    ``budget`` bytes each; None when no count does (each rank still receives what its own views see)."""
    for ranks in range(max(at_least, 2), MAX_SUGGESTED_GPUS + 1):
        if estimate(total, sh_degree, views, width, height, ranks, sharded=True).total <= budget:
            return ranks
    return None


def too_large_message(need: MemoryEstimate, budget: int, device: torch.device, ranks: int, sharded: bool,
                      sh_degree: int, cap_key: str, total: int) -> str:
    """The one line a run that would not fit says, with the ways out: the Gaussians sharded over these GPUs when that
    fits, else over the fewest GPUs where it would; a Gaussian budget that fits; a lower resolution."""
    fits = fitting_count(sh_degree, need.views, need.width, need.height, budget, ranks, sharded)
    layout = f" (a {'shard' if sharded else 'copy'} of {_count(total)} on each of {ranks} GPUs)" if ranks > 1 else ""
    gpus = gpus_to_shard_over(total, sh_degree, need.views, need.width, need.height, budget,
                              ranks + 1 if sharded else ranks)
    ways = [f"cap the Gaussians ({cap_key}={max(fits // 1000 * 1000, 1000)})", "lower the resolution (data.downscale=2)"]
    if gpus == ranks:
        ways.insert(0, f"shard the Gaussians over these {ranks} GPUs (system.shard_gaussians=true)")
    elif gpus is not None:
        ways.insert(0, f"train on {gpus} GPUs with the Gaussians sharded (--gpus {','.join(map(str, range(gpus)))} "
                       "system.shard_gaussians=true)")
    said = ", ".join(ways[:-1]) + " or " + ways[-1]
    return (f"the model needs about {_gib(need.total)} on {device}{layout}: {need.describe()}; {device} has "
            f"{_gib(budget)} free. {said[0].upper()}{said[1:]}")


def check_fits(need: MemoryEstimate, budget: int | None, device: torch.device, ranks: int, sharded: bool,
               sh_degree: int, cap_key: str, total: int) -> None:
    """A ConfigError (one line) when ``need`` exceeds ``budget`` (None: nothing to check)."""
    if budget is not None and need.total > budget:
        raise ConfigError(too_large_message(need, budget, device, ranks, sharded, sh_degree, cap_key, total))
