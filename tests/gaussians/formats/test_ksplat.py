""".ksplat files (mkkellogg GaussianSplats3D): files written by GaussianSplats3D's own writer read with the Gaussians
of the .ply they came from, as PlayCanvas splat-transform reads them too; ours read back within each level's
quantization and read by GaussianSplats3D's and splat-transform's readers; clear errors for bad files; `lift3d
export` takes a .ksplat as Gaussians."""

import json
import struct
import subprocess

import numpy as np
import pytest
import torch

from lift3d.gaussians.formats.files import load_gaussian_file
from lift3d.gaussians.formats.ksplat import KsplatFormatError, decode_ksplat, encode_ksplat, load_ksplat, save_ksplat
from lift3d.gaussians.formats.ply import load_ply, save_ply
from lift3d.sh import Y0
from tests.gaussian_params import random_params, same_sign, unit
from tests.validators import JS, _node, _require, splat_transform

EPS = 1e-6
POSITION_STEP = 5.0 / 2 / 32767  # levels 1, 2: 16 bits over a 5-unit bucket block


def gaussian_splats_3d(*args: str) -> None:
    """Run tests/js/ksplat.mjs (GaussianSplats3D's own .ksplat writer and reader, pinned in tests/js)."""
    _require("@mkkellogg/gaussian-splats-3d")
    result = subprocess.run([_node(), str(JS / "ksplat.mjs"), *map(str, args)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"ksplat.mjs {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr[-2000:]}")


def matched(back: dict, source: dict) -> dict:
    """``source`` reordered to ``back``'s order (the writers group Gaussians by buckets), by nearest position."""
    index = torch.cdist(back["means"].double(), source["means"].double()).argmin(dim=1)
    assert len(set(index.tolist())) == len(index)  # one to one
    return {name: value[index] for name, value in source.items()}


def assert_within_ksplat_steps(back: dict, source: dict, level: int, steps: float = 0.5) -> None:
    """``back`` equals ``source`` (same order) within ``steps`` (half: rounding; a whole one: truncation) of each
    quantization step of a .ksplat ``level``; colors as the file stores them (DC clamped to 0..1)."""
    f16 = steps * 2.0**-10  # float16 (levels 1, 2): a step is at most 2^-10 of the value
    position_tol = EPS if level == 0 else steps * POSITION_STEP + 2e-6
    assert (back["means"] - source["means"]).abs().max() <= position_tol
    scales = source["log_scales"].exp()
    assert ((back["log_scales"].exp() - scales).abs() <= (EPS if level == 0 else f16) * scales + 1e-7).all()
    reference = unit(source["quats"])
    assert (same_sign(reference, back["quats"]) - reference).abs().max() <= (EPS if level == 0 else f16)
    opacity = torch.sigmoid(source["opacity_logits"])
    assert (torch.sigmoid(back["opacity_logits"]) - opacity).abs().max() <= steps / 255 + EPS
    color = (0.5 + Y0 * source["sh0"]).clamp(0, 1)
    assert ((0.5 + Y0 * back["sh0"]) - color).abs().max() <= steps / 255 + EPS
    assert back["shN"].shape == source["shN"].shape
    if source["shN"].shape[1]:
        error = (back["shN"] - source["shN"]).abs()
        span = max(source["shN"].max().item(), 1e-6) - min(source["shN"].min().item(), -1e-6)  # level 2's byte range
        sh_tol = {0: EPS, 1: f16 * source["shN"].abs().max().item() + 1e-7, 2: steps * span / 255 + 1e-6}[level]
        assert error.max() <= sh_tol, (error.max(), sh_tol)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_ksplat_written_by_gaussian_splats_3d_reads_with_the_gaussians_of_its_ply(tmp_path, level):
    source = random_params(300, degree=2, seed=level)
    save_ply(tmp_path / "g.ply", source)
    gaussian_splats_3d("write", tmp_path / "g.ply", tmp_path / "theirs.ksplat", level, 2)
    back = load_ksplat(tmp_path / "theirs.ksplat")
    # GaussianSplats3D truncates where lift3d rounds: within a whole quantization step
    assert_within_ksplat_steps(back, matched(back, load_ply(tmp_path / "g.ply")), level, steps=1.0)
    # PlayCanvas splat-transform reads the same file to the same Gaussians, in the same order
    splat_transform(tmp_path / "theirs.ksplat", tmp_path / "theirs.ply")
    theirs = load_ply(tmp_path / "theirs.ply")
    for name in ("means", "log_scales", "quats", "sh0", "shN", "opacity_logits"):
        assert torch.allclose(back[name], theirs[name], rtol=1e-5, atol=1e-5), name


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("degree", [0, 1, 2])
def test_round_trip_is_within_each_levels_quantization(tmp_path, level, degree):
    params = random_params(500, degree=degree, seed=10 * level + degree)
    params["means"][:7] += torch.tensor([40.0, -12.0, 3.0])  # a far cluster: a second bucket block
    back = load_ksplat(save_ksplat(tmp_path / "g.ksplat", params, level=level))
    assert_within_ksplat_steps(back, matched(back, params), level)


def test_buckets_hold_at_most_256_gaussians_full_ones_first(tmp_path):
    params = random_params(700, degree=0, seed=3)
    params["means"] = params["means"] * 0.3 + 2.5  # within one 5-unit block: buckets of 256, 256 and 188
    data = encode_ksplat(params, level=1)
    count, capacity, bucket_capacity, buckets = struct.unpack_from("<4I", data, 4096)
    full, partial = struct.unpack_from("<2I", data, 4096 + 32)
    assert (count, capacity, bucket_capacity) == (700, 700, 256) and (full, partial) == (2, buckets - 2)
    assert sum(np.frombuffer(data, "<u4", count=partial, offset=4096 + 1024)) == 700 - 2 * 256


def test_degree_3_keeps_bands_up_to_2(tmp_path):
    params = random_params(40, degree=3, seed=4)
    back = load_ksplat(save_ksplat(tmp_path / "g.ksplat", params, level=0))
    assert back["shN"].shape == (40, 8, 3)
    assert torch.allclose(back["shN"], matched(back, params)["shN"][:, :8], atol=EPS)


@pytest.mark.parametrize("level", [0, 1])
def test_our_ksplat_reads_in_gaussian_splats_3d_and_splat_transform(tmp_path, level):
    params = random_params(300, degree=2, seed=5)
    save_ksplat(tmp_path / "ours.ksplat", params, level=level)
    ours = load_ksplat(tmp_path / "ours.ksplat")
    gaussian_splats_3d("read", tmp_path / "ours.ksplat", tmp_path / "theirs.json")
    theirs = json.loads((tmp_path / "theirs.json").read_text())
    assert theirs["count"] == 300
    assert np.allclose(theirs["centers"], ours["means"].numpy(), atol=1e-5)
    assert np.allclose(theirs["scales"], ours["log_scales"].exp().numpy(), rtol=1e-5, atol=1e-7)
    rotations = torch.tensor(theirs["rotations"], dtype=torch.float32)
    assert torch.allclose(same_sign(ours["quats"], rotations), unit(ours["quats"]), atol=1e-3)  # float16 at level 1
    rgba = torch.cat([(0.5 + Y0 * ours["sh0"][:, 0]), torch.sigmoid(ours["opacity_logits"])[:, None]], dim=1) * 255
    assert torch.allclose(torch.tensor(theirs["colors"], dtype=torch.float32), rgba, atol=1e-3)
    splat_transform(tmp_path / "ours.ksplat", tmp_path / "from_ksplat.ply")
    back = load_ply(tmp_path / "from_ksplat.ply")
    assert len(back["means"]) == 300
    for name in ("means", "log_scales", "quats", "sh0", "shN", "opacity_logits"):
        assert torch.allclose(back[name], ours[name], rtol=1e-5, atol=1e-5), name


def _section(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:1000], "too short"),
    (lambda data: b"\x01\x00" + data[2:], "version 1.0"),
    (lambda data: _section(data, 20, struct.pack("<H", 7)), "compression level 7"),
    (lambda data: data[:-20], "truncated or corrupt"),
    (lambda data: _section(data, 16, struct.pack("<I", 999)), "header says 999"),
    (lambda data: _section(data, 4096 + 40, struct.pack("<H", 5)), "SH degree 5"),
])
def test_bad_files_are_ksplat_format_errors(tmp_path, damage, message):
    path = tmp_path / "bad.ksplat"
    path.write_bytes(damage(encode_ksplat(random_params(10, degree=1), level=1)))
    with pytest.raises(KsplatFormatError, match=message):
        load_ksplat(path)
    with pytest.raises(FileNotFoundError):
        load_ksplat(tmp_path / "missing.ksplat")


