"""Proposal-network sampling (lift3d.render.volume.proposal) and the distortion loss: the losses' fixed points, the sampler
over an unbounded field, and the unbounded recipe with it against the occupancy-grid march at equal steps."""

import math

import pytest
import torch

from lift3d.registry import find
from lift3d.render.volume.distortion import distortion_loss
from lift3d.render.volume.proposal import dense_weights, interlevel_loss, outer_weights
from tests.nerf_fields import AnalyticField, single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


def _sorted_edges(n_rays: int, k: int, generator: torch.Generator) -> torch.Tensor:
    gaps = torch.rand(n_rays, k, generator=generator) + 0.05
    edges = torch.cat([torch.zeros(n_rays, 1), torch.cumsum(gaps, -1)], -1)
    return edges / edges[:, -1:]


def test_interlevel_loss_is_zero_when_the_histogram_bounds_the_weights_and_positive_when_it_misses():
    g = torch.Generator().manual_seed(0)
    edges = _sorted_edges(5, 12, g)
    weights = torch.softmax(torch.randn(5, 12, generator=g) * 3, -1) * 0.9
    assert interlevel_loss(edges, weights, edges, weights).abs().max() < 1e-6  # the same histogram
    coarse_edges = edges[:, ::3]  # a coarser histogram holding the same mass: every fine interval lies in one coarse bin
    coarse = weights.reshape(5, 4, 3).sum(-1)
    assert torch.allclose(outer_weights(edges, coarse_edges, coarse), coarse.repeat_interleave(3, -1))
    assert interlevel_loss(edges, weights, coarse_edges, coarse).abs().max() < 1e-6
    missing = coarse.clone()
    missing[:, 1] = 0.0  # the histogram lost the mass of one bin: the rays whose weights sit there pay
    loss = interlevel_loss(edges, weights, coarse_edges, missing)
    expected = (weights[:, 3:6] ** 2 / (weights[:, 3:6] + 1e-7)).sum(-1) / 12
    assert torch.allclose(loss, expected, rtol=1e-4)


def test_distortion_matches_its_double_sum_and_is_least_for_one_thin_interval():
    g = torch.Generator().manual_seed(1)
    edges = _sorted_edges(4, 16, g)
    weights = torch.rand(4, 16, generator=g) / 16
    mid, width = 0.5 * (edges[:, 1:] + edges[:, :-1]), edges[:, 1:] - edges[:, :-1]
    brute = (weights[:, :, None] * weights[:, None, :] * (mid[:, :, None] - mid[:, None, :]).abs()).sum((1, 2))
    brute = brute + (weights**2 * width).sum(-1) / 3
    assert torch.allclose(distortion_loss(edges, weights), brute, rtol=1e-5, atol=1e-7)
    even = torch.linspace(0, 1, 17)[None]
    delta = torch.zeros(1, 16)
    delta[0, 7] = 1.0  # all of the ray's weight in one interval of width 1/16
    spread = torch.full((1, 16), 1 / 16)
    assert float(distortion_loss(even, delta)) == pytest.approx(1 / 48, rel=1e-5)  # 1/3 * 1 * 1/16: the intra term alone
    assert float(distortion_loss(even, spread)) > 10 * float(distortion_loss(even, delta))
    with pytest.raises(ValueError, match="K \\+ 1"):
        distortion_loss(even[:, :-1], spread)


def test_dense_weights_are_front_to_back_compositing():
    sigma_delta = torch.tensor([[0.0, math.log(2.0), math.log(2.0), 50.0]])
    assert torch.allclose(dense_weights(sigma_delta), torch.tensor([[0.0, 0.5, 0.25, 0.25]]), atol=1e-6)


def _proposal_renderer(field, **proposal):
    material = find("emission")({})
    background = find("solid-color")({"color": [1.0, 1.0, 1.0]})
    cfg = {"sampler": "proposal", "disparity_from": 6.0, "far_plane": 1000.0, "occupancy": {"enabled": False},
           "proposal": {"samples": [32, 16], "n_samples": 8, "resolutions": [32, 64], "n_levels": 2,
                        "log2_hashmap_size": 12, **proposal}}
    return find("volume-renderer")(cfg, field, material, background)


