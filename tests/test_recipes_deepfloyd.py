"""The DeepFloyd IF recipes end to end on the CPU with a tiny random-weight IF stage I (no download):
``lift3d generate --method dreamfusion-if`` ends in its .glb; ``--method magic3d-if`` trains the IF NeRF stage,
then the Stable Diffusion mesh stage from its checkpoint, ending in a textured .glb."""

from __future__ import annotations

from lift3d.api.generate import carries_to_other_model
from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from tests.tiny_deepfloyd import tiny_if_path
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)

SIZE = 32
TINY = [
    "trainer.max_steps=2", "trainer.val_check_interval=2", f"data.height={SIZE}", f"data.width={SIZE}",
    f"data.eval_height={SIZE}", f"data.eval_width={SIZE}", "data.n_val_views=1", "data.n_test_views=2",
    "checkpoint.every_n_train_steps=2", "use_timestamp=false", "trainer.enable_progress_bar=false",
    "system.export.resolution=24", "system.export.texture_size=32",
    "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10", "system.field.encoding.start_level=-1",
    "system.field.encoding.base_resolution=4", "system.field.encoding.per_level_scale=2.0",
    "system.field.hidden_dim=16", "system.renderer.steps_per_diagonal=32", "system.renderer.occupancy.resolution=16",
]
REFINE = [  # the mesh stage at test size, with the tiny Stable Diffusion
    "system.guidance.resolution=64", "system.geometry.grid_resolution=16", "system.geometry.texture.encoding.n_levels=4",
    "system.geometry.texture.encoding.log2_hashmap_size=10", "system.geometry.texture.encoding.base_resolution=4",
    "system.inherit_texture_steps=5", "system.inherit_texture_points=2048", "system.export.texture_size=32",
    f"data.height={SIZE}", f"data.width={SIZE}", f"data.eval_height={SIZE}", f"data.eval_width={SIZE}",
    "data.n_val_views=1", "data.n_test_views=2", "trainer.enable_progress_bar=false",
]


def test_recipes_use_threestudio_if_defaults():
    for name, weighting in (("dreamfusion-if", "sds"), ("magic3d-if", "uniform")):
        cfg = load_config(recipe_config(name))
        guidance = cfg.system["guidance"]
        assert cfg.system["guidance_type"] == "deepfloyd-if"
        assert guidance["pretrained_model_name_or_path"] == "DeepFloyd/IF-I-XL-v1.0"
        assert guidance["guidance_scale"] == 20.0 and guidance["resolution"] == 64 and guidance["weighting"] == weighting
        assert cfg.data["height"] == cfg.data["width"] == 64 and cfg.trainer.max_steps == 10000


def test_refine_stage_takes_prompts_but_not_the_if_guidance_settings():
    assert carries_to_other_model("system.guidance.prompt=\"a cat\"")
    assert carries_to_other_model("system.guidance.negative_prompt=x")
    assert carries_to_other_model("seed=3") and carries_to_other_model("system.loss.lambda_sds=2")
    assert not carries_to_other_model("system.guidance.pretrained_model_name_or_path=/if")
    assert not carries_to_other_model("system.guidance.guidance_scale=20")


def test_generate_dreamfusion_if_exports(tmp_path):
    model = f"system.guidance.pretrained_model_name_or_path={tiny_if_path()}"
    cache = f"system.guidance.prompt_cache_dir={tmp_path / 'cache'}"
    command = ["generate", "a small red cube", "--method", "dreamfusion-if", f"output_root={tmp_path}", model, cache, *TINY]
    assert main(command) == 0
    run_dir = tmp_path / "dreamfusion-if" / "a_small_red_cube"
    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert state["global_step"] == 2 and not any(k.startswith("guidance.") for k in state["state_dict"])
    assert (run_dir / "save" / "it2.glb").stat().st_size > 0 and (run_dir / "save" / "it2-test.mp4").is_file()
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 7  # T5 ran once; the embeddings stay for next time


def test_generate_magic3d_if_chains_the_sd_mesh_stage(tmp_path):
    model = f"system.guidance.pretrained_model_name_or_path={tiny_if_path()}"
    refine = [item for override in [*REFINE, f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}",
                                     f"system.guidance.prompt_cache_dir={tmp_path / 'sd-cache'}"]
              for item in ("--refine-set", override)]
    assert main(["generate", "a small red cube", "--method", "magic3d-if", f"output_root={tmp_path}", model,
                 f"system.guidance.prompt_cache_dir={tmp_path / 'cache'}", "system.export.threshold=5.0", *TINY,
                 "--refine-steps", "2", *refine]) == 0
    coarse = tmp_path / "magic3d-if" / "a_small_red_cube"
    fine = tmp_path / "magic3d-refine" / "a_small_red_cube"
    assert load_checkpoint(coarse / "ckpts" / "last.ckpt")["global_step"] == 2
    state = load_checkpoint(fine / "ckpts" / "last.ckpt")
    assert state["global_step"] == 2 and "geometry.sdf" in state["state_dict"]
    parsed = load_config(fine / "configs" / "parsed.yaml")
    assert parsed.system["guidance_type"] == "stable-diffusion" and parsed.system["guidance"]["prompt"] == "a small red cube"
    assert parsed.system["geometry_convert_from"] == str(coarse / "ckpts" / "last.ckpt")
    assert sorted((fine / "save").glob("it2*.glb"))
