"""Each marching path of the volume renderer on its own, on tiny CPU inputs, against a dense reference: occupancy-grid
candidates (PyTorch ops; the kernel path's intervals), early termination in one pass and in segments, importance
sampling, and the sample budgets."""

import math

import pytest
import torch

from lift3d.registry import find
from lift3d.render.volume import march_triton
from lift3d.render.volume.budgets import SampleBudgets
from lift3d.render.volume.compositing import render_weights
from lift3d.render.volume.early_stop import EarlyStop, terminate
from lift3d.render.volume.march_grid import compact_candidates, grid_candidates, kernel_applies, packed_intervals
from lift3d.render.volume.march_importance import importance_samples
from lift3d.render.volume.march_segments import keep_in_segments
from lift3d.render.volume.occupancy import OccupancyGrid, OccupancyGridConfig
from lift3d.render.volume.sampling import n_marching_steps, ray_box, step_distance, step_index
from tests.nerf_fields import AnalyticField, ball, single_thread, slab  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

BBOX = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])


def _rays(n=40, seed=0):
    generator = torch.Generator().manual_seed(seed)
    o = torch.nn.functional.normalize(torch.randn(n, 3, generator=generator), dim=-1) * 3.0
    d = torch.nn.functional.normalize(torch.rand(n, 3, generator=generator) * 1.6 - 0.8 - o, dim=-1)
    t_near, t_far = ray_box(o, d, BBOX)
    jitter = 1.0 - torch.rand(n, generator=generator)
    return o, d, t_near, t_far, jitter


def _grid(resolution=8, enabled=True, seed=0):
    grid = OccupancyGrid(OccupancyGridConfig(resolution=resolution, enabled=enabled), BBOX)
    grid.occupied.copy_(torch.rand(resolution**3, generator=torch.Generator().manual_seed(seed)) < 0.5)
    return grid


def _candidates(step_size=0.05, grid=None):
    o, d, t_near, t_far, jitter = _rays()
    grid = _grid() if grid is None else grid
    n_steps = n_marching_steps(float((t_far - t_near).clamp_min(0).max()), step_size)
    lo, hi, mask = grid_candidates(o, d, t_near, t_far, jitter, step_size, n_steps, 0.0, grid)
    return o, d, t_near, t_far, jitter, n_steps, lo, hi, mask, grid


def _density_fn(field):
    return lambda points: (field.density(points), points)  # the "encoding" is the points: easy to check


# ------------------------------------------------------------------------------------ occupancy-grid candidates
def test_grid_candidates_tile_each_chord_and_keep_the_steps_in_occupied_cells():
    o, d, t_near, t_far, jitter, n_steps, lo, hi, mask, grid = _candidates()
    hit = t_far > t_near
    assert hit.sum() > 10
    covered = (hi - lo).clamp_min(0).sum(dim=1)
    torch.testing.assert_close(covered[hit], (t_far - t_near)[hit])  # the steps tile [t_near, t_far]
    assert not mask[~hit].any()
    points = o[:, None] + d[:, None] * (0.5 * (lo + hi))[..., None]
    expected = (hi > lo) & grid.query(points.reshape(-1, 3)).reshape(mask.shape)
    assert torch.equal(mask, expected) and 0 < mask.sum() < (hi > lo).sum()  # some steps skipped, some kept
    # the Triton kernel's reference (what the kernel is checked against on a GPU) gives the same mask
    reference = march_triton.reference_steps(o, d, t_near, t_far, jitter, 0.05, n_steps, grid.occupied, BBOX, 8)
    assert torch.equal(mask, reference)
    *_, lo_all, hi_all, everything, _ = _candidates(grid=_grid(enabled=False))
    assert torch.equal(everything, hi_all > lo_all)  # the grid disabled: every step inside the box


def test_compacted_candidates_and_the_kernel_paths_intervals_are_the_pytorch_ones():
    _, _, t_near, t_far, jitter, n_steps, lo, hi, mask, _ = _candidates()
    first, ray, lo_s, hi_s = compact_candidates(mask, lo, hi, None)
    rows, steps = torch.nonzero(mask, as_tuple=True)
    assert torch.equal(ray, rows) and torch.equal(lo_s, lo[rows, steps]) and torch.equal(hi_s, hi[rows, steps])
    assert first.valid is None and first.dropped is None
    ray_k, lo_k, hi_k = packed_intervals(first.index, n_steps, t_near, t_far, jitter, 0.05)
    assert torch.equal(ray_k, ray) and torch.equal(lo_k, lo_s) and torch.equal(hi_k, hi_s)  # bit for bit
    budget = int(mask.sum()) // 2
    packed, ray_b, _, _ = compact_candidates(mask, lo, hi, budget)
    assert packed.index.shape[0] == budget and torch.equal(ray_b, ray[:budget]) and packed.dropped.sum() > 0


