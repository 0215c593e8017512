"""TripoSR as a lift3d generator: a tiny random model of the real architecture, saved as the release is laid out
(config.yaml + model.safetensors under the released weight names), loads through the real path into a
triplane-nerf field that lift3d's renderer and exporters use; broken releases get one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at, spherical_to_position
from lift3d.generators.base import GeneratorLoadError
from lift3d.generators.triposr import TripoSRGenerator, prepare_image, release_config, released_state_dict
from lift3d.generators.triposr_model import TripoSRArchitecture, TripoSRNetwork
from lift3d.registry import find

# the sizes of the tiny model: the released architecture with small widths, one layer each, 4x4 tokens per plane
TINY = dict(cond_image_size=32, plane_size=4, num_channels=32, num_attention_heads=2, attention_head_dim=8, num_layers=1,
            cross_attention_dim=16, norm_num_groups=4, out_channels=4, n_neurons=8, n_hidden_layers=2)
TINY_FIELD = {"plane_channels": 4, "plane_size": 8, "n_neurons": 8, "n_hidden_layers": 2}
VIT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32, patch_size=16)

# the weight names of TripoSR's module tree (tsr/system.py TSR.configure: image_tokenizer, tokenizer, backbone,
# post_processor, decoder; transformers 4.x ViTModel names; diffusers-style Transformer1D blocks; NeRFMLP's
# Sequential of Linear/activation), written out for a 1-block backbone, a 1-layer ViT and a 2-hidden-layer decoder
VIT_LAYER = [f"attention.attention.{p}.{w}" for p in ("query", "key", "value") for w in ("weight", "bias")] + [
    "attention.output.dense.weight", "attention.output.dense.bias", "intermediate.dense.weight", "intermediate.dense.bias",
    "output.dense.weight", "output.dense.bias", "layernorm_before.weight", "layernorm_before.bias",
    "layernorm_after.weight", "layernorm_after.bias"]
BLOCK = [f"{n}.{w}" for n in ("norm1", "norm2", "norm3") for w in ("weight", "bias")] + [
    f"{a}.{p}.weight" for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v", "to_out.0")] + [
    "attn1.to_out.0.bias", "attn2.to_out.0.bias", "ff.net.0.proj.weight", "ff.net.0.proj.bias", "ff.net.2.weight",
    "ff.net.2.bias"]
OFFICIAL_NAMES = {
    *(f"image_tokenizer.model.{k}" for k in (
        "embeddings.cls_token", "embeddings.position_embeddings", "embeddings.patch_embeddings.projection.weight",
        "embeddings.patch_embeddings.projection.bias", "layernorm.weight", "layernorm.bias", "pooler.dense.weight",
        "pooler.dense.bias")),
    *(f"image_tokenizer.model.encoder.layer.0.{k}" for k in VIT_LAYER),
    "tokenizer.embeddings",
    "backbone.norm.weight", "backbone.norm.bias", "backbone.proj_in.weight", "backbone.proj_in.bias",
    "backbone.proj_out.weight", "backbone.proj_out.bias",
    *(f"backbone.transformer_blocks.0.{k}" for k in BLOCK),
    "post_processor.upsample.weight", "post_processor.upsample.bias",
    *(f"decoder.layers.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")),
}


def tiny_network(seed: int = 0) -> TripoSRNetwork:
    from transformers import ViTConfig

    torch.manual_seed(seed)
    network = TripoSRNetwork(TripoSRArchitecture(**TINY), ViTConfig(**VIT)).eval()
    with torch.no_grad():  # random densities barely vary in space: steepen them, so the field has surfaces to mesh
        network.decoder.layers[-1].weight[0] *= 100.0
    return network


def save_release(folder: Path, network: TripoSRNetwork, weights: str = "model.safetensors") -> Path:
    """``folder`` as the TripoSR release lays it out: config.yaml (with the official class names and an
    interpolation, as released) + weights; the ViT's config.json in its own folder, named by the config."""
    from safetensors.torch import save_file
    from transformers import ViTConfig

    folder.mkdir(parents=True, exist_ok=True)
    ViTConfig(**VIT).save_pretrained(folder / "dino")
    (folder / "config.yaml").write_text(release_config(TripoSRArchitecture(**TINY), folder / "dino"))
    state = {k: v.contiguous() for k, v in released_state_dict(network).items()}
    if weights.endswith(".safetensors"):
        save_file(state, str(folder / weights))
    else:
        torch.save(state, folder / weights)
    return folder


