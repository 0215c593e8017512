"""Compositing by hand, renders of analytic fields, occupancy-grid skipping and sample budgets."""

import math

import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.registry import find
from lift3d.render.volume.compositing import accumulate, exclusive_segment_cumsum, render_weights
from lift3d.render.volume.occupancy import cell_coordinates
from lift3d.render.volume.regularizers import depth_variance
from lift3d.render.volume.sampling import compact, ray_box, sample_pdf
from tests.nerf_fields import (
    AnalyticField,
    ball,
    single_thread,  # noqa: F401  (fixture)
    slab,
    uniform,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def make_renderer(field, **cfg):
    material = find("emission")({})
    background = find("solid-color")({"color": [1.0, 1.0, 1.0]})
    renderer = find("volume-renderer")(cfg, field, material, background)
    return renderer.eval()


def test_compositing_matches_hand_computation():
    ln2 = math.log(2.0)
    sigma_delta = torch.tensor([ln2, ln2, 2 * ln2, ln2])  # ray 0: three samples; ray 1: one sample
    rays = torch.tensor([0, 0, 0, 1])
    weights, transmittance, alpha = render_weights(sigma_delta, rays)
    torch.testing.assert_close(alpha, torch.tensor([0.5, 0.5, 0.75, 0.5]))
    torch.testing.assert_close(transmittance, torch.tensor([1.0, 0.5, 0.25, 1.0]))
    torch.testing.assert_close(weights, torch.tensor([0.5, 0.25, 0.1875, 0.5]))
    colors = torch.eye(3)[[0, 1, 2, 0]]
    rgb = accumulate(weights[:, None] * colors, rays, 2)
    torch.testing.assert_close(rgb, torch.tensor([[0.5, 0.25, 0.1875], [0.5, 0.0, 0.0]]))
    torch.testing.assert_close(accumulate(weights, rays, 2), torch.tensor([0.9375, 0.5]))


def test_exclusive_segment_cumsum_keeps_precision_over_long_arrays():
    values = torch.full((200000,), 3.0)
    rays = torch.arange(200000) // 4
    out = exclusive_segment_cumsum(values, rays)
    torch.testing.assert_close(out[-4:], torch.tensor([0.0, 3.0, 6.0, 9.0]))


def test_exclusive_segment_cumsum_gradient_matches_a_dense_reference():
    # segments of lengths 1..5 (and a ray id that repeats after a gap is still its own segment)
    rays = torch.tensor([0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 0, 0])
    values = torch.rand(len(rays), dtype=torch.float64, requires_grad=True)
    out = exclusive_segment_cumsum(values, rays)
    segment = torch.cumsum(torch.cat([torch.ones(1), (rays[1:] != rays[:-1]).double()]), 0)
    before = (segment[:, None] == segment[None, :]) & (torch.arange(len(rays))[None, :] < torch.arange(len(rays))[:, None])
    expected = before.double() @ values
    torch.testing.assert_close(out, expected)
    torch.autograd.gradcheck(lambda v: exclusive_segment_cumsum(v, rays), (values,))
    weights = torch.randn(len(rays), dtype=torch.float64)
    (grad,) = torch.autograd.grad((out * weights).sum(), values)
    torch.testing.assert_close(grad, before.double().T @ weights)


@pytest.mark.parametrize("opaque", [float("inf"), 1e30])
def test_an_opaque_sample_changes_only_its_own_ray(opaque):
    # the transmittance is one float64 running sum over every ray's samples: an infinite (exp overflow of a density)
    # or huge optical thickness in one ray made every later ray's differences NaN or lost their precision
    sigma_delta = torch.tensor([0.1, opaque, 0.2, 0.3, 0.1, 0.2, 0.4], requires_grad=True)
    ray = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    weights, transmittance, alpha = render_weights(sigma_delta, ray)
    assert torch.isfinite(weights).all() and torch.isfinite(transmittance).all()
    expected = torch.exp(-torch.tensor([0.0, 0.1, 30.1, 0.0, 0.3, 0.0, 0.2]))  # ray 0 ends at its opaque sample
    assert torch.allclose(transmittance, expected, rtol=1e-6, atol=1e-12)
    assert alpha[1] == 1.0 and weights[2] < 1e-12
    weights.sum().backward()
    assert torch.isfinite(sigma_delta.grad).all()


def test_accumulate_equals_index_add_with_empty_rays_and_its_gradient_is_a_gather():
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 1, 250, 0, 7, 0])  # rays without samples in the middle and at the end
    rays = torch.repeat_interleave(torch.arange(len(counts)), counts)
    for shape in ((len(rays),), (len(rays), 3)):
        values = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
        out = accumulate(values, rays, len(counts))
        expected = torch.zeros((len(counts),) + shape[1:], dtype=torch.float64).index_add(0, rays, values)
        torch.testing.assert_close(out, expected)
        assert out.dtype == values.dtype
        torch.autograd.gradcheck(lambda v: accumulate(v, rays, len(counts)), (values,))
    assert accumulate(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 2).tolist() == [[0.0] * 3] * 2