def test_the_proposal_sampler_gives_fixed_samples_reaches_the_far_plane_and_trains_its_networks():
    torch.manual_seed(0)
    field = AnalyticField(lambda p: torch.where(p.norm(dim=-1) < 1.0, 20.0, 0.0), 2.0)
    field.contraction = "cube"
    renderer = _proposal_renderer(field)
    assert renderer.graph_key(64, torch.device("cpu")) == ("proposal",)  # static shapes: the step can be a CUDA graph
    rays_o = torch.tensor([[0.0, 0.0, 4.0]]).expand(6, 3)
    rays_d = torch.nn.functional.normalize(torch.tensor([[0.0, 0.0, -1.0]]).expand(6, 3) + 0.05 * torch.randn(6, 3), dim=-1)
    renderer.train()
    renderer.proposal.update_step(0, 0)
    assert float(renderer.proposal.anneal) == 0.0  # uniform draws at the start
    out = renderer.render_rays(rays_o, rays_d)
    assert out["ray_indices"].shape[0] == 6 * 8 and out["interlevel"].shape == (6,) and out["distortion"].shape == (6,)
    assert out["sample_t"].max() > 20.0  # evenly in step counts: the last eighth of them lies beyond 24 units
    out["interlevel"].mean().backward()
    grads = [p.grad for p in renderer.proposal.parameters()]
    assert all(g is not None for g in grads) and any(float(g.abs().sum()) > 0 for g in grads)
    # after training the proposals, the field's samples crowd onto the ball (distances 3..5 along the rays)
    optimizer = torch.optim.Adam(renderer.proposal.parameters(), lr=0.02)
    for _ in range(150):
        renderer.proposal.update_step(0, 1000)
        optimizer.zero_grad()
        renderer.render_rays(rays_o, rays_d)["interlevel"].mean().backward()
        optimizer.step()
    renderer.eval()
    with torch.no_grad():
        out = renderer.render_rays(rays_o, rays_d)
    t = out["sample_t"].reshape(6, 8)
    assert ((t > 2.5) & (t < 5.5)).float().mean() > 0.5, t
    assert (out["alpha"] > 0.8).all()  # the ball is found (the samples straddling its surface see it as thinner)


def test_the_proposal_config_is_checked():
    field = AnalyticField(lambda p: p[:, 0] * 0, 2.0)
    field.contraction = "cube"
    with pytest.raises(ValueError, match="one resolution per proposal stage"):
        _proposal_renderer(field, resolutions=[32])


def _sky_scene(root):
    """The sample toy under a sky that changes with direction, in the nerfstudio layout with true poses (a real-photo
    layout: `lift3d reconstruct` picks the unbounded recipe for it)."""
    import json

    from PIL import Image

    from lift3d.data.sample_scene import render_toy, sample_cameras

    cameras = sample_cameras("train", 40)[::2]
    toy = render_toy(cameras, supersample=2)
    sky = 0.5 + 0.45 * cameras.rays()[1]
    photos = toy[..., :3] * toy[..., 3:] + sky * (1 - toy[..., 3:])
    (root / "images").mkdir(parents=True)
    for i, photo in enumerate(photos):
        Image.fromarray((photo.clamp(0, 1) * 255 + 0.5).byte().numpy()).save(root / "images" / f"photo_{i:03d}.png")
    k = cameras.intrinsics[0]
    frames = [{"file_path": f"images/photo_{i:03d}.png", "transform_matrix": cameras.c2w[i].tolist()}
              for i in range(len(cameras))]
    (root / "transforms.json").write_text(json.dumps({
        "camera_model": "PINHOLE", "fl_x": float(k[0, 0]), "fl_y": float(k[1, 1]), "cx": float(k[0, 2]), "cy": float(k[1, 2]),
        "w": cameras.width, "h": cameras.height, "frames": frames}))
    return root