def test_the_kernel_is_used_only_where_it_applies():
    grid = _grid()
    assert not kernel_applies("auto", torch.device("cpu"), False, grid, 0.0)
    assert not kernel_applies("never", torch.device("cuda"), False, grid, 0.0)
    assert not kernel_applies("auto", torch.device("cuda"), True, grid, 0.0)  # unbounded
    assert not kernel_applies("auto", torch.device("cuda"), False, _grid(enabled=False), 0.0)
    assert not kernel_applies("auto", torch.device("cuda"), False, grid, 2.0)  # steps growing with distance


# ------------------------------------------------------------------------------------ early termination
def _dense_kept(o, d, lo, hi, mask, density, stop):
    """The reference: every candidate's density in one pass, then ``stop.kept``, as flat indices into ``mask``."""
    rows, steps = torch.nonzero(mask, as_tuple=True)
    lo_s, hi_s = lo[rows, steps], hi[rows, steps]
    points = o[rows] + d[rows] * (0.5 * (lo_s + hi_s))[:, None]
    _, transmittance, alpha = render_weights(density(points) * (hi_s - lo_s), rows)
    keep = stop.kept(transmittance, alpha, lo_s, hi_s)
    return (rows * mask.shape[1] + steps)[keep]


@pytest.mark.parametrize("eps, alpha_threshold", [(1e-2, 0.0), (1e-4, 0.05)])
def test_terminate_keeps_the_dense_references_samples_and_their_encoding(eps, alpha_threshold):
    o, d, _, _, _, n_steps, lo, hi, mask, _ = _candidates()
    field = AnalyticField(ball(0.7, 20.0))
    stop = EarlyStop(eps, alpha_threshold)
    first, ray, lo_s, hi_s = compact_candidates(mask, lo, hi, None)
    samples, counts = terminate(o, d, first, ray, lo_s, hi_s, n_steps, _density_fn(field), stop, None)
    expected = _dense_kept(o, d, lo, hi, mask, field.density, stop)
    assert 0 < expected.numel() < mask.sum()  # termination dropped samples behind the ball
    assert torch.equal(samples["ray"], expected // n_steps) and int(counts["second"]) == expected.numel()
    assert torch.equal(samples["lo"], lo.reshape(-1)[expected]) and torch.equal(samples["hi"], hi.reshape(-1)[expected])
    midpoints = o[samples["ray"]] + d[samples["ray"]] * (0.5 * (samples["lo"] + samples["hi"]))[:, None]
    assert torch.equal(samples["encoding"], midpoints)  # the density pass's encoding rows follow the kept samples
    assert samples["valid"] is None and samples["ray_ok"] is None


def test_terminate_without_stopping_keeps_every_candidate_and_a_full_budget_flags_the_rays_past_it():
    o, d, _, _, _, n_steps, lo, hi, mask, _ = _candidates()
    field = AnalyticField(ball(0.7, 20.0))
    first, ray, lo_s, hi_s = compact_candidates(mask, lo, hi, None)
    samples, counts = terminate(o, d, first, ray, lo_s, hi_s, n_steps, _density_fn(field), EarlyStop(0.0, 0.0), None)
    assert counts == {} and torch.equal(samples["ray"], ray) and samples["encoding"] is None
    stop = EarlyStop(1e-2, 0.0)
    exact, _ = terminate(o, d, first, ray, lo_s, hi_s, n_steps, _density_fn(field), stop, None)
    budget = exact["ray"].numel() // 2
    packed, _ = terminate(o, d, first, ray, lo_s, hi_s, n_steps, _density_fn(field), stop, budget)
    assert packed["ray"].shape[0] == budget and packed["valid"].all()
    ok = packed["ray_ok"]
    lost = torch.unique(exact["ray"][budget:])
    whole = exact["ray"][:budget][~torch.isin(exact["ray"][:budget], lost)]
    assert not ok[lost].any() and whole.numel() > 0 and ok[whole].all()  # the rays that lost samples are flagged
    assert torch.equal(packed["lo"], exact["lo"][:budget])


@pytest.mark.parametrize("segment", [1, 5, 32])
def test_segments_keep_the_one_pass_samples_and_the_fields_outputs_at_them(segment):
    o, d, _, _, _, _, lo, hi, mask, _ = _candidates()
    field = AnalyticField(slab(0.2, 30.0))
    stop = EarlyStop(1e-3, 0.0)
    expected = _dense_kept(o, d, lo, hi, mask, field.density, stop)
    assert 0 < expected.numel() < mask.sum()
    flat = keep_in_segments(o, d, lo, hi, mask, segment, stop, lambda p: {"density": field.density(p)})
    assert torch.equal(flat, expected)
    fields = []
    flat = keep_in_segments(o, d, lo, hi, mask, segment, stop, field, fields)
    assert torch.equal(flat, expected) and len(fields) == 1
    ray = flat // mask.shape[1]
    points = o[ray] + d[ray] * (0.5 * (lo.reshape(-1)[flat] + hi.reshape(-1)[flat]))[:, None]
    for key, value in field(points).items():
        torch.testing.assert_close(fields[0][key], value)


# ------------------------------------------------------------------------------------ importance sampling
def test_importance_samples_tile_each_ray_and_gather_where_the_density_is():
    o, d, t_near, t_far, _ = _rays()
    field = AnalyticField(slab(0.1, 50.0))
    off = _grid(enabled=False)
    fixed = importance_samples(o, d, t_near, t_far, 16, 0, field.density, off, random=False)
    hit = t_far > t_near
    mids = (0.5 * (fixed["lo"] + fixed["hi"])).reshape(-1, 16)
    centers = t_near[:, None] + (torch.arange(16) + 0.5) / 16 * (t_far - t_near).clamp_min(0)[:, None]
    torch.testing.assert_close(fixed["lo"].reshape(-1, 16)[:, 0], t_near)
    torch.testing.assert_close(mids[hit, 1:-1], centers[hit, 1:-1], atol=1e-6, rtol=0)  # bin centers without jitter
    assert fixed["valid"] is None and fixed["ray_ok"] is None
    torch.manual_seed(0)
    both = importance_samples(o, d, t_near, t_far, 16, 32, field.density, off, random=True)
    lo, hi = both["lo"].reshape(-1, 48), both["hi"].reshape(-1, 48)
    assert torch.equal(both["ray"], torch.arange(o.shape[0]).repeat_interleave(48))
    torch.testing.assert_close((hi - lo).sum(1)[hit], (t_far - t_near)[hit])  # intervals still tile the chord
    through = hit & ((o[:, 2] + d[:, 2] * t_near) * (o[:, 2] + d[:, 2] * t_far) < 0)  # chords crossing the slab
    assert through.sum() > 5

    def in_slab(samples, k):
        mid = (0.5 * (samples["lo"] + samples["hi"])).reshape(-1, k)
        return ((o[:, None, 2] + d[:, None, 2] * mid)[through].abs() < 0.15).float().mean()

    stratified = importance_samples(o, d, t_near, t_far, 48, 0, field.density, off, random=True)
    assert in_slab(both, 48) > 2 * in_slab(stratified, 48)  # the extra samples go where the density is


def test_importance_samples_follow_the_occupancy_grid_and_unbounded_spacing():
    o, d, t_near, t_far = _rays()[:4]
    field = AnalyticField(ball(0.5, 5.0))
    grid = _grid()
    out = importance_samples(o, d, t_near, t_far, 8, 0, field.density, grid, random=False)
    points = o[out["ray"]] + d[out["ray"]] * (0.5 * (out["lo"] + out["hi"]))[:, None]
    assert torch.equal(out["valid"], grid.query(points))
    near, far = torch.full_like(t_near, 0.1), torch.full_like(t_near, 100.0)
    spaced = importance_samples(o, d, near, far, 8, 0, field.density, _grid(enabled=False), False, (0.05, 2.0))
    u_near, u_far = step_index(near, 0.05, 2.0), step_index(far, 0.05, 2.0)
    u = u_near[:, None] + (torch.arange(8) + 0.5) / 8 * (u_far - u_near)[:, None]  # even in step counts (Mip-NeRF 360)
    t = step_distance(u, 0.05, 2.0)
    torch.testing.assert_close(spaced["lo"].reshape(-1, 8)[:, 1:], 0.5 * (t[:, 1:] + t[:, :-1]))
    assert (t[:, -1] - t[:, -2] > 10 * (t[:, 1] - t[:, 0])).all()  # sparser far away


# ------------------------------------------------------------------------------------ budgets and counters
def _budget_cfg(**kw):
    return type("Cfg", (), {"sample_budget": "always", "budget_margin": 1.25, "max_train_samples": 0, **kw})()


def test_budgets_round_up_cap_the_full_field_pass_and_shrink_only_past_the_margin():
    budgets = SampleBudgets(_budget_cfg(max_train_samples=10000))
    assert budgets.budget("first", 64, "second") is None  # no counts yet
    assert budgets.active(torch.device("cpu"), True) and not budgets.active(torch.device("cpu"), False)
    assert not SampleBudgets(_budget_cfg(sample_budget="auto")).active(torch.device("cpu"), True)  # auto: CUDA only
    budgets.record({"first": torch.tensor(6400.0), "second": torch.tensor(3200.0), "over_budget": torch.tensor(1.0)}, 64)
    assert budgets.per_ray == {"first": 100.0, "second": 50.0}  # over_budget is only counted
    assert budgets.budget("first", 64, "second") == 8192  # 1.25 * 100 * 64 = 8000, rounded up to 4096s
    assert budgets.budget("second", 10, "second") == 4096  # at least 4096
    assert budgets.budget("second", 1000, "second") == 10000  # the full-field pass is capped
    assert budgets.budget("first", 1000, "second") == math.ceil(125 * 1000 / 4096) * 4096
    budgets.observe("first", 90.0)  # within the margin: kept
    assert budgets.per_ray["first"] == 100.0
    budgets.observe("first", 70.0)  # well below: shrinks
    assert budgets.per_ray["first"] == 70.0
    counts = budgets.sample_counts()
    assert counts == {"rays": 64.0, "first": 6400.0, "over_budget": 1.0, "second": 3200.0}
    budgets.reset_sample_counts()
    assert budgets.sample_counts() == {"rays": 0.0}


def test_captured_counts_wait_for_their_replay():
    budgets = SampleBudgets(_budget_cfg())
    budgets.begin_capture()
    assert budgets.capturing
    budgets.record({"first": torch.tensor(640.0)}, 64)
    held = budgets.end_capture()
    assert len(held) == 1 and budgets.per_ray == {} and budgets.sample_sums is None and not budgets.capturing
    budgets.record_captured()
    budgets.record_captured()  # each replay counts
    assert budgets.per_ray == {"first": 10.0} and budgets.sample_counts()["rays"] == 128


# ------------------------------------------------------------------------------------ the renderer's wiring
def test_the_renderer_marches_with_these_units():
    """``VolumeRenderer._march`` (two passes, exact compaction on the CPU) is grid_candidates, compact_candidates
    and terminate, in that order, with the renderer's step size and jitter."""
    field = AnalyticField(ball(0.6, 20.0))
    material, background = find("emission")({}), find("solid-color")({"color": [1.0, 1.0, 1.0]})
    renderer = find("volume-renderer")({"steps_per_diagonal": 64, "march_segment": 0, "early_stop_eps": 1e-2,
                                        "randomized": False}, field, material, background).eval()
    o, d, t_near, t_far, _ = _rays()
    with torch.no_grad():
        samples = renderer._march(o, d, t_near, t_far, training=False)
        jitter = torch.full((o.shape[0],), 0.5)
        n_steps = renderer._n_steps(t_near, t_far, static=False)
        lo, hi, mask = grid_candidates(o, d, t_near, t_far, jitter, renderer.step_size, n_steps, 0.0, renderer.occupancy)
        first, ray, lo_s, hi_s = compact_candidates(mask, lo, hi, None)
        expected, _ = terminate(o, d, first, ray, lo_s, hi_s, n_steps, lambda p: (field.density(p), None),
                                renderer.stop, None)
    for key in ("ray", "lo", "hi"):
        assert torch.equal(samples[key], expected[key])
