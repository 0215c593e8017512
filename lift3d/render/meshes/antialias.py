"""Analytic silhouette antialiasing: coverage at silhouette edges, differentiable in vertex positions.

A rasterized image is piecewise constant in the vertex positions wherever coverage changes, so it
gives no gradient that moves silhouettes. As nvdiffrast's ``antialias`` op does, this pass blends the
colors of neighboring pixels across silhouette edges by the fraction of the pixel each surface
covers, computed from where the edge crosses the segment between the two pixel centers.

The coverage model (box filter, one axis): take two neighboring pixels, ``o`` seeing triangle T and
``n`` seeing something else, and let T's silhouette edge cross the segment from o's center to n's
center at parameter ``t`` in [0, 1]. For an edge that is more vertical than horizontal, tested on a
horizontal pixel pair (and vice versa), a straight edge crossing a unit pixel box through its top and
bottom sides covers exactly the fraction equal to its horizontal offset from the center, so

    t > 1/2:  T covers ``t - 1/2`` of n's box:      c_n += (t - 1/2) (c_o - c_n)
    t < 1/2:  T leaves ``1/2 - t`` of o's box open: c_o += (1/2 - t) (c_n - c_o)

Both branches vanish at t = 1/2 and the blend reaches 1/2 when the edge reaches a pixel center, where
the rasterized coverage flips, so the image is continuous in the vertex positions along a straight
edge and ``d image / d vertex`` is the derivative of the box-filtered coverage.

Silhouette edges are found from the mesh topology per view: an edge of T is a silhouette when no other
triangle on that edge faces the camera the same way as T (boundary edges always are). Where two pixels
see different triangles, the search starts from the nearer one (at its pixel center) and walks across
the mesh along the segment between the centers, triangle to neighboring triangle, until it leaves
through a silhouette edge (then that edge is used) or reaches the other center (no silhouette: no
blend); if that fails it starts from the other pixel's triangle. The walk (``max_walk`` triangles)
finds silhouettes of triangles smaller than a pixel, which nvdiffrast's per-pixel-triangle test misses.
Triangles crossing the near plane are not antialiased.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.meshes.topology import EdgeTopology, edge_topology
from lift3d.render.meshes.raster import Rasterization


@torch.no_grad()
def silhouette_edges(clip: Tensor, faces: Tensor, topology: EdgeTopology) -> Tensor:
    """[B, F, 3] bool: face corner k's edge (v_k, v_k+1) is a silhouette of that face in view b."""
    X, Y, W = (clip[:, faces][..., k].double() for k in (0, 1, 3))  # [B, F, 3] each
    # det of the (X, Y, W) rows: the orientation seen from the eye (valid behind it too)
    det = (X[..., 0] * (Y[..., 1] * W[..., 2] - Y[..., 2] * W[..., 1])
           - X[..., 1] * (Y[..., 0] * W[..., 2] - Y[..., 2] * W[..., 0])
           + X[..., 2] * (Y[..., 0] * W[..., 1] - Y[..., 1] * W[..., 0]))
    front = det > 0
    batch, num_edges = clip.shape[0], topology.edge_face_count.numel()
    front_count = torch.zeros(batch, num_edges, dtype=torch.long, device=clip.device)
    index = topology.face_edges.reshape(1, -1).expand(batch, -1)
    front_count.scatter_add_(1, index, front.long().repeat_interleave(3, dim=1))
    front_on_edge = front_count.gather(1, index).view(batch, -1, 3)
    total_on_edge = topology.edge_face_count[topology.face_edges].unsqueeze(0)
    same_facing_others = torch.where(front.unsqueeze(-1), front_on_edge - 1, total_on_edge - front_on_edge - 1)
    return same_facing_others == 0


def _screen(tri: Tensor, width: int, height: int) -> Tensor:
    """Pixel coordinates [..., 3, 2] (x right, y down, centers at i + 0.5) of clip vertices [..., 3, 4]."""
    w = tri[..., 3]
    return torch.stack([(tri[..., 0] / w + 1.0) * (0.5 * width), (1.0 - tri[..., 1] / w) * (0.5 * height)], dim=-1)


