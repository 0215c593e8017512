"""Parameter surgery on a ``GaussianModel`` that keeps its optimizer in step: every densification strategy adds,
moves and removes Gaussians through these (``lift3d.gaussians.strategies``).

Whenever Gaussians are added or removed, every optimizer state tensor shaped like a parameter (Adam's moments) is
cut or extended to match: new Gaussians start with zero moments, kept ones keep theirs, and the optimizer tracks
the new parameter tensors in the same groups with the same options. Random draws come from the generator given
(under DDP one that depends only on the step, so every rank makes the same change).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.gaussians.model import PARAMETER_NAMES, GaussianModel
from lift3d.rotations import quaternion_to_matrix


def replace_parameters(
    model: GaussianModel,
    optimizer: torch.optim.Optimizer | None,
    new_value: Callable[[str, Tensor], Tensor],
    new_state: Callable[[str, Tensor], Tensor],
    names: tuple[str, ...] = PARAMETER_NAMES,
) -> None:
    """Swap each Gaussian parameter in ``names`` for ``new_value(name, old)`` and each optimizer state
    tensor shaped like it (e.g. Adam's ``exp_avg``) for ``new_state(name, old_state)``; the optimizer
    then tracks the new parameters in the same groups with the same options."""
    for name in names:
        old = getattr(model, name)
        new = nn.Parameter(new_value(name, old.detach()), requires_grad=old.requires_grad)
        if optimizer is not None:
            for group in optimizer.param_groups:
                group["params"] = [new if p is old else p for p in group["params"]]
            state = optimizer.state.pop(old, None)
            if state is not None:
                optimizer.state[new] = {
                    key: new_state(name, value) if torch.is_tensor(value) and value.shape == old.shape else value
                    for key, value in state.items()
                }
        setattr(model, name, new)


def duplicate(model: GaussianModel, optimizer: torch.optim.Optimizer | None, mask: Tensor) -> None:
    """Append copies of the Gaussians in ``mask`` [N] (zero optimizer moments for the copies)."""
    replace_parameters(model, optimizer, lambda _, p: torch.cat([p, p[mask]]),
                       lambda _, s: torch.cat([s, torch.zeros_like(s[mask])]))


def remove(model: GaussianModel, optimizer: torch.optim.Optimizer | None, mask: Tensor) -> None:
    """Drop the Gaussians in ``mask`` [N] together with their optimizer state."""
    keep = ~mask
    replace_parameters(model, optimizer, lambda _, p: p[keep], lambda _, s: s[keep])


def split_gaussians(model: GaussianModel, optimizer: torch.optim.Optimizer | None, mask: Tensor,
                    into: int = 2, shrink: float = 1.6, generator: torch.Generator | None = None,
                    among: tuple[int, int] | None = None) -> None:
    """Replace each Gaussian in ``mask`` [N] by ``into`` Gaussians whose centers are drawn from it and whose
    scales are divided by ``shrink``; the new ones go at the end with zero optimizer moments. The draws come
    from ``generator`` (a CPU generator; None: the global RNG). ``among`` = (offset, total): these splits are
    ``offset``.. of ``total`` split on every shard together, and take their draws there (sharded Gaussians split as
    one model would)."""
    n = int(mask.sum())
    scales, quats = model.scales[mask], model.quats[mask]
    offset, total = among or (0, n)
    draws = torch.randn(into, total, 3, 1, generator=generator).to(scales.device) if generator is not None else \
        torch.randn(into, total, 3, 1, device=scales.device)
    draws = draws[:, offset : offset + n]
    offsets = (quaternion_to_matrix(quats)[None] @ (draws * scales[None, :, :, None]))
    means = (model.means[mask][None] + offsets.squeeze(-1)).reshape(into * n, 3)
    new = {"means": means, "log_scales": torch.log(scales / shrink).repeat(into, 1)}
    keep = ~mask

    def value(name: str, p: Tensor) -> Tensor:
        grown = new.get(name)
        if grown is None:
            grown = p[mask].repeat(into, *([1] * (p.ndim - 1)))
        return torch.cat([p[keep], grown])

    def state(name: str, s: Tensor) -> Tensor:
        return torch.cat([s[keep], s.new_zeros((into * n,) + s.shape[1:])])

    replace_parameters(model, optimizer, value, state)


def reset_opacities(model: GaussianModel, optimizer: torch.optim.Optimizer | None, value: float) -> None:
    """Cap every opacity at ``value`` and zero the opacity's optimizer moments."""
    cap = math.log(value / (1 - value))
    replace_parameters(model, optimizer, lambda _, p: p.clamp(max=cap), lambda _, s: torch.zeros_like(s),
                       names=("opacity_logits",))


def _with_values(name: str, p: Tensor, index: Tensor, values: dict[str, Tensor]) -> Tensor:
    """A copy of parameter ``p`` whose rows ``index`` hold ``values[name]`` when given."""
    p = p.clone()
    if name in values:
        p[index] = values[name]
    return p


def relocate(model: GaussianModel, optimizer: torch.optim.Optimizer | None, dead: Tensor, sampled: Tensor,
             shared: dict[str, Tensor]) -> None:
    """Move each Gaussian of ``dead`` [n] (indices) onto the one at the same place in ``sampled`` [n]: it takes every
    parameter of that one, after the sampled ones took ``shared`` (parameter name -> their new values [n, ...], e.g.
    the opacity and scale they now share with their copies). The optimizer moments of both start again from zero."""

    def value(name: str, p: Tensor) -> Tensor:
        p = _with_values(name, p, sampled, shared)
        p[dead] = p[sampled]
        return p

    def state(name: str, s: Tensor) -> Tensor:
        s = s.clone()
        s[sampled] = 0
        s[dead] = 0
        return s

    replace_parameters(model, optimizer, value, state)


def add_copies(model: GaussianModel, optimizer: torch.optim.Optimizer | None, sampled: Tensor,
               shared: dict[str, Tensor]) -> None:
    """Append a copy of each Gaussian of ``sampled`` [n] (indices, repeats allowed) after the sampled ones took
    ``shared`` (as in ``relocate``); the copies start with zero optimizer moments, the sampled ones keep theirs."""
    n = len(sampled)

    def value(name: str, p: Tensor) -> Tensor:
        p = _with_values(name, p, sampled, shared)
        return torch.cat([p, p[sampled]])

    def state(name: str, s: Tensor) -> Tensor:
        return torch.cat([s, s.new_zeros((n,) + s.shape[1:])])

    replace_parameters(model, optimizer, value, state)
