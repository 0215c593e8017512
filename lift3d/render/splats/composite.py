"""Front-to-back alpha compositing of binned Gaussians, with gsplat 1.5's rules, in plain PyTorch.

Per pixel, Gaussians in depth order: ``alpha = min(0.999, o exp(-sigma))``; those with alpha < 1/255
are skipped; a pixel finishes, exclusive of the Gaussian that would do it, once its transmittance
would fall to 1e-4 or below; ``out = sum_k w_k c_k + T_final background`` with ``w_k = a_k T_k``.

Work is done per chunk of tiles (``render.splats.bins``) and, within a chunk, in depth blocks: tiles whose
pixels have all finished stop early, which skips most of the hidden Gaussians of opaque scenes. The
fast path (``mode="custom"``) is a ``torch.autograd.Function`` with hand-derived gradients that keeps
(alpha, transmittance) of blocks for the backward pass while they fit in ``save_elements`` and
recomputes the rest, so memory stays bounded. ``mode="autograd"`` composites each chunk in one piece
with differentiable tensor operations: it is the reference the tests compare the fast path with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.render.splats.bins import TileBins, tile_lists, tile_origins, to_image, to_tiles
from lift3d.render.splats.project import ALPHA_THRESHOLD, exact_float32_matmuls

ALPHA_MAX = 0.999  # gsplat's clamp (the original 3DGS CUDA code uses 0.99)
T_MIN = 1e-4  # a pixel is finished once its transmittance would fall to this or below
S_MAX = 12.0  # cap on sigma - log(opacity) before exp(): exp(-12) is far below 1/255 and no denormals appear
BLOCK_ELEMENTS = 1 << 17  # a depth block covers about this many pixel x Gaussian pairs
MIN_BLOCK = 32  # ... and at least this many Gaussians


def pixel_features(tile_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[P, 6] monomials (1, u, v, u^2, uv, v^2) of the tile-local pixel centers, row-major in a tile."""
    local = torch.arange(tile_size * tile_size, device=device)
    u, v = (local % tile_size).to(dtype) + 0.5, (local // tile_size).to(dtype) + 0.5
    return torch.stack([torch.ones_like(u), u, v, u * u, u * v, v * v], dim=-1)


def quadratic(mean: Tensor, conic: Tensor, opacity: Tensor, origin: Tensor) -> Tensor:
    """[..., 6] coefficients q with ``q . (1, u, v, u^2, uv, v^2) = sigma - log(opacity)``.

    sigma = 1/2 d^T [[a, b], [b, c]] d with d = (u, v) - (mean - origin), in tile-local coordinates so
    the expansion stays accurate in float32; then alpha = exp(-(sigma - log o)) before the clamp.
    sigma >= 0 always (the dilated 2D covariance is positive definite), so gsplat's ``sigma < 0`` skip
    never triggers and is not tested (the expansion may round sigma to -1e-7 at a center)."""
    mu, mv = (mean - origin).unbind(-1)
    a, b, c = conic.unbind(-1)
    q0 = 0.5 * a * mu * mu + b * mu * mv + 0.5 * c * mv * mv - torch.log(opacity)
    return torch.stack([q0, -(a * mu + b * mv), -(c * mv + b * mu), 0.5 * a, b, 0.5 * c], dim=-1)


def intersection_quadratics(bins: TileBins, means2d: Tensor, conics: Tensor, opacities: Tensor) -> Tensor:
    """q [M + 1, 6] of every (tile, Gaussian) entry of the bins, plus a last row that gives alpha 0
    (tile lists are padded with it). Inputs are flat over cameras: [C*N, 2], [C*N, 3], [C*N]."""
    ids = bins.flat_ids
    q = quadratic(means2d[ids], conics[ids], opacities[ids], tile_origins(bins.tile_of, bins, means2d.dtype))
    pad = q.new_zeros(1, 6)
    pad[0, 0] = S_MAX + 1.0
    return torch.cat([q, pad])


_THRESHOLDS: dict[torch.dtype, float] = {}


def _below_threshold(dtype: torch.dtype) -> float:
    """The largest ``dtype`` number below 1/255, so ``alpha > it`` means ``alpha >= 1/255`` (cached)."""
    if dtype not in _THRESHOLDS:
        v = torch.tensor(ALPHA_THRESHOLD, dtype=dtype)
        _THRESHOLDS[dtype] = float(torch.nextafter(v, torch.zeros_like(v)))
    return _THRESHOLDS[dtype]


# ---------------------------------------------------------------------------------------------------
# reference: one chunk in one piece, differentiable by autograd


def _exponents(features: Tensor, q: Tensor) -> Tensor:
    """sigma - log(opacity) [n, K, P] for every Gaussian of a tile list and pixel of the tile (one GEMM)."""
    n, K = q.shape[:2]
    return (q.reshape(n * K, 6) @ features.T).reshape(n, K, features.shape[0])


def composite_chunk_reference(features: Tensor, q: Tensor, color: Tensor) -> tuple[Tensor, Tensor]:
    """Accumulated color [n, P, D] (no background) and final transmittance [n, P] of a chunk."""
    alpha = torch.exp(-_exponents(features, q).clamp(max=S_MAX)).clamp(max=ALPHA_MAX)  # [n, K, P]
    alpha = torch.where(alpha >= ALPHA_THRESHOLD, alpha, torch.zeros_like(alpha))
    trans = torch.cumprod(1 - alpha, dim=1)  # the true transmittance wherever the pixel is not finished
    before = torch.cat([torch.ones_like(trans[:, :1]), trans[:, :-1]], dim=1)
    w = torch.where(trans > T_MIN, alpha, torch.zeros_like(alpha)) * before
    return torch.bmm(w.transpose(1, 2), color), 1 - w.sum(1)


# ---------------------------------------------------------------------------------------------------
# fast path: depth blocks with early termination, hand-derived backward


@dataclass
class _Block:
    """One depth block of a chunk: rows (tiles) still running, Gaussian range, state on entry."""

    rows: Tensor  # [m] chunk rows processed
    start: int
    stop: int
    t_in: Tensor  # [m, P] transmittance in front of the block
    done: Tensor  # [m, P] pixels already finished
    a: Tensor | None = None  # [m, b, P] composited alphas (kept when within the save budget)
    before: Tensor | None = None  # [m, b, P] transmittance in front of each Gaussian


@torch.no_grad()
def _block_alphas(features: Tensor, q: Tensor, t_in: Tensor, done: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Composited alpha and transmittance in front of each Gaussian [m, b, P], and after the block [m, P]
    (what it would be without stopping; <= T_MIN exactly when a pixel finished in this block)."""
    alpha = _exponents(features, q).clamp_(max=S_MAX).neg_().exp_().clamp_(max=ALPHA_MAX)
    torch.nn.functional.threshold(alpha, _below_threshold(alpha.dtype), 0.0, inplace=True)
    m, b, P = alpha.shape
    trans = alpha.new_empty(m, b + 1, P)  # trans[:, k] = t_in * prod_{j<k} (1 - alpha_j)
    trans[:, 0] = t_in
    torch.sub(1.0, alpha, out=trans[:, 1:])
    trans.cumprod_(dim=1)
    alpha.masked_fill_((trans[:, 1:] <= T_MIN) | done[:, None], 0.0)
    return alpha, trans[:, :-1], trans[:, -1]


@torch.no_grad()
def _forward_chunk(features: Tensor, q: Tensor, color: Tensor, counts: Tensor, outside: Tensor,
                   budget: list[int]) -> tuple[Tensor, Tensor, list[_Block]]:
    """Accumulated color [n, P, D], final transmittance [n, P] and the blocks (for backward)."""
    n, K = q.shape[:2]
    P = features.shape[0]
    acc = color.new_zeros(n, P, color.shape[-1])
    trans, done = color.new_ones(n, P), outside.clone()
    rows = torch.arange(n, device=q.device)
    size = min(K, max(MIN_BLOCK, BLOCK_ELEMENTS // max(n * P, 1)))
    blocks = []
    for start in range(0, K, size):
        stop = min(start + size, K)
        t_in, d_in = trans[rows], done[rows]
        a, before, last = _block_alphas(features, q[rows, start:stop], t_in, d_in)
        w = a * before
        acc.index_add_(0, rows, torch.bmm(w.transpose(1, 2), color[rows, start:stop]))
        trans[rows] = t_in - w.sum(1)
        done[rows] = d_in | (last <= T_MIN)
        keep = a.numel() <= budget[0]
        budget[0] -= a.numel() if keep else 0
        blocks.append(_Block(rows, start, stop, t_in, d_in, a if keep else None, before if keep else None))
        rows = rows[~done[rows].all(-1) & (counts[rows] > stop)]
        if len(rows) == 0:
            break
    return acc, trans, blocks


def abs_gradient_features(features: Tensor) -> Tensor:
    """[6, 2P]: ``q @ it`` gives (a dx + b dy, b dx + c dy) at each pixel of the tile (dx, dy: the pixel minus the
    center), the derivative of sigma by the pixel, whose absolute value times |dL/dsigma| is the absolute per-pixel
    gradient of the 2D mean (gsplat's ``absgrad``)."""
    _, u, v = features[:, 0], features[:, 1], features[:, 2]
    zero, one = torch.zeros_like(u), torch.ones_like(u)
    x = torch.stack([zero, one, zero, 2 * u, v, zero])  # q1 + 2 q3 u + q4 v
    y = torch.stack([zero, zero, one, zero, u, 2 * v])  # q2 + q4 u + 2 q5 v
    return torch.cat([x, y], dim=1)


@torch.no_grad()
def _backward_chunk(features: Tensor, q: Tensor, color: Tensor, blocks: list[_Block], g_acc: Tensor,
                    g_final: Tensor, final: Tensor, abs_features: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """dL/dq [n, K, 6], dL/dcolor [n, K, D] and, with ``abs_features``, the absolute per-pixel gradients of the 2D
    means summed over the tile [n, K, 2] (else None), back to front over the blocks.

    With w_k = a_k T_k, T_k = prod_{j<k} (1 - a_j) and out = sum_k w_k c_k + T_final bg:
    dL/da_k = T_k (c_k . g) - (sum_{j>k} w_j (c_j . g) + T_final dL/dT_final) / (1 - a_k).
    ``g_acc`` [n, P, D] is dL/d(accumulated color), ``g_final`` [n, P] is dL/dT_final."""
    g_q, g_color = torch.zeros_like(q), torch.zeros_like(color)
    g_abs = q.new_zeros(q.shape[:2] + (2,)) if abs_features is not None else None
    later = final.new_zeros(final.shape)  # sum of w (c . g) over the blocks behind
    final_term = final * g_final
    for block in reversed(blocks):
        rows, s, e = block.rows, block.start, block.stop
        qb, cb = q[rows, s:e], color[rows, s:e]
        if block.a is None:
            a, before, _ = _block_alphas(features, qb, block.t_in, block.done)
        else:
            a, before = block.a, block.before
        g = g_acc[rows]
        w = a * before
        g_color[rows, s:e] = torch.bmm(w, g)
        g_a = torch.bmm(cb, g.transpose(1, 2))  # c_k . g  [m, b, P]
        contrib = w.mul_(g_a)
        total = contrib.sum(1)
        behind = torch.sub((later[rows] + total + final_term[rows])[:, None], contrib.cumsum_(dim=1), out=contrib)
        behind.div_(torch.rsub(a, 1.0))
        g_a.mul_(before).sub_(behind)
        g_a.mul_(a.masked_fill(a >= ALPHA_MAX, 0.0))  # d alpha / d(sigma - log o) = -alpha unless clamped
        m, b = g_a.shape[:2]
        g_q[rows, s:e] = -(g_a.reshape(m * b, -1) @ features).reshape(m, b, 6)
        if g_abs is not None:
            slopes = (qb.reshape(m * b, 6) @ abs_features).abs_().reshape(m * b, 2, -1)
            g_abs[rows, s:e] = (slopes * g_a.abs().reshape(m * b, 1, -1)).sum(-1).reshape(m, b, 2)
        later[rows] += total
    return g_q, g_color, g_abs


def _flat(means2d: Tensor, conics: Tensor, opacities: Tensor, colors: Tensor) -> tuple[Tensor, ...]:
    C, N = opacities.shape
    return means2d.reshape(C * N, 2), conics.reshape(C * N, 3), opacities.reshape(C * N), colors.reshape(C * N, -1)


def _padded_ids(bins: TileBins) -> Tensor:
    """flat_ids plus one entry for the padding row (any valid id: its weight is always 0)."""
    return torch.cat([bins.flat_ids, bins.flat_ids.new_zeros(1)])


def _outside(tiles: Tensor, bins: TileBins, width: int, height: int, features: Tensor) -> Tensor:
    """[n, P] pixels of border tiles that lie beyond the image (treated as finished from the start)."""
    origin = tile_origins(tiles, bins, features.dtype)
    return ((origin[:, None, 0] + features[None, :, 1]) > width) | ((origin[:, None, 1] + features[None, :, 2]) > height)


def _composite_inputs(means2d: Tensor, conics: Tensor, opacities: Tensor, colors: Tensor,
                      bins: TileBins) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """What both compositing paths start from: every intersection's quadratic and color, the pixel features, and
    the empty accumulators (color [tiles, P, D] at 0, transmittance [tiles, P] at 1)."""
    means2d_f, conics_f, opacities_f, colors_f = _flat(means2d, conics, opacities, colors)
    q_all = intersection_quadratics(bins, means2d_f, conics_f, opacities_f)
    color_all = colors_f[_padded_ids(bins)]
    features = pixel_features(bins.tile_size, colors.dtype, colors.device)
    n_tiles, P, D = bins.n_cameras * bins.tiles_x * bins.tiles_y, bins.tile_size**2, colors.shape[-1]
    return q_all, color_all, features, colors.new_zeros(n_tiles, P, D), colors.new_ones(n_tiles, P)


class _Composite(torch.autograd.Function):
    """Chunked, depth-blocked compositing with a hand-derived backward (memory bounded)."""

    @staticmethod
    def forward(ctx, means2d, conics, opacities, colors, backgrounds, bins: TileBins, width: int, height: int,
                save_elements: int, absgrad: bool = False):
        q_all, color_all, features, acc, final = _composite_inputs(means2d, conics, opacities, colors, bins)
        budget, chunk_blocks = [save_elements], []
        for tiles, K in bins.chunks:
            index = tile_lists(bins, tiles, K)
            outside = _outside(tiles, bins, width, height, features)
            acc[tiles], final[tiles], blocks = _forward_chunk(features, q_all[index], color_all[index],
                                                              bins.counts[tiles], outside, budget)
            chunk_blocks.append(blocks)
        acc, final = to_image(acc, bins, width, height), to_image(final[..., None], bins, width, height)
        ctx.save_for_backward(means2d, conics, opacities, colors, backgrounds, final, q_all)
        ctx.bins, ctx.chunk_blocks, ctx.absgrad = bins, chunk_blocks, absgrad
        return acc + final * backgrounds[:, None, None, :], 1 - final

    @staticmethod
    @exact_float32_matmuls()  # autograd runs the backward outside the forward's context
    def backward(ctx, g_render, g_alpha):
        means2d, conics, opacities, colors, backgrounds, final, q_all = ctx.saved_tensors
        bins: TileBins = ctx.bins
        g_background = (g_render * final).sum(dim=(1, 2))
        # T_final enters the render through T * background and the alpha through 1 - T
        g_final_image = (g_render * backgrounds[:, None, None, :]).sum(-1, keepdim=True) - g_alpha
        g_acc_tiles, g_final_tiles = to_tiles(g_render, bins), to_tiles(g_final_image, bins)[..., 0]
        final_tiles = to_tiles(final, bins)[..., 0]
        features = pixel_features(bins.tile_size, colors.dtype, colors.device)
        padded = _padded_ids(bins)
        color_all = colors.reshape(-1, colors.shape[-1])[padded]
        g_q_all, g_color_all = torch.zeros_like(q_all), torch.zeros_like(color_all)
        abs_features = abs_gradient_features(features) if ctx.absgrad else None
        g_abs_all = q_all.new_zeros(len(q_all), 2) if ctx.absgrad else None
        for (tiles, K), blocks in zip(bins.chunks, ctx.chunk_blocks):
            index = tile_lists(bins, tiles, K)
            g_q, g_color, g_abs = _backward_chunk(features, q_all[index], color_all[index], blocks, g_acc_tiles[tiles],
                                                  g_final_tiles[tiles], final_tiles[tiles], abs_features)
            g_q_all.index_add_(0, index.reshape(-1), g_q.reshape(-1, 6))
            g_color_all.index_add_(0, index.reshape(-1), g_color.reshape(-1, g_color.shape[-1]))
            if g_abs is not None:
                g_abs_all.index_add_(0, index.reshape(-1), g_abs.reshape(-1, 2))
        # chain q back to each entry's 2D mean, conic and opacity, then sum entries per Gaussian with
        # index_add_ (deterministic on CPU, unlike the backward of an indexing gather)
        ids = bins.flat_ids
        with torch.enable_grad():
            leaves = [t.detach()[ids].requires_grad_() for t in _flat(means2d, conics, opacities, colors)[:3]]
            q = quadratic(*leaves, tile_origins(bins.tile_of, bins, means2d.dtype))
            entry_grads = torch.autograd.grad(q, leaves, g_q_all[:-1])
        flat_grads = [torch.zeros_like(t) for t in _flat(means2d, conics, opacities, colors)]
        for total, g in zip(flat_grads, (*entry_grads, g_color_all[:-1])):
            total.index_add_(0, ids, g)
        shape = opacities.shape
        if g_abs_all is not None:  # as gsplat: an attribute of the 2D means tensor the caller holds
            absgrad = torch.zeros_like(flat_grads[0]).index_add_(0, ids, g_abs_all[:-1]).reshape(*shape, 2)
            means2d.absgrad = absgrad if getattr(means2d, "absgrad", None) is None else means2d.absgrad + absgrad
        return (flat_grads[0].reshape(*shape, 2), flat_grads[1].reshape(*shape, 3), flat_grads[2].reshape(shape),
                flat_grads[3].reshape(colors.shape), g_background, None, None, None, None, None)


def _composite_reference(means2d, conics, opacities, colors, backgrounds, bins: TileBins, width: int, height: int):
    """Every chunk in one piece under plain autograd (keeps all intermediates for backward)."""
    q_all, color_all, features, acc, final = _composite_inputs(means2d, conics, opacities, colors, bins)
    if bins.chunks:
        parts = []
        for tiles, K in bins.chunks:
            index = tile_lists(bins, tiles, K)
            parts.append(composite_chunk_reference(features, q_all[index], color_all[index]))
        tiles = torch.cat([t for t, _ in bins.chunks])
        acc = acc.index_copy(0, tiles, torch.cat([p[0] for p in parts]))
        final = final.index_copy(0, tiles, torch.cat([p[1] for p in parts]))
    acc, final = to_image(acc, bins, width, height), to_image(final[..., None], bins, width, height)
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
    absgrad: bool = False,
) -> tuple[Tensor, Tensor]:
    """Front-to-back alpha compositing: (render [C, H, W, D] over the backgrounds, alpha [C, H, W, 1]).

    ``mode="custom"`` keeps intermediates of at most ``save_elements`` pixel x Gaussian pairs (two
    numbers each) for the backward pass and recomputes the rest; ``mode="autograd"`` keeps everything.
    ``absgrad`` (custom mode): the backward also sets ``means2d.absgrad`` [C, N, 2], the absolute values of the
    per-pixel gradients of each 2D mean summed over the pixels (gsplat's ``absgrad``, AbsGS's densification signal)."""
    if mode == "custom":
        return _Composite.apply(means2d, conics, opacities, colors, backgrounds, bins, width, height, save_elements,
                                absgrad)
    if absgrad:
        raise ValueError("absgrad needs compositing mode 'custom' (the autograd reference computes plain gradients)")
    if mode == "autograd":
        return _composite_reference(means2d, conics, opacities, colors, backgrounds, bins, width, height)
    raise ValueError(f"compositing mode must be 'custom' or 'autograd', got {mode!r}")
