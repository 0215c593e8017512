"""3DGS PLY files: exact round trip, the standard layout, degree-0 files and clear errors for bad files."""

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from lift3d.cli import main
from lift3d.gaussians.formats.ply import PlyFormatError, load_ply, property_names, save_ply
from lift3d.gaussians.model import PARAMETER_NAMES, GaussianModel


def _model(degree: int, n: int = 25) -> GaussianModel:
    model = GaussianModel({"sh_degree": degree})
    model.initialize(torch.randn(n, 3), torch.rand(n, 3))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_is_exact(tmp_path, degree):
    model = _model(degree)
    path = save_ply(tmp_path / "g.ply", model)
    loaded = load_ply(path)
    for name in PARAMETER_NAMES:
        assert torch.equal(loaded[name], getattr(model, name).detach()), name
    again = GaussianModel({"sh_degree": degree})
    again.set_parameters(loaded)
    assert torch.equal(again.sh, model.sh)


def test_layout_is_the_3dgs_one(tmp_path):
    model = _model(3, n=4)
    ply = PlyData.read(str(save_ply(tmp_path / "g.ply", model)))
    vertex = ply["vertex"]
    assert list(vertex.data.dtype.names) == property_names(45)
    assert property_names(45)[:9] == ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    assert property_names(45)[-8:] == ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    assert all(vertex.data.dtype[name] == np.dtype("<f4") for name in vertex.data.dtype.names)
    assert not ply.text and ply.byte_order == "<"
    shN = model.shN.detach()
    for channel in range(3):  # f_rest is channel-major: 15 red coefficients, then green, then blue
        for k in range(15):
            assert vertex[f"f_rest_{channel * 15 + k}"][2] == shN[2, k, channel]
    assert np.array_equal(vertex["opacity"], model.opacity_logits.detach().numpy())  # pre-activation values
    assert np.array_equal(vertex["rot_0"], model.quats[:, 0].detach().numpy())  # w first


def _write(path, names, n=3, kind="f4", drop_bytes=0):
    data = np.zeros(n, dtype=[(name, kind if name != "x" else "f4") for name in names])
    for name in names:
        data[name] = np.arange(n)
    PlyData([PlyElement.describe(data, "vertex")], text=False).write(str(path))
    if drop_bytes:
        raw = path.read_bytes()
        path.write_bytes(raw[:-drop_bytes])
    return path


def test_degree_zero_file_loads_and_pads(tmp_path):
    names = [n for n in property_names(0) if n not in ("nx", "ny", "nz")]  # normals are optional too
    path = _write(tmp_path / "dc.ply", names)
    params = load_ply(path)
    assert params["shN"].shape == (3, 0, 3) and params["sh0"].shape == (3, 1, 3)
    padded = load_ply(path, sh_degree=3)
    assert padded["shN"].shape == (3, 15, 3) and not padded["shN"].any()
    model = GaussianModel({"sh_degree": 3})
    model.set_parameters(padded)
    assert len(model) == 3


def test_bad_files_give_clear_errors(tmp_path):
    full = property_names(9)
    with pytest.raises(PlyFormatError, match="lacks the Gaussian properties opacity, rot_3"):
        load_ply(_write(tmp_path / "missing.ply", [n for n in full if n not in ("opacity", "rot_3")]))
    with pytest.raises(PlyFormatError, match="not floating point"):
        load_ply(_write(tmp_path / "ints.ply", full, kind="i4"))
    with pytest.raises(PlyFormatError, match="truncated or corrupt"):
        load_ply(_write(tmp_path / "short.ply", full, n=50, drop_bytes=30))
    with pytest.raises(PlyFormatError, match="has 7 f_rest properties"):
        load_ply(_write(tmp_path / "rest.ply", property_names(7)))
    (tmp_path / "junk.ply").write_bytes(b"not a ply file at all")
    with pytest.raises(PlyFormatError, match="not a readable PLY"):
        load_ply(tmp_path / "junk.ply")
    with pytest.raises(FileNotFoundError):
        load_ply(tmp_path / "nowhere.ply")


def test_cli_reports_a_bad_point_cloud_in_one_line(tmp_path, data_dir, capsys):
    bad = _write(tmp_path / "cloud.ply", ["x", "y"])
    code = main(["reconstruct", str(data_dir / "lego_tiny"), f"output_root={tmp_path}", "system.gaussians.init=points",
                 f"system.gaussians.init_path={bad}", "trainer.enable_progress_bar=false", "data.val_split=train"])
    err = capsys.readouterr().err
    assert code == 2
    assert "lift3d: error:" in err and "needs x, y, z vertex properties" in err and "Traceback" not in err
