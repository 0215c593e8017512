"""Every photo its own size and intrinsics, and masks that mean "ignore", end to end on the CPU: COLMAP folders with
per-image sizes (COLMAP's undistorted dense layout) and with two cameras, nerfstudio per-frame sizes, batches,
evaluation views, metrics, the Gaussian and NeRF recipes, and the data.* value checks."""

import json
import re

import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.config import ConfigError, load_config
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.metrics import psnr, ssim
from lift3d.recipes import recipe_config
from lift3d.rng import step_generator
from lift3d.runs.runner import run_experiment
from tests.mixed_photo_sets import HOLDOUT, write_colmap_scene, write_nerfstudio_scene
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)

QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false", "trainer.num_sanity_val_steps=0",
         "checkpoint.every_n_train_steps=0", "trainer.run_test_after_fit=false", "system.export.formats=[]"]
SMALL = ["system.gaussians.init_points=2000", "system.renderer.tile_size=4", "system.gaussians.sh_degree=1",
         "system.gaussians.sh_degree_interval=50"]


def _gaussians(tmp_path, root, tag, steps, *extra):
    """Train reconstruct-gaussians on ``root`` for ``steps`` -> (held-out PSNR, run folder)."""
    config = recipe_config("reconstruct-gaussians")
    overrides = [f"output_root={tmp_path}", f"data.root={root}", f"tag={tag}", f"data.holdout_every={HOLDOUT}", *QUIET, *SMALL,
                 f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "system.densify.refine_start=50",
                 "system.densify.refine_every=50", f"system.densify.refine_stop={steps - 20}", "system.densify.reset_every=0",
                 *extra]
    run_dir = run_experiment("train", load_config(config, overrides=overrides), [config], [])
    return json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["psnr"], run_dir


