"""The Python API: ``lift3d.reconstruct`` / ``generate`` / ``train`` return a ``Run`` that exports, ``lift3d.load`` opens
runs, Gaussian files of other tools and meshes, and ``import lift3d`` stays light."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import lift3d
from lift3d.api.overrides import as_overrides, gpu_ids

QUICK = {"trainer.max_steps": 20, "trainer.val_check_interval": 20, "system.export.formats": ["3dgs-ply"],
         "trainer.enable_progress_bar": False}


def test_import_lift3d_is_light_and_public_names_resolve():
    code = ("import sys, lift3d; heavy = [m for m in ('torch', 'lightning', 'diffusers') if m in sys.modules]; "
            "print(heavy, sorted(lift3d.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("[]"), out
    for name in lift3d.__all__:
        assert getattr(lift3d, name) is not None
    with pytest.raises(AttributeError):
        lift3d.no_such_name  # noqa: B018


def test_keyword_settings_become_overrides():
    assert as_overrides({"trainer.max_steps": 5, "system__export__formats": ["spz", "glb"], "tag": "a b"}, ["seed=1"]) == [
        "trainer.max_steps=5", "system.export.formats=[\"spz\",\"glb\"]", 'tag="a b"', "seed=1"]
    assert gpu_ids("0,1") == [0, 1] and gpu_ids([2]) == [2] and gpu_ids(None) is None
    with pytest.raises(ValueError, match="GPU ids"):
        gpu_ids("first")


def test_reconstruct_returns_a_run_that_exports_and_loads(tmp_path):
    run = lift3d.reconstruct(output_root=str(tmp_path), **QUICK)
    assert isinstance(run, lift3d.Run) and run.checkpoint is not None and run.psnr is not None
    assert run.config.name == "reconstruct-gaussians-sample" and "val PSNR" in repr(run)
    written = run.export("spz")
    assert [p.suffix for p in written] == [".spz"] and written[0].is_file() and written[0] in run.files
    again = lift3d.load(run.path)
    assert again.path == run.path and again.metrics == run.metrics
    scene = lift3d.load(written[0])
    assert isinstance(scene, lift3d.GaussianFile) and len(scene) == len(run.system().gaussians)
    means = run.system().gaussians.means.detach().numpy()
    assert np.abs(scene.model.means.detach().numpy() - means).max() < 1e-2  # SPZ stores positions in fixed point


def test_load_opens_a_mesh_and_refuses_what_it_cannot_read(tmp_path):
    import trimesh

    box = tmp_path / "box.obj"
    trimesh.creation.box().export(box)
    mesh = lift3d.load(box)
    assert mesh.faces.shape[0] == 12
    with pytest.raises(FileNotFoundError, match="nothing at"):
        lift3d.load(tmp_path / "missing.ply")
    (tmp_path / "not-a-run").mkdir()
    with pytest.raises(ValueError, match="not a run folder"):
        lift3d.load(tmp_path / "not-a-run")


def test_generate_checks_its_inputs_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="give a prompt"):
        lift3d.generate("  ")
    with pytest.raises(ValueError, match="makes 3D from one photo"):
        lift3d.generate("a cat", method="triposr")
    with pytest.raises(ValueError, match="no such file"):
        lift3d.generate(image=tmp_path / "cat.png")
    (tmp_path / "cat.png").write_bytes(b"")
    with pytest.raises(ValueError, match="takes a prompt|adds a text prior"):
        lift3d.generate(image=tmp_path / "cat.png", method="magic123")
    with pytest.raises(ValueError, match="has none"):
        lift3d.generate(image=tmp_path / "cat.png", method="zero123-nerf", refine=True)
