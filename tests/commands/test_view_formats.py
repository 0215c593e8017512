"""``lift3d view`` (and ``lift3d render``) open every Gaussian file lift3d reads, through ``load_gaussian_file`` (the
reader of ``lift3d export``): files of lift3d's own writers and of other tools (splat-transform, GaussianSplats3D);
a mesh .glb stays a mesh, and an unknown extension is one line that lists what lift3d reads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lift3d.cameras import look_at
from lift3d.cli import main
from lift3d.commands.view import HELP, SOURCE_HELP
from lift3d.gaussians.formats.files import load_gaussian_file
from lift3d.gaussians.formats.gltf import is_gaussian_glb, save_gltf_splat
from lift3d.gaussians.formats.ksplat import save_ksplat
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.formats.sog import save_sog
from lift3d.gaussians.formats.sog_lod import save_sog_lod
from lift3d.gaussians.formats.splat import rgb_from_sh_dc, write_splat
from lift3d.gaussians.formats.spz import save_spz
from lift3d.gaussians.tensors import GaussianTensors
from lift3d.viewer.camera_math import viewer_cameras
from lift3d.viewer.models import gaussian_suffixes, load_view_model, render_picture
from lift3d.viewer.path import CameraPath, Keyframe, save_camera_path
from tests.gaussian_params import random_params, unit
from tests.gaussians.formats.test_ksplat import gaussian_splats_3d
from tests.validators import splat_transform


def _splat(path, params):
    tensors = GaussianTensors(params["means"], params["log_scales"].exp(), unit(params["quats"]),
                              torch.sigmoid(params["opacity_logits"]), colors=rgb_from_sh_dc(params["sh0"]))
    return write_splat(path, tensors)


# every lift3d writer of a Gaussian file, by the name of the file it writes
WRITERS = {
    "g.ply": save_ply,
    "g.splat": _splat,
    "g-v3.spz": lambda path, params: save_spz(path, params, version=3),
    "g-v4.spz": lambda path, params: save_spz(path, params, version=4),
    "g.sog": save_sog,
    "g.ksplat": save_ksplat,
    "g-gaussians.glb": save_gltf_splat,
    "g-lod/lod-meta.json": lambda path, params: save_sog_lod(path, params, levels=2),
}


def assert_viewed_as_read(path):
    """The viewer's Gaussians of ``path`` are those ``load_gaussian_file`` reads: count, means and SH bands."""
    model = load_view_model(path)
    read = load_gaussian_file(path)
    gaussians = model.system.gaussians
    assert len(gaussians) == len(read["means"]) > 0
    assert torch.equal(gaussians.means.detach().cpu(), read["means"].float())
    assert gaussians.shN.shape == read["shN"].shape
    return model


def test_every_suffix_lift3d_reads_has_a_writer_here_and_is_in_the_help():
    assert {name.rsplit(".", 1)[1] for name in WRITERS} == {s.lstrip(".") for s in gaussian_suffixes()}
    for suffix in gaussian_suffixes():
        assert suffix in SOURCE_HELP and suffix in HELP, suffix


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_files_of_lift3d_writers_open_in_the_viewer_as_read(tmp_path, name):
    path = tmp_path / name
    WRITERS[name](path, random_params(40, degree=2, seed=3))
    model = assert_viewed_as_read(path)
    position, target = model.home
    cameras = viewer_cameras(look_at(torch.tensor(position), torch.tensor(target), torch.tensor([0.0, 0, 1])),
                             math.radians(50), 16, 16)
    alpha = render_picture(model, cameras, "alpha", "cpu")
    assert alpha.mean() > 10, "the Gaussians should be in view of the home camera"


@pytest.mark.parametrize("args", [("theirs.ply",), ("--spz-version", "3", "theirs-v3.spz"),
                                  ("--spz-version", "4", "theirs-v4.spz"), ("-g", "cpu", "theirs.sog"),
                                  ("theirs.glb",)])
