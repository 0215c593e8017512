"""Triton kernels for the hash-grid lookup (forward and table gradient), the fast path on CUDA.

One program handles a block of points at one level: it computes the 8 vertex rows (dense index or
Instant-NGP hash), gathers their features and blends them trilinearly, so no [N, L, 8] index or weight
tensor is ever written. The backward pass scatters ``weight * grad`` into the table with relaxed atomic
adds, after summing runs of consecutive points that hit the same row (a segmented scan in the block).
Gradients with respect to the points are not provided: callers needing them use the PyTorch path
(``lift3d.fields.hash_reference.hash_grid_encode``), which is also the reference these kernels are tested
against (under ``TRITON_INTERPRET=1`` on CPU).
"""

import logging

import torch
from torch import Tensor

from lift3d.fields.hash_reference import HashGridLayout, hash_grid_encode

log = logging.getLogger("lift3d")

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch
    triton = None

# launch settings (points per program, warps per program) of each kernel, from `python -m benchmarks hash_grid`'s sweep
LAUNCH = {"forward": (128, 8), "backward": (128, 4)}
# A one-dimensional grid whose consecutive programs are the levels of one block of points, rather than every block of
# one level and then the next: the levels read the same points from the cache, and a coarse level's rows, which many
# samples share, take atomic adds from fewer programs at once.


