"""The hash-grid lookup on the CPU: the same numbers as ``lift3d.fields.hash_reference.hash_grid_encode``, faster.

The reference lays its work out as [N, L, 2, 2, 2] tensors of int64 rows and weights over all the points at
once: every step streams hundreds of megabytes through memory and broadcasts over tiny innermost axes. Here
points go through in blocks of ``chunk`` (the block's rows and weights stay in the CPU's caches), the corner
axes lead ([2, 2, 2, L, block]: every elementwise op runs over a long contiguous axis), rows are int32 where
the table allows, and the hash's per-axis products are masked before the XOR (the same rows: masking
commutes with XOR). The 8 corner terms are summed in the reference's layout by the same kernel, and the
table gradient adds each row's terms in the reference's order (point, level, corner), so forward values
and gradients are bit-identical to the reference. Gradients with respect to the points are not provided:
callers that need them (analytic normals) use the reference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from lift3d.fields.hash_reference import HASH_PRIMES, HashGridLayout

DEFAULT_CHUNK = 8192  # points per block: its rows and weights (~0.5 MB per level) stay in the L2 cache

_CONSTANTS: dict[tuple, tuple[Tensor, Tensor, Tensor, torch.dtype]] = {}


def _layout_constants(layout: HashGridLayout, device: torch.device) -> tuple[Tensor, Tensor, Tensor, torch.dtype]:
    """Per level: resolution [L, 1] (float), per-axis multipliers [3, L, 1] (int64: 1, s, s^2 when dense, the
    hash primes when hashed), row offsets [L, 1] (row dtype), and the row dtype (int32 when every row fits)."""
    key = (layout, str(device))
    if key not in _CONSTANTS:
        rows = torch.int32 if layout.n_rows < 2**31 else torch.int64
        multipliers = [(1, r + 1, (r + 1) ** 2) if dense else HASH_PRIMES
                       for r, dense in zip(layout.resolutions, layout.dense, strict=False)]
        _CONSTANTS[key] = (
            torch.tensor(layout.resolutions, dtype=torch.float32, device=device)[:, None],
            torch.tensor(multipliers, dtype=torch.int64, device=device).t()[:, :, None].contiguous(),
            torch.tensor(layout.offsets, dtype=rows, device=device)[:, None],
            rows,
        )
    return _CONSTANTS[key]


def corner_rows_weights(points: Tensor, layout: HashGridLayout) -> tuple[Tensor, Tensor]:
    """Table rows [8, L, N] and trilinear weights [8, L, N] of the 8 vertices of each point's cell at each level
    (corners in the reference's order: x slowest, z fastest), for ``points`` [N, 3] in the unit cube."""
    resolution, multiplier, offset, row_dtype = _layout_constants(layout, points.device)
    n, n_levels = points.shape[0], layout.n_levels
    scaled = points.t()[:, None, :] * resolution  # [3, L, N]
    cells = torch.minimum(torch.floor(scaled).clamp_min(0), resolution - 1)
    frac = scaled - cells
    vertex = cells.long()
    axis = torch.stack([vertex, vertex + 1]) * multiplier  # [2, 3, L, N]: each axis's term of the row
    n_dense = sum(layout.dense)
    axis[:, :, n_dense:] &= layout.hashmap_size - 1  # hashed levels: (a ^ b ^ c) & m == (a & m) ^ (b & m) ^ (c & m)
    axis = axis.to(row_dtype)
    x, y, z = axis[:, None, None, 0], axis[None, :, None, 1], axis[None, None, :, 2]  # [2,1,1,L,N], [1,2,1,..], [1,1,2,..]
    rows = torch.empty(2, 2, 2, n_levels, n, dtype=row_dtype, device=points.device)
    if n_dense:
        torch.add(x[..., :n_dense, :] + y[..., :n_dense, :], z[..., :n_dense, :], out=rows[..., :n_dense, :])
    if n_dense < n_levels:
        torch.bitwise_xor(x[..., n_dense:, :] ^ y[..., n_dense:, :], z[..., n_dense:, :], out=rows[..., n_dense:, :])
    rows += offset
    w = torch.stack([1 - frac, frac])  # [2, 3, L, N]
    weights = (w[:, None, None, 0] * w[None, :, None, 1]) * w[None, None, :, 2]  # [2, 2, 2, L, N]
    return rows.reshape(8, n_levels, n), weights.reshape(8, n_levels, n)


def _blend(columns: Tensor, rows: Tensor, weights: Tensor) -> Tensor:
    """Features [N, L * F] = sum over the 8 corners of weight * table row (``columns``: the table transposed,
    [F, R], so each gather moves single values), summed in the reference's order."""
    _, n_levels, n = rows.shape
    n_features = columns.shape[0]
    # the products in the reference's layout [N, L, 8, F], reduced by the same kernel: the same sums bit for bit
    terms = torch.empty(n, n_levels, 8, n_features, dtype=columns.dtype, device=columns.device)
    by_corner = terms.permute(2, 1, 0, 3)  # [8, L, N, F] view
    flat = rows.reshape(-1)
    for f in range(n_features):
        torch.mul(columns[f].index_select(0, flat).view(8, n_levels, n), weights, out=by_corner[..., f])
    return terms.sum(2).reshape(n, n_levels * n_features)


def _encode_blocks(points: Tensor, table: Tensor, layout: HashGridLayout, chunk: int,
                   keep: list[tuple[Tensor, Tensor]] | None) -> Tensor:
    columns = table.t()  # a view: gathering a column with a stride costs no more than a copy of the table would
    out = []
    for block in points.split(max(chunk, 1)):
        rows, weights = corner_rows_weights(block, layout)
        out.append(_blend(columns, rows, weights))
        if keep is not None:
            keep.append((rows, weights))
    if not out:
        return points.new_zeros(0, layout.output_dim, dtype=table.dtype)
    return torch.cat(out) if len(out) > 1 else out[0]


class _HashGridCPU(torch.autograd.Function):
    """Blocked lookup with the table gradient scatter-added in the reference's order."""

    @staticmethod
    def forward(ctx: Any, points: Tensor, table: Tensor, layout: HashGridLayout, chunk: int) -> Tensor:  # type: ignore[override]
        kept: list[tuple[Tensor, Tensor]] = []
        out = _encode_blocks(points, table, layout, chunk, kept)
        ctx.kept, ctx.table_shape, ctx.n_levels = kept, table.shape, layout.n_levels
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None, None]:  # type: ignore[override]
        n_features = ctx.table_shape[1]
        grad_table = grad.new_zeros(ctx.table_shape)
        start = 0
        for rows, weights in ctx.kept:
            n = rows.shape[2]
            g = grad[start:start + n].reshape(n, ctx.n_levels, 1, n_features)
            start += n
            index = rows.permute(2, 1, 0).reshape(-1).long()  # [N * L * 8], point-major like the reference
            point_major = weights.permute(2, 1, 0)  # [N, L, 8]
            for f in range(n_features):  # one column at a time: each row's terms added in the reference's order
                grad_table[:, f].index_add_(0, index, (g[..., f] * point_major).reshape(-1))
        ctx.kept = None
        return None, grad_table, None, None


def hash_grid_encode_cpu(points: Tensor, table: Tensor, layout: HashGridLayout, chunk: int = DEFAULT_CHUNK) -> Tensor:
    """``hash_grid_encode`` of ``points`` [N, 3] (unit cube, no gradient) with ``table`` [R, F] -> [N, L * F],
    bit-identical, with the table's gradient when it requires one."""
    if points.requires_grad:
        raise ValueError("hash_grid_encode_cpu gives no gradient for the points: use hash_grid_encode")
    if torch.is_grad_enabled() and table.requires_grad:
        return _HashGridCPU.apply(points, table, layout, chunk)
    return _encode_blocks(points, table, layout, chunk, None)
