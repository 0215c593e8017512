"""Each text-to-3D recipe end to end on the CPU with a tiny random-weight Stable Diffusion (no download):
``lift3d generate`` writes checkpoints, validation grids (with the guidance panel), the test video and the
export; ``lift3d train --resume`` continues from the last checkpoint."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from lift3d.api.generate import prompt_overrides, prompt_tag
from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from lift3d.config import ConfigError, load_config
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.runs.run_dirs import load_system
from lift3d.runs.runner import build_parts, run_experiment
from lift3d.systems.evaluation import LABEL_HEIGHT
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (fixture)

SIZE = 32
TINY = [
    "system.guidance.resolution=64", "trainer.max_steps=2", "trainer.val_check_interval=2",
    f"data.eval_height={SIZE}", f"data.eval_width={SIZE}", "data.n_val_views=1", "data.n_test_views=2",
    "checkpoint.every_n_train_steps=2", "use_timestamp=false", "trainer.enable_progress_bar=false",
    "system.export.resolution=24", "system.export.texture_size=32",
]
NERF = [
    "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
    "system.field.encoding.base_resolution=4", "system.field.encoding.per_level_scale=2.0",
    "system.field.hidden_dim=16", "system.renderer.steps_per_diagonal=32", "system.renderer.occupancy.resolution=16",
]
CASES = {  # method -> (recipe name, extra overrides, export files at step 2, panels per grid)
    "gaussian-sds": ("gaussian-sds", [f"data.height={SIZE}", f"data.width={SIZE}", "data.batch_size=2",
                                      "system.gaussians.init_points=300", "system.renderer.tile_size=8",
                                      "system.densify.refine_start=0", "system.densify.refine_every=1"],
                     ["it2-gaussians.ply", "it2.glb"], 4),  # rgb | depth | opacity | guidance
    "dreamfusion": ("dreamfusion-sd", [*NERF, f"data.height={SIZE}", f"data.width={SIZE}"], ["it2.glb"], 5),
    "prolificdreamer": ("prolificdreamer", [*NERF, f"data.height=[{SIZE},{SIZE + 8}]", f"data.width=[{SIZE},{SIZE + 8}]",
                                            "data.resolution_milestones=[1]"], ["it2.glb"], 5),
}


@pytest.mark.parametrize("method", list(CASES))
def test_generate_writes_outputs_and_resumes(method, tmp_path):
    name, extra, exports, panels = CASES[method]
    model = f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}"
    assert main(["generate", "a small red cube", "--method", method, f"output_root={tmp_path}", model, *TINY, *extra]) == 0
    run_dir = tmp_path / name / "a_small_red_cube"
    last = run_dir / "ckpts" / "last.ckpt"
    state = load_checkpoint(last)
    assert state["global_step"] == 2
    assert not any(key.startswith("guidance.") for key in state["state_dict"])  # frozen weights stay out
    if method == "prolificdreamer":
        assert "part:guidance" in state  # VSD's LoRA is trained state
    grid = Image.open(run_dir / "save" / "it2-val" / "0000.png")
    assert grid.height == SIZE + LABEL_HEIGHT and grid.width >= panels * SIZE, grid.size  # a label band above the panels
    assert (run_dir / "save" / "it2-test.mp4").is_file()
    for export in exports:
        assert (run_dir / "save" / export).stat().st_size > 0, export

    # resume from step 2 in the same run folder: two more steps, from the saved state
    assert main(["train", str(run_dir / "configs" / "parsed.yaml"), "--resume", str(last), "trainer.max_steps=4",
                 "trainer.run_test_after_fit=false"]) == 0
    resumed = load_checkpoint(run_dir / "ckpts" / "step0000004.ckpt")
    assert resumed["global_step"] == 4
    after = resumed["state_dict"]
    moved = [k for k, v in state["state_dict"].items() if v.is_floating_point() and k in after
             and (v.shape != after[k].shape or not torch.equal(v, after[k]))]  # densification may change the count
    assert moved, "resuming trained nothing"
    if method == "prolificdreamer":  # the LoRA trains too, and its state resumes
        lora_then, lora_now = state["part:guidance"]["params"], resumed["part:guidance"]["params"]
        assert any(not torch.equal(lora_then[k], lora_now[k]) for k in lora_then if "lora_B" in k)


def test_prompt_overrides_quote_the_prompt_and_user_overrides_win():
    overrides = [*prompt_overrides('a "cube": red, #1'), "tag=mine"]
    cfg = load_config(recipe_config("gaussian-sds"), overrides=overrides)
    assert cfg.system["guidance"]["prompt"] == 'a "cube": red, #1'
    assert cfg.tag == "mine"
    assert prompt_tag("A DSLR photo of a hamburger!") == "A_DSLR_photo_of_a_hamburger"
    assert prompt_tag("???") == "prompt"
    with pytest.raises(ConfigError, match="give a prompt"):
        prompt_overrides("  ")
    with pytest.raises(ConfigError, match="looks like an override"):
        prompt_overrides("trainer.max_steps=5")


def test_switching_the_guidance_type_drops_the_old_guidance_options(tmp_path):
    cfg = load_config(recipe_config("dreamfusion-sd"),
                      overrides=["system.guidance_type=analytic", f"system.guidance.root={tmp_path}"])
    assert cfg.system["guidance_type"] == "analytic"
    assert dict(cfg.system["guidance"]) == {"root": str(tmp_path)}  # no Stable Diffusion options left over


def test_gaussian_sds_starts_from_a_user_mesh_fitted_into_the_init_ball(data_dir):
    import trimesh

    mesh_path = data_dir / "meshes" / "suzanne" / "suzanne.obj"
    overrides = ["system.gaussians.init=mesh", f"system.gaussians.init_path={mesh_path}", "system.gaussians.init_points=400",
                 "system.gaussians.init_radius=0.6", "system.gaussians.init_up_axis=+z"]  # +z: the file's own frame
    cfg = load_config(recipe_config("gaussian-sds"), overrides=overrides)
    system = find(cfg.system_type)(cfg.system)
    torch.manual_seed(0)
    system.initialize_gaussians()
    means = system.gaussians.means.detach()
    assert means.shape == (400, 3)
    center = (means.amin(0) + means.amax(0)) / 2
    assert torch.allclose(center, torch.zeros(3), atol=1e-5)
    assert float(means.norm(dim=-1).max()) == pytest.approx(0.6, rel=1e-4)
    # the same shape: the mesh's own points, mapped by the same centring and scale, lie on the surface
    mesh = trimesh.load(str(mesh_path), force="mesh")
    lo, hi = torch.tensor(mesh.bounds[0]).float(), torch.tensor(mesh.bounds[1]).float()
    extent_ratio = (means.amax(0) - means.amin(0)) / (hi - lo)
    assert torch.allclose(extent_ratio, extent_ratio.mean().expand(3), rtol=0.05)  # uniform scale, no distortion


def test_dreamfusion_latent_warm_up_renders_latents_then_rgb(tmp_path):
    overrides = [f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}", "system.guidance.prompt=a cube",
                 f"output_root={tmp_path}", *TINY, *NERF,
                 f"data.height={SIZE}", f"data.width={SIZE}", "system.latent_steps=1", "system.field.n_feature_dims=4",
                 "trainer.run_test_after_fit=false", "trainer.val_check_interval=0"]
    cfg = load_config(recipe_config("dreamfusion-sd"), overrides=overrides)
    datamodule, system = build_parts(cfg)
    batch = next(iter(datamodule.train_dataloader()))
    assert system.render_for_training(batch)["rgb"].shape == (1, SIZE, SIZE, 4)  # step 0: latents
    assert system.guidance.latent_input
    run_dir = run_experiment("train", cfg, [recipe_config("dreamfusion-sd")], overrides)  # a latent step, then an RGB step
    trained = load_system(cfg, run_dir / "ckpts" / "last.ckpt")
    assert trained.true_global_step == 2
    assert trained.render_for_training(batch)["rgb"].shape == (1, SIZE, SIZE, 3)  # after the warm-up: RGB
    assert not trained.guidance.latent_input


def test_a_stage_starts_from_the_previous_stage_checkpoint(tmp_path):
    stage1 = [f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}", "system.guidance.prompt=a cube",
              f"output_root={tmp_path}", *TINY, *NERF, f"data.height={SIZE}", f"data.width={SIZE}",
              "data.resolution_milestones=[]",
              "trainer.run_test_after_fit=false", "trainer.val_check_interval=0", "tag=stage1"]
    cfg = load_config(recipe_config("prolificdreamer"), overrides=stage1)
    run_dir = run_experiment("train", cfg, [recipe_config("prolificdreamer")], stage1)
    ckpt = run_dir / "ckpts" / "last.ckpt"
    trained = load_checkpoint(ckpt)["state_dict"]

    # a NeRF stage from it: the field (and material, background, occupancy grid) are taken over
    stage2 = [o for o in stage1 if not o.startswith("tag=")] + [f"system.geometry_convert_from={ckpt}"]
    system = find("dreamfusion")(load_config(recipe_config("prolificdreamer"), overrides=stage2).system)
    before = {k: v.clone() for k, v in system.field.state_dict().items()}
    system.setup("fit")
    after = system.field.state_dict()
    assert all(torch.equal(after[k], trained[f"field.{k}"]) for k in after)
    assert any(not torch.equal(before[k], after[k]) for k in after)

    # a field of another shape cannot continue: a clear error
    other = [*stage2, "system.field.encoding.n_levels=3"]
    system = find("dreamfusion")(load_config(recipe_config("prolificdreamer"), overrides=other).system)
    with pytest.raises(ValueError, match="field does not match"):
        system.setup("fit")
    missing = [*stage1, f"system.geometry_convert_from={tmp_path / 'nope.ckpt'}"]
    system = find("dreamfusion")(load_config(recipe_config("prolificdreamer"), overrides=missing).system)
    with pytest.raises(Exception, match="does not exist"):
        system.setup("fit")


def test_generate_with_a_prompt_file_goes_to_the_multi_prompt_runner(tmp_path, monkeypatch):
    from lift3d.commands import multi_prompt

    calls = []
    monkeypatch.setattr(multi_prompt, "generate_many", lambda *a: calls.append(a) or (None, [{"returncode": 0}]))
    assert main(["generate", "--prompts", "p.txt", "--method", "dreamfusion", "trainer.max_steps=5", "seed=1"]) == 0
    assert calls == [("p.txt", "dreamfusion", ["trainer.max_steps=5", "seed=1"], None)]
    assert main(["generate", "trainer.max_steps=5"]) == 2  # an override where the prompt goes: a clear error
    assert main(["generate"]) == 2