if triton is not None:

    @triton.jit
    def _level_vertex(px, py, pz, res_ptr, off_ptr, dense_ptr, level, hash_mask, corner: tl.constexpr):
        """Table row [BLOCK] and trilinear weight [BLOCK] of one corner of each point's cell at ``level``."""
        resolution = tl.load(res_ptr + level)
        rf = resolution.to(tl.float32)
        sx, sy, sz = px * rf, py * rf, pz * rf
        cx = tl.minimum(tl.maximum(tl.floor(sx), 0.0), rf - 1.0)
        cy = tl.minimum(tl.maximum(tl.floor(sy), 0.0), rf - 1.0)
        cz = tl.minimum(tl.maximum(tl.floor(sz), 0.0), rf - 1.0)
        fx, fy, fz = sx - cx, sy - cy, sz - cz
        dx: tl.constexpr = corner & 1
        dy: tl.constexpr = (corner >> 1) & 1
        dz: tl.constexpr = (corner >> 2) & 1
        wx = dx * fx + (1 - dx) * (1.0 - fx)  # exact: one of the terms is zero
        wy = dy * fy + (1 - dy) * (1.0 - fy)
        wz = dz * fz + (1 - dz) * (1.0 - fz)
        ix = cx.to(tl.int64) + dx
        iy = cy.to(tl.int64) + dy
        iz = cz.to(tl.int64) + dz
        stride = (resolution + 1).to(tl.int64)
        dense_row = ix + iy * stride + iz * stride * stride
        # the hash in uint32 arithmetic (wraps mod 2**32, like Instant-NGP); equal to the int64 hash mod 2**T
        hx = ix.to(tl.uint32)
        hy = iy.to(tl.uint32) * 2654435761
        hz = iz.to(tl.uint32) * 805459861
        hashed_row = ((hx ^ hy ^ hz) & hash_mask.to(tl.uint32)).to(tl.int64)
        is_dense = tl.load(dense_ptr + level)
        row = tl.where(is_dense != 0, dense_row, hashed_row) + tl.load(off_ptr + level)
        return row, wx * wy * wz

    @triton.jit
    def _hash_forward_kernel(points_ptr, table_ptr, out_ptr, res_ptr, off_ptr, dense_ptr, n_points, hash_mask,
                             N_LEVELS: tl.constexpr, N_FEATURES: tl.constexpr, BLOCK: tl.constexpr):
        level = tl.program_id(0) % N_LEVELS  # the levels of a block of points run side by side (see LAUNCH)
        block = tl.program_id(0) // N_LEVELS
        rows = block * BLOCK + tl.arange(0, BLOCK)
        valid = rows < n_points
        rows64 = rows.to(tl.int64)
        px = tl.load(points_ptr + rows64 * 3 + 0, mask=valid, other=0.0)
        py = tl.load(points_ptr + rows64 * 3 + 1, mask=valid, other=0.0)
        pz = tl.load(points_ptr + rows64 * 3 + 2, mask=valid, other=0.0)
        columns = tl.arange(0, N_FEATURES)
        acc = tl.zeros((BLOCK, N_FEATURES), dtype=tl.float32)
        for corner in tl.static_range(8):
            row, weight = _level_vertex(px, py, pz, res_ptr, off_ptr, dense_ptr, level, hash_mask, corner)
            features = tl.load(table_ptr + row[:, None] * N_FEATURES + columns[None, :], mask=valid[:, None], other=0.0)
            acc += weight[:, None] * features.to(tl.float32)
        out_offsets = rows64[:, None] * (N_LEVELS * N_FEATURES) + level * N_FEATURES + columns[None, :]
        tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None])

    @triton.jit
    def _segment_sum(value_a, head_a, value_b, head_b):
        """Combine of a segmented prefix sum; ``head`` marks the first element of a segment."""
        return tl.where(head_b != 0, value_b, value_a + value_b), head_a | head_b

    @triton.jit
    def _hash_backward_kernel(points_ptr, grad_out_ptr, grad_table_ptr, res_ptr, off_ptr, dense_ptr, n_points, hash_mask,
                              N_LEVELS: tl.constexpr, N_FEATURES: tl.constexpr, BLOCK: tl.constexpr):
        level = tl.program_id(0) % N_LEVELS
        block = tl.program_id(0) // N_LEVELS
        lane = tl.arange(0, BLOCK)
        rows = block * BLOCK + lane
        valid = rows < n_points
        rows64 = rows.to(tl.int64)
        columns = tl.arange(0, N_FEATURES)
        grad_offsets = rows64[:, None] * (N_LEVELS * N_FEATURES) + level * N_FEATURES + columns[None, :]
        grad = tl.load(grad_out_ptr + grad_offsets, mask=valid[:, None], other=0.0).to(tl.float32)
        if tl.sum(tl.sum((grad != 0).to(tl.int32), axis=1), axis=0) == 0:  # NaN counts as non-zero: never dropped
            return  # nothing to add: a sample budget's padding (a fifth of the rows at its 1.25 margin) has zero gradient
        px = tl.load(points_ptr + rows64 * 3 + 0, mask=valid, other=0.0)
        py = tl.load(points_ptr + rows64 * 3 + 1, mask=valid, other=0.0)
        pz = tl.load(points_ptr + rows64 * 3 + 2, mask=valid, other=0.0)
        # the neighbors in the block: consecutive points (samples along a ray, a normal's finite-difference
        # probes) often share a table row at coarse levels, and a run of equal rows is summed here first,
        # so it costs one atomic add instead of one per point (atomics on one address serialize)
        has_prev = (lane > 0) & valid
        has_next = (lane < BLOCK - 1) & (rows + 1 < n_points)
        qx = tl.load(points_ptr + (rows64 - 1) * 3 + 0, mask=has_prev, other=0.0)
        qy = tl.load(points_ptr + (rows64 - 1) * 3 + 1, mask=has_prev, other=0.0)
        qz = tl.load(points_ptr + (rows64 - 1) * 3 + 2, mask=has_prev, other=0.0)
        sx = tl.load(points_ptr + (rows64 + 1) * 3 + 0, mask=has_next, other=0.0)
        sy = tl.load(points_ptr + (rows64 + 1) * 3 + 1, mask=has_next, other=0.0)
        sz = tl.load(points_ptr + (rows64 + 1) * 3 + 2, mask=has_next, other=0.0)
        for corner in tl.static_range(8):
            row, weight = _level_vertex(px, py, pz, res_ptr, off_ptr, dense_ptr, level, hash_mask, corner)
            prev_row, _ = _level_vertex(qx, qy, qz, res_ptr, off_ptr, dense_ptr, level, hash_mask, corner)
            next_row, _ = _level_vertex(sx, sy, sz, res_ptr, off_ptr, dense_ptr, level, hash_mask, corner)
            # not has_prev (no ~: triton 3.0's interpreter lacks it)
            head = ((row != prev_row) | (lane == 0) | (rows >= n_points)).to(tl.int32)
            tail = (row != next_row) | (lane == BLOCK - 1) | (rows + 1 >= n_points)  # not has_next
            value = weight[:, None] * grad
            heads = tl.broadcast_to(head[:, None], (BLOCK, N_FEATURES))
            run_sum, _ = tl.associative_scan((value, heads), 0, _segment_sum)
            tl.atomic_add(grad_table_ptr + row[:, None] * N_FEATURES + columns[None, :], run_sum,
                          mask=(valid & tail)[:, None], sem="relaxed")


_META_CACHE: dict[tuple, tuple[Tensor, Tensor, Tensor]] = {}


