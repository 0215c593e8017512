"""Adam's step on the Gaussians a training step saw (gsplat's ``visible_adam``), with no host sync.

A Gaussian outside every view of a step gets a zero gradient, yet plain Adam still decays its moments and moves it by
its momentum. Here the rows (Gaussians) outside the step's views keep their parameters and moments untouched, as
gsplat's ``SelectiveAdam`` does, and a row's memory is not even read: the update costs what the visible Gaussians
cost. Parameters whose first dimension is not the Gaussian count (per-photo color transforms) get plain Adam.

The state is ``torch.optim.Adam``'s (``exp_avg``, ``exp_avg_sq``, a ``step`` tensor counted per parameter), so the
two can take turns (the recipe's eager first steps, a resumed checkpoint). On CUDA one Triton kernel per parameter
reads the visibility, step count and learning rate from device memory, so the update can be captured in a CUDA
graph; elsewhere (and as the reference of the tests) the same arithmetic in PyTorch ops with ``torch.where``.
"""

import math

import torch
from torch import Tensor

# no ``from __future__ import annotations`` here: Triton 3.0 reads the ``tl.constexpr`` annotations as objects

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch
    triton = None

BLOCK = 1024

if triton is not None:

    @triton.jit
    def _visible_adam(param, grad, exp_avg, exp_avg_sq, visible, step, lr, numel, row_size, beta1, beta2,
                      log2_beta1, log2_beta2, eps, weight_decay, BLOCK_SIZE: tl.constexpr):
        """Adam on the elements of the visible rows of one [rows, row_size] parameter (the others not read)."""
        offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        inside = offsets < numel
        seen = tl.load(visible + offsets // row_size, mask=inside, other=0) != 0
        keep = inside & seen
        t = tl.load(step).to(tl.float32)
        rate = tl.load(lr).to(tl.float32)
        correction1 = 1.0 - tl.exp2(t * log2_beta1)
        correction2 = 1.0 - tl.exp2(t * log2_beta2)
        g = tl.load(grad + offsets, mask=keep, other=0.0)
        m = tl.load(exp_avg + offsets, mask=keep, other=0.0)
        v = tl.load(exp_avg_sq + offsets, mask=keep, other=0.0)
        p = tl.load(param + offsets, mask=keep, other=0.0)
        g = g + weight_decay * p
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        denom = tl.sqrt(v) / tl.sqrt(correction2) + eps
        p = p - (rate / correction1) * m / denom
        tl.store(exp_avg + offsets, m, mask=keep)
        tl.store(exp_avg_sq + offsets, v, mask=keep)
        tl.store(param + offsets, p, mask=keep)


def supports(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``visible_adam_step`` computes this optimizer's update: Adam (its weight decay is an L2 term in the
    gradient) or AdamW without decay; no amsgrad or maximize, not differentiable."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return False
    decoupled = isinstance(optimizer, torch.optim.AdamW)
    return all(not (decoupled and group.get("weight_decay")) and not group.get("amsgrad") and not group.get("maximize")
               and not group.get("differentiable") for group in optimizer.param_groups)


def visibility(radii: Tensor) -> Tensor:
    """[N] bool: the Gaussians drawn in at least one view of a render's ``radii`` [B, N, 2] (or [B, N])."""
    drawn = radii > 0
    if drawn.ndim == 3:
        drawn = drawn.all(dim=-1)
    return drawn.any(dim=0)


@torch.no_grad()
def visible_adam_step(optimizer: torch.optim.Optimizer, visible: Tensor, use_triton: bool | None = None) -> None:
    """One Adam step of ``optimizer`` (whose every parameter with a gradient has Adam's state, ``step`` a tensor) in
    which the rows of Gaussian-shaped parameters (first dimension ``len(visible)``) not in ``visible`` [N] keep their
    values and moments. ``use_triton``: None = on CUDA when Triton is installed."""
    rows = visible.shape[0]
    flags = visible.to(torch.uint8)
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        eps, lr, decay = group["eps"], group["lr"], float(group.get("weight_decay") or 0.0)
        params = [p for p in group["params"] if p.grad is not None and p.numel()]
        if not params:
            continue
        steps = [optimizer.state[p]["step"] for p in params]
        torch._foreach_add_(steps, 1)
        for param, step in zip(params, steps):
            state = optimizer.state[param]
            shaped = param.ndim > 0 and param.shape[0] == rows
            seen = flags if shaped else torch.ones(max(param.shape[0] if param.ndim else 1, 1), dtype=torch.uint8,
                                                   device=param.device)
            fast = (param.is_cuda and triton is not None) if use_triton is None else use_triton
            if fast:
                rate = lr if torch.is_tensor(lr) else torch.full((), float(lr), device=param.device)
                _launch(param, state, seen, step, rate, beta1, beta2, eps, decay)
            else:
                _reference(param, state, seen.bool(), step, lr, beta1, beta2, eps, decay)


def _launch(param: Tensor, state: dict, seen: Tensor, step: Tensor, lr: Tensor, beta1: float, beta2: float,
            eps: float, decay: float = 0.0) -> None:
    numel = param.numel()
    if numel == 0:
        return
    row_size = max(numel // max(seen.shape[0], 1), 1)
    grid = (triton.cdiv(numel, BLOCK),)
    _visible_adam[grid](param, param.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"], seen, step, lr, numel,
                        row_size, beta1, beta2, math.log2(beta1), math.log2(beta2), eps, decay, BLOCK_SIZE=BLOCK)


def _reference(param: Tensor, state: dict, seen: Tensor, step: Tensor, lr: float | Tensor, beta1: float, beta2: float,
               eps: float, decay: float = 0.0) -> None:
    """The same update in PyTorch ops (CPU, tests): Adam's arithmetic, kept only on the visible rows."""
    grad, exp_avg, exp_avg_sq = param.grad + decay * param, state["exp_avg"], state["exp_avg_sq"]
    mask = seen.reshape(-1, *([1] * (param.ndim - 1))) if param.ndim else seen.reshape(())
    t = step.float()
    correction1 = 1 - beta1 ** t
    correction2 = 1 - beta2 ** t
    m = beta1 * exp_avg + (1 - beta1) * grad
    v = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    update = (lr / correction1) * m / (v.sqrt() / correction2.sqrt() + eps)
    exp_avg.copy_(torch.where(mask, m, exp_avg))
    exp_avg_sq.copy_(torch.where(mask, v, exp_avg_sq))
    param.copy_(torch.where(mask, param - update, param))
