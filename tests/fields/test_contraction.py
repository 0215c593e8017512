"""Scene contraction (unbounded scenes): the maps, exponential marching, and a renderer that reaches the far world."""

import math

import pytest
import torch

from lift3d.fields.contraction import contract, from_unit_cube, to_unit_cube, uncontract
from lift3d.registry import find
from lift3d.render.volume.sampling import step_bounds, step_distance, step_index
from tests.nerf_fields import AnalyticField, single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


class ContractedField(AnalyticField):
    """An analytic field that declares a contraction, as ImplicitVolume does."""

    def __init__(self, density_fn, radius: float, contraction: str, color=(0.9, 0.1, 0.1)) -> None:
        super().__init__(density_fn, radius, color)
        self.contraction = contraction


@pytest.mark.parametrize("kind, norm", [("cube", lambda z: z.abs().amax(-1)), ("sphere", lambda z: z.norm(dim=-1))])
def test_contraction_keeps_the_box_squeezes_the_rest_and_inverts(kind, norm):
    generator = torch.Generator().manual_seed(0)
    y = torch.randn(4000, 3, generator=generator) * torch.logspace(-1, 2.5, 4000)[:, None]
    z = contract(y, kind)
    inside = norm(y) <= 1
    torch.testing.assert_close(z[inside], y[inside])  # the box (or ball) is untouched
    assert (norm(z) < 2).all() and (norm(z[~inside]) > 1).all()
    # a point at distance d (in box units) lands at 2 - 1/d along its own direction
    d = norm(y[~inside])
    torch.testing.assert_close(norm(z[~inside]), 2 - 1 / d)
    normalize = torch.nn.functional.normalize
    torch.testing.assert_close(normalize(z[~inside], dim=-1), normalize(y[~inside], dim=-1))
    torch.testing.assert_close(uncontract(z, kind), y, rtol=1e-3, atol=1e-4)  # float32 near the outer face: d = 1 / (2 - |z|)