def photo(height: int = 40, width: int = 60) -> torch.Tensor:
    """An RGBA cut-out [H, W, 4] of a red disc off-center on a transparent, non-square canvas."""
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    inside = ((ys - 15) ** 2 + (xs - 40) ** 2 < 10**2).float()
    return torch.stack([inside, 0.1 * inside, 0.1 * inside, inside], -1)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, TripoSRNetwork]:
    network = tiny_network()
    return save_release(tmp_path_factory.mktemp("triposr"), network), network


def test_weight_names_are_the_released_module_trees():
    assert set(released_state_dict(tiny_network())) == OFFICIAL_NAMES


def test_prepare_image_recenters_the_object_on_gray():
    image = prepare_image(photo(), size=64, foreground_ratio=0.85, background=0.5)
    assert image.shape == (64, 64, 3)
    assert torch.allclose(image[0, 0], torch.tensor([0.5, 0.5, 0.5]))  # gray surround
    red = (image[..., 0] > 0.75) & (image[..., 1] < 0.3)
    ys, xs = torch.nonzero(red, as_tuple=True)
    assert abs(float(xs.float().mean()) - 31.5) < 1.5 and abs(float(ys.float().mean()) - 31.5) < 1.5  # centered
    span = int(xs.max() - xs.min() + 1) / 64
    assert 0.75 < span < 0.9  # the disc spans about foreground_ratio of the side


def test_release_loads_into_a_field_that_renders(release):
    folder, network = release
    generator = find("triposr")({"pretrained_model_name_or_path": str(folder)})
    assert isinstance(generator, TripoSRGenerator)
    generated = generator.load("cpu").generate(photo())
    expected = network(prepare_image(photo(), 32).permute(2, 0, 1)[None])[0]  # the saved weights, run directly
    assert torch.allclose(generated.state["triplane"], expected, atol=1e-5)
    field = generated.build()
    assert tuple(field.triplane.shape) == (3, 4, 8, 8)
    points = torch.rand(100, 3) * 1.7 - 0.85
    out = field(points, with_normal=True)
    assert out["density"].shape == (100,) and out["features"].shape == (100, 3) and out["normal"].shape == (100, 3)
    assert bool((out["density"] > 0).all())
    empty = field(torch.zeros(0, 3))  # a chunk the occupancy grid emptied
    assert empty["density"].shape == (0,) and empty["features"].shape == (0, 3)
    material, background = find("emission")({}), find("solid-color")({"color": [1.0, 1.0, 1.0]})
    renderer = find("volume-renderer")({"occupancy": {"enabled": False}, "steps_per_diagonal": 64}, field, material, background)
    renderer.eval()
    c2w = look_at(spherical_to_position(torch.tensor([0.2]), torch.tensor([0.5]), torch.tensor([1.9])), torch.zeros(1, 3),
                  torch.tensor([[0.0, 0.0, 1.0]]))
    with torch.no_grad():
        render = renderer(Cameras(c2w, intrinsics_from_fovy(torch.deg2rad(torch.tensor([40.0])), 32, 24), 32, 24))
    assert render["rgb"].shape == (1, 24, 32, 3) and render["alpha"].shape == (1, 24, 32, 1)
    assert bool(render["alpha"].max() > 0.01) and bool(((render["rgb"] >= 0) & (render["rgb"] <= 1)).all())


def test_pytorch_checkpoint_layout_loads_too(tmp_path, release):
    _, network = release
    folder = save_release(tmp_path / "ckpt", network, weights="model.ckpt")
    generated = TripoSRGenerator({"pretrained_model_name_or_path": str(folder)}).generate(photo())
    assert generated.state["triplane"].shape == (3, 4, 8, 8)