def test_an_undistorted_dense_colmap_folder_loads_every_photo_at_its_own_size(tmp_path):
    root = write_colmap_scene(tmp_path / "dense", "dense")
    module = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT})
    train = module.train
    sizes = [train.size(i) for i in range(len(train))]
    assert train.mixed_sizes and len(set(sizes)) > 10
    assert (train.cameras.width, train.cameras.height) == (max(w for w, _ in sizes), max(h for _, h in sizes))
    for i, (w, h) in enumerate(sizes):  # the padding is never compared; the photo's own pixels all are
        assert int(train.keep[i].sum()) == w * h and bool(train.keep[i, :h, :w].all())
    # image batches: loss_mask marks the padding; ray batches draw only pixels inside the photos
    batch = module.on_after_batch_transfer(module._pick_images(3, step_generator(0, 3)), 0)
    i = int(batch["index"][0])
    assert batch["loss_mask"].shape == (1, train.cameras.height, train.cameras.width, 1)
    assert torch.equal(batch["loss_mask"][0, ..., 0].bool(), train.keep[i])
    rays = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT, "batch_mode": "rays", "rays_per_batch": 512})
    pick, _ = rays._pick_rays(0, step_generator(0, 0))
    assert bool(rays.train.keep.reshape(-1)[pick].all())
    # evaluation views come at their own size, each with its own camera; batched only with views of their size
    views = module._views(module.val_scene())
    for view, k in zip(views, range(len(views))):
        w, h = module.val_scene().size(k)
        assert view["rgb"].shape == (1, h, w, 3) and (view["cameras"].width, view["cameras"].height) == (w, h)
        assert "loss_mask" not in view
    batched = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT, "eval_batch_size": 4})
    for b in batched.val_dataloader():
        assert b["rgb"].shape[1:3] == (b["cameras"].height, b["cameras"].width)
    assert module.orbit_cameras(3).width == train.size(0)[0]
    record = json.loads(module.write_records(tmp_path / "run").read_text())
    assert len(record["image_sizes"]) == len(train)
    # the viewer's training frustums: each photo's own size and thumbnail (no padding)
    from lift3d.viewer.models import training_views_of

    shown = training_views_of(module, thumbnail_side=16)
    assert shown.sizes == sizes
    step = max(train.cameras.width, train.cameras.height) // 16
    assert [t.shape[:2] for t in shown.thumbnails] == [(-(-h // step), -(-w // step)) for w, h in sizes]


@pytest.mark.slow
def test_two_size_set_trains_to_within_1db_of_the_one_size_set(tmp_path):
    """The same views cropped to one size, to portrait and landscape (two sizes), and to every photo its own size
    (poses kept): held-out PSNR within 1 dB of the one-size set's."""
    # appearance off: its held-out protocol scores each crop's own right half, other pixels for each set
    psnr_of = {kind: _gaussians(tmp_path, write_colmap_scene(tmp_path / kind, kind), kind, 300,
                                "system.appearance.enabled=false")[0]
               for kind in ("one", "orientations", "dense")}
    assert psnr_of["one"] > 21.0 and all(abs(v - psnr_of["one"]) < 1.0 for v in psnr_of.values()), psnr_of


def test_two_cameras_train(tmp_path):
    """A model with two cameras of different sizes and focal lengths."""
    results = {}
    for kind in ("two-cameras",):
        root = write_colmap_scene(tmp_path / kind, kind)
        module = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT})
        assert len({module.train.size(i) for i in range(len(module.train))}) == 2
        _, run_dir = _gaussians(tmp_path, root, kind, 120, "trainer.num_sanity_val_steps=-1")
        history = json.loads((run_dir / "save" / "metrics.json").read_text())["history"]
        results[kind] = (history[0]["step"], history[0]["psnr"], history[-1]["psnr"])
    assert all(start == 0 and end > first + 5.0 for start, first, end in results.values()), results


@pytest.mark.usefixtures("single_thread")
def test_nerf_trains_on_two_cameras_in_rays_and_image_mode(tmp_path):
    root = write_colmap_scene(tmp_path / "two", "two-cameras")
    config = recipe_config("reconstruct-nerf")
    tiny = ["data.rays_per_batch=256", "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
            "system.field.encoding.base_resolution=4", "system.field.encoding.per_level_scale=2.0",
            "system.field.hidden_dim=16", "system.material.hidden_dim=16", "system.material.sh_degree=1",
            "system.renderer.steps_per_diagonal=64", "system.renderer.occupancy.resolution=16",
            "system.renderer.occupancy.warmup_steps=32", "system.eval_normals=false", "data.max_val_views=2"]
    for mode in ("rays", "image"):
        overrides = [f"output_root={tmp_path}", f"data.root={root}", f"tag={mode}", f"data.batch_mode={mode}", *QUIET, *tiny,
                     "trainer.max_steps=30", "trainer.val_check_interval=30", "data.holdout_every=4"]
        run_dir = run_experiment("train", load_config(config, overrides=overrides), [config], [])
        metrics = json.loads((run_dir / "save" / "metrics.json").read_text())["val"]
        assert metrics["views"] == 2 and np.isfinite(metrics["psnr"]) and metrics["psnr"] > 8.0, (mode, metrics)
        shapes = {p.name: p.stat().st_size for p in (run_dir / "save" / "it30-val").glob("*.png")}
        assert len(shapes) == 2


def test_nerfstudio_per_frame_sizes(tmp_path):
    root = write_nerfstudio_scene(tmp_path / "ns", occluded=False, per_frame_sizes=True)
    meta = json.loads((root / "transforms.json").read_text())
    module = PosedImagesDataModule({"root": str(root)})
    frames = {f["file_path"]: f for f in meta["frames"]}
    for i, path in enumerate(module.train.paths):
        frame = frames[next(k for k in frames if path.endswith(k))]
        assert module.train.size(i) == (frame["w"], frame["h"])
        assert float(module.train.cameras.intrinsics[i, 0, 2]) == pytest.approx(frame["cx"])
        assert float(module.train.cameras.intrinsics[i, 1, 2]) == pytest.approx(frame["cy"])


def test_masked_metrics_score_kept_pixels_only():
    target = torch.rand(2, 16, 16, 3, generator=torch.Generator().manual_seed(0))
    prediction = target.clone()
    prediction[:, :, :8] = 1 - prediction[:, :, :8]  # wrong on the left half only
    mask = torch.ones(2, 16, 16, 1)
    mask[:, :, :8] = 0
    assert bool((psnr(prediction, target, mask) > 90).all()) and bool((psnr(prediction, target) < 20).all())
    assert bool((ssim(prediction, target, mask=mask) > 0.999).all()) and bool((ssim(prediction, target) < 0.9).all())


def test_gaussians_seen_only_in_ignored_pixels_get_no_gradient_and_are_not_counted():
    """The loss mask zeroes the gradients of a Gaussian drawn only in ignored pixels, and densification counts it as
    unseen there: it is never grown. One beside it, in kept pixels, gathers both."""
    from lift3d.cameras import intrinsics_matrix, look_at
    from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem, seen_in_kept_pixels

    system = ReconstructGaussiansSystem({"renderer": {"tile_size": 4}, "gaussians": {"sh_degree": 0}})
    points = torch.tensor([[-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    system.gaussians.initialize(points, torch.full((2, 3), 0.5), torch.Generator().manual_seed(0))
    with torch.no_grad():
        system.gaussians.log_scales.fill_(float(np.log(0.05)))  # small: each footprint stays within its half
    c2w = look_at(torch.tensor([[0.0, -3.0, 0.0]]), torch.zeros(1, 3), torch.tensor([0.0, 0.0, 1.0]))
    cameras = Cameras(c2w, intrinsics_matrix(torch.tensor([20.0]), torch.tensor([20.0]), torch.tensor([16.0]),
                                             torch.tensor([16.0])), 32, 32)
    mask = torch.ones(1, 32, 32, 1)
    mask[:, :, :16] = 0  # the left half is ignored: the Gaussian at x = -0.5 is drawn only there
    target = torch.rand(1, 32, 32, 3, generator=torch.Generator().manual_seed(1))
    terms, out = system.loss_terms(cameras, torch.ones(1, 3), target, mask)
    system.weighted_sum(terms).backward()
    grad = out["means2d"].grad[0]
    left, right = int(out["means2d"][0, :, 0].argmin()), int(out["means2d"][0, :, 0].argmax())
    assert float(grad[left].abs().max()) == 0.0 and float(grad[right].abs().max()) > 0.0
    assert float(system.gaussians.means.grad[left].abs().max()) == 0.0
    counted = seen_in_kept_pixels({**out, "means2d_grad": grad[None]}, mask)
    system.densify.update(counted)
    assert float(system.densify.count[left]) == 0.0 and float(system.densify.count[right]) == 1.0
    assert float(system.densify.grad2d[left]) == 0.0 and float(system.densify.grad2d[right]) > 0.0


@pytest.mark.slow
def test_ignore_masks_keep_a_moving_occluder_out_of_the_reconstruction(tmp_path):
    """A red box walks through the training photos, masked with nerfstudio's mask_path (mask_mode auto: ignore):
    held-out PSNR within 1 dB of the clean scene's; the same photos without the masks do worse."""
    occluded = write_nerfstudio_scene(tmp_path / "occluded", occluded=True)
    module = PosedImagesDataModule({"root": str(occluded)})
    assert module.mask_mode == "ignore" and module.train.keep is not None and not module._has_masks()
    assert PosedImagesDataModule({"root": str(occluded), "mask_mode": "alpha"})._has_masks()  # cut-outs when asked
    clean, _ = _gaussians(tmp_path, write_nerfstudio_scene(tmp_path / "clean", occluded=False), "clean", 300)
    masked, run_dir = _gaussians(tmp_path, occluded, "masked", 300)
    unmasked_scene = write_nerfstudio_scene(tmp_path / "unmasked", occluded=True, masked=False)
    unmasked, _ = _gaussians(tmp_path, unmasked_scene, "unmasked", 300)
    assert clean > 21.0 and masked > clean - 1.0 and masked > unmasked + 0.3, (clean, masked, unmasked)
    assert json.loads((run_dir / "configs" / "scene.json").read_text())["mask_mode"] == "ignore"


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("downscale", 0, "posed-images.downscale must be a number >= 1; got 0"),
    ("holdout_every", -2, "posed-images.holdout_every must be a number >= 0; got -2"),
    ("batch_size", 0, "posed-images.batch_size must be a number >= 1; got 0"),
    ("rays_per_batch", -5, "posed-images.rays_per_batch must be a number >= 1"),
    ("eval_batch_size", 0, "posed-images.eval_batch_size must be"),
    ("n_orbit_views", -1, "posed-images.n_orbit_views must be"),
    ("max_train_frames", 0, "posed-images.max_train_frames must be a number >= 1 (or -1); got 0"),
    ("max_val_views", -3, "posed-images.max_val_views must be a number >= 1 (or -1)"),
    ("max_side", -1, "posed-images.max_side must be"),
    ("camera_distance", 0.0, "posed-images.camera_distance must be a number > 0"),
    ("mask_mode", "cutout", "posed-images.mask_mode must be one of auto, alpha, ignore; got 'cutout'"),
])
def test_data_values_out_of_range_are_one_line_config_errors(data_dir, key, value, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)) as error:
        PosedImagesDataModule({"root": str(data_dir / "lego_tiny"), key: value})
    assert "\n" not in str(error.value)


def test_data_values_through_the_cli(tmp_path, data_dir, capsys):
    from lift3d.cli import main

    code = main(["reconstruct", str(data_dir / "lego_tiny"), f"output_root={tmp_path}", "data.downscale=0", *QUIET[:2]])
    err = capsys.readouterr().err
    assert code != 0 and "data.downscale must be a number >= 1; got 0" in err and "internal error" not in err


@pytest.mark.parametrize(("key", "value"), [("batch_size", 0), ("height", [64, 0]), ("eval_width", -1), ("n_val_views", 0)])
def test_random_view_sizes_and_counts_out_of_range_are_config_errors(key, value):
    from lift3d.data.random_views import RandomViewsDataModule

    with pytest.raises(ConfigError, match=re.escape(f"random-views.{key} must be a number >= 1")):
        RandomViewsDataModule({key: value, **({"width": [64, 64]} if key == "height" else {})})
    assert len(RandomViewsDataModule({"height": [32, 64], "width": [32, 64], "batch_size": [2, 1]}).cfg.height) == 2


@pytest.mark.parametrize("batch_mode", ["image", "rays"])
def test_resident_batches_of_a_mixed_size_capture_equal_the_host_loaders(tmp_path, batch_mode):
    """images_on_device (as on CUDA): the batches gathered from photos kept on the device carry the same loss_mask,
    and draw the same kept pixels, as the host loader's."""
    root = write_colmap_scene(tmp_path / "dense", "dense")
    module = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT, "images_on_device": "always",
                                    "batch_mode": batch_mode, "batch_size": 3, "rays_per_batch": 300})
    module._training_device = lambda: torch.device("cpu")
    module.train_dataloader()
    for step in (0, 1, 7):
        host = module.on_after_batch_transfer((module._pick_images if batch_mode == "image" else module._sample_rays)(
            step, step_generator(module.base_seed, step)), 0)
        resident = module.on_after_batch_transfer({"step": step}, 0)
        assert set(resident) == set(host)
        for key in ("rgb", "alpha", "background") + (("loss_mask",) if batch_mode == "image" else ("rays_o", "rays_d")):
            assert torch.equal(resident[key], host[key]), (key, step)


def test_ray_batches_draw_every_kept_pixel_and_nothing_else(tmp_path):
    """Kept pixels are numbered arithmetically for padding alone and through a table with ignore-masks: both
    number exactly the kept pixels, each once."""
    from lift3d.data.resident import KeptPixels

    for root, table in ((write_colmap_scene(tmp_path / "dense", "dense"), False),
                        (write_nerfstudio_scene(tmp_path / "ns", occluded=True, per_frame_sizes=True), True)):
        scene = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT}).train
        kept = KeptPixels(scene)
        assert (kept.table is not None) == table and len(kept) == int(scene.keep.sum())
        flat = kept.flat(torch.arange(len(kept)))
        assert torch.equal(flat, scene.keep.reshape(-1).nonzero().squeeze(1))
