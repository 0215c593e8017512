"""spz, sog and gltf-splat through `lift3d export`: the export table, its pruning options (opacity floor, count
cap, SH degree), conversion of any Gaussian file, one-line errors, and models started from the new files."""

import json
import os
import zipfile

import pytest
import torch

from lift3d.cli import main
from lift3d.export import ExportConfig, GaussianTensors, export_formats, gaussian_sources, rgb_from_sh_dc
from lift3d.gaussians.formats.files import load_gaussian_file
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.model import GaussianModel
from lift3d.saving import OutputSaver
from tests.gaussian_params import random_params

FILES = {"spz": "g.spz", "sog": "g.sog", "gltf-splat": "g-gaussians.glb"}


def tensors(params: dict) -> GaussianTensors:
    return GaussianTensors(params["means"], params["log_scales"].exp(), params["quats"], torch.sigmoid(params["opacity_logits"]),
                           colors=rgb_from_sh_dc(params["sh0"][:, 0]))


def test_the_export_table_writes_each_format_with_the_pruning_options(tmp_path):
    params = random_params(400, degree=3, seed=2)
    cfg = ExportConfig(min_opacity=0.5, max_gaussians=100, gaussian_sh_degree=1, sog_sh_palette=32)
    sources = gaussian_sources(tensors(params), cfg, gaussian_params=lambda: params)
    written = export_formats(OutputSaver(tmp_path), list(FILES), cfg, sources, stem="g")
    assert [p.name for p in written] == list(FILES.values())
    opacity = torch.sigmoid(params["opacity_logits"])
    assert int((opacity >= 0.5).sum()) > 100  # so the count cap, not only the floor, decides
    importance = torch.where(opacity >= 0.5, params["log_scales"].exp().prod(-1) * opacity, torch.tensor(-1.0))
    expected = importance.topk(100).indices.sort().values  # the 100 most visible of those at least half opaque
    for fmt, name in FILES.items():
        back = load_gaussian_file(tmp_path / name)
        assert back["shN"].shape == (100, 3, 3), fmt  # SH degree 1 kept of 3
        kept = torch.cdist(back["means"], params["means"]).argmin(dim=1)
        assert torch.equal(kept.sort().values, expected), fmt
        assert (back["means"] - params["means"][kept]).abs().max() < 1e-3, fmt  # within every format's steps
    with zipfile.ZipFile(tmp_path / "g.sog") as bundle:
        assert json.loads(bundle.read("meta.json"))["shN"]["count"] == 32  # system.export.sog_sh_palette


def test_without_the_models_parameters_the_formats_are_refused(tmp_path):
    params = random_params(20, degree=0)
    sources = gaussian_sources(tensors(params), ExportConfig())
    with pytest.raises(ValueError, match="cannot export 'spz'.*it can export: .*splat"):
        export_formats(OutputSaver(tmp_path), ["spz"], ExportConfig(), sources)


@pytest.mark.slow
def test_lift3d_export_converts_between_every_gaussian_file(tmp_path, capsys):
    params = random_params(120, degree=2, seed=3)
    save_ply(tmp_path / "model.ply", params)
    assert main(["export", str(tmp_path / "model.ply"), "--format", "spz", "sog", "gltf-splat"]) == 0, capsys.readouterr().err
    assert "model-ply.spz" in capsys.readouterr().out
    for name in ("model-ply.spz", "model-ply.sog", "model-ply-gaussians.glb"):
        assert load_gaussian_file(tmp_path / name)["shN"].shape == (120, 8, 3)
    # each new file converts back to a 3DGS .ply (written beside it as <stem>-<format>-gaussians.ply)
    assert main(["export", str(tmp_path / "model-ply.sog"), "--format", "3dgs-ply"]) == 0
    again = load_gaussian_file(tmp_path / "model-ply-sog-gaussians.ply")
    assert torch.equal(again["means"], load_gaussian_file(tmp_path / "model-ply.sog")["means"])
    # a name that would overwrite the file itself is a clear error, not a lost file
    assert main(["export", str(tmp_path / "model-ply-gaussians.glb"), "--format", "glb",
                 "system.export.stem=model-ply-gaussians"]) == 2
    assert "would overwrite it" in capsys.readouterr().err


@pytest.mark.parametrize("name, content, message", [
    ("bad.spz", b"\x1f\x8b not really gzip", "not an SPZ file"),
    ("bad.sog", b"PK\x05\x06 broken zip", "not a SOG bundle"),
    ("bad.glb", b"glTF\x02\0\0\0\x30\0\0\0" + b"\0" * 36, "no JSON chunk"),
])
def test_a_bad_file_is_one_clear_line(tmp_path, capsys, name, content, message):
    (tmp_path / name).write_bytes(content)
    assert main(["export", str(tmp_path / name), "--format", "splat"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".spz", ".sog", ".glb"])
def test_a_model_starts_from_each_new_file(tmp_path, suffix):
    params = random_params(64, degree=1, seed=4)
    save_ply(tmp_path / "model.ply", params)
    fmt = {".spz": "spz", ".sog": "sog", ".glb": "gltf-splat"}[suffix]
    assert main(["export", str(tmp_path / "model.ply"), "--format", fmt]) == 0
    path = tmp_path / ("model-ply-gaussians.glb" if suffix == ".glb" else f"model-ply{suffix}")
    model = GaussianModel({"sh_degree": 2})
    assert model.load_gaussian_file(path) == 1 and len(model) == 64
    assert model.shN.shape == (64, 8, 3) and not model.shN[:, 3:].any()  # degree 2 asked: the missing band is zero
    assert torch.allclose(model.means.detach(), load_gaussian_file(path)["means"])


def test_the_app_offers_the_new_files_for_download_but_views_the_mesh(tmp_path):
    from lift3d.app.results import result_files

    save = tmp_path / "save"
    save.mkdir()
    for age, name in enumerate(("it9-gaussians.glb", "it9.sog", "it9.spz", "it9.glb")):
        (save / name).write_bytes(b"x")
        os.utime(save / name, (1e9 - age, 1e9 - age))  # the Gaussian .glb is the newest: still not the viewer's mesh
    results = result_files(tmp_path)
    assert results.model == save / "it9.glb"
    assert {p.name for p in results.files} == {"it9.glb", "it9.spz", "it9.sog", "it9-gaussians.glb"}