def test_depth_variance_by_hand():
    # ray 0: w 0.5, 0.5 at t 1, 3 (mean 2, variance 1); ray 1: alpha 0.2 (left out); ray 2: no samples (left out);
    # ray 3: w 0.3, 0.6 at t 2, 5 (alpha 0.9, mean 4, variance (0.3 * 4 + 0.6 * 1) / 0.9 = 2)
    weights = torch.tensor([0.5, 0.5, 0.2, 0.3, 0.6], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1.0, 3.0, 5.0, 2.0, 5.0], dtype=torch.float64)
    rays = torch.tensor([0, 0, 1, 3, 3])
    torch.testing.assert_close(depth_variance(weights, t, rays, 4), torch.tensor(1.5, dtype=torch.float64))
    torch.autograd.gradcheck(lambda w: depth_variance(w, t, rays, 4), (weights,))


def test_accumulate_keeps_float32_precision_over_long_arrays():
    # a float32 running sum over a million samples would lose the small late rays; the float64 one does not
    values = torch.full((1_000_000,), 0.1)
    rays = torch.arange(1_000_000) // 10
    sums = accumulate(values, rays, 100_000)
    torch.testing.assert_close(sums, torch.full((100_000,), 1.0), rtol=1e-6, atol=1e-6)


def test_ray_box_and_compaction():
    o = torch.tensor([[0.0, 0.0, -3.0], [0.0, 5.0, -3.0]])
    d = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    near, far = ray_box(o, d, torch.tensor([[-1.0] * 3, [1.0] * 3]))
    torch.testing.assert_close(near[0], torch.tensor(2.0))
    torch.testing.assert_close(far[0], torch.tensor(4.0))
    assert far[1] <= near[1]  # the second ray misses
    mask = torch.tensor([False, True, True, False, True, True])
    exact = compact(mask)
    assert exact.index.tolist() == [1, 2, 4, 5]
    fitted = compact(mask, budget=3)
    assert fitted.index.tolist() == [1, 2, 4] and fitted.valid.all() and fitted.dropped.tolist() == [False] * 5 + [True]
    padded = compact(mask, budget=6)
    assert padded.valid.tolist() == [True] * 4 + [False] * 2 and not padded.dropped.any()


def test_sample_pdf_follows_weights():
    bins = torch.linspace(0, 1, 5)[None]
    weights = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    samples = sample_pdf(bins, weights, 1000, torch.rand(1, 1000))
    inside = ((samples >= 0.5) & (samples <= 0.75)).float().mean()
    assert inside > 0.99


def _rays(n=64):
    torch.manual_seed(0)
    o = torch.randn(n, 3)
    o = o / o.norm(dim=-1, keepdim=True) * 3.0
    target = torch.rand(n, 3) * 0.8 - 0.4
    d = target - o
    return o, d / d.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("sampler", ["occupancy", "importance"])
def test_uniform_medium_has_exact_opacity(sampler):
    # a constant density: alpha = 1 - exp(-sigma * chord) whatever the step size
    field = AnalyticField(uniform(0.7), radius=1.0)
    renderer = make_renderer(field, sampler=sampler, steps_per_diagonal=200, early_stop_eps=0.0,
                             occupancy={"enabled": False}, n_samples=16, n_importance=8, eval_field_chunk=500)
    o, d = _rays()
    with torch.no_grad():
        out = renderer.render_rays(o, d)
    near, far = ray_box(o, d, field.bbox)
    expected_alpha = 1 - torch.exp(-0.7 * (far - near).clamp_min(0))
    torch.testing.assert_close(out["alpha"][:, 0], expected_alpha, atol=1e-5, rtol=1e-5)
    color = torch.tensor([0.2, 0.6, 0.9])
    torch.testing.assert_close(out["rgb"], expected_alpha[:, None] * color + (1 - expected_alpha[:, None]), atol=1e-5, rtol=1e-5)