def one_line_error(folder: Path | str) -> str:
    with pytest.raises(GeneratorLoadError) as error:
        TripoSRGenerator({"pretrained_model_name_or_path": str(folder)}).load()
    assert "\n" not in str(error.value)
    return str(error.value)


def test_missing_files_are_one_line_errors(tmp_path, release):
    message = one_line_error(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in message and "does not exist" in message
    folder = save_release(tmp_path / "no-weights", release[1])
    (folder / "model.safetensors").unlink()
    message = one_line_error(folder)
    assert "model.safetensors or model.ckpt" in message and str(folder) in message


def test_a_hub_id_not_in_the_cache_offline_says_how_to_get_a_local_copy(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    message = one_line_error("someone/not-cached")
    assert "HF_HUB_OFFLINE is set, and the local Hugging Face cache" in message and "of 'someone/not-cached'" in message
    assert "hf download someone/not-cached --local-dir" in message
    assert "system.generator.pretrained_model_name_or_path=/path/to/folder" in message
    assert "local_files_only" not in message and "outgoing traffic" not in message  # the hub library's own words


def test_hub_failures_are_said_in_lift3d_words():
    from lift3d.generators.files import hub_failure

    def error(kind: str) -> Exception:
        return type(kind, (Exception,), {})("401 Client Error. (Request ID: Root=1-abc) Cannot access gated repo ...")

    assert "gated: accept its terms on huggingface.co" in hub_failure(error("GatedRepoError"))
    assert "no such repository" in hub_failure(error("RepositoryNotFoundError"))
    assert "no such file" in hub_failure(error("RemoteEntryNotFoundError"))
    assert hub_failure(OSError("[Errno 111] Connection refused")) == "connection refused"
    assert "Request ID" not in hub_failure(error("HfHubHTTPError"))


def test_mismatched_weights_are_one_line_errors(tmp_path, release):
    from safetensors.torch import load_file, save_file

    folder = save_release(tmp_path / "renamed", release[1])
    state = load_file(str(folder / "model.safetensors"))
    state["decoder.layers.9.weight"] = state.pop("decoder.layers.4.weight")
    state["tokenizer.embeddings"] = torch.zeros(3, 32, 5, 5)
    save_file(state, str(folder / "model.safetensors"))
    message = one_line_error(folder)
    assert "1 missing (decoder.layers.4.weight)" in message and "1 unexpected (decoder.layers.9.weight)" in message
    assert "tokenizer.embeddings: (3, 32, 5, 5) in the file, (3, 32, 4, 4) in the model" in message
    config = (folder / "config.yaml").read_text().replace("NeRFMLP", "OtherMLP")
    (folder / "config.yaml").write_text(config)
    assert "decoder_cls is 'tsr.models.network_utils.OtherMLP'" in one_line_error(folder)


def test_generate_command_writes_a_valid_glb(tmp_path, release, capsys):
    from lift3d.cli import main
    from tests.validators import validate_gltf

    folder, _ = release
    image = tmp_path / "cat.png"
    Image.fromarray((photo(48, 64).numpy() * 255).astype(np.uint8), "RGBA").save(image)
    overrides = [f"output_root={tmp_path / 'out'}", f"system.generator.pretrained_model_name_or_path={folder}",
                 *(f"system.field.{k}={v}" for k, v in TINY_FIELD.items()), "data.reference_size=32",
                 "data.eval_height=16", "data.eval_width=16", "data.n_test_views=2", "system.export.resolution=24",
                 "system.export.texture_size=64", "system.export.threshold=null", "system.export.keep_components=0",
                 "system.renderer.occupancy.enabled=false", "system.renderer.steps_per_diagonal=32", "trainer.accelerator=cpu"]
    assert main(["generate", "--image", str(image), "--method", "triposr", *overrides]) == 0
    glbs = sorted((tmp_path / "out").glob("triposr/*/save/it*.glb"))
    assert len(glbs) == 1
    report = validate_gltf(glbs[0])[0]
    assert report["issues"]["numErrors"] == 0 and report["info"]["totalTriangleCount"] > 0
    # the run is an ordinary NeRF run: lift3d export reloads its field from the checkpoint, without the generator
    run_dir = glbs[0].parent.parent
    gone = f"system.generator.pretrained_model_name_or_path={tmp_path / 'gone'}"
    assert main(["export", str(run_dir), "--format", "obj", gone]) == 0
    assert (run_dir / "save" / glbs[0].with_suffix(".obj").name).stat().st_size > 0


def test_generate_command_reports_a_missing_release_in_one_line(tmp_path, capsys):
    from lift3d.cli import main

    image = tmp_path / "cat.png"
    Image.fromarray((photo().numpy() * 255).astype(np.uint8), "RGBA").save(image)
    code = main(["generate", "--image", str(image), "--method", "triposr", f"output_root={tmp_path / 'out'}",
                 f"system.generator.pretrained_model_name_or_path={tmp_path / 'missing'}", "trainer.accelerator=cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and any(str(tmp_path / "missing") in line and "does not exist" in line for line in err)
    assert not any(line.startswith("Traceback") for line in err)
    # the failed run is set aside with its error, not left among the good runs
    assert not [p for p in (tmp_path / "out" / "triposr").iterdir()]
    failed = list((tmp_path / "out" / ".failed" / "triposr").iterdir())
    record = json.loads((failed[0] / "progress.json").read_text())
    assert len(failed) == 1 and record["status"] == "failed" and "does not exist" in record["error"]
    assert record["run_dir"] == str(failed[0]) and any(str(failed[0]) in line for line in err)


def test_field_config_names_the_generators_sizes(release):
    generator = TripoSRGenerator({"pretrained_model_name_or_path": str(release[0])}).load()
    assert {k: generator.field_config()[k] for k in TINY_FIELD} == TINY_FIELD
    assert json.dumps(generator.field_config())  # plain data: it goes into configs as is


def test_refinement_starts_from_the_generated_field(tmp_path, release):
    """triposr on the sample scene's reference view, then its offline refinement twin (analytic prior) from that run:
    the refined field starts from the generated one (small steps away from it), not from a blank field."""
    from lift3d.checkpoints import load_checkpoint
    from lift3d.config import load_config
    from lift3d.data.sample_scene import sample_scene_path
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment

    scene = sample_scene_path()
    common = [f"output_root={tmp_path}", "trainer.accelerator=cpu", "trainer.run_test_after_fit=false",
              f"data.reference_scene={scene}",
              "data.reference_frame=0", *(f"system.field.{k}={v}" for k, v in TINY_FIELD.items()),
              "system.renderer.occupancy.enabled=false", "system.renderer.steps_per_diagonal=32"]
    first = run_experiment("train", load_config(recipe_config("triposr"), overrides=[
        *common, f"system.generator.pretrained_model_name_or_path={release[0]}", "data.reference_size=32"]))
    start = load_checkpoint(first / "ckpts" / "last.ckpt")["state_dict"]
    refined_run = run_experiment("train", load_config(recipe_config("triposr-refine-analytic"), overrides=[
        *common, f"system.geometry_convert_from={first / 'ckpts' / 'last.ckpt'}", "trainer.max_steps=3",
        "trainer.val_check_interval=3", "data.height=32", "data.width=32", "data.batch_size=1", "data.reference_size=32",
        "data.eval_height=16", "data.eval_width=16", "data.n_val_views=2", "checkpoint.every_n_train_steps=3"]))
    refined = load_checkpoint(refined_run / "ckpts" / "last.ckpt")["state_dict"]
    before, after = start["field.triplane"], refined["field.triplane"]
    assert before.abs().max() > 0  # the generator's planes, not the field's zero initialization
    change = (after - before).abs().max() / before.abs().max()
    assert 0 < change < 0.2  # three Adam steps at lr 0.003 move the generated planes a little
    metrics = sorted((refined_run / "save").glob("**/metrics*.json")) + sorted(refined_run.glob("metrics*.json"))
    assert metrics, "the twin scores its held-out views"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_generation_on_cuda_matches_the_cpu(release, dtype):
    folder, _ = release
    reference = TripoSRGenerator({"pretrained_model_name_or_path": str(folder)}).generate(photo()).state["triplane"]
    generator = TripoSRGenerator({"pretrained_model_name_or_path": str(folder), "dtype": dtype}).load("cuda")
    assert next(generator.network.parameters()).dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    planes = generator.generate(photo().cuda()).state["triplane"]
    assert planes.is_cuda and planes.dtype == torch.float32
    assert torch.allclose(planes.cpu(), reference, atol=0.05 * float(reference.abs().max()))


@pytest.mark.gpu
def test_generate_command_on_cuda_writes_a_valid_glb(tmp_path, release):
    """The command on CUDA writes a .glb with a mesh (the export follows the test renders, so they stay on). GPU
    machines here have no node (the Khronos validator): the glTF is read back with trimesh (the CPU twin above runs
    the validator)."""
    import trimesh

    from lift3d.cli import main

    image = tmp_path / "cat.png"
    Image.fromarray((photo(48, 64).numpy() * 255).astype(np.uint8), "RGBA").save(image)
    overrides = [f"output_root={tmp_path / 'out'}", f"system.generator.pretrained_model_name_or_path={release[0]}",
                 *(f"system.field.{k}={v}" for k, v in TINY_FIELD.items()), "data.reference_size=32", "data.n_test_views=2",
                 "system.export.threshold=null", "system.export.keep_components=0", "trainer.accelerator=gpu",
                 "trainer.devices=1"]
    assert main(["generate", "--image", str(image), "--method", "triposr", *overrides]) == 0
    (glb,) = sorted((tmp_path / "out").glob("triposr/*/save/it*.glb"))
    mesh = trimesh.load(glb, force="mesh")
    assert len(mesh.faces) > 0 and np.isfinite(mesh.vertices).all()


def test_generate_refine_continues_from_the_generated_run(tmp_path, release, capsys):
    """``--refine`` runs triposr-refine from the triposr run's checkpoint (here with the analytic prior for Zero123)."""
    from lift3d.cli import main
    from lift3d.data.sample_scene import sample_scene_path

    image = tmp_path / "cat.png"
    Image.fromarray((photo(48, 64).numpy() * 255).astype(np.uint8), "RGBA").save(image)
    small = ["data.reference_size=32", "data.n_test_views=1", "data.eval_height=16", "data.eval_width=16",
             "system.renderer.occupancy.enabled=false", "system.renderer.steps_per_diagonal=32", "trainer.accelerator=cpu",
             "trainer.run_test_after_fit=false", *(f"system.field.{k}={v}" for k, v in TINY_FIELD.items())]
    refine = ["system.guidance_type=analytic", f"system.guidance.root={sample_scene_path()}", "system.guidance_panel=false",
              "trainer.max_steps=2", "trainer.val_check_interval=2", "checkpoint.every_n_train_steps=2", "data.height=32",
              "data.width=32", "data.batch_size=1", "data.resolution_milestones=[]", "data.n_val_views=1"]
    args = ["generate", "--image", str(image), "--method", "triposr", "--refine", f"output_root={tmp_path / 'out'}",
            f"system.generator.pretrained_model_name_or_path={release[0]}", *small]
    for item in refine:
        args += ["--refine-set", item]
    assert main(args) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert re.search(r"refinement from \S+triposr\S* \(triposr-refine.yaml, 2 steps\)", out), out
    assert len(sorted((tmp_path / "out").glob("triposr-refine/*/ckpts/last.ckpt"))) == 1
    code = main(["generate", "--image", str(image), "--method", "zero123-nerf", "--refine", f"output_root={tmp_path / 'x'}"])
    assert code == 2 and "--refine adds a method's refine stages; zero123-nerf has none" in capsys.readouterr().err


def test_refining_from_a_field_of_other_settings_names_them():
    from lift3d.config import ConfigError, load_config
    from lift3d.recipes import recipe_config

    cfg = load_config(recipe_config("triposr"))
    released = find(cfg.system_type)(cfg.system)
    tiny = find(cfg.system_type)({**cfg.system, "field": TINY_FIELD})
    expected = "set system.field.plane_channels=40 system.field.plane_size=64 system.field.n_neurons=64"
    with pytest.raises(ConfigError, match=expected):
        tiny.convert_from(released, cfg)


TWIN_FIELD = ["system.field.radius=1.5", "system.field.plane_channels=8", "system.field.plane_size=32",
              "system.field.n_neurons=32", "system.field.n_hidden_layers=2"]


def twin_run(tmp_path: Path, steps: int, extra: list[str]) -> Path:
    """A triposr-refine-analytic run of ``steps`` on the sample scene (32 px renders, one validation at the end)."""
    from lift3d.config import load_config
    from lift3d.data.sample_scene import sample_scene_path
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment

    overrides = [f"data.reference_scene={sample_scene_path()}", f"output_root={tmp_path}", "trainer.accelerator=cpu", *TWIN_FIELD,
                 f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", f"checkpoint.every_n_train_steps={steps}",
                 "trainer.run_test_after_fit=false", "system.renderer.steps_per_diagonal=128", "data.batch_size=1",
                 "data.height=32", "data.width=32", "data.reference_size=32", *extra]
    return run_experiment("train", load_config(recipe_config("triposr-refine-analytic"), overrides=overrides))


def val_psnr(run_dir: Path) -> float:
    return float(json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["psnr"])


@pytest.mark.slow
def test_refinement_from_a_degraded_object_beats_a_blank_start(tmp_path):
    """The offline proof of the refinement path: the sample scene's object fitted briefly by the twin, its planes then
    blurred (a degraded start, as a feed-forward prediction is), refines in 60 steps to >= 3 dB higher held-out PSNR
    than the same 60 steps from a blank triplane, and above its own start."""
    import shutil

    import torch.nn.functional as F

    from lift3d.checkpoints import load_checkpoint, save_checkpoint
    from lift3d.config import load_config
    from lift3d.metrics import psnr
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import build_parts
    from lift3d.systems.stages import load_previous_stage

    fit = twin_run(tmp_path / "fit", 100, ["system.optimizer.params.field\\.triplane.lr=0.03",
                                           "system.optimizer.params.field\\.decoder.lr=0.003"])
    degraded = tmp_path / "degraded"
    shutil.copytree(fit, degraded)
    checkpoint = load_checkpoint(degraded / "ckpts" / "last.ckpt")
    planes = checkpoint["state_dict"]["field.triplane"]
    for _ in range(6):
        planes = F.avg_pool2d(planes, 5, stride=1, padding=2, count_include_pad=False)
    checkpoint["state_dict"]["field.triplane"] = planes
    save_checkpoint(checkpoint, degraded / "ckpts" / "last.ckpt")
    start_from = f"system.geometry_convert_from={degraded / 'ckpts' / 'last.ckpt'}"

    from lift3d.data.sample_scene import sample_scene_path

    cfg = load_config(recipe_config("triposr-refine-analytic"),
                      overrides=[f"data.reference_scene={sample_scene_path()}", *TWIN_FIELD, "data.reference_size=32"])
    datamodule, system = build_parts(cfg)
    previous_cfg, previous = load_previous_stage(degraded / "ckpts" / "last.ckpt")
    system.convert_from(previous, previous_cfg)
    views = list(datamodule.val_dataloader())
    with torch.no_grad():
        start = sum(float(psnr(system.eval().render(v)["rgb"].clamp(0, 1), v["rgb"])) for v in views) / len(views)
    refined = val_psnr(twin_run(tmp_path / "refined", 60, [start_from]))
    blank = val_psnr(twin_run(tmp_path / "blank", 60, []))
    print(f"degraded start {start:.2f} dB -> refined {refined:.2f} dB; blank start -> {blank:.2f} dB")
    assert refined >= blank + 3.0 and refined > start, (start, refined, blank)