def _layout_tensors(layout: HashGridLayout, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    key = (layout, str(device))
    if key not in _META_CACHE:
        _META_CACHE[key] = (
            torch.tensor(layout.resolutions, dtype=torch.int32, device=device),
            torch.tensor(layout.offsets, dtype=torch.int64, device=device),
            torch.tensor([int(d) for d in layout.dense], dtype=torch.int32, device=device),
        )
    return _META_CACHE[key]


def _check_features(layout: HashGridLayout) -> None:
    f = layout.n_features
    if f & (f - 1):
        raise ValueError(f"the Triton hash grid needs a power-of-two n_features_per_level, got {f}")


def _output_dtype(table: Tensor) -> torch.dtype:
    """The features' dtype: the table's, or under CUDA autocast its half type (the MLP that reads them casts them
    so anyway, as tiny-cuda-nn keeps them: writing them in half and reading back half gradients saves two casts
    of [N, L * F] each way)."""
    if table.dtype == torch.float32 and table.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return table.dtype


class _HashGridFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, points: Tensor, table: Tensor, layout: HashGridLayout, reuse: Tensor | None) -> Tensor:  # type: ignore[override]
        points = points.contiguous().float()
        n = points.shape[0]
        res, off, dense = _layout_tensors(layout, points.device)
        # with ``reuse`` this lookup's values come from an earlier one: only the backward is left to do
        out = reuse if reuse is not None else torch.empty(n, layout.output_dim, device=points.device, dtype=_output_dtype(table))
        if n and reuse is None:
            block, warps = LAUNCH["forward"]
            grid = (triton.cdiv(n, block) * layout.n_levels,)
            _hash_forward_kernel[grid](points, table.contiguous(), out, res, off, dense, n, layout.hashmap_size - 1,
                                       N_LEVELS=layout.n_levels, N_FEATURES=layout.n_features, BLOCK=block,
                                       num_warps=warps)
        ctx.save_for_backward(points)
        ctx.layout = layout
        ctx.table_shape = table.shape
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        (points,) = ctx.saved_tensors
        layout: HashGridLayout = ctx.layout
        n = points.shape[0]
        res, off, dense = _layout_tensors(layout, points.device)
        grad_table = torch.zeros(ctx.table_shape, device=points.device, dtype=torch.float32)
        if n:
            block, warps = LAUNCH["backward"]
            grid = (triton.cdiv(n, block) * layout.n_levels,)
            _hash_backward_kernel[grid](points, grad_out.contiguous(), grad_table, res, off, dense, n,
                                        layout.hashmap_size - 1, N_LEVELS=layout.n_levels, N_FEATURES=layout.n_features,
                                        BLOCK=block, num_warps=warps)
        return None, grad_table, None, None


def hash_grid_encode_triton(points: Tensor, table: Tensor, layout: HashGridLayout, reuse: Tensor | None = None) -> Tensor:
    """Same result as ``hash_grid_encode`` (up to float rounding; in half under CUDA autocast); gradient for the table
    only. ``reuse``: this function's output for the same points and table from an earlier call, returned as the
    values (no gather) with the table gradient still computed in the backward, which needs only the points."""
    if triton is None:
        raise RuntimeError("triton is not installed: use the PyTorch hash grid (hash grid backend: torch)")
    if points.requires_grad:
        raise ValueError("the Triton hash grid gives no gradient for the points: use the torch backend for analytic normals")
    _check_features(layout)
    if reuse is not None and (reuse.shape != (points.shape[0], layout.output_dim) or reuse.dtype != _output_dtype(table)):
        raise ValueError(f"features to reuse must be [{points.shape[0]}, {layout.output_dim}] in {_output_dtype(table)}, "
                         f"got {list(reuse.shape)} in {reuse.dtype}")
    return _HashGridFunction.apply(points, table, layout, reuse)


def self_check(table: Tensor, layout: HashGridLayout, strict: bool = False, n_points: int = 4096) -> bool:
    """Compare the Triton path with the PyTorch path (values and table gradient) on random points.

    Returns True when they agree; otherwise logs why and returns False (or raises if ``strict``)."""
    try:
        if triton is None:
            raise RuntimeError("triton is not installed")
        _check_features(layout)
        # the first lookup may come from a no-grad or inference-mode caller (occupancy update, evaluation), or
        # under autocast (which would make the features half: compared here in float32)
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast(table.device.type, enabled=False):
            _compare(table, layout, n_points)
    except Exception as error:  # noqa: BLE001 - any failure means: use the reference path
        if strict:
            raise
        log.warning("Triton hash grid unavailable (%s); using the PyTorch path", error)
        return False
    log.info("hash grid: using the Triton kernels")
    return True


def _compare(table: Tensor, layout: HashGridLayout, n_points: int) -> None:
    """Raise if the Triton lookup and its table gradient differ from the PyTorch reference on random points."""
    generator = torch.Generator(device=table.device).manual_seed(0)
    points = torch.rand(n_points, 3, device=table.device, generator=generator)
    weights = torch.randn(n_points, layout.output_dim, device=table.device, generator=generator)
    probe = table.detach().float().clone().requires_grad_(True)
    fast = hash_grid_encode_triton(points, probe, layout)
    (grad_fast,) = torch.autograd.grad((fast * weights).sum(), probe)
    reference = hash_grid_encode(points, probe, layout)
    (grad_reference,) = torch.autograd.grad((reference * weights).sum(), probe)
    value_error = float((fast - reference).abs().max())
    grad_error = float((grad_fast - grad_reference).abs().max())
    scale = float(grad_reference.abs().max()) + 1e-12
    # float32 positions scaled to the finest level keep only ~2^-24 x resolution of their cell fraction, so
    # the two paths' interpolation weights may differ by that much (FMA vs separate multiply-add)
    weight_precision = 8.0 * 2.0**-24 * max(layout.resolutions)
    tolerance = 1e-4 + weight_precision
    if value_error > 1e-5 + tolerance * float(reference.abs().max()) or grad_error > tolerance * scale:
        raise RuntimeError(f"Triton and PyTorch hash grids disagree (value error {value_error:.3g}, "
                           f"gradient error {grad_error:.3g})")
