"""GPU: the 3DGS step as a CUDA graph. Tile intersections in fixed slots are gsplat's own, the fixed-slot render
equals gsplat's ``rasterization`` (images and gradients), and the recipe trains as well with the captured step."""

import json

import pytest
import torch

from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.render.splats.renderer import rasterize
from lift3d.render.splats.tiles import tile_grid, tile_intersections
from lift3d.runs.runner import build_parts, build_trainer
from tests.conftest import require_gpu_and_gsplat
from tests.render.splats.test_parity import _cameras, _scene
from tests.systems.test_reconstruct_gaussians import QUIET

pytestmark = pytest.mark.gpu


def _tile_lists(offsets, flatten_ids, n_tiles, rows_of_tiles):
    """[(start, end)] per image tile -> list of Gaussian ids, for offsets shaped [I, rows, W] (rows >= tiles down)."""
    flat = offsets.reshape(offsets.shape[0], -1).cpu()
    ends = torch.cat([flat.reshape(-1)[1:], torch.tensor([len(flatten_ids)])]).reshape(flat.shape)
    ids = flatten_ids.cpu()
    return [[ids[int(flat[i, t]) : int(ends[i, t])].tolist() for t in range(n_tiles)] for i in range(flat.shape[0])]


def test_fixed_slots_hold_gsplats_own_intersections():
    device = require_gpu_and_gsplat()
    from gsplat import fully_fused_projection, isect_offset_encode, isect_tiles

    splats, width, height = _scene(20000, 0, False, device), 200, 150
    cameras = _cameras(width, height, device)
    radii, means2d, depths, _, _ = fully_fused_projection(
        splats.means, None, splats.quats, splats.scales, cameras.w2c_opencv(), cameras.intrinsics, width, height)
    if radii.ndim == means2d.ndim - 1:
        radii = radii[..., None].expand(*radii.shape, 2).contiguous()
    tile_width, tile_height = tile_grid(width, height, 16)
    _, isect_ids, gsplat_ids = isect_tiles(means2d, radii, depths, 16, tile_width, tile_height)
    gsplat_offsets = isect_offset_encode(isect_ids, len(cameras), tile_width, tile_height)
    capacity = len(gsplat_ids) + 1000
    offsets, flatten_ids, count = tile_intersections(means2d, radii, depths, 16, tile_width, tile_height, capacity)
    assert int(count) == len(gsplat_ids)
    n_tiles = tile_width * tile_height
    assert _tile_lists(offsets, flatten_ids, n_tiles, tile_height + 1) == _tile_lists(gsplat_offsets, gsplat_ids, n_tiles,
                                                                                      tile_height)


def test_the_fixed_slot_render_equals_gsplats_rasterization():
    device = require_gpu_and_gsplat()
    splats, width, height = _scene(20000, 1, True, device), 160, 120
    cameras = _cameras(width, height, device)
    background = torch.tensor([0.2, 0.5, 0.9], device=device)
    results = []
    for capacity in (0, 1 << 20):
        leaves = {k: getattr(splats, k).clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "sh")}
        source = type(splats)(**leaves)
        out = rasterize(source, cameras, background=background, sh_degree=3, backend="gsplat", isect_capacity=capacity)
        weights = torch.rand_like(out["rgb"], generator=torch.Generator(device).manual_seed(5))
        ((out["rgb"] * weights).sum() + out["depth"].mean() + out["alpha"].sum()).backward()
        results.append((out, {k: v.grad for k, v in leaves.items()}))
    (plain, plain_grads), (fixed, fixed_grads) = results
    assert "isect_count" in fixed and int(fixed["isect_count"]) < (1 << 20)
    for name in ("rgb", "alpha", "depth"):
        assert (fixed[name] - plain[name]).abs().max() < 1e-5, name
    # gradients are sums of atomic adds, whose order changes from run to run: equal up to that, relative to their size
    pairs = {"means2d": (fixed["means2d"].grad, plain["means2d"].grad)}
    pairs.update({name: (fixed_grads[name], grad) for name, grad in plain_grads.items()})
    errors = {name: float((a - b).norm() / b.norm()) for name, (a, b) in pairs.items()}
    assert all(e < 1e-4 for e in errors.values()), errors


def test_reconstruct_gaussians_trains_as_well_with_the_captured_step(tmp_path, data_dir):
    require_gpu_and_gsplat()
    scores, graphs = {}, {}
    for mode in ("true", "false"):
        overrides = [f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}", *QUIET, "trainer.max_steps=400",
                     "trainer.val_check_interval=400", "trainer.accelerator=gpu", f"system.cuda_graphs={mode}",
                     "trainer.run_test_after_fit=false", "data.val_split=train", "system.densify.refine_start=100",
                     "system.densify.refine_every=100", "system.densify.reset_every=250", "system.export.formats=[]",
                     "system.gaussians.sh_degree_interval=100", "checkpoint.every_n_train_steps=0"]
        cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=overrides)
        trainer = build_trainer(cfg, tmp_path / mode, train=True)
        datamodule, system = build_parts(cfg)
        system.set_save_dir(tmp_path / mode / "save")
        trainer.fit(system, datamodule=datamodule)
        scores[mode] = json.loads((tmp_path / mode / "save" / "metrics.json").read_text())["val"]["psnr"]
        graphs[mode] = (system._graphs.captures, system._graphs.step.replays if system._graphs.step else 0,
                        len(system.gaussians))
    captures, replays, _ = graphs["true"]
    assert graphs["false"][:2] == (0, 0)
    # a capture at the start, after each of the 3 refine steps, the opacity reset and the 3 SH-degree steps
    assert replays > 350 and 4 <= captures <= 12, graphs
    assert scores["true"] > 20.0 and abs(scores["true"] - scores["false"]) < 1.0, (scores, graphs)
