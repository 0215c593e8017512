"""Small fully connected networks (the Instant-NGP "tiny" MLPs) and activations shared by fields."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

# exp of float32 is finite up to 88.72: a density from exp(x) past that would be inf, which no render needs (30 units
# of optical thickness already make a sample opaque) and which meshing and the exporters reject as non-finite
EXP_INPUT_MAX = 88.0


class _TruncExp(torch.autograd.Function):
    """exp(min(x, 88)) whose gradient uses exp(clamp(x, max=15)): keeps density gradients finite (Instant-NGP) and
    the density itself finite in float32."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return torch.exp(x.clamp(max=EXP_INPUT_MAX))

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


class _LinearReLU(torch.autograd.Function):
    """relu(x @ weight.T + bias) as one cuBLASLt GEMM with a bias-and-ReLU epilogue (``torch._addmm_activation``,
    which has no derivative of its own): the separate ReLU pass over [N, hidden] was ~3% of an MVDream step."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:  # type: ignore[override]
        y = torch._addmm_activation(bias, x, weight.t())
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight, y = ctx.saved_tensors
        grad = torch.ops.aten.threshold_backward(grad, y, 0)  # ReLU's own backward kernel
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ x if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def linear_relu(x: Tensor, layer: nn.Linear) -> Tensor:
    """relu(layer(x)): on CUDA one fused GEMM (in the autocast dtype where autocast is on), else two ops."""
    if x.device.type != "cuda" or layer.bias is None or x.ndim != 2:
        return F.relu(layer(x), inplace=True)
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
    with torch.autocast("cuda", enabled=False):
        return _LinearReLU.apply(x.to(dtype), layer.weight.to(dtype), layer.bias.to(dtype))


class MLP(nn.Module):
    """in -> [hidden -> ReLU] x n_hidden_layers -> out (no output activation)."""

    def __init__(self, input_dim: int, output_dim: int, hidden_dim: int = 64, n_hidden_layers: int = 1,
                 bias: bool = True) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * n_hidden_layers + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(dims[:-1], dims[1:], strict=False))

    def forward(self, x: Tensor) -> Tensor:
        """[N, input_dim] -> [N, output_dim]."""
        for layer in self.layers[:-1]:
            x = linear_relu(x, layer)
        return linear_aligned(x, self.layers[-1])


def linear_aligned(x: Tensor, layer: nn.Linear) -> Tensor:
    """layer(x); on CUDA with an output width that is not a multiple of 8 the weight gets zero rows up to one (the
    output is a view of the first columns): cuBLAS picks faster GEMMs for it."""
    width = layer.out_features
    if x.device.type != "cuda" or width % 8 == 0:
        return layer(x)
    pad = (0, 0, 0, 8 - width % 8)
    bias = None if layer.bias is None else F.pad(layer.bias, pad[2:])
    return F.linear(x, F.pad(layer.weight, pad), bias)[..., :width]