def _conservative_ball_grid(renderer, radius):
    """Occupied exactly where a cell's box comes within ``radius`` of the origin."""
    grid = renderer.occupancy
    r = grid.resolution
    ijk = cell_coordinates(r).float()
    lo = grid.bbox[0] + ijk / r * (grid.bbox[1] - grid.bbox[0])
    hi = lo + (grid.bbox[1] - grid.bbox[0]) / r
    closest = torch.clamp(torch.zeros(3), lo, hi)
    grid.occupied.copy_(closest.norm(dim=-1) < radius)


def test_occupancy_skipping_does_not_change_the_render():
    field = AnalyticField(ball(0.5, 4.0), radius=1.0)
    o, d = _rays(128)
    renders = {}
    calls = {}
    for name in ("full", "skipping"):
        renderer = make_renderer(field, steps_per_diagonal=256, early_stop_eps=0.0, occupancy={"resolution": 16})
        if name == "skipping":
            _conservative_ball_grid(renderer, 0.5)
            assert renderer.occupancy.occupancy_fraction() < 0.2
        field.calls = 0
        with torch.no_grad():
            renders[name] = renderer.render_rays(o, d)
        calls[name] = field.calls
    for key in ("rgb", "alpha", "depth"):
        torch.testing.assert_close(renders["skipping"][key], renders["full"][key], atol=1e-6, rtol=1e-6)
    assert calls["skipping"] < 0.5 * calls["full"]  # and far fewer samples were evaluated


def test_early_termination_changes_little_and_saves_samples():
    field = AnalyticField(ball(0.5, 50.0), radius=1.0)
    o, d = _rays(128)
    out = {}
    for eps in (0.0, 1e-3):
        renderer = make_renderer(field, steps_per_diagonal=256, early_stop_eps=eps)
        with torch.no_grad():
            out[eps] = renderer.render_rays(o, d)
    assert (out[0.0]["rgb"] - out[1e-3]["rgb"]).abs().max() < 2e-3
    assert out[1e-3]["num_samples"] < 0.7 * out[0.0]["num_samples"]


@pytest.mark.parametrize("alpha_threshold", [0.0, 1e-3])
def test_segmented_termination_keeps_the_same_samples_and_evaluates_fewer(alpha_threshold):
    """The exact march's density pass a segment of steps at a time (rays already opaque skip the rest) keeps the
    samples one pass over every candidate keeps, and never evaluates what lies behind an opaque surface."""
    evaluated = []

    def counting(p):
        evaluated.append(p.shape[0])
        return ball(0.5, 50.0)(p)

    field = AnalyticField(counting, radius=1.0)
    o, d = _rays(128)
    out, density_points = {}, {}
    for segment in (0, 16):
        renderer = make_renderer(field, steps_per_diagonal=256, early_stop_eps=1e-3, alpha_threshold=alpha_threshold,
                                 march_segment=segment, fuse_field_pass="never")
        renderer.occupancy.mark_all()
        evaluated.clear()
        with torch.no_grad():
            out[segment] = renderer.render_rays(o, d)
        density_points[segment] = sum(evaluated) - int(out[segment]["num_samples"])  # the density-only pass
    assert out[16]["num_samples"] == out[0]["num_samples"]
    torch.testing.assert_close(out[16]["ray_indices"], out[0]["ray_indices"])
    torch.testing.assert_close(out[16]["sample_t"], out[0]["sample_t"])
    for key in ("rgb", "alpha", "depth"):
        torch.testing.assert_close(out[16][key], out[0][key], atol=1e-6, rtol=1e-6)
    assert density_points[16] < 0.7 * density_points[0]


