"""Small fully connected networks (the Instant-NGP "tiny" MLPs) and activations shared by fields."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class _TruncExp(torch.autograd.Function):
    """exp(x) whose gradient uses exp(clamp(x, max=15)): keeps density gradients finite (Instant-NGP)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return torch.exp(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return grad * torch.exp(x.clamp(max=15.0))


def trunc_exp(x: Tensor) -> Tensor:
    return _TruncExp.apply(x)


def activation(name: str, x: Tensor) -> Tensor:
    """Apply a named activation: none, relu, softplus, exp, trunc_exp, sigmoid, tanh."""
    if name == "none":
        return x
    if name == "relu":
        return F.relu(x)
    if name == "softplus":
        return F.softplus(x)
    if name == "exp":
        return torch.exp(x)
    if name == "trunc_exp":
        return trunc_exp(x)
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "tanh":
        return torch.tanh(x)
    raise ValueError(f"unknown activation '{name}' (none, relu, softplus, exp, trunc_exp, sigmoid, tanh)")


ACTIVATIONS = ("none", "relu", "softplus", "exp", "trunc_exp", "sigmoid", "tanh")


class MLP(nn.Module):
    """in -> [hidden -> ReLU] x n_hidden_layers -> out (no output activation)."""

    def __init__(self, input_dim: int, output_dim: int, hidden_dim: int = 64, n_hidden_layers: int = 1, bias: bool = True) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * n_hidden_layers + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: Tensor) -> Tensor:
        """[N, input_dim] -> [N, output_dim]."""
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x, inplace=True)
        return x