def _edge_values(screen: Tensor, point: Tensor) -> Tensor:
    """Edge functions [..., 3] of edges (v_k, v_k+1) of triangles [..., 3, 2] at points [..., 2]."""
    start, end = screen, screen[..., [1, 2, 0], :]
    d, r = end - start, point.unsqueeze(-2) - start
    return d[..., 0] * r[..., 1] - d[..., 1] * r[..., 0]


@torch.no_grad()
def _find_silhouettes(
    clip: Tensor,
    faces: Tensor,
    topology: EdgeTopology,
    silhouette: Tensor,
    view: Tensor,
    face: Tensor,
    p_from: Tensor,
    p_to: Tensor,
    vertical_pair: bool,
    size: tuple[int, int],
    max_steps: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Walk from triangle ``face`` (seen at pixel center ``p_from`` [M, 2]) across the mesh along the
    segment to ``p_to`` until it leaves through a silhouette edge: returns that edge's face [M], slot [M]
    and whether one was found within the segment and ``max_steps`` triangles [M]. The walk lets
    silhouettes of triangles smaller than a pixel (seen by no pixel center) still be found."""
    height, width = size
    count = face.shape[0]
    found_face = torch.full_like(face, -1)
    found_slot = torch.zeros_like(face)
    active = torch.arange(count, device=face.device)
    current = face.clone()
    entry = torch.full_like(face, -1)  # edge id through which the walk entered the current face
    for _ in range(max_steps):
        if active.numel() == 0:
            break
        f, b = current[active], view[active]
        tri = clip[b[:, None], faces[f]].float()  # [A, 3, 4]
        screen = _screen(tri, width, height)
        u, v = screen[:, 1] - screen[:, 0], screen[:, 2] - screen[:, 0]
        area = u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]  # twice the signed area
        sign = torch.where(area >= 0, 1.0, -1.0).unsqueeze(-1)
        e_from = _edge_values(screen, p_from[active]) * sign
        e_to = _edge_values(screen, p_to[active]) * sign
        edge_ids = topology.face_edges[f]  # [A, 3]
        leaving = (e_to < e_from) & (edge_ids != entry[active, None])
        t = torch.where(leaving, e_from / (e_from - e_to).clamp_min(1e-20), torch.full_like(e_from, float("inf")))
        t_exit, slot = t.min(-1)
        ok = ((tri[..., 2] + tri[..., 3]) > 0).all(-1) & (area != 0) & (t_exit <= 1.0)
        is_silhouette = silhouette[b, f, slot]
        d = (screen[:, [1, 2, 0]] - screen).gather(1, slot[:, None, None].expand(-1, 1, 2)).squeeze(1)
        steep = d[:, 1].abs() >= d[:, 0].abs()  # horizontal pairs take edges closer to vertical
        oriented = ~steep if vertical_pair else steep
        done = ok & is_silhouette
        hit = done & oriented
        found_face[active[hit]] = f[hit]
        found_slot[active[hit]] = slot[hit]
        step_on = ok & ~is_silhouette
        neighbor = topology.face_adjacency[f, slot]
        step_on &= neighbor >= 0
        current[active[step_on]] = neighbor[step_on]
        entry[active[step_on]] = edge_ids.gather(1, slot[:, None]).squeeze(1)[step_on]
        active = active[step_on]
    return found_face, found_slot, found_face >= 0


def _pairs(ids: Tensor, depth: Tensor, vertical: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Neighboring pixels seeing different triangles: (first, second) flat pixel indices [P] with the
    nearer of the two listed first as the occluder candidate; also (occluder face, other face)."""
    batch, height, width = ids.shape
    flat = torch.arange(batch * height * width, device=ids.device).view(batch, height, width)
    if vertical:
        a, b = flat[:, :-1, :], flat[:, 1:, :]
    else:
        a, b = flat[:, :, :-1], flat[:, :, 1:]
    ids_flat, depth_flat = ids.reshape(-1), depth.reshape(-1)
    differ = ids_flat[a] != ids_flat[b]
    a, b = a[differ], b[differ]
    swap = depth_flat[b] < depth_flat[a]
    first, second = torch.where(swap, b, a), torch.where(swap, a, b)
    return first, second, ids_flat[first], ids_flat[second]


def _pixel_centers(index: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """(view [M], pixel-center coordinates [M, 2]) of flat pixel indices."""
    hw = height * width
    view = torch.div(index, hw, rounding_mode="floor")
    rem = index - view * hw
    iy = torch.div(rem, width, rounding_mode="floor")
    ix = rem - iy * width
    return view, torch.stack([ix, iy], dim=-1).float() + 0.5


def antialias(
    color: Tensor, rast: Rasterization, clip: Tensor, faces: Tensor, topology: EdgeTopology | None = None, max_walk: int = 8
) -> Tensor:
    """Antialiased copy [B, H, W, C] of the rasterized image ``color`` [B, H, W, C].

    Gradients reach ``color`` and, through the edge crossing positions, the clip-space vertex
    positions ``clip`` [B, V, 4]. ``topology`` caches ``edge_topology(faces)``. ``max_walk`` bounds how
    many triangles the search for a silhouette crosses between two pixel centers (1: only the
    triangle seen at the pixel, as nvdiffrast; more finds silhouettes of sub-pixel triangles).
    """
    faces = faces.long()
    batch, height, width, channels = color.shape
    if (batch, height, width) != (rast.batch, rast.height, rast.width):
        raise ValueError(f"color {tuple(color.shape)} does not match the rasterization "
                         f"[{rast.batch}, {rast.height}, {rast.width}, C]")
    if topology is None or topology.face_adjacency is None:
        topology = edge_topology(faces)
    flat = color.reshape(-1, channels)
    if rast.pixels.numel() == 0:
        return color
    silhouette = silhouette_edges(clip, faces, topology)
    ids = rast.face_ids()
    depth = torch.full((batch * height * width,), float("inf"), device=color.device)
    depth[rast.pixels] = rast.depth.detach().float()
    targets, sources, weights = [], [], []
    for vertical in (False, True):
        first, second, f_first, f_second = _pairs(ids, depth.view(batch, height, width), vertical)
        # occluder candidates: the nearer pixel's triangle first, then the other one
        view, c_first = _pixel_centers(first, height, width)
        _, c_second = _pixel_centers(second, height, width)
        has_first, has_second = f_first >= 0, f_second >= 0
        args = (clip, faces, topology, silhouette, view)
        walk = (vertical, (height, width), max_walk)
        face1, slot1, ok1 = _find_silhouettes(*args, f_first.clamp_min(0), c_first, c_second, *walk)
        face2, slot2, ok2 = _find_silhouettes(*args, f_second.clamp_min(0), c_second, c_first, *walk)
        ok1, ok2 = ok1 & has_first, ok2 & has_second & ~(ok1 & has_first)
        use = ok1 | ok2
        occluder = torch.where(ok1, first, second)[use]
        other = torch.where(ok1, second, first)[use]
        face = torch.where(ok1, face1, face2)[use]
        slot = torch.where(ok1, slot1, slot2)[use]
        view = view[use]
        c_occ = torch.where(ok1[:, None], c_first, c_second)[use]
        c_oth = torch.where(ok1[:, None], c_second, c_first)[use]
        # the crossing parameter, differentiable in the clip positions of the edge's two vertices
        corners = faces[face]
        v_start = corners.gather(1, slot[:, None]).squeeze(1)
        v_end = corners.gather(1, ((slot + 1) % 3)[:, None]).squeeze(1)
        edge = _screen(torch.stack([clip[view, v_start], clip[view, v_end]], dim=1), width, height)  # [M, 2, 2]
        d = edge[:, 1] - edge[:, 0]

        def value(p: Tensor, d: Tensor = d, edge: Tensor = edge) -> Tensor:
            r = p.to(edge) - edge[:, 0]
            return d[:, 0] * r[:, 1] - d[:, 1] * r[:, 0]

        e_occ, e_oth = value(c_occ), value(c_oth)
        t = e_occ / (e_occ - e_oth)
        into_other = t.detach() > 0.5
        targets.append(torch.where(into_other, other, occluder))
        sources.append(torch.where(into_other, occluder, other))
        weights.append(torch.where(into_other, t - 0.5, 0.5 - t))
    target, source, weight = torch.cat(targets), torch.cat(sources), torch.cat(weights)
    delta = weight.unsqueeze(-1).to(flat) * (flat[source] - flat[target])
    return flat.index_add(0, target, delta).view(batch, height, width, channels)