def test_ksplat_reads_through_load_gaussian_file_and_converts_with_lift3d_export(tmp_path, capsys):
    from lift3d.cli import main

    params = random_params(60, degree=1, seed=6)
    save_ksplat(tmp_path / "model.ksplat", params, level=0)
    loaded = load_gaussian_file(tmp_path / "model.ksplat")
    assert torch.equal(loaded["means"], decode_ksplat((tmp_path / "model.ksplat").read_bytes())["means"])
    # a .ksplat on the command line is Gaussians to convert, not a config that needs --resume
    assert main(["export", str(tmp_path / "model.ksplat"), "--format", "spz"]) == 0, capsys.readouterr().err
    spz = sorted(tmp_path.glob("*.spz"))
    assert len(spz) == 1
    back = load_gaussian_file(spz[0])
    assert len(back["means"]) == 60 and (back["means"] - loaded["means"]).abs().max() <= 0.5 / 4096 + EPS


def test_our_splat_reads_in_gaussian_splats_3d_as_we_read_it(tmp_path):
    """GaussianSplats3D's .splat parser (its .ksplat writer at level 0 stores what it parsed as float32) gives the
    Gaussians lift3d's .splat reader gives."""
    from lift3d.export import GaussianTensors, rgb_from_sh_dc, write_splat

    params = random_params(200, degree=0, seed=7)
    tensors = GaussianTensors(params["means"], params["log_scales"].exp(), params["quats"],
                              torch.sigmoid(params["opacity_logits"]), colors=rgb_from_sh_dc(params["sh0"]))
    write_splat(tmp_path / "g.splat", tensors)
    gaussian_splats_3d("write", tmp_path / "g.splat", tmp_path / "g.ksplat", 0, 0)
    ours, theirs = load_gaussian_file(tmp_path / "g.splat"), load_ksplat(tmp_path / "g.ksplat")
    assert len(theirs["means"]) == 200
    ours = matched(theirs, ours)
    for name in ("means", "log_scales"):
        assert torch.allclose(theirs[name], ours[name], atol=1e-5), name
    assert torch.allclose(same_sign(unit(ours["quats"]), theirs["quats"]), unit(ours["quats"]), atol=1e-5)
    assert (torch.sigmoid(theirs["opacity_logits"]) - torch.sigmoid(ours["opacity_logits"])).abs().max() <= 1 / 255 + EPS
    assert ((theirs["sh0"] - ours["sh0"]) * Y0).abs().max() <= 1 / 255 + EPS


def test_lift3d_export_writes_ksplat(tmp_path, capsys):
    from lift3d.cli import main

    params = random_params(80, degree=3, seed=8)
    save_ply(tmp_path / "model.ply", params)
    assert main(["export", str(tmp_path / "model.ply"), "--format", "ksplat"]) == 0, capsys.readouterr().err
    (written,) = tmp_path.glob("*.ksplat")
    back = load_ksplat(written)
    source = load_ply(tmp_path / "model.ply")
    assert_within_ksplat_steps(back, matched(back, {**source, "shN": source["shN"][:, :8]}), level=1)