PROPOSAL = ["system.renderer.sampler=proposal", "system.renderer.occupancy.enabled=false", "system.renderer.near_plane=0.05",
            "system.renderer.proposal.samples=[32,16]", "system.renderer.proposal.n_samples=16",
            "system.renderer.proposal.resolutions=[32,64]", "system.renderer.proposal.n_levels=3",
            "system.renderer.proposal.log2_hashmap_size=12", "system.loss.lambda_distortion=0.002"]


@pytest.mark.slow
def test_the_unbounded_recipe_with_proposal_sampling_beats_the_march_in_equal_time(tmp_path):
    """The unbounded CPU recipe on a small sky scene: the occupancy-grid march evaluates the field at every one of
    ~110 steps a ray through this young, foggy field; proposal sampling at 16 a ray (two small proposal grids decide
    where) makes a step in about half the time, so twice its steps cost the march's time, and score higher on the
    held-out view."""
    import json

    from lift3d.config import load_config
    from lift3d.method_table import find_method, stage_recipes
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment
    from tests.systems.test_reconstruct_nerf import TINY

    scene = _sky_scene(tmp_path / "scene")
    config = recipe_config(stage_recipes(find_method("nerf"), on_cpu=True, unbounded=True)[0])
    scores = {}
    for name, steps, extra in (("march", 150, []), ("proposal", 300, PROPOSAL)):
        overrides = [f"data.root={scene}", f"output_root={tmp_path / name}", *TINY, "data.max_val_views=1",
                     "trainer.run_test_after_fit=false", "system.appearance.enabled=false", f"trainer.max_steps={steps}",
                     f"trainer.val_check_interval={steps}", *extra]
        cfg = load_config(config, overrides=overrides)
        run_dir = run_experiment("train", cfg, [config], overrides)
        scores[name] = json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["psnr"]
    assert scores["proposal"] > scores["march"] + 0.7, scores


@pytest.mark.gpu
def test_the_captured_proposal_step_gives_the_eager_loss_and_gradients(tmp_path):
    """The unbounded recipe's step with proposal sampling as one CUDA graph (static shapes: no budgets, no host sync):
    the replay's loss terms and gradients equal the eager step's (jitter off, so both see the same samples)."""
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import build_parts
    from lift3d.systems.captured_step import CapturedStep
    from tests.systems.test_reconstruct_nerf import TINY

    scene = _sky_scene(tmp_path / "scene")
    overrides = [f"data.root={scene}", f"output_root={tmp_path}", *TINY, "system.renderer.randomized=false",
                 "system.appearance.enabled=false", *PROPOSAL]
    cfg = load_config(recipe_config("reconstruct-nerf-unbounded"), overrides=overrides)
    datamodule, system = build_parts(cfg)
    system = system.cuda().train()
    datamodule.setup("fit")
    batch = {k: v.cuda() for k, v in datamodule._sample_rays(0, torch.Generator().manual_seed(0)).items() if torch.is_tensor(v)}
    key = system.renderer.graph_key(batch["rays_o"].shape[0], batch["rays_o"].device)
    assert key == ("proposal",)
    params = [p for p in system.parameters() if p.requires_grad]
    captured = CapturedStep(params)

    def compute(inputs):
        terms, _, _ = system.loss_terms(inputs)
        return system.weighted_sum(terms), {f"term_{k}": v for k, v in terms.items()}

    outputs = captured.run(key, batch, compute)
    for p in params:
        p.grad = None
    captured.assign_gradients()
    replayed = [None if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    terms, _, _ = system.loss_terms(batch)
    assert {"rgb", "interlevel", "distortion"} <= set(terms)
    system.weighted_sum(terms).backward()
    for name, value in terms.items():
        torch.testing.assert_close(outputs[f"term_{name}"], value.detach(), rtol=1e-4, atol=1e-6)
    proposal_params = {id(p) for p in system.renderer.proposal.parameters()}
    assert any(g is not None and id(p) in proposal_params and float(g.abs().sum()) > 0
               for p, g in zip(params, replayed, strict=False))
    for got, p in zip(replayed, params, strict=False):
        if p.grad is None:
            assert got is None or float(got.abs().max()) == 0.0
        else:
            torch.testing.assert_close(got, p.grad, rtol=1e-3, atol=1e-5)
