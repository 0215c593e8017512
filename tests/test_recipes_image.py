"""Image-to-3D recipes: the offline twins must reconstruct the sample scene from one of its views, and every
recipe runs end to end through `lift3d generate --image` with tiny random-weight models, ending in its file."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lift3d.cli import main
from tests.test_recipes_analytic import GAUSSIANS, NERF, start_and_final_psnr
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (fixture)
from tests.tiny_zero123 import tiny_zero123_path

REFERENCE = ["data.reference_size=32", "data.batch_size=2"]


def test_dreamgaussian_image_twin_reconstructs_the_sample_scene_from_one_view(tmp_path):
    start, final = start_and_final_psnr("dreamgaussian-image-analytic", [*REFERENCE, *GAUSSIANS], tmp_path)
    assert final > start + 5.0, (start, final)


@pytest.mark.slow
def test_zero123_nerf_twin_reconstructs_the_sample_scene_from_one_view(tmp_path):
    start, final = start_and_final_psnr("zero123-nerf-analytic", [*REFERENCE, *NERF], tmp_path)
    assert final > start + 5.0, (start, final)


def write_photo(path) -> None:
    """An RGBA cut-out: a two-colored disc on a transparent background."""
    yy, xx = np.mgrid[0:64, 0:64]
    inside = (xx - 30) ** 2 + (yy - 34) ** 2 < 20**2
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[..., 0] = np.where(xx < 30, 220, 40)
    rgba[..., 2] = np.where(xx < 30, 30, 200)
    rgba[..., 3] = inside * 255
    Image.fromarray(rgba, "RGBA").save(path)


TINY = [  # every stage: 32x32 renders and references, the tiny Zero123, one validation and two test views
    "data.height=32", "data.width=32", "data.resolution_milestones=[]", "data.batch_size=1", "data.reference_size=32",
    "data.eval_height=32", "data.eval_width=32", "data.n_val_views=1", "data.n_test_views=2",
    "system.guidance.resolution=64", "use_timestamp=false", "trainer.enable_progress_bar=false",
]
MESH_STAGE = [  # a 16^3 DMTet grid and a small texture field
    "system.geometry.grid_resolution=16", "system.geometry.radius=0.8", "system.geometry.texture.radius=0.8",
    "system.geometry.texture.encoding.n_levels=4", "system.geometry.texture.encoding.log2_hashmap_size=10",
    "system.geometry.texture.encoding.base_resolution=4", "system.inherit_texture_steps=10",
    "system.inherit_texture_points=2048", "system.export.texture_size=64", "system.isosurface_threshold=0.5",
]


def generate(tmp_path, method: str, *extra: str, refine: list[str] = (), prompt: list[str] = ()) -> list[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    photo = tmp_path / "photo.png"
    write_photo(photo)
    args = ["generate", *prompt, "--image", str(photo), "--method", method, "--elevation", "10", "--refine-steps", "2",
            f"output_root={tmp_path / 'out'}", f"system.guidance.pretrained_model_name_or_path={tiny_zero123_path()}",
            "trainer.max_steps=2", *TINY, *extra]
    for item in refine:
        args += ["--refine-set", item]
    assert main(args) == 0
    return sorted(p.name for p in (tmp_path / "out").rglob("it*.glb"))


def test_dreamgaussian_image_ends_in_a_textured_glb(tmp_path):
    files = generate(tmp_path, "dreamgaussian", "system.gaussians.init_points=300", "system.renderer.tile_size=8",
                     "system.export.resolution=32", "system.export.texture_size=64", refine=MESH_STAGE)
    # only the mesh stage writes a .glb (the textured result): the Gaussian stage's own mesh would only delay it
    assert files == ["it2.glb"]
    stage2 = next((tmp_path / "out" / "dreamgaussian-image-texture").glob("*/save/it2.glb"))
    assert next((tmp_path / "out" / "dreamgaussian-image").glob("*/save/it2-gaussians.ply")).stat().st_size > 0
    import trimesh

    mesh = trimesh.load(stage2, force="mesh")
    assert len(mesh.faces) > 50 and mesh.visual.material.baseColorTexture is not None


@pytest.mark.slow
def test_zero123_nerf_and_magic123_end_in_their_files(tmp_path):
    nerf = [item for item in NERF if "loss" not in item and "optimizer" not in item] + ["system.export.resolution=32",
                                                                                         "system.export.texture_size=64"]
    assert generate(tmp_path / "z", "zero123-nerf", *nerf) == ["it2.glb"]
    magic = generate(tmp_path / "m", "magic123", *nerf, f"system.text_guidance.pretrained_model_name_or_path={tiny_sd_path()}",
                     "system.text_guidance.resolution=64", prompt=["a blue and red disc"],
                     refine=[*MESH_STAGE, f"system.text_guidance.pretrained_model_name_or_path={tiny_sd_path()}",
                             "system.text_guidance.resolution=64"])
    assert magic == ["it2.glb"]  # the refine stage's


def test_generate_image_errors(tmp_path, capsys):
    assert main(["generate", "--image", str(tmp_path / "missing.png")]) == 2
    assert "no such file" in capsys.readouterr().err
    write_photo(tmp_path / "p.png")
    assert main(["generate", "--image", str(tmp_path / "p.png"), "--method", "magic123"]) == 2
    assert "give a prompt" in capsys.readouterr().err
    assert main(["generate", "--image", str(tmp_path / "p.png"), "--method", "dreamfusion"]) == 2
    assert "makes 3D from text" in capsys.readouterr().err


@pytest.mark.gpu
def test_dreamgaussian_image_on_cuda(tmp_path):
    """Both stages on the GPU (gsplat when installed), tiny Zero123, ending in the textured .glb."""
    import torch

    assert torch.cuda.is_available()
    files = generate(tmp_path, "dreamgaussian", "trainer.accelerator=gpu", "system.gaussians.init_points=300",
                     "system.export.resolution=32", "system.export.texture_size=64", refine=MESH_STAGE)
    assert "it2.glb" in files
