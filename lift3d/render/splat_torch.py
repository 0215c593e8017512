"""Pure-PyTorch tiled Gaussian rasterizer (CPU or GPU), numerically matching gsplat 1.5's classic mode.

Pipeline: ``project_gaussians`` (EWA + 0.3 px^2 dilation) -> ``bin_gaussians`` (each visible Gaussian
goes to every tile its bounding box touches, tiles list Gaussians front to back) -> ``composite``.
Compositing per pixel, front to back: ``alpha = min(0.999, o exp(-sigma))``; Gaussians with
``sigma < 0`` or ``alpha < 1/255`` are skipped; a pixel stops, exclusive of the Gaussian that would do
it, once its transmittance would fall to 1e-4 or below; ``out = sum w_i c_i + T_final * background``.

Memory stays bounded: tiles are processed in chunks of at most ``chunk_elements`` pixel x Gaussian
pairs (tiles sorted by how many Gaussians they hold, so padding is small), and the backward pass
recomputes each chunk and applies hand-derived gradients (``mode="custom"``). ``mode="autograd"``
runs the same chunks under plain autograd (keeps every chunk's intermediates; used to test the
hand-derived gradients and measured in benchmarks/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.render.splat_project import ALPHA_THRESHOLD, Projection

ALPHA_MAX = 0.999  # gsplat's clamp (the original 3DGS CUDA code uses 0.99)
T_MIN = 1e-4  # a pixel is finished once its transmittance would fall to this or below
S_MAX = 12.0  # cap on sigma - log(opacity) before exp(); exp(-12) is far below the 1/255 skip threshold


@dataclass
class TileBins:
    """Which Gaussians each tile composites, front to back, and the chunks tiles are processed in."""

    tile_size: int
    tiles_x: int
    tiles_y: int
    n_cameras: int
    flat_ids: Tensor  # [M] camera * N + gaussian, grouped by tile, front to back within a tile
    offsets: Tensor  # [C * tiles_y * tiles_x] start of each tile's run in flat_ids
    counts: Tensor  # [C * tiles_y * tiles_x] length of each tile's run
    chunks: list[tuple[Tensor, int]]  # (tile indices [n], padded Gaussians per tile K)


def bin_gaussians(proj: Projection, width: int, height: int, tile_size: int, chunk_elements: int) -> TileBins:
    """Assign visible Gaussians to tiles, sorted by depth within each tile (ties: lower index first)."""
    C, N = proj.depths.shape
    device = proj.depths.device
    tiles_x, tiles_y = -(-width // tile_size), -(-height // tile_size)
    n_tiles = C * tiles_x * tiles_y
    with torch.no_grad():
        cam, gid = torch.nonzero(proj.visible, as_tuple=True)
        order = torch.argsort(proj.depths[cam, gid], stable=True)
        cam, gid = cam[order], gid[order]
        mean = proj.means2d[cam, gid].detach()
        radius = proj.radii[cam, gid].to(mean.dtype)
        lo = torch.floor((mean - radius) / tile_size).long()
        hi = torch.ceil((mean + radius) / tile_size).long()
        lo[:, 0].clamp_(0, tiles_x), hi[:, 0].clamp_(0, tiles_x)
        lo[:, 1].clamp_(0, tiles_y), hi[:, 1].clamp_(0, tiles_y)
        span = (hi - lo).clamp_min(0)
        per_gaussian = span[:, 0] * span[:, 1]
        owner = torch.repeat_interleave(torch.arange(len(cam), device=device), per_gaussian)
        first = torch.cumsum(per_gaussian, 0) - per_gaussian
        local = torch.arange(len(owner), device=device) - first[owner]
        width_in_tiles = span[owner, 0]
        tx = lo[owner, 0] + local % width_in_tiles.clamp_min(1)
        ty = lo[owner, 1] + local // width_in_tiles.clamp_min(1)
        tile = (cam[owner] * tiles_y + ty) * tiles_x + tx
        tile, by_tile = torch.sort(tile, stable=True)
        flat_ids = (cam * N + gid)[owner[by_tile]]
        counts = torch.bincount(tile, minlength=n_tiles)
        offsets = torch.cumsum(counts, 0) - counts
        chunks = _plan_chunks(counts, tile_size * tile_size, chunk_elements)
    return TileBins(tile_size, tiles_x, tiles_y, C, flat_ids, offsets, counts, chunks)


def _plan_chunks(counts: Tensor, pixels_per_tile: int, chunk_elements: int) -> list[tuple[Tensor, int]]:
    """Group non-empty tiles, sorted by count, so each chunk holds <= chunk_elements pixel-Gaussian pairs."""
    occupied = torch.nonzero(counts > 0).squeeze(1)
    if len(occupied) == 0:
        return []
    sorted_counts, order = torch.sort(counts[occupied])
    tiles, values = occupied[order], sorted_counts.tolist()
    chunks, start = [], 0
    for end in range(1, len(values) + 1):
        if end == len(values) or (end + 1 - start) * pixels_per_tile * values[end] > chunk_elements:
            chunks.append((tiles[start:end], int(values[end - 1])))
            start = end
    return chunks


def _tile_origins(tiles: Tensor, bins: TileBins, dtype: torch.dtype) -> Tensor:
    """Top-left pixel corner [n, 2] (x, y) of each of ``tiles``."""
    per_camera = bins.tiles_x * bins.tiles_y
    rest = tiles % per_camera
    return torch.stack([rest % bins.tiles_x, rest // bins.tiles_x], dim=-1).to(dtype) * bins.tile_size


def _pixel_features(tile_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[P, 6] monomials (1, u, v, u^2, uv, v^2) of the tile-local pixel centres, row-major in a tile."""
    local = torch.arange(tile_size * tile_size, device=device)
    u, v = (local % tile_size).to(dtype) + 0.5, (local // tile_size).to(dtype) + 0.5
    return torch.stack([torch.ones_like(u), u, v, u * u, u * v, v * v], dim=-1)


def _gather(bins: TileBins, tiles: Tensor, K: int) -> tuple[Tensor, Tensor]:
    """Flat Gaussian ids [n, K] of each tile's list (padded) and the mask of real entries."""
    rank = torch.arange(K, device=tiles.device)
    valid = rank[None] < bins.counts[tiles][:, None]
    index = (bins.offsets[tiles][:, None] + rank[None]).clamp_max(max(len(bins.flat_ids) - 1, 0))
    return bins.flat_ids[index], valid


def _quadratic(mean: Tensor, conic: Tensor, opacity: Tensor, origin: Tensor) -> Tensor:
    """[n, K, 6] coefficients q with ``q . (1, u, v, u^2, uv, v^2) = sigma - log(opacity)``.

    sigma = 1/2 d^T [[a, b], [b, c]] d with d = (u, v) - (mean - origin), in tile-local coordinates so
    the expansion stays accurate in float32; alpha = exp(-(sigma - log o)) before the clamp."""
    mu, mv = (mean - origin[:, None, :]).unbind(-1)
    a, b, c = conic.unbind(-1)
    log_o = torch.log(opacity.clamp_min(1e-30))  # padded entries have opacity 0: alpha ~1e-30, never used
    q0 = 0.5 * a * mu * mu + b * mu * mv + 0.5 * c * mv * mv - log_o
    return torch.stack([q0, -(a * mu + b * mv), -(c * mv + b * mu), 0.5 * a, b, 0.5 * c], dim=-1)


def _alphas_autograd(features: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """Composited alpha [n, P, K] (0 where skipped or after the pixel finished) and the transmittance in
    front of each Gaussian, as differentiable tensor operations (the reference for the fast path).

    sigma >= 0 always holds (the dilated 2D covariance is positive definite), so gsplat's ``sigma < 0``
    skip never triggers and is not tested (the quadratic expansion may round sigma to -1e-7 at a centre).
    The exponent is capped at S_MAX: any alpha it changes is far below the 1/255 skip threshold anyway,
    and the cap keeps exp() out of slow denormal numbers."""
    alpha = torch.exp(-torch.matmul(features, q.transpose(1, 2)).clamp(max=S_MAX)).clamp(max=ALPHA_MAX)
    alpha = torch.where(alpha >= ALPHA_THRESHOLD, alpha, torch.zeros_like(alpha))
    trans = torch.cumprod(1 - alpha, dim=-1)  # the true transmittance wherever the pixel is not finished
    before = torch.cat([torch.ones_like(trans[..., :1]), trans[..., :-1]], dim=-1)
    return torch.where(trans > T_MIN, alpha, torch.zeros_like(alpha)), before


@torch.no_grad()
def _alphas_fast(features: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """``_alphas_autograd`` with in-place operations (no autograd), for the custom backward path."""
    alpha = torch.matmul(features, q.transpose(1, 2)).clamp_(max=S_MAX).neg_().exp_().clamp_(max=ALPHA_MAX)
    torch.nn.functional.threshold(alpha, _just_below(ALPHA_THRESHOLD, alpha.dtype), 0.0, inplace=True)
    trans = torch.rsub(alpha, 1.0).cumprod_(dim=-1)
    alpha.masked_fill_(trans <= T_MIN, 0.0)
    before = torch.cat([torch.ones_like(trans[..., :1]), trans[..., :-1]], dim=-1)
    return alpha, before


def _just_below(value: float, dtype: torch.dtype) -> float:
    """The largest number of ``dtype`` below ``value`` (so ``x > it`` means ``x >= value``)."""
    v = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(v, torch.zeros_like(v)))


def _composite_chunk(features: Tensor, q: Tensor, color: Tensor, fast: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Accumulated colours [n, P, D] (no background), final transmittance [n, P], and (alpha, before)."""
    a, before = _alphas_fast(features, q) if fast else _alphas_autograd(features, q)
    w = a * before
    return torch.matmul(w, color), 1 - w.sum(-1), a, before


@torch.no_grad()
def _backward_chunk(features, a, before, color, g_acc, g_final) -> tuple[Tensor, Tensor]:
    """dL/dq [n, K, 6] and dL/dcolor [n, K, D] of one chunk by the chain rule.

    With w_k = a_k T_k and T_k = prod_{j<k} (1 - a_j): out = sum_k w_k c_k + T_final bg, so
    dL/da_k = T_k (c_k . g) - (sum_{j>k} w_j (c_j . g) + T_final dL/dT_final) / (1 - a_k).
    ``g_acc`` [n, P, D] is dL/d(accumulated colour), ``g_final`` [n, P] dL/d(final transmittance)."""
    w = a * before
    final = 1 - w.sum(-1, keepdim=True)
    g_color = torch.matmul(w.transpose(1, 2), g_acc)
    g_a = torch.matmul(g_acc, color.transpose(1, 2))  # c_k . g, [n, P, K]
    behind = w.mul_(g_a)  # reuses w: contributions w_k (c_k . g)
    total = behind.sum(-1, keepdim=True)
    behind = torch.sub(total, behind.cumsum_(dim=-1), out=behind)  # sum over the Gaussians further back
    behind.add_(final * g_final[..., None]).div_(torch.rsub(a, 1.0))
    g_a.mul_(before).sub_(behind)
    # alpha = o exp(-sigma) unless clamped: d alpha / d(sigma - log o) = -alpha
    g_a.mul_(a.masked_fill(a >= ALPHA_MAX, 0.0))
    return -torch.matmul(g_a.transpose(1, 2), features), g_color


def _to_image(tiles_data: Tensor, bins: TileBins, width: int, height: int) -> Tensor:
    """[C * tiles, P, D] tile layout -> [C, H, W, D] image."""
    ts, D = bins.tile_size, tiles_data.shape[-1]
    image = tiles_data.reshape(bins.n_cameras, bins.tiles_y, bins.tiles_x, ts, ts, D).permute(0, 1, 3, 2, 4, 5)
    return image.reshape(bins.n_cameras, bins.tiles_y * ts, bins.tiles_x * ts, D)[:, :height, :width]


def _to_tiles(image: Tensor, bins: TileBins) -> Tensor:
    """[C, H, W, D] image -> [C * tiles, P, D] tile layout (zero-padded at the borders)."""
    ts, (C, H, W, D) = bins.tile_size, image.shape
    padded = image.new_zeros(C, bins.tiles_y * ts, bins.tiles_x * ts, D)
    padded[:, :H, :W] = image
    tiles = padded.reshape(C, bins.tiles_y, ts, bins.tiles_x, ts, D).permute(0, 1, 3, 2, 4, 5)
    return tiles.reshape(C * bins.tiles_y * bins.tiles_x, ts * ts, D)


def _flat(means2d, conics, opacities, colors):
    C, N = opacities.shape
    return means2d.reshape(C * N, 2), conics.reshape(C * N, 3), opacities.reshape(C * N), colors.reshape(C * N, -1)


def _chunk_inputs(bins: TileBins, tiles: Tensor, K: int, flat: tuple[Tensor, ...]):
    """Gathered per-tile inputs of one chunk: ids [n, K], (mean, conic, opacity, origin), colours."""
    ids, valid = _gather(bins, tiles, K)
    means2d, conics, opacities, colors = flat
    opacity = torch.where(valid, opacities[ids], torch.zeros_like(opacities[ids]))
    origin = _tile_origins(tiles, bins, means2d.dtype)
    return ids, (means2d[ids], conics[ids], opacity, origin), colors[ids]


class _Composite(torch.autograd.Function):
    """Chunked compositing with a hand-derived backward. Per-chunk (alpha, transmittance) are kept for
    backward while they fit in ``save_elements``; chunks beyond that are recomputed, so memory stays
    bounded by one chunk plus the budget."""

    @staticmethod
    def forward(ctx, means2d, conics, opacities, colors, backgrounds, bins: TileBins, width: int, height: int,
                save_elements: int):
        flat = _flat(means2d, conics, opacities, colors)
        features = _pixel_features(bins.tile_size, colors.dtype, colors.device)
        n_tiles, P, D = bins.n_cameras * bins.tiles_x * bins.tiles_y, bins.tile_size**2, colors.shape[-1]
        acc, final = colors.new_zeros(n_tiles, P, D), colors.new_ones(n_tiles, P)
        saved, budget = [], save_elements
        for tiles, K in bins.chunks:
            _, geometry, color = _chunk_inputs(bins, tiles, K, flat)
            acc[tiles], final[tiles], a, before = _composite_chunk(features, _quadratic(*geometry), color, fast=True)
            keep = a.numel() <= budget
            budget -= a.numel() if keep else 0
            saved.append((a, before) if keep else None)
        acc, final = _to_image(acc, bins, width, height), _to_image(final[..., None], bins, width, height)
        ctx.save_for_backward(means2d, conics, opacities, colors, backgrounds, final)
        ctx.bins, ctx.saved_chunks = bins, saved
        return acc + final * backgrounds[:, None, None, :], 1 - final

    @staticmethod
    def backward(ctx, g_render, g_alpha):
        means2d, conics, opacities, colors, backgrounds, final = ctx.saved_tensors
        bins: TileBins = ctx.bins
        g_background = (g_render * final).sum(dim=(1, 2))
        # T_final enters the render through T * background and the alpha through 1 - T
        g_final_image = (g_render * backgrounds[:, None, None, :]).sum(-1, keepdim=True) - g_alpha
        g_acc_tiles, g_final_tiles = _to_tiles(g_render, bins), _to_tiles(g_final_image, bins)[..., 0]
        flat = _flat(means2d, conics, opacities, colors)
        features = _pixel_features(bins.tile_size, colors.dtype, colors.device)
        grads = [torch.zeros_like(t) for t in flat]
        for (tiles, K), saved in zip(bins.chunks, ctx.saved_chunks):
            ids, geometry, color = _chunk_inputs(bins, tiles, K, flat)
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(i < 3) for i, t in enumerate(geometry)]
                q = _quadratic(*leaves)
            a, before = saved if saved is not None else _alphas_fast(features, q.detach())
            g_q, g_color = _backward_chunk(features, a, before, color, g_acc_tiles[tiles], g_final_tiles[tiles])
            g_geometry = torch.autograd.grad(q, leaves[:3], g_q)
            for total, g in zip(grads, (*g_geometry, g_color)):
                total.index_add_(0, ids.reshape(-1), g.reshape(ids.numel(), *g.shape[2:]))
        ctx.saved_chunks = None
        shape = opacities.shape
        return (grads[0].reshape(*shape, 2), grads[1].reshape(*shape, 3), grads[2].reshape(shape),
                grads[3].reshape(*shape, -1), g_background, None, None, None, None)


def _composite_autograd(means2d, conics, opacities, colors, backgrounds, bins: TileBins, width: int, height: int):
    """The same chunks under plain autograd (intermediates of every chunk are kept for backward)."""
    flat = _flat(means2d, conics, opacities, colors)
    features = _pixel_features(bins.tile_size, colors.dtype, colors.device)
    n_tiles, P, D = bins.n_cameras * bins.tiles_x * bins.tiles_y, bins.tile_size**2, colors.shape[-1]
    acc, final = colors.new_zeros(n_tiles, P, D), colors.new_ones(n_tiles, P)
    if bins.chunks:
        tiles = torch.cat([t for t, _ in bins.chunks])
        parts = []
        for t, K in bins.chunks:
            _, geometry, color = _chunk_inputs(bins, t, K, flat)
            parts.append(_composite_chunk(features, _quadratic(*geometry), color, fast=False))
        acc = acc.index_copy(0, tiles, torch.cat([p[0] for p in parts]))
        final = final.index_copy(0, tiles, torch.cat([p[1] for p in parts]))
    acc, final = _to_image(acc, bins, width, height), _to_image(final[..., None], bins, width, height)
    return acc + final * backgrounds[:, None, None, :], 1 - final


def composite(
    means2d: Tensor,  # [C, N, 2]
    conics: Tensor,  # [C, N, 3]
    opacities: Tensor,  # [C, N]
    colors: Tensor,  # [C, N, D]
    backgrounds: Tensor,  # [C, D]
    bins: TileBins,
    width: int,
    height: int,
    mode: str = "custom",
    save_elements: int = 1 << 26,
) -> tuple[Tensor, Tensor]:
    """Front-to-back alpha compositing: (render [C, H, W, D] over the backgrounds, alpha [C, H, W, 1]).

    ``mode="custom"`` keeps at most ``save_elements`` pixel x Gaussian pairs of intermediates for the
    backward pass (2 numbers each) and recomputes the rest; ``mode="autograd"`` keeps everything."""
    if mode == "custom":
        return _Composite.apply(means2d, conics, opacities, colors, backgrounds, bins, width, height, save_elements)
    if mode == "autograd":
        return _composite_autograd(means2d, conics, opacities, colors, backgrounds, bins, width, height)
    raise ValueError(f"compositing mode must be 'custom' or 'autograd', got {mode!r}")


def rasterize_torch(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] wxyz, any norm
    scales: Tensor,  # [N, 3] activated
    opacities: Tensor,  # [N] activated
    colors: Tensor,  # [N, K, 3] SH coefficients when sh_degree is set, else [N, D] or [C, N, D] colours
    viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV axes
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    backgrounds: Tensor,  # [C, D]
    sh_degree: int | None = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    chunk_elements: int = 1 << 22,
    mode: str = "custom",
    save_elements: int = 1 << 26,
) -> dict[str, Tensor]:
    """Render C views; returns colours+depth ``render`` [C, H, W, D+1] (depth accumulated, not yet
    normalised), ``alpha`` [C, H, W, 1], ``means2d`` [C, N, 2], ``radii`` [C, N, 2], ``depths`` [C, N]."""
    from lift3d.gaussians.sh import sh_to_color
    from lift3d.render.splat_project import covariance_3d, project_gaussians

    proj = project_gaussians(means, covariance_3d(quats, scales), opacities, viewmats, Ks, width, height,
                             eps2d=eps2d, near_plane=near_plane, far_plane=far_plane)
    C = viewmats.shape[0]
    if sh_degree is not None:
        campos = torch.linalg.inv(viewmats)[:, None, :3, 3]  # [C, 1, 3]
        rgb = sh_to_color(sh_degree, colors[None], means[None] - campos)  # [C, N, 3]
    else:
        rgb = colors.expand(C, *colors.shape[-2:]) if colors.ndim == 2 else colors
    features = torch.cat([rgb, proj.depths[..., None]], dim=-1)
    backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], dim=-1)
    bins = bin_gaussians(proj, width, height, tile_size, chunk_elements)
    opacity = opacities[None].expand(C, -1)
    render, alpha = composite(proj.means2d, proj.conics, opacity, features, backgrounds, bins, width, height, mode,
                              save_elements)
    return {"render": render, "alpha": alpha, "means2d": proj.means2d, "radii": proj.radii, "depths": proj.depths}