def test_occupancy_grid_update_finds_the_ball():
    field = AnalyticField(ball(0.5, 50.0), radius=1.0)
    renderer = make_renderer(field, occupancy={"resolution": 16, "warmup_steps": 10})
    renderer.train()
    renderer.update_step(0, 0)
    grid = renderer.occupancy
    centers = grid.cell_points(torch.arange(16**3), jitter=False)
    distance = centers.norm(dim=-1)
    assert grid.occupied[distance < 0.3].all()
    assert not grid.occupied[distance > 0.8].any()


def test_sample_budget_matches_exact_and_flags_overflow():
    field = AnalyticField(ball(0.6, 3.0), radius=1.0)
    o, d = _rays(64)
    exact = make_renderer(field, steps_per_diagonal=128, randomized=False, sample_budget="never").train()
    budget = make_renderer(field, steps_per_diagonal=128, randomized=False, sample_budget="always").train()
    reference = exact.render_rays(o, d)
    budget.render_rays(o, d)  # first call: exact counts size the budgets
    fitted = budget.render_rays(o, d)
    assert fitted["ray_valid"].all()
    torch.testing.assert_close(fitted["rgb"], reference["rgb"], atol=1e-6, rtol=1e-6)
    budget._per_ray = {k: v * 0.3 for k, v in budget._per_ray.items()}  # too small: rays at the end overflow
    budget.cfg.budget_margin = 1.0
    small = budget.render_rays(o, d)
    ok = small["ray_valid"]
    assert 0 < ok.sum() < ok.numel() and ok[0]
    torch.testing.assert_close(small["rgb"][ok], reference["rgb"][ok], atol=1e-6, rtol=1e-6)


def test_max_train_samples_caps_the_full_field_pass_and_leaves_the_rest_out_of_the_loss():
    field = AnalyticField(ball(0.6, 3.0), radius=1.0)
    o, d = _rays(64)
    free = make_renderer(field, steps_per_diagonal=128, randomized=False, sample_budget="always").train()
    capped = make_renderer(field, steps_per_diagonal=128, randomized=False, sample_budget="always",
                           max_train_samples=512).train()
    for renderer in (free, capped):
        renderer.render_rays(o, d)  # exact counts size the budgets
    capped._per_ray = {k: v * 1000 for k, v in capped._per_ray.items()}  # a foggy field: far more samples than the cap
    free._per_ray = dict(capped._per_ray)
    assert capped._budget("second", 64) == 512 < free._budget("second", 64)
    assert capped._budget("first", 64) == free._budget("first", 64)  # the density-only pass is not capped
    capped.reset_sample_counts()
    out, reference = capped.render_rays(o, d), free.render_rays(o, d)
    assert out["weights"].shape[0] == 512
    ok = out["ray_valid"]
    assert ok[0] and 0 < ok.sum() < 64 and reference["ray_valid"].all()  # the rays past the cap are flagged, in order
    assert capped.sample_counts()["over_budget"] == float((~ok).sum())  # and counted, for benchmarks
    assert "over_budget" not in capped._per_ray  # a count, not a pass with a budget
    torch.testing.assert_close(out["rgb"][ok], reference["rgb"][ok], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="max_train_samples"):
        make_renderer(field, max_train_samples=-1)


def test_training_chunks_are_large_on_cuda_where_every_chunk_gets_the_densest_chunks_budget():
    field = AnalyticField(ball(0.6, 3.0), radius=1.0)
    renderer = make_renderer(field)
    assert renderer._chunk_rays(10**6, True, torch.device("cuda")) == 262144
    assert renderer._chunk_rays(10**6, True, torch.device("cpu")) == 32768
    assert renderer._chunk_rays(10**6, False, torch.device("cuda")) == 65536
    assert make_renderer(field, train_chunk_rays=0)._chunk_rays(10**6, True, torch.device("cuda")) == 10**6


