"""``lift3d edit`` end to end on a tiny Gaussian reconstruction of the sample scene: the analytic editor moves the
scene's colors toward the transformed photos (PSNR against references computed here), the exports and the
orbit video are written next to the source run, the target store feeds image and ray batches, InstructPix2Pix
(tiny random weights) runs in the loop, and bad runs are clear errors."""

from __future__ import annotations

import json

import imageio.v3 as iio
import numpy as np
import pytest
import torch
import yaml

from lift3d.cli import main
from lift3d.config import load_config
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.sample_scene import sample_scene_path
from lift3d.guidance.editing import BRONZE_MATRIX, BRONZE_OFFSET
from lift3d.runs.run_dirs import load_system
from tests.tiny_diffusion import one_thread  # noqa: F401  (fixture)
from tests.tiny_instruct_pix2pix import tiny_instruct_pix2pix_path

QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false", "data.n_orbit_views=2"]
EDIT = "make it look like bronze"
FAST_COLORS = 'system.optimizer.params={"gaussians.sh0": {"lr": 0.025}}'  # 10x the 3DGS color rate: a few steps show it


@pytest.fixture(scope="module")
def reconstruction(tmp_path_factory):
    """A finished (tiny) reconstruct-gaussians run of the built-in sample scene."""
    root = tmp_path_factory.mktemp("runs")
    assert main(["reconstruct", f"output_root={root}", "trainer.max_steps=100", "trainer.val_check_interval=100",
                 "system.gaussians.init_points=2000", *QUIET]) == 0
    return root / "reconstruct-gaussians-sample" / "sample_scene"


def bronze_references() -> torch.Tensor:
    """The sample scene's train photos with the bronze color matrix applied to the object (numpy, from the PNGs)."""
    root = sample_scene_path()
    frames = json.loads((root / "transforms_train.json").read_text())["frames"]
    matrix, offset = np.array(BRONZE_MATRIX), np.array(BRONZE_OFFSET)
    images = []
    for frame in frames:
        rgba = iio.imread(root / f"{frame['file_path']}.png").astype(np.float64) / 255.0
        alpha = rgba[..., 3:]
        photo = rgba[..., :3] * alpha + (1 - alpha)  # on the white training background
        images.append(alpha * np.clip(photo @ matrix.T + offset, 0, 1) + (1 - alpha))
    return torch.tensor(np.stack(images), dtype=torch.float32)


def train_view_psnr(run_dir, references) -> float:
    """PSNR of a run's renders of the train views against ``references``."""
    cfg = load_config(run_dir / "configs" / "parsed.yaml")
    system = load_system(cfg, run_dir / "ckpts" / "last.ckpt").eval()
    data = PosedImagesDataModule(cfg.data)
    with torch.no_grad():
        renders = torch.cat([system.render_views({"cameras": data.train.cameras[i], "background": data.background[None]})["rgb"]
                             for i in range(len(data.train))])
    return float(-10 * torch.log10(((renders.clamp(0, 1) - references) ** 2).mean()))


@pytest.mark.slow
def test_analytic_edit_moves_the_scene_toward_the_transformed_photos(reconstruction, capsys):
    code = main(["edit", str(reconstruction), EDIT, "--editor", "analytic", "trainer.max_steps=80", "system.edit_every=1",
                 "system.edit_count=2", FAST_COLORS, *QUIET])
    assert code == 0
    run_dir = reconstruction.parent / "sample_scene-edit-make_it_look_like_bronze"  # next to the source run
    assert (run_dir / "save" / "it80-gaussians.ply").stat().st_size > 0 and (run_dir / "save" / "it80-test.mp4").is_file()
    assert "it80-gaussians.ply" in capsys.readouterr().out
    assert sorted(p.name for p in (run_dir / "save" / "edits").iterdir())[0] == "it000000-view000.png"
    parsed = yaml.safe_load((run_dir / "configs" / "parsed.yaml").read_text())
    assert parsed["system_type"] == "edit-gaussians" and parsed["system"]["editor"]["prompt"] == EDIT
    assert parsed["system"]["gaussians"]["sh_degree"] == 1  # the source run's settings carried over
    references = bronze_references()
    start, end = train_view_psnr(reconstruction, references), train_view_psnr(run_dir, references)
    # observed: 17.9 -> 23.8 dB (80 steps); the unedited reconstruction is far from the bronze photos
    print(f"train-view PSNR against the bronze photos: {start:.2f} -> {end:.2f} dB")
    assert end > start + 4.0, (start, end)


