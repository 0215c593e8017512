import json
import shutil

import pytest
import torch

from lift3d.config import ConfigError
from lift3d.data.posed_images import PosedImagesDataModule, SceneFormatError, read_transforms
from lift3d.data.random_views import RandomViewsConfig, sample_random_views
from lift3d.rng import step_generator


def test_lego_tiny_reads_with_camera_angle(data_dir):
    scene = read_transforms(data_dir / "lego_tiny", "train")
    assert scene.rgba.shape == (1, 50, 50, 4) and scene.rgba.dtype == torch.uint8
    fx = float(scene.cameras.intrinsics[0, 0, 0])
    assert fx == pytest.approx(0.5 * 50 / torch.tan(torch.tensor(0.6911112070083618 / 2)).item(), rel=1e-5)
    assert torch.allclose(scene.cameras.c2w[0, :3, 3], torch.tensor([-0.0538, 3.8455, 1.2081]), atol=1e-3)


def test_lego_splits_and_downscale(data_dir):
    scene = read_transforms(data_dir / "lego", "val", downscale=4, max_frames=5)
    assert scene.rgba.shape == (5, 100, 100, 4)
    assert scene.cameras.intrinsics[0, 0, 2] == pytest.approx(50.0)


def test_missing_frames_are_reported_together(tmp_path, data_dir):
    scene = tmp_path / "scene"
    shutil.copytree(data_dir / "lego_tiny", scene)
    meta = json.loads((scene / "transforms_train.json").read_text())
    meta["frames"] += [dict(meta["frames"][0], file_path="./train/r_99"), dict(meta["frames"][0], file_path="./train/r_98")]
    (scene / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(SceneFormatError, match=r"2 of 3 frames.*r_99.*r_98"):
        read_transforms(scene, "train")
    with pytest.raises(SceneFormatError, match="no transforms_test.json.*found: transforms_train.json"):
        read_transforms(scene, "test")
    (scene / "transforms_val.json").write_text("{not json")
    with pytest.raises(SceneFormatError, match="not valid JSON"):
        read_transforms(scene, "val")


def test_posed_images_batches(data_dir):
    dm = PosedImagesDataModule({"root": str(data_dir / "lego_tiny"), "background": [0.0, 0.0, 0.0]})
    batch = dm._sample_images(0, step_generator(0, 0))
    assert batch["rgb"].shape == (1, 50, 50, 3) and batch["cameras"].width == 50
    # transparent pixels take the background color (black here)
    transparent = batch["alpha"][..., 0] == 0
    assert transparent.any() and batch["rgb"][transparent].abs().max() == 0
    rays = PosedImagesDataModule({"root": str(data_dir / "lego_tiny"), "batch_mode": "rays", "rays_per_batch": 64})
    rb = rays._sample_rays(3, step_generator(0, 3))
    assert rb["rays_o"].shape == (64, 3) and rb["rgb"].shape == (64, 3)
    assert torch.allclose(rb["rays_d"].norm(dim=-1), torch.ones(64))
    # the loader yields the stored bytes (a quarter of the floats' size to copy), composited after the copy to the device
    raw = dm._pick_images(0, step_generator(0, 0))
    assert raw["rgba"].dtype == torch.uint8 and "rgb" not in raw
    finished = dm.on_after_batch_transfer(raw, 0)
    assert torch.equal(finished["rgb"], batch["rgb"]) and torch.equal(finished["alpha"], batch["alpha"])
    assert torch.equal(finished["index"], batch["index"]) and dm.on_after_batch_transfer(rb, 0) is rb  # rays pass through
    # on CUDA the loader pins every batch, which refuses views whose elements share memory (expanded tensors)
    for batch_ in (raw, rb):
        for key, value in batch_.items():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                assert 0 not in value.stride(), f"{key} is an expanded view: pin_memory would refuse it"
    orbit = dm.orbit_cameras(6)
    assert len(orbit) == 6 and orbit.width == 50


def test_random_views_are_a_function_of_step():
    cfg = RandomViewsConfig(height=[8, 16], width=[8, 16], batch_size=[4, 2], resolution_milestones=[10])
    a = sample_random_views(cfg, 3, step_generator(1, 3))
    b = sample_random_views(cfg, 3, step_generator(1, 3))
    assert torch.equal(a["cameras"].c2w, b["cameras"].c2w)
    assert a["cameras"].height == 8 and len(a["cameras"]) == 4
    late = sample_random_views(cfg, 10, step_generator(1, 10))
    assert late["cameras"].height == 16 and len(late["cameras"]) == 2
    assert (a["elevation_deg"] >= -10).all() and (a["elevation_deg"] <= 60).all()
    # stratified azimuths: one per quarter of the circle
    quarters = ((a["azimuth_deg"] + 180) // 90).long().sort().values
    assert torch.equal(quarters, torch.arange(4))
    # cameras look roughly at the origin (target perturbed by center_perturb)
    forward = -a["cameras"].c2w[:, :3, 2]
    to_origin = -a["cameras"].positions / a["cameras"].positions.norm(dim=-1, keepdim=True)
    assert ((forward * to_origin).sum(-1) > 0.8).all()


def test_resident_images_give_the_loaders_batches(data_dir, monkeypatch):
    """images_on_device: batches gathered from photos kept on the device, drawn ahead in blocks, are the ones the
    host loader copies each step (same views, backgrounds, cameras and colors), across a block boundary."""
    from lift3d.data.resident import ResidentImages

    cfg = {"root": str(data_dir / "lego"), "max_train_frames": 6, "downscale": 8, "batch_size": 2, "random_background": True}
    dm = PosedImagesDataModule(cfg)
    dm._resident = ResidentImages(dm.train, torch.device("cpu"), dm._pick, seed=7)
    fixed = PosedImagesDataModule({**cfg, "random_background": False, "background": [0.2, 0.5, 1.0]})
    fixed._resident = ResidentImages(fixed.train, torch.device("cpu"), fixed._pick, 7, fixed._composite, fixed.background)
    assert fixed._resident.composited is not None and dm._resident.composited is None  # one background: composited once
    steps = (0, 1, ResidentImages.BLOCK - 1, ResidentImages.BLOCK, 3 * ResidentImages.BLOCK + 5, 2)
    for module, step in [(dm, s) for s in steps] + [(fixed, s) for s in steps[:3]]:
        host = module.on_after_batch_transfer(module._pick_images(step, step_generator(7, step)), 0)
        resident = module.on_after_batch_transfer({"step": step}, 0)
        assert torch.equal(resident["index"], host["index"]) and torch.equal(resident["background"], host["background"])
        assert torch.equal(resident["cameras"].c2w, host["cameras"].c2w) and torch.equal(resident["rgb"], host["rgb"])
        assert torch.equal(resident["alpha"], host["alpha"]) and resident["step"] == step
        # its cameras carry their world-to-camera matrices, precomputed once for every photo
        assert resident["cameras"].viewmats is not None and host["cameras"].viewmats is None
        assert torch.allclose(resident["cameras"].w2c_opencv(), host["cameras"].w2c_opencv(), atol=1e-6)
        assert torch.equal(resident["cameras"].to("cpu")[0].w2c_opencv(), resident["cameras"].viewmats[:1])
    # auto: on CUDA where the photos take at most a quarter of its memory (a pretend GPU of 4 or 4n bytes)
    photo_bytes = dm.train.rgba.numel()
    for memory, expected in ((4 * photo_bytes, True), (4 * photo_bytes - 4, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, m=memory: type("P", (), {"total_memory": m}))
        assert dm._use_resident_images(torch.device("cuda")) is expected
    assert not dm._use_resident_images(torch.device("cpu"))
    with pytest.raises(ConfigError, match="images_on_device must be one of auto, always, never; got 'yes'"):
        PosedImagesDataModule({**cfg, "images_on_device": "yes"})


@pytest.mark.parametrize("random_background", [True, False])
def test_resident_rays_give_the_loaders_batches(data_dir, random_background, monkeypatch):
    """images_on_device with ray batches: rays and colors kept on the device, pixels drawn ahead in blocks, give
    the batches the host loader samples and copies each step (same rays, colors, alpha, background)."""
    from lift3d.data.resident import DrawnAhead, ResidentRays, fits_on_device

    cfg = {"root": str(data_dir / "lego"), "max_train_frames": 6, "downscale": 8, "batch_mode": "rays",
           "rays_per_batch": 96, "random_background": random_background, "background": [0.2, 0.5, 1.0]}
    dm = PosedImagesDataModule(cfg)
    dm._resident = ResidentRays(*dm._all_rays(), dm.train.rgba, torch.device("cpu"), dm._pick_rays, seed=7)
    for step in (0, 1, DrawnAhead.BLOCK - 1, DrawnAhead.BLOCK, 2 * DrawnAhead.BLOCK + 3, 5):
        host = dm.on_after_batch_transfer(dm._sample_rays(step, step_generator(7, step)), 0)
        resident = dm.on_after_batch_transfer({"step": step}, 0)
        assert set(resident) == set(host) and resident["step"] == step
        for key in ("rays_o", "rays_d", "rgb", "alpha", "background"):
            assert torch.equal(resident[key], host[key]), key
    assert len({float(dm._resident_rays(s)["background"][0, 0]) for s in range(4)}) == (4 if random_background else 1)
    # auto: on CUDA only (where the rays fit), always: anywhere, never: nowhere
    assert not dm._use_resident_images(torch.device("cpu"))
    always = PosedImagesDataModule({**cfg, "images_on_device": "always"})
    assert always._use_resident_images(torch.device("cpu"))
    monkeypatch.setattr(always, "_training_device", lambda: torch.device("cpu"))
    always.train_dataloader()
    assert isinstance(always._resident, ResidentRays) and always._rays is None  # no host copy beside the device's
    assert fits_on_device(10**15, torch.device("cpu"))
    # on CUDA, auto needs room for every pixel's ray, not only its color: 28 bytes a pixel in a quarter of memory
    pixels = dm.train.rgba[..., 0].numel()
    for memory, expected in ((4 * 28 * pixels, True), (4 * 28 * pixels - 4, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, m=memory: type("P", (), {"total_memory": m}))
        assert dm._use_resident_images(torch.device("cuda")) is expected


def test_ddp_ranks_take_their_share_of_one_order_of_the_photos(data_dir):
    """Under DDP each rank takes its own slice of the step's one shuffled order (the run's seed): no photo twice in a
    step, and the ranks together draw what one process with ranks x batch_size views a step draws (views and random
    backgrounds). With more views than photos the order wraps around."""
    from types import SimpleNamespace

    cfg = {"root": str(data_dir / "lego"), "max_train_frames": 6, "downscale": 8, "random_background": True}
    one = PosedImagesDataModule({**cfg, "batch_size": 4})
    one._shared_seed = 7
    ranks = []
    for rank in (0, 1):
        dm = PosedImagesDataModule({**cfg, "batch_size": 2})
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        dm._shared_seed = 7
        ranks.append(dm)
    for step in (0, 1, 5, 123):
        alone = one._pick(step, step_generator(7, step))
        parts = [dm._pick(step, step_generator(7 + rank, step)) for rank, dm in enumerate(ranks)]
        assert torch.equal(torch.cat([p[0] for p in parts]), alone[0]) and len(set(alone[0].tolist())) == 4
        assert torch.equal(torch.cat([p[1] for p in parts]), alone[1])
    crowded = [PosedImagesDataModule({**cfg, "batch_size": 4}) for _ in range(2)]
    for rank, dm in enumerate(crowded):
        dm.trainer, dm._shared_seed = SimpleNamespace(global_rank=rank, world_size=2), 7
    views = torch.cat([dm._pick(3, step_generator(7 + rank, 3))[0] for rank, dm in enumerate(crowded)])
    assert sorted(views[:6].tolist()) == list(range(6)) and torch.equal(views[6:], views[:2])