def test_graph_key_names_the_budgets_and_captured_counts_wait_for_their_replay():
    """What a CUDA-graph capture of the training step relies on (the capture itself is in test_captured_step_gpu):
    no key until budgets exist, a key of every chunk's budgets after, budgets fixed and counts held back while a
    step is captured, and the held-back counts recorded when handed back after a replay."""
    field = AnalyticField(ball(0.6, 3.0), radius=1.0)
    o, d = _rays(64)
    renderer = make_renderer(field, steps_per_diagonal=128, randomized=False, sample_budget="always", train_chunk_rays=48).train()
    never = make_renderer(field, sample_budget="never").train()
    assert never.graph_key(64, o.device) is None  # exact compaction waits on the host: not capturable
    assert renderer.graph_key(64, o.device) is None  # no counts yet
    reference = renderer.render_rays(o, d)
    key = renderer.graph_key(64, o.device)
    assert key is not None and len(key) == 4  # first and second pass, chunks of 48 and 16 rays
    seen = dict(renderer._per_ray)
    renderer.reset_sample_counts()
    renderer.begin_graph_capture()
    captured = renderer.render_rays(o, d)
    counts = renderer.end_graph_capture()
    assert len(counts) == 2 and renderer._sample_sums is None  # one entry per chunk, nothing recorded yet
    torch.testing.assert_close(captured["rgb"], reference["rgb"])
    renderer._per_ray = {}
    renderer.record_graph_counts()
    assert renderer._per_ray == pytest.approx(seen)
    assert renderer.sample_counts()["rays"] == 64


def test_camera_render_shapes_and_camera_z_depth():
    # a dense slab at z = 0 seen from above: camera-space depth is the camera height at every pixel
    field = AnalyticField(slab(0.02, 2000.0), radius=1.0)
    renderer = make_renderer(field, steps_per_diagonal=2048, eval_chunk_rays=100, eval_field_chunk=1000)
    c2w = look_at(torch.tensor([[0.0, 0.0, 2.0]]), torch.zeros(1, 3), torch.tensor([[0.0, 1.0, 0.0]]))
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.6]), 12, 10), 12, 10)
    with torch.no_grad():
        out = renderer(cameras, compute_normals=True)
    assert out["rgb"].shape == (1, 10, 12, 3) and out["alpha"].shape == (1, 10, 12, 1)
    assert out["depth"].shape == (1, 10, 12, 1) and out["normal"].shape == (1, 10, 12, 3)
    assert out["alpha"].min() > 0.99
    depth = out["depth"]
    assert (depth - 1.98).abs().max() < 0.02  # the slab's top is at z = 0.02
    assert depth.max() - depth.min() < 3e-3  # z depth, not distance along the ray (which varies by 7% here)
    # normals of the slab's top face point up (+z), towards the camera
    assert (out["normal"][..., 2] > 0.9).all()
    assert out["weights"].shape == out["ray_indices"].shape and out["ray_indices"].max() < 120


def test_gradients_reach_the_field_through_the_renderer():
    field = find("implicit-volume")({"radius": 1.0, "encoding": {"n_levels": 2, "log2_hashmap_size": 8, "base_resolution": 4}})
    renderer = make_renderer(field, steps_per_diagonal=64, occupancy={"resolution": 8}).train()
    o, d = _rays(32)
    out = renderer.render_rays(o, d)
    out["rgb"].sum().backward()
    assert field.encoding.table.grad.abs().sum() > 0 and field.mlp.layers[0].weight.grad.abs().sum() > 0



def test_the_full_pass_reuses_the_density_pass_encoding_and_renders_the_same():
    """With ``reuse_encoding`` (the default) the density-only pass hands the kept samples' hash-grid features to the
    full pass: without gradients (evaluation) the field takes them as they are, and the render is the one that
    looks them up again."""
    torch.manual_seed(0)
    field = find("implicit-volume")({"radius": 1.0, "density_bias": 1.0,
                                     "encoding": {"n_levels": 4, "log2_hashmap_size": 10, "base_resolution": 4}})
    o, d = _rays(64)
    renders, calls = [], []
    original = field.encoding.lookup
    field.encoding.lookup = lambda points, reuse=None: calls.append(reuse is not None) or original(points, reuse)
    for reuse in ("auto", "never"):
        renderer = make_renderer(field, steps_per_diagonal=64, march_segment=0, reuse_encoding=reuse,
                                 occupancy={"resolution": 8})
        calls.clear()
        with torch.no_grad():
            renders.append(renderer.render_rays(o, d))
        assert calls == ([False, True] if reuse == "auto" else [False, False])
    for key in ("rgb", "alpha", "depth"):
        torch.testing.assert_close(renders[0][key], renders[1][key], atol=0, rtol=0)
    with pytest.raises(ValueError, match="reuse_encoding must be one of auto, never"):
        make_renderer(field, reuse_encoding="always")