def test_the_target_store_feeds_image_and_ray_batches():
    for mode in ("image", "rays"):
        data = PosedImagesDataModule({"root": str(sample_scene_path()), "batch_mode": mode, "rays_per_batch": 20000,
                                      "batch_size": 40})
        photos = data._composite(data.train.rgba, data.background)[0]
        store = data.scene_summary().edit_targets()  # what an editing system is handed: the data module's one store
        assert store is data.editable_targets() and torch.allclose(store.images(list(range(40))), photos, atol=0.5 / 255)
        store.update(3, torch.full((64, 64, 3), 0.25))
        alpha = data.train.rgba[3, ..., 3:].float() / 255.0
        expected = alpha * 0.25 + (1 - alpha) * 1.0  # the edit lands on the object; the white backdrop stays
        assert torch.allclose(store.images([3])[0], expected, atol=1 / 255)
        assert int(store.edits[3]) == 1 and int(store.edits.sum()) == 1
        batch = data._sample_images(0, torch.Generator().manual_seed(0)) if mode == "image" else \
            data._sample_rays(0, torch.Generator().manual_seed(0))
        if mode == "image":
            index = batch["index"].tolist().index(3)
            assert torch.allclose(batch["rgb"][index], expected, atol=1 / 255)
        else:
            of_view_3 = torch.isclose(batch["rgb"], torch.tensor(0.25), atol=1 / 255).all(-1)
            assert of_view_3.sum() > 0  # rays of the edited view read the edited colors
            assert torch.allclose(batch["rgb"][~of_view_3].mean(), photos.reshape(-1, 3).mean(), atol=0.05)


def test_instruct_pix2pix_runs_in_the_editing_loop(reconstruction, capsys):
    model = f"system.editor.pretrained_model_name_or_path={tiny_instruct_pix2pix_path()}"
    # the folder above the run: its newest reconstruction (an edit run beside it is not one)
    assert main(["edit", str(reconstruction.parent), "turn it to gold", model, "system.editor.diffusion_steps=2",
                 "trainer.max_steps=3", "system.edit_every=1", "system.save_edits_every=1", *QUIET]) == 0
    assert "editing the newest reconstruction, sample_scene\n" in capsys.readouterr().out
    run_dir = reconstruction.parent / "sample_scene-edit-turn_it_to_gold"
    assert len(list((run_dir / "save" / "edits").glob("*.png"))) == 3 and (run_dir / "save" / "it3-gaussians.ply").is_file()


def test_bad_runs_are_clear_errors(tmp_path, reconstruction, capsys):
    assert main(["edit", str(tmp_path / "nowhere"), EDIT]) == 2
    assert "no run at" in capsys.readouterr().err
    assert main(["edit", str(tmp_path), EDIT]) == 2
    assert "not a lift3d run folder" in capsys.readouterr().err
    other = tmp_path / "outputs" / "dreamfusion-sd" / "cube"
    (other / "configs").mkdir(parents=True)
    (other / "ckpts").mkdir()
    (other / "configs" / "parsed.yaml").write_text("system_type: dreamfusion\n")
    (other / "ckpts" / "last.ckpt").write_bytes(b"")
    assert main(["edit", str(other), EDIT]) == 2
    assert "is a dreamfusion run, not a reconstruction" in capsys.readouterr().err
    assert main(["edit", str(reconstruction), "trainer.max_steps=3"]) == 2
    assert "give the edit instruction" in capsys.readouterr().err


NERF = ["system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
        "system.field.encoding.base_resolution=4",
        "system.field.encoding.per_level_scale=2.0", "system.field.hidden_dim=16", "system.renderer.steps_per_diagonal=32",
        "system.renderer.occupancy.resolution=16", "data.rays_per_batch=256", "trainer.run_test_after_fit=false"]


def test_a_nerf_reconstruction_is_edited_through_its_ray_batches(tmp_path):
    from lift3d.checkpoints import load_checkpoint

    assert main(["reconstruct", "--method", "nerf", f"output_root={tmp_path}", "trainer.max_steps=5",
                 "trainer.val_check_interval=0", *NERF, *QUIET]) == 0
    source = tmp_path / "reconstruct-nerf" / "sample_scene"
    assert main(["edit", str(source), EDIT, "--editor", "analytic", "trainer.max_steps=6", "system.edit_every=2",
                 "system.save_edits_every=1", "system.export.formats=[]", *NERF, *QUIET]) == 0
    run_dir = tmp_path / "reconstruct-nerf" / "sample_scene-edit-make_it_look_like_bronze"
    assert sorted(p.name for p in (run_dir / "save" / "edits").iterdir()) == [
        "it000000-view000.png", "it000002-view001.png", "it000004-view002.png"]
    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert state["lift3d"]["system_type"] == "edit-nerf" and state["lift3d_edit"]["edits_done"] == 3
    assert state["lift3d_edit"]["edits"].tolist()[:4] == [1, 1, 1, 0]  # the edited views, kept for a resume
