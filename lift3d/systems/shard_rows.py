"""Rows of sharded Gaussians: which rows a rank owns, the whole model gathered for a checkpoint and sliced again on
resume (on any number of ranks), and rows moved between ranks when densification leaves the shards uneven.

A model of N Gaussians on R ranks is held as contiguous even shards in rank order (rank r: rows ``shard_range(N, r,
R)``); the whole model is the shards concatenated in rank order. Optimizer state tensors shaped like a parameter
(Adam's moments) travel with their rows."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lift3d.distributed import all_gather_ints, exchange, gather_to_zero, rank, world_size
from lift3d.gaussians.model import PARAMETER_NAMES, GaussianModel
from lift3d.gaussians.ops import replace_parameters

IMBALANCE = 1.1  # rows move when the largest shard holds more than this x the mean


def shard_range(count: int, index: int, ranks: int) -> tuple[int, int]:
    """(start, stop) of shard ``index`` of ``count`` rows split evenly over ``ranks`` (the first ones one larger)."""
    base, extra = divmod(count, ranks)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def keep_shard(model: GaussianModel, index: int, ranks: int) -> tuple[int, int]:
    """Keep only this rank's shard of ``model``'s Gaussians (before an optimizer exists); returns its range."""
    start, stop = shard_range(len(model), index, ranks)
    model.set_parameters({name: p.detach()[start:stop] for name, p in model.parameters_dict().items()})
    return start, stop


def gaussian_state(model: GaussianModel, optimizer: torch.optim.Optimizer | None) -> dict[int, str]:
    """The index of each Gaussian parameter in ``optimizer.state_dict()`` -> its name."""
    if optimizer is None:
        return {}
    names = {id(p): name for name, p in model.parameters_dict().items()}
    found, index = {}, 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) in names:
                found[index] = names[id(p)]
            index += 1
    return found


def gather_checkpoint(checkpoint: dict[str, Any], model: GaussianModel, optimizer: torch.optim.Optimizer | None,
                      prefix: str = "gaussians.", statistics: dict[str, Any] | None = None) -> None:
    """Every rank: bring the shards' Gaussians, their optimizer moments and their densification ``statistics``
    (tensors per Gaussian, or None) to rank 0's ``checkpoint`` as one whole model (in place; rank 0 writes it)."""
    n = len(model)
    for name in PARAMETER_NAMES:
        whole = gather_to_zero(getattr(model, name))
        if whole is not None:
            checkpoint["state_dict"][prefix + name] = whole
    states = checkpoint.get("optimizer_states") or []
    for index in sorted(gaussian_state(model, optimizer)):
        # a copy: optimizer.state_dict() shares each parameter's state dict with the live optimizer
        state = dict(states[0]["state"].get(index, {})) if states else {}
        for key in sorted(k for k, v in state.items() if torch.is_tensor(v) and v.ndim and len(v) == n):
            whole = gather_to_zero(state[key])
            if whole is not None:
                state[key] = whole
        if states and index in states[0]["state"]:
            states[0]["state"][index] = state
    for key, value in (statistics or {}).items():
        present = all_gather_ints([value is not None])
        if all(row[0] for row in present):
            whole = gather_to_zero(value)
            if whole is not None:
                statistics[key] = whole


def slice_checkpoint(checkpoint: dict[str, Any], index: int, ranks: int, prefix: str = "gaussians.",
                     statistics: dict[str, Any] | None = None) -> int:
    """Cut a whole-model ``checkpoint`` (in place) to shard ``index`` of ``ranks``: the Gaussian parameters, every
    optimizer state tensor with one row per Gaussian and the densification ``statistics``; returns the whole count."""
    weights = checkpoint["state_dict"]
    if prefix + "means" not in weights:
        return 0
    count = len(weights[prefix + "means"])
    start, stop = shard_range(count, index, ranks)

    def cut(value: Any) -> Any:
        return value[start:stop] if torch.is_tensor(value) and value.ndim and len(value) == count else value

    for name in PARAMETER_NAMES:
        if prefix + name in weights:
            weights[prefix + name] = weights[prefix + name][start:stop]
    for states in checkpoint.get("optimizer_states") or []:
        for state in states.get("state", {}).values():
            state.update({key: cut(value) for key, value in state.items()})
    if statistics is not None:
        statistics.update({key: cut(value) for key, value in statistics.items()})
    return count


def transfers(counts: list[int]) -> list[list[int]]:
    """[source][destination] rows to move so every shard holds ``shard_range``'s share (each surplus from the tail
    of its shard, to the deficits in rank order)."""
    total, ranks = sum(counts), len(counts)
    target = [shard_range(total, r, ranks)[1] - shard_range(total, r, ranks)[0] for r in range(ranks)]
    surplus = [max(c - t, 0) for c, t in zip(counts, target)]
    deficit = [max(t - c, 0) for c, t in zip(counts, target)]
    moves = [[0] * ranks for _ in range(ranks)]
    for source in range(ranks):
        for destination in range(ranks):
            n = min(surplus[source], deficit[destination])
            moves[source][destination] += n
            surplus[source] -= n
            deficit[destination] -= n
    return moves


def rebalance(model: GaussianModel, optimizer: torch.optim.Optimizer | None, statistics: list[Tensor] | None = None,
              imbalance: float = IMBALANCE) -> tuple[int, list[Tensor]]:
    """Every rank: move Gaussians (with their optimizer moments and the ``statistics`` tensors, one value per
    Gaussian) from the shards above ``imbalance`` x the mean to the smaller ones; returns how many moved (0 when the
    shards are even enough) and the statistics as they are now."""
    statistics = list(statistics or [])
    counts = [row[0] for row in all_gather_ints([len(model)])]
    if world_size() <= 1 or max(counts) <= imbalance * sum(counts) / len(counts):
        return 0, statistics
    moves, me = transfers(counts), rank()
    sending = sum(moves[me])
    keep = len(model) - sending
    columns: list[tuple[Any, int]] = []  # (what the column block belongs to, its width)
    blocks: list[Tensor] = []
    params = model.parameters_dict()
    for name in PARAMETER_NAMES:
        p = params[name].detach()
        tensors: list[tuple[str, Any, Tensor]] = [("param", None, p)]
        if optimizer is not None:
            state = optimizer.state.get(params[name], {})
            tensors += [("state", id(v), v) for v in state.values() if torch.is_tensor(v) and v.shape == p.shape]
        for kind, key, tensor in tensors:
            flat = tensor.detach().reshape(len(p), -1).float()
            blocks.append(flat[keep:])
            columns.append(((kind, name, key), flat.shape[1]))
    for i, values in enumerate(statistics):
        blocks.append(values.detach().reshape(-1, 1).float()[keep:])
        columns.append((("statistics", i, None), 1))
    received = exchange(torch.cat(blocks, dim=1), moves[me], [moves[s][me] for s in range(len(counts))])
    incoming = dict(zip((owner for owner, _ in columns), received.split([w for _, w in columns], dim=1)))

    def grown(old: Tensor, rows: Tensor) -> Tensor:
        return torch.cat([old[:keep], rows.to(old.dtype).reshape(-1, *old.shape[1:])])

    def new_value(name: str, p: Tensor) -> Tensor:
        return grown(p, incoming[("param", name, None)])

    def new_state(name: str, s: Tensor) -> Tensor:
        return grown(s, incoming[("state", name, id(s))])

    replace_parameters(model, optimizer, new_value, new_state)
    moved = [grown(values, incoming[("statistics", i, None)]) for i, values in enumerate(statistics)]
    return sum(map(sum, moves)), moved
