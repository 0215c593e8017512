"""Gaussians trained on several processes (Lightning DDP): gradients averaged by hand, replicas checked equal.

Why not torch's DistributedDataParallel wrapper: it registers the module's parameters once, and densification
replaces every Gaussian parameter by a new ``nn.Parameter`` of a new size, so DDP would reduce stale tensors and
the replicas would diverge. ``ReplicatedDDPStrategy`` keeps Lightning's DDP machinery (launch, process group,
seeding, barriers, rank-0 checkpoints) without wrapping the module; the system calls ``average_gradients`` on the
parameters its optimizer steps, after each backward pass and before densification. Every Gaussian gradient
arrives at the end of backward, so one flat all-reduce per step loses nothing against DDP's bucketing.

With ``data.batch_size`` = B views per rank and N ranks, a step's gradient is the mean over N x B views; the
densification statistics are per view and summed over the ranks. The runner rescales the recipe's step counts and
Adam's rates for the N x B views a step (``lift3d.runs.rescale``), so the run reaches the one-GPU result sooner.

Scenes bigger than one GPU shard the Gaussians instead of copying them (``ShardedGaussians``, the base of the mixin
here: ``system.shard_gaussians``): the Gaussians' gradients then arrive summed over the ranks through the render's
exchange, and only the other parameters (per-photo appearance, pose corrections) are averaged here.

The captured CUDA-graph step (``lift3d.systems.graphed_splats``) keeps Adam out of the graph under DDP: the
all-reduce runs eagerly between the replay and Adam. ``LIFT3D_DDP_CUDA_GRAPHS=0`` keeps the eager step under DDP.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor

from lift3d.distributed import all_reduce_sum_, world_size
from lift3d.systems.shards import ShardedGaussians

DDP_GRAPHS_ENV = "LIFT3D_DDP_CUDA_GRAPHS"  # "1": the Gaussian step's CUDA graph also under DDP (Adam eager, after the all-reduce)
DDP_GRAPHS_DEFAULT = True  # without the variable: captured, as on one GPU (its scaling: benchmarks/RESULTS.md, ddp)


def graphs_under_ddp() -> bool:
    """Whether the captured Gaussian step may run under DDP (``LIFT3D_DDP_CUDA_GRAPHS`` 1 or 0; else the default)."""
    return os.environ.get(DDP_GRAPHS_ENV, "1" if DDP_GRAPHS_DEFAULT else "0") == "1"


class ReplicaDivergenceError(RuntimeError):
    """The DDP ranks' parameters differ: densification or an update was not the same on every rank."""


def average_gradients(parameters: Iterable[Tensor]) -> None:
    """Replace each gradient by its mean over the ranks (as DDP would), in one collective."""
    grads = [p.grad for p in parameters if p.grad is not None]
    n = world_size()
    if n <= 1 or not grads:
        return
    all_reduce_sum_(grads)
    for grad in grads:
        grad.div_(n)


def parameter_checksums(tensors: dict[str, Tensor]) -> Tensor:
    """[T, 2] float64 (sum, sum of squares) of each tensor: equal tensors give equal rows (cheap, no copy home)."""
    rows = [torch.stack([t.detach().double().sum(), t.detach().double().square().sum()]) for t in tensors.values()]
    return torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64)


def check_replicas(tensors: dict[str, Tensor], step: int) -> None:
    """Raise ReplicaDivergenceError naming ``step`` and the tensors unless every rank holds the same checksums
    (and the same sizes) of ``tensors``; a no-op in a single process."""
    import torch.distributed as dist

    n = world_size()
    if n <= 1:
        return
    sizes = torch.tensor([float(len(t)) for t in tensors.values()], dtype=torch.float64)
    local = torch.cat([parameter_checksums(tensors).reshape(-1).cpu(), sizes])
    if dist.get_backend() == "nccl":
        local = local.cuda()
    gathered = [torch.empty_like(local) for _ in range(n)]
    dist.all_gather(gathered, local)
    table = torch.stack(gathered).cpu()
    if bool((table == table[0]).all()):
        return
    names = list(tensors)
    per_tensor = torch.cat([table[:, : 2 * len(names)].reshape(n, len(names), 2), table[:, 2 * len(names):, None]], -1)
    differing = [name for i, name in enumerate(names) if not bool((per_tensor[:, i] == per_tensor[0, i]).all())]
    raise ReplicaDivergenceError(
        f"step {step}: the {n} DDP ranks' Gaussians differ ({', '.join(differing)}; Gaussians per rank "
        f"{[int(table[r, 2 * len(names)]) for r in range(n)]}): replicas must stay identical (a bug; "
        "system.replica_check_every=0 turns the check off)")


class ReplicatedDDPStrategy(DDPStrategy):
    """Lightning's DDP without the DistributedDataParallel wrapper: the system averages its gradients itself
    (``average_gradients``) because its parameters are replaced during training (see the module docstring)."""

    strategy_name = "ddp_replicated"

    def configure_ddp(self) -> None:
        """Start every rank from rank 0's parameters and buffers (what DDP's constructor does), unwrapped."""
        from lightning.pytorch.overrides.distributed import _sync_module_states

        _sync_module_states(self.model)


def optimized_parameters(optimizers: Iterable[torch.optim.Optimizer]) -> list[Tensor]:
    """Every parameter the optimizers step, once each (what DDP would have reduced)."""
    seen: dict[int, Tensor] = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                seen.setdefault(id(p), p)
    return list(seen.values())


class ReplicatedGaussians(ShardedGaussians):
    """Mixin of the Gaussian systems: under ``ReplicatedDDPStrategy`` average the gradients after each backward
    pass (before densification reads or replaces the parameters) and, every ``system.replica_check_every``
    steps, check that every rank holds the same Gaussians (sharded: the same other parameters; the shards are
    evened out after densification)."""

    @classmethod
    def ddp_strategy(cls) -> ReplicatedDDPStrategy:
        """Densification replaces the parameters: DDP without the wrapper, the system averages its gradients."""
        return ReplicatedDDPStrategy()

    def init_seed(self) -> int:
        """The seed of the Gaussians' initialization: the run's seed on every rank (the runner seeds each rank
        with seed + rank), so all ranks start from the same Gaussians, as many of them."""
        rank = self.trainer.global_rank if self._trainer is not None else 0
        return (torch.initial_seed() - rank) % (2**31)

    def sync_gradients(self) -> None:
        average_gradients(self.shard_gradients(optimized_parameters(self._all_optimizers())))

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        every = self.cfg.replica_check_every
        step = self.true_global_step  # the optimizer has stepped: global_step counts this step
        self.even_out_shards(step)
        if every > 0 and step % every == 0:
            shared = {name: p for name, p in self.named_parameters() if not name.startswith("gaussians.")}
            check_replicas(shared if self.sharded else dict(self.gaussians.named_parameters()), step)
