"""Camera paths through a capture's own cameras: the default video of photos taken from one side (a landmark from
its square, an object on a wall) follows the photos instead of circling to the side nobody saw.

``camera_path_through(cameras, frames)`` orders the cameras around what they look at (the point nearest to every
optical axis) by their angle about the cameras' mean up direction, starting after the widest gap (a capture all
around becomes a closed loop), merges neighbors into keyframes about ``KEYFRAME_DEG`` apart (so photos taken at
several heights do not make the path zigzag), and interpolates them as nerfstudio's interpolated path does:
positions on a (centripetal) Catmull-Rom spline, rotations by slerp, at a constant speed along the path. Rotations
are interpolated relative to looking at that point when the cameras converge on it, so where the photos look at
the subject the path does too; a forward-facing capture interpolates the rotations themselves.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.rotations import matrix_to_quaternion, quaternion_to_matrix, slerp

KEYFRAME_DEG = 15.0  # neighbors closer than this (in angle about the look-at point) merge into one keyframe
CLOSED_GAP_DEG = 60.0  # cameras all around, with no gap wider than this, make a closed loop
CONVERGING_DEG = 10.0  # optical axes spread wider than this look at one subject (narrower: a forward-facing capture)


def look_at_point(c2w: Tensor) -> Tensor:
    """[3] the point nearest to every camera's optical axis (least squares; OpenGL cameras look along -z), pulled
    gently towards a point in front of the cameras so that parallel axes (a forward-facing capture) still give one."""
    c2w = c2w.double()
    positions, forward = c2w[:, :3, 3], -c2w[:, :3, 2]
    forward = forward / forward.norm(dim=-1, keepdim=True)
    spread = (positions - positions.mean(0)).norm(dim=-1).mean().clamp_min(1e-6)
    ahead = positions.mean(0) + forward.mean(0) * spread  # a fallback in front of the cameras
    projector = torch.eye(3, dtype=torch.float64) - forward[:, :, None] * forward[:, None, :]  # [N, 3, 3]
    weight = 1e-3 * len(c2w)
    lhs = projector.sum(0) + weight * torch.eye(3, dtype=torch.float64)
    rhs = (projector @ positions[:, :, None]).sum(0)[:, 0] + weight * ahead
    return torch.linalg.solve(lhs, rhs)


def axes_converge(c2w: Tensor, min_spread_deg: float = CONVERGING_DEG) -> bool:
    """Whether the cameras' optical axes spread by more than about ``min_spread_deg`` in every direction across
    them (they look at one subject from around it), rather than running near parallel (a forward-facing capture)."""
    forward = -c2w[:, :3, 2].double()
    forward = forward / forward.norm(dim=-1, keepdim=True)
    spread = (torch.eye(3, dtype=torch.float64) - forward[:, :, None] * forward[:, None, :]).mean(0)
    return float(torch.linalg.eigvalsh(spread)[0]) > math.sin(math.radians(min_spread_deg)) ** 2


def path_order(c2w: Tensor, center: Tensor) -> tuple[Tensor, Tensor, bool]:
    """(order [N], angles [N] in radians along that order, increasing from 0, closed): the cameras sorted by their
    angle about ``center`` around the cameras' mean up axis, starting after the widest gap; ``closed`` when they go
    all around with no gap wider than CLOSED_GAP_DEG."""
    c2w = c2w.double()
    up = c2w[:, :3, 1].mean(0)
    up = up / up.norm().clamp_min(1e-12)
    offsets = c2w[:, :3, 3] - center
    flat = offsets - (offsets @ up)[:, None] * up  # in the plane normal to up
    reference = flat[flat.norm(dim=-1).argmax()]
    side = torch.linalg.cross(up, reference)
    angle = torch.atan2(flat @ side, flat @ reference) % (2 * math.pi)
    order = torch.argsort(angle)
    sorted_angle = angle[order]
    gaps = torch.diff(torch.cat([sorted_angle, sorted_angle[:1] + 2 * math.pi]))
    widest = int(gaps.argmax())
    order = torch.roll(order, -(widest + 1))
    unwrapped = (angle[order] - angle[order[0]]) % (2 * math.pi)
    closed = len(order) > 2 and float(gaps.max()) < math.radians(CLOSED_GAP_DEG)
    return order, unwrapped, closed


def _keyframes(c2w: Tensor, order: Tensor, angles: Tensor, center: Tensor) -> tuple[Tensor, Tensor]:
    """(positions [K, 3], quaternions [K, 4]): consecutive cameras within KEYFRAME_DEG of a group's first one merged
    into one at their mean direction and mean distance from ``center`` (not nearer, as their mean position would be)
    with their mean rotation."""
    groups, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or angles[i] - angles[start] >= math.radians(KEYFRAME_DEG):
            groups.append(order[start:i])
            start = i
    quats = matrix_to_quaternion(c2w[:, :3, :3].double())
    positions, rotations = [], []
    for group in groups:
        q = quats[group]
        q = torch.where((q @ q[0])[:, None] < 0, -q, q)  # one hemisphere before averaging
        mean = q.mean(0)
        rotations.append(mean / mean.norm())
        offsets = c2w[group, :3, 3] - center
        direction = offsets.mean(0)
        positions.append(center + direction / direction.norm().clamp_min(1e-12) * offsets.norm(dim=-1).mean())
    return torch.stack(positions), torch.stack(rotations)


def _catmull_rom(p0: Tensor, p1: Tensor, p2: Tensor, p3: Tensor, u: Tensor) -> Tensor:
    """Centripetal Catmull-Rom [N, 3] between ``p1`` and ``p2`` at ``u`` [N] in 0..1 (Barry and Goldman's pyramid):
    no loops or overshoot where keyframes are unevenly spaced."""
    def knot(a: Tensor, b: Tensor) -> Tensor:
        return (b - a).norm(dim=-1, keepdim=True).sqrt().clamp_min(1e-9)

    t0 = torch.zeros_like(u[:, None])
    t1 = t0 + knot(p0, p1)
    t2 = t1 + knot(p1, p2)
    t3 = t2 + knot(p2, p3)
    t = t1 + u[:, None] * (t2 - t1)

    def lerp(a: Tensor, b: Tensor, ta: Tensor, tb: Tensor) -> Tensor:
        return (tb - t) / (tb - ta) * a + (t - ta) / (tb - ta) * b

    a1, a2, a3 = lerp(p0, p1, t0, t1), lerp(p1, p2, t1, t2), lerp(p2, p3, t2, t3)
    return lerp(lerp(a1, a2, t0, t2), lerp(a2, a3, t1, t3), t1, t2)


def interpolate_keyframes(positions: Tensor, quats: Tensor, frames: int, closed: bool = False) -> Tensor:
    """c2w [frames, 4, 4] through keyframes (``positions`` [K, 3], ``quats`` [K, 4]) at a constant speed along
    their polyline: positions on a Catmull-Rom spline, rotations by slerp; ``closed`` returns to the first keyframe
    (without repeating it), otherwise the path runs from the first keyframe to the last."""
    if closed:
        positions, quats = torch.cat([positions, positions[:1]]), torch.cat([quats, quats[:1]])
    k = len(positions)
    c2w = torch.eye(4, dtype=torch.float64).repeat(frames, 1, 1)
    if k == 1:
        c2w[:, :3, :3], c2w[:, :3, 3] = quaternion_to_matrix(quats[:1]), positions[:1]
        return c2w
    lengths = (positions[1:] - positions[:-1]).norm(dim=-1).clamp_min(1e-9)
    cumulative = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    travel = torch.arange(frames, dtype=torch.float64) / (frames if closed else max(frames - 1, 1)) * cumulative[-1]
    segment = (torch.searchsorted(cumulative, travel, right=True) - 1).clamp(0, k - 2)
    t = ((travel - cumulative[segment]) / lengths[segment]).clamp(0, 1)
    if closed:  # neighbors wrap around the loop (the last keyframe is the first)
        before = positions[(segment - 1) % (k - 1)]
        after = positions[(segment + 2) % (k - 1)]
    else:  # at the ends the missing neighbor is mirrored, so the spline leaves an end towards the next keyframe
        padded = torch.cat([2 * positions[:1] - positions[1:2], positions, 2 * positions[-1:] - positions[-2:-1]])
        before, after = padded[segment], padded[segment + 3]
    c2w[:, :3, 3] = _catmull_rom(before, positions[segment], positions[segment + 1], after, t)
    c2w[:, :3, :3] = quaternion_to_matrix(slerp(quats[segment], quats[segment + 1], t))
    return c2w


def _aim(positions: Tensor, center: Tensor, up: Tensor) -> Tensor:
    """Rotations [N, 3, 3] of cameras at ``positions`` [N, 3] looking at ``center`` with ``up`` as near up as can be."""
    return look_at(positions, center.expand_as(positions), up.expand_as(positions))[:, :3, :3]


def camera_path_through(cameras: Cameras, frames: int, width: int | None = None, height: int | None = None,
                        there_and_back: bool = False) -> Cameras:
    """``frames`` cameras on a smooth path through ``cameras`` (a capture's photos; see the module docstring), each
    looking as the photos around it look, with their median vertical field of view, ``width`` x ``height`` pixels
    (default: the cameras' own). A path that does not close runs from one end of the photos to the other, or with
    ``there_and_back`` out and back again (a video that loops)."""
    if frames < 1:
        raise ValueError(f"a camera path needs at least one frame, got {frames}")
    c2w = cameras.c2w.detach().double().cpu()
    width, height = width or cameras.width, height or cameras.height
    # each photo's field of view from its own focal length and height (2 cy: padding never counts)
    k = cameras.intrinsics.detach().double().cpu()
    fovy = float(torch.median(2 * torch.atan(k[:, 1, 2] / k[:, 1, 1])))
    if len(c2w) == 1:
        path = c2w.repeat(frames, 1, 1)
    else:
        center = look_at_point(c2w)
        order, angles, closed = path_order(c2w, center)
        # cameras that converge on a subject: rotations relative to looking at it, so the path looks at it too; a
        # forward-facing capture (near-parallel axes) interpolates the rotations themselves
        up, converging = c2w[:, :3, 1].mean(0), axes_converge(c2w)
        relative = c2w.clone()
        if converging:
            relative[:, :3, :3] = _aim(c2w[:, :3, 3], center, up).transpose(1, 2) @ c2w[:, :3, :3]
        positions, quats = _keyframes(relative, order, angles, center)
        closed = closed and len(positions) > 2
        if there_and_back and not closed and frames > 2:
            out = interpolate_keyframes(positions, quats, frames // 2 + 1)
            path = torch.cat([out, out.flip(0)[1: frames - len(out) + 1]])
        else:
            path = interpolate_keyframes(positions, quats, frames, closed)
        if converging:
            path[:, :3, :3] = _aim(path[:, :3, 3], center, up) @ path[:, :3, :3]
    intrinsics = intrinsics_from_fovy(torch.full((frames,), fovy, dtype=torch.float64), width, height)
    return Cameras(path.to(cameras.c2w.dtype), intrinsics.to(cameras.intrinsics.dtype), width, height).to(cameras.device)
