"""benchmarks/reference/plain_nerf.py, the NeRF benchmark's plain-loop reference, trains the recipe's field without Lightning."""

import pytest
import torch

from benchmarks.reference.plain_nerf import train_plain
from lift3d.config import load_config
from lift3d.metrics import psnr
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_parts
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)
from tests.systems.test_reconstruct_nerf import TINY

pytestmark = pytest.mark.usefixtures("single_thread")


def test_plain_loop_fits_the_lego_fixture_and_stops_at_its_checkpoints(tmp_path, data_dir):
    overrides = [f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}", *TINY]
    cfg = load_config(recipe_config("reconstruct-nerf"), overrides=overrides)
    datamodule, _ = build_parts(cfg)
    view = datamodule._views(datamodule.val_scene())[0]

    @torch.no_grad()
    def score(system):
        system.eval()
        return {"psnr": float(psnr(system.render_views(view)["rgb"].clamp(0, 1), view["rgb"]))}

    records = train_plain(cfg, datamodule, torch.device("cpu"), [1, 100], budget_s=600.0, score=score, sync=lambda: None)
    assert [r["steps"] for r in records] == [1, 100] and not any(r["stopped_by_time_budget"] for r in records)
    assert records[1]["psnr"] > records[0]["psnr"] + 5.0, records
    assert records[1]["train_wall_s"] >= records[0]["train_wall_s"] > 0
