"""The reconstruct-nerf recipe end to end on the 50x50 lego fixture: PSNR rises, outputs are written."""

import json

import pytest
import torch

from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from lift3d.config import load_config
from lift3d.metrics import psnr
from lift3d.recipes import recipe_config
from lift3d.runs.run_dirs import load_system
from lift3d.runs.runner import build_parts, run_experiment
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

# a tiny field and a coarse march so a CPU trains it in seconds; val_split=train measures the fit
TINY = [
    "data.rays_per_batch=256", "data.val_split=train", "data.n_orbit_views=2",
    "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
    "system.field.encoding.base_resolution=4", "system.field.encoding.per_level_scale=2.0",
    "system.field.hidden_dim=16", "system.material.hidden_dim=16", "system.material.sh_degree=1",
    "system.renderer.steps_per_diagonal=64", "system.renderer.occupancy.resolution=16",
    "system.renderer.occupancy.warmup_steps=32", "system.eval_normals=false",
    "trainer.max_steps=100", "trainer.val_check_interval=100", "checkpoint.every_n_train_steps=0",
    "trainer.enable_progress_bar=false", "use_timestamp=false",
]


def test_reconstruct_nerf_fits_the_lego_fixture(tmp_path, data_dir):
    overrides = [f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}", *TINY]
    cfg = load_config(recipe_config("reconstruct-nerf"), overrides=overrides)
    datamodule, system = build_parts(cfg)
    view = datamodule._views(datamodule.val_scene())[0]
    with torch.no_grad():
        start = float(psnr(system.eval().render_views(view)["rgb"].clamp(0, 1), view["rgb"]))

    run_dir = run_experiment("train", cfg, [recipe_config("reconstruct-nerf")], overrides)
    metrics = json.loads((run_dir / "save" / "metrics.json").read_text())
    final = metrics["val"]["psnr"]
    assert final > start + 8.0, (start, final)
    assert (run_dir / "save" / "it100-val" / "0000.png").is_file()
    assert (run_dir / "save" / "it100-test.mp4").is_file()

    # the checkpoint holds the occupancy grid and reloads to the same render
    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")["state_dict"]
    loaded = load_system(cfg, run_dir / "ckpts" / "last.ckpt").eval()
    assert torch.equal(loaded.renderer.occupancy.occupied, state["renderer.occupancy.occupied"])
    with torch.no_grad():
        again = float(psnr(loaded.render_views(view)["rgb"].clamp(0, 1), view["rgb"]))
    assert abs(again - final) < 0.05
    assert loaded.density_at(torch.zeros(4, 3)).shape == (4,) and loaded.albedo_at(torch.zeros(4, 3)).shape == (4, 3)


def test_train_command_runs_the_recipe_config(tmp_path, data_dir):
    code = main(["train", "configs/reconstruct-nerf.yaml", f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}",
                 *[o for o in TINY if not o.startswith("trainer.max_steps")], "trainer.max_steps=3",
                 "trainer.run_test_after_fit=false", "trainer.val_check_interval=0"])
    assert code == 0
    assert (tmp_path / "reconstruct-nerf" / "run" / "ckpts" / "last.ckpt").is_file()


def test_resident_ray_batches_train_the_same_field(tmp_path, data_dir):
    """images_on_device=always (what CUDA runs do): ray batches gathered on the device from resident rays train the
    same field, step for step, as the host loader's copied batches."""
    checkpoints = []
    for mode in ("never", "always"):
        code = main(["train", "configs/reconstruct-nerf.yaml", f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}",
                     *[o for o in TINY if not o.startswith("trainer.max_steps")], "trainer.max_steps=4", f"tag={mode}",
                     f"data.images_on_device={mode}", "trainer.run_test_after_fit=false", "trainer.val_check_interval=0"])
        assert code == 0
        checkpoints.append(load_checkpoint(tmp_path / "reconstruct-nerf" / mode / "ckpts" / "last.ckpt"))
    assert checkpoints[0]["global_step"] == checkpoints[1]["global_step"] == 4
    host, resident = (c["state_dict"] for c in checkpoints)
    assert "field.encoding.table" in host
    for name, value in host.items():
        assert torch.equal(value, resident[name]), name
