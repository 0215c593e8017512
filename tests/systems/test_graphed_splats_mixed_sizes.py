"""The CUDA-graph 3DGS step on a capture of photos of two sizes (portrait and landscape crops).

Photos of several sizes train padded to one size with ``loss_mask`` marking the padding, so the captured step sees
one shape for the whole run: one capture (per change of the Gaussians, as for one size), never a capture per size.
The GPU test trains such a capture with the step captured and launched kernel by kernel; its CPU twin checks that
the batches of that capture keep the step eligible for capture at every step, with the mask among the inputs."""

import json

import pytest
import torch

from lift3d.config import load_config
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.recipes import recipe_config
from lift3d.rng import step_generator
from lift3d.runs.runner import build_parts, build_trainer
from lift3d.systems.graphed_splats import GraphedSplatStep
from tests.mixed_photo_sets import HOLDOUT, write_colmap_scene
from tests.systems.test_graphed_splats import _CudaLike, _system


def test_a_two_size_capture_keeps_every_step_eligible_for_capture(tmp_path, monkeypatch):
    """CPU twin: the batches of a portrait + landscape capture share one (padded) size, so the captured step never
    turns off, and the mask reaches the captured loss as an input (one capture serves every photo)."""
    monkeypatch.setattr("lift3d.systems.graphed_splats.choose_backend", lambda backend, device: backend)
    root = write_colmap_scene(tmp_path / "orientations", "orientations")
    module = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT})
    assert len({module.train.size(i) for i in range(len(module.train))}) == 2
    step = GraphedSplatStep(_system())
    eligible, masks = [], set()
    for s in range(12):
        batch = module.on_after_batch_transfer(module._pick_images(s, step_generator(0, s)), 0)
        kept = batch["loss_mask"][0, ..., 0].bool()
        masks.add((int(kept.any(1).sum()), int(kept.any(0).sum())))  # the kept photo's height and width
        batch["rgb"] = batch["rgb"].as_subclass(_CudaLike)
        eligible.append(step.applies(batch))
    assert eligible == [False] + [True] * 11 and not step._off  # the first step runs eagerly, as for one size
    assert masks == {(36, 48), (48, 36)}  # the two orientations: each batch's mask covers its own photo


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["orientations", "dense", "two-cameras"])
def test_a_mixed_size_capture_trains_as_well_with_the_captured_step(tmp_path, layout):
    """Portrait and landscape crops of one camera, COLMAP's undistorted dense layout (every photo its own size) and a
    model with two cameras: each trains with the captured step as well as launched kernel by kernel."""
    from tests.conftest import require_gpu_and_gsplat

    require_gpu_and_gsplat()
    root = write_colmap_scene(tmp_path / layout, layout)
    scores, graphs = {}, {}
    for mode in ("true", "false"):
        overrides = [f"data.root={root}", f"output_root={tmp_path}", f"data.holdout_every={HOLDOUT}", "use_timestamp=false",
                     "trainer.enable_progress_bar=false", "trainer.max_steps=600", "trainer.val_check_interval=600",
                     "trainer.accelerator=gpu", f"system.cuda_graphs={mode}", "trainer.run_test_after_fit=false",
                     "system.gaussians.init_points=2000", "system.gaussians.sh_degree=1",  # toy photos: nothing to triangulate
                     "system.densify.refine_start=100", "system.densify.refine_every=100", "system.densify.reset_every=0",
                     "system.export.formats=[]", "system.gaussians.sh_degree_interval=100", "checkpoint.every_n_train_steps=0",
                     "trainer.num_sanity_val_steps=0"]
        cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=overrides)
        trainer = build_trainer(cfg, tmp_path / mode, train=True)
        datamodule, system = build_parts(cfg)
        system.set_save_dir(tmp_path / mode / "save")
        trainer.fit(system, datamodule=datamodule)
        scores[mode] = json.loads((tmp_path / mode / "save" / "metrics.json").read_text())["val"]["psnr"]
        graphs[mode] = (system._graphs.captures, system._graphs.step.replays if system._graphs.step else 0, system._graphs._off)
    captures, replays, off = graphs["true"]
    assert graphs["false"][:2] == (0, 0)
    # one capture at the start and after each refine and SH-degree step: never one per photo size
    assert not off and replays > 500 and 2 <= captures <= 12, graphs
    assert scores["true"] > 20.0 and abs(scores["true"] - scores["false"]) < 1.0, (scores, graphs)
    assert torch.cuda.is_available()
