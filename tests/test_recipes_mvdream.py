"""The mvdream recipes end to end on the CPU with a tiny random-weight MVDream-shaped model (no download):
``lift3d generate --method mvdream|mvdream-gaussians`` trains on 4-view batches through the multi-view UNet,
writes checkpoints (without the frozen weights), validation grids with the guidance panel, the test video
and the export."""

from __future__ import annotations

import pytest
from PIL import Image

from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from lift3d.systems.evaluation import LABEL_HEIGHT
from tests.test_recipes import NERF, SIZE, TINY
from tests.tiny_diffusion import one_thread  # noqa: F401  (fixture)
from tests.tiny_mvdream import tiny_mvdream_path

FOUR_VIEWS = [f"data.height={SIZE}", f"data.width={SIZE}", "data.batch_size=4", "data.resolution_milestones=[]"]
CASES = {  # method -> (recipe name, extra overrides, export files at step 2)
    "mvdream": ("mvdream", [*NERF, *FOUR_VIEWS], ["it2.glb"]),
    "mvdream-gaussians": ("mvdream-gaussians", [*FOUR_VIEWS, "system.gaussians.init_points=300", "system.renderer.tile_size=8"],
                          ["it2-gaussians.ply", "it2.glb"]),
}


@pytest.mark.parametrize("method", list(CASES))
def test_generate_mvdream_runs_end_to_end(method, tmp_path):
    name, extra, exports = CASES[method]
    model = f"system.guidance.pretrained_model_name_or_path={tiny_mvdream_path()}"
    assert main(["generate", "a small red cube", "--method", method, f"output_root={tmp_path}", model, *TINY, *extra]) == 0
    run_dir = tmp_path / name / "a_small_red_cube"
    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert state["global_step"] == 2
    assert not any(key.startswith("guidance.") for key in state["state_dict"])
    grid = Image.open(run_dir / "save" / "it2-val" / "0000.png")
    assert grid.height == SIZE + LABEL_HEIGHT and grid.width >= 4 * SIZE, grid.size  # rgb | ... | the guidance estimate
    assert (run_dir / "save" / "it2-test.mp4").is_file()
    for export in exports:
        assert (run_dir / "save" / export).stat().st_size > 0, export


def test_a_batch_that_is_not_whole_objects_is_a_config_error(tmp_path, capsys):
    model = f"system.guidance.pretrained_model_name_or_path={tiny_mvdream_path()}"
    code = main(["generate", "a cube", "--method", "mvdream", f"output_root={tmp_path}", model, *TINY, *NERF,
                 f"data.height={SIZE}", f"data.width={SIZE}", "data.batch_size=6", "data.resolution_milestones=[]"])
    assert code == 2
    assert "must be a multiple of data.n_views (4)" in capsys.readouterr().err