def test_files_of_splat_transform_open_in_the_viewer_as_read(tmp_path, args):
    save_ply(tmp_path / "g.ply", random_params(64, degree=1, seed=5))
    splat_transform(tmp_path / "g.ply", *args[:-1], tmp_path / args[-1])
    if args[-1].endswith(".glb"):
        assert is_gaussian_glb(tmp_path / args[-1])
    assert len(assert_viewed_as_read(tmp_path / args[-1]).system.gaussians) == 64


def test_ksplat_of_gaussian_splats_3d_opens_in_the_viewer_as_read(tmp_path):
    save_ply(tmp_path / "g.ply", random_params(64, degree=1, seed=6))
    gaussian_splats_3d("write", tmp_path / "g.ply", tmp_path / "theirs.ksplat", 1, 1)
    assert len(assert_viewed_as_read(tmp_path / "theirs.ksplat").system.gaussians) == 64


def test_a_mesh_glb_and_obj_stay_meshes(tmp_path):
    import trimesh

    for name in ("box.glb", "box.obj"):
        trimesh.creation.box(extents=(1.0, 1.0, 1.0)).export(tmp_path / name)
        model = load_view_model(tmp_path / name)
        assert model.system is None and "normal" in model.render_fn(viewer_cameras(
            look_at(torch.tensor([3.0, 0, 1]), torch.zeros(3), torch.tensor([0.0, 0, 1])), math.radians(50), 8, 8))
    assert not is_gaussian_glb(tmp_path / "box.glb")


def test_render_takes_a_gaussian_glb(tmp_path, capsys):
    save_gltf_splat(tmp_path / "g.glb", random_params(40, degree=0, seed=2))
    c2w = look_at(torch.tensor([6.0, 0, 2]), torch.zeros(3), torch.tensor([0.0, 0, 1])).tolist()
    path = save_camera_path(tmp_path / "path.json", CameraPath([Keyframe(c2w, 50.0), Keyframe(c2w, 40.0)], fps=2,
                                                               seconds=1.0, width=16, height=16))
    out = tmp_path / "video.gif"
    assert main(["render", str(tmp_path / "g.glb"), "--path", str(path), "--out", str(out), "--device", "cpu"]) == 0
    assert f"to {out}" in capsys.readouterr().out and out.is_file()


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_an_unknown_extension_is_one_line_listing_what_lift3d_reads(tmp_path, capsys):
    (tmp_path / "model.xyz").write_text("x")
    assert main(["view", str(tmp_path / "model.xyz")]) == 2
    err = _one_line_error(capsys)
    assert "cannot view" in err and ".xyz" in err
    for suffix in (*gaussian_suffixes(), ".gltf", ".obj", ".ckpt"):
        assert suffix in err, suffix
    path = save_camera_path(tmp_path / "path.json", CameraPath([Keyframe(np.eye(4).tolist(), 50.0)] * 2, fps=2,
                                                               seconds=1.0, width=8, height=8))
    assert main(["render", str(tmp_path / "model.xyz"), "--path", str(path)]) == 2
    assert "cannot view" in _one_line_error(capsys)


def test_a_damaged_gaussian_file_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.spz").write_bytes(b"not an spz at all")
    assert main(["view", str(tmp_path / "bad.spz")]) == 2
    assert "bad.spz" in _one_line_error(capsys)


def test_an_antialiased_spz_is_shown_with_the_2d_filter_as_export_renders_it(tmp_path):
    save_spz(tmp_path / "aa.spz", random_params(20, degree=0), antialiased=True)
    save_spz(tmp_path / "plain.spz", random_params(20, degree=0))
    assert load_view_model(tmp_path / "aa.spz").system.renderer.cfg.rasterize_mode == "antialiased"
    assert load_view_model(tmp_path / "plain.spz").system.renderer.cfg.rasterize_mode != "antialiased"