def test_unit_cube_puts_the_box_in_the_middle_half():
    bbox = torch.tensor([[-2.0, -2.0, -2.0], [2.0, 2.0, 2.0]])
    corners = torch.tensor([[-2.0, -2.0, -2.0], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(to_unit_cube(corners, bbox, "cube"), torch.tensor([[0.25] * 3, [0.75] * 3, [0.5] * 3]))
    torch.testing.assert_close(to_unit_cube(corners, bbox, "none"), torch.tensor([[0.0] * 3, [1.0] * 3, [0.5] * 3]))
    far = torch.tensor([[1e6, 0.0, 0.0], [0.0, -1e6, 3.0]])
    unit = to_unit_cube(far, bbox, "cube")
    assert ((unit >= 0) & (unit <= 1)).all() and unit[0, 0] > 0.999 and unit[1, 1] < 0.001
    points = torch.randn(100, 3) * 10
    torch.testing.assert_close(from_unit_cube(to_unit_cube(points, bbox, "cube"), bbox, "cube"), points, rtol=1e-4, atol=1e-3)


def test_marching_past_the_knee_steps_evenly_in_inverse_distance_and_ends():
    step, knee = 0.05, 2.0  # fixed steps of 0.05 up to distance 2, then evenly spaced in 1 / distance
    t = torch.tensor([0.0, 0.3, knee, 3.0, 50.0, 999.0])
    torch.testing.assert_close(step_distance(step_index(t, step, knee), step, knee), t, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(step_index(torch.tensor([0.3, 1e9]), step, knee), torch.tensor([6.0, 80.0]))  # infinity: 2K/dt
    t_near, t_far = torch.tensor([[0.2]]), torch.tensor([[1000.0]])
    n = int(math.ceil(step_index(t_far, step, knee).item())) + 1
    k = torch.arange(n, dtype=torch.float32)[None]
    lo, hi = step_bounds(t_near, t_far, torch.tensor([[0.5]]), step, k, knee)
    real = hi > lo
    lo, hi = lo[real], hi[real]
    assert lo[0] == pytest.approx(0.2) and hi[-1] == pytest.approx(1000.0)  # covers the whole ray
    torch.testing.assert_close(lo[1:], hi[:-1])  # no gaps, no overlaps
    assert int(real.sum()) <= 81  # 36 fixed steps from 0.2 to 2, 40 to infinity, cut at 1000
    width = hi - lo
    inner = (lo > 0.21) & (hi < knee)
    torch.testing.assert_close(width[inner], torch.full_like(width[inner], step), rtol=1e-3, atol=1e-5)
    outer = (lo > knee) & (hi < 999.0)  # the last step is cut by the far end
    disparity_step = 1 / lo[outer] - 1 / hi[outer]
    torch.testing.assert_close(disparity_step, torch.full_like(disparity_step, step / knee**2), rtol=1e-3, atol=1e-6)
    # with no knee the steps are the fixed ones
    lo0, hi0 = step_bounds(t_near, torch.tensor([[1.0]]), torch.tensor([[1.0]]), step, k[:, :5])
    torch.testing.assert_close(hi0[0], torch.tensor([0.25, 0.3, 0.35, 0.4, 0.45]))


def far_shell(inner: float, outer: float, sigma: float):
    """Density sigma between two spheres around the origin: a 'background' far outside the object's box."""
    return lambda p: torch.where((p.norm(dim=-1) > inner) & (p.norm(dim=-1) < outer), torch.full_like(p[:, 0], sigma),
                                 torch.zeros_like(p[:, 0]))


def _renderer(field, **cfg):
    material = find("emission")({})
    background = find("solid-color")({"color": [1.0, 1.0, 1.0]})
    return find("volume-renderer")(cfg, field, material, background).eval()


def _rays_from(distance: float, n: int = 32):
    generator = torch.Generator().manual_seed(1)
    directions = torch.nn.functional.normalize(torch.randn(n, 3, generator=generator), dim=-1)
    return torch.tensor([[0.0, 0.0, distance]]).expand(n, 3), directions


@pytest.mark.parametrize("sampler", ["occupancy", "importance"])
def test_an_unbounded_renderer_sees_the_far_background_a_bounded_one_cannot(sampler):
    shell = far_shell(40.0, 60.0, 5.0)  # a red world 40-60 units away, around an empty box of radius 2
    rays_o, rays_d = _rays_from(4.0)
    bounded = _renderer(ContractedField(shell, 2.0, "none"), sampler=sampler, steps_per_diagonal=128)
    unbounded = _renderer(ContractedField(shell, 2.0, "cube"), sampler=sampler, steps_per_diagonal=128,
                          disparity_from=6.0, n_samples=128, n_importance=64)
    if sampler == "occupancy":
        unbounded.occupancy.mark_all()
    with torch.no_grad():
        far, near = unbounded.render_rays(rays_o, rays_d), bounded.render_rays(rays_o, rays_d)
    assert near["alpha"].max() < 1e-6  # the box alone holds nothing: the background color shows
    assert far["alpha"].min() > 0.99  # every ray reaches the shell and is stopped by it
    torch.testing.assert_close(far["rgb"], torch.tensor([[0.9, 0.1, 0.1]]).expand(32, 3), atol=0.02, rtol=0)
    # the depth is where the ray enters the shell (40 units from the origin, the camera 4 from it)
    t_enter = -(rays_o * rays_d).sum(-1) + ((rays_o * rays_d).sum(-1) ** 2 - 16.0 + 1600.0).sqrt()
    assert ((far["depth"][:, 0] - t_enter).abs() / t_enter).max() < 0.1


def test_the_occupancy_grid_over_contracted_space_finds_the_far_shell():
    torch.manual_seed(0)
    field = ContractedField(far_shell(12.0, 1000.0, 5.0), 2.0, "cube")  # contracted: max-norm 1.83-1.998 of 2
    renderer = _renderer(field, disparity_from=6.0, steps_per_diagonal=128, occupancy={"resolution": 32})
    grid = renderer.occupancy
    for _ in range(8):  # each update probes one random point a cell; the outer cells span much of the world
        grid.update(field.density, renderer.step_size, step=0)
    points = torch.tensor([[50.0, 0.0, 0.0], [0.0, -450.0, 0.0], [0.0, 0.0, 0.0], [1.5, 1.0, 0.0], [5.0, 0.0, 0.0]])
    assert grid.query(points).tolist() == [True, True, False, False, False]
    # the box's cells are the middle half of the grid: a quarter of the cells along each axis is outside it on each side
    centers = grid.cell_points(torch.arange(grid.occupied.numel()), jitter=False)
    inside_box = (centers.abs() <= 2).all(-1)
    assert inside_box.float().mean().item() == pytest.approx(0.125)


def test_an_unbounded_field_needs_a_knee_and_the_field_checks_its_contraction():
    field = ContractedField(far_shell(40.0, 60.0, 5.0), 2.0, "cube")
    with pytest.raises(ValueError, match="disparity_from > 0"):
        _renderer(field)
    with pytest.raises(ValueError, match="contraction must be one of"):
        find("implicit-volume")({"contraction": "ball"})
    volume = find("implicit-volume")({"radius": 2.0, "contraction": "cube", "encoding": {"n_levels": 2, "log2_hashmap_size": 8}})
    unit = volume.normalize(torch.tensor([[1e5, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert 0.99 < unit[0, 0] <= 1.0 and unit[1].tolist() == [0.5, 0.5, 0.5]


def test_lift3d_reconstruct_picks_the_unbounded_recipe_and_it_trains(tmp_path):
    """Photos of the sample toy under a sky that changes with direction (nerfstudio layout, true poses): a real-photo
    layout gets the unbounded recipe, which trains, renders the sky, and reloads to the same render."""
    import json

    from PIL import Image

    from lift3d.config import load_config
    from lift3d.data.formats import is_object_centric
    from lift3d.data.sample_scene import render_toy, sample_cameras
    from lift3d.data.scene import detect_format
    from lift3d.method_table import find_method, stage_recipes
    from lift3d.metrics import psnr
    from lift3d.recipes import recipe_config
    from lift3d.runs.run_dirs import load_system
    from lift3d.runs.runner import build_parts, run_experiment
    from tests.systems.test_reconstruct_nerf import TINY

    scene = tmp_path / "scene"
    cameras = sample_cameras("train", 40)[::2]
    toy = render_toy(cameras, supersample=2)
    sky = 0.5 + 0.45 * cameras.rays()[1]  # a color per direction: a world at infinity
    photos = toy[..., :3] * toy[..., 3:] + sky * (1 - toy[..., 3:])
    (scene / "images").mkdir(parents=True)
    for i, photo in enumerate(photos):
        Image.fromarray((photo.clamp(0, 1) * 255 + 0.5).byte().numpy()).save(scene / "images" / f"photo_{i:03d}.png")
    k = cameras.intrinsics[0]
    frames = [{"file_path": f"images/photo_{i:03d}.png", "transform_matrix": cameras.c2w[i].tolist()}
              for i in range(len(cameras))]
    (scene / "transforms.json").write_text(json.dumps({
        "camera_model": "PINHOLE", "fl_x": float(k[0, 0]), "fl_y": float(k[1, 1]), "cx": float(k[0, 2]), "cy": float(k[1, 2]),
        "w": cameras.width, "h": cameras.height, "frames": frames}))
    assert not is_object_centric(detect_format(scene)) and is_object_centric("blender")
    nerf, gaussians = find_method("nerf"), find_method("gaussians")
    config = recipe_config(stage_recipes(nerf, on_cpu=True, unbounded=True)[0])
    assert config.name == "reconstruct-nerf-unbounded-cpu.yaml"
    assert stage_recipes(nerf, on_cpu=False, unbounded=True) == ["reconstruct-nerf-unbounded"]
    assert stage_recipes(gaussians, on_cpu=True, unbounded=True) == ["reconstruct-gaussians-cpu"]

    # appearance off: the reloaded model's render is compared with the whole photo, the plain validation score
    overrides = [f"data.root={scene}", f"output_root={tmp_path / 'out'}", *TINY, "data.max_val_views=1",
                 "trainer.run_test_after_fit=false", "system.appearance.enabled=false"]
    cfg = load_config(config, overrides=overrides)
    assert cfg.system["field"]["contraction"] == "cube"
    datamodule, system = build_parts(cfg)
    view = datamodule._views(datamodule.val_scene())[0]
    with torch.no_grad():
        start = float(psnr(system.eval().render_views(view)["rgb"].clamp(0, 1), view["rgb"]))
    run_dir = run_experiment("train", cfg, [config], overrides)
    final = json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["psnr"]
    assert final > start + 2.5, (start, final)
    loaded = load_system(cfg, run_dir / "ckpts" / "last.ckpt").eval()
    assert loaded.field.contraction == "cube"
    with torch.no_grad():
        again = float(psnr(loaded.render_views(view)["rgb"].clamp(0, 1), view["rgb"]))
    assert abs(again - final) < 0.05
