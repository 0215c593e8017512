"""Inject a precomputed gradient into autograd as a loss (the SDS / VSD trick).

The distillation gradient skips the UNet Jacobian, so it is not the gradient of any loss autograd can
see. ``inject_gradient(x, grad)`` returns a scalar whose backward hands ``grad * upstream`` to ``x``,
where ``upstream`` is whatever multiplies the loss (1, a loss weight, an AMP grad-scaler's scale):
with a power-of-two scale the unscaled gradient is bit-exact ``grad``. (The usual alternative,
``0.5 * ||x - (x - grad).detach()||^2``, loses bits to the subtraction.)
"""

from __future__ import annotations

import torch
from torch import Tensor


class _InjectGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, grad: Tensor) -> Tensor:
        ctx.save_for_backward(grad)
        ctx.input_dtype = x.dtype
        # the value is only for logging: half the squared gradient norm (what the MSE form would print)
        return 0.5 * grad.detach().float().square().sum()

    @staticmethod
    def backward(ctx, upstream: Tensor) -> tuple[Tensor, None]:
        (grad,) = ctx.saved_tensors
        return (grad * upstream.to(grad.dtype)).to(ctx.input_dtype), None


def inject_gradient(x: Tensor, grad: Tensor) -> Tensor:
    """A float32 scalar (value 0.5 ||grad||^2) whose gradient w.r.t. ``x`` [B, ...] is exactly ``grad`` [B, ...]."""
    if grad.shape != x.shape:
        raise ValueError(f"the injected gradient has shape {tuple(grad.shape)} but its input has {tuple(x.shape)}")
    return _InjectGradient.apply(x, grad.detach())
