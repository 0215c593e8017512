"""SPZ files: Niantic's header and layout, round trips within the format's quantisation, SH degree kept,
clear errors for bad files, and PlayCanvas splat-transform (which embeds Niantic's own SPZ code) reading ours
and writing files that we read."""

import gzip
import math
import struct

import numpy as np
import pytest
import torch

from lift3d.gaussians.ply import load_ply, save_ply
from lift3d.gaussians.spz import SpzFormatError, decode_spz, encode_spz, load_spz, save_spz
from lift3d.gaussians.transform import quat_multiply
from tests.gaussian_params import random_params, same_sign, unit
from tests.validators import splat_transform

# Tolerances, each half of the format's quantisation step (values stay inside the coded ranges, see random_params):
EPS = 1e-6  # float32 rounding of the decoded values
POSITION_TOL = 0.5 / 2**12  # 24-bit fixed point with 12 fractional bits
LOG_SCALE_TOL = 0.5 / 16  # bytes of 16 * (log scale + 10)
OPACITY_TOL = 0.5 / 255  # bytes of 255 * sigmoid(logit), compared after the sigmoid
DC_TOL = 0.5 / (0.15 * 255)  # bytes of 255 * (0.15 dc + 0.5)
SH1_TOL = (0.5 + 4) / 128  # round(128 c) (+-0.5) snapped to multiples of 8 (+-4), over 128
SH_REST_TOL = (0.5 + 8) / 128  # ... snapped to multiples of 16 (+-8)
QUAT_SMALL_TOL = 0.5 * math.sqrt(0.5) / 511  # each of the three smallest: 9 bits over [0, sqrt(1/2)]
QUAT_LARGEST_TOL = 3 * QUAT_SMALL_TOL  # the largest (>= 1/2) from the others: |dL| <= sum|c_i| d / L <= 3 d


def assert_within_spz_steps(back: dict, params: dict) -> None:
    """``back`` (decoded) equals ``params`` (written) to within half of each SPZ quantisation step."""
    assert (back["means"] - params["means"]).abs().max() <= POSITION_TOL + EPS
    assert (back["log_scales"] - params["log_scales"]).abs().max() <= LOG_SCALE_TOL + EPS
    assert (torch.sigmoid(back["opacity_logits"]) - torch.sigmoid(params["opacity_logits"])).abs().max() <= OPACITY_TOL + EPS
    assert (back["sh0"] - params["sh0"]).abs().max() <= DC_TOL + EPS
    assert back["shN"].shape == params["shN"].shape  # the SH degree is kept
    if params["shN"].shape[1]:
        assert (back["shN"][:, :3] - params["shN"][:, :3]).abs().max() <= SH1_TOL + EPS
    if params["shN"].shape[1] > 3:
        assert (back["shN"][:, 3:] - params["shN"][:, 3:]).abs().max() <= SH_REST_TOL + EPS
    reference = unit(params["quats"])
    error = (same_sign(reference, back["quats"]) - reference).abs()
    largest = reference.abs().argmax(dim=1)
    small = torch.ones_like(error, dtype=torch.bool)
    small[torch.arange(len(small)), largest] = False
    assert error[small].max() <= QUAT_SMALL_TOL + EPS
    assert error.max() <= QUAT_LARGEST_TOL + EPS


def test_header_and_array_sizes_follow_the_spz_layout(tmp_path):
    params = random_params(50, degree=2)
    raw = gzip.decompress(save_spz(tmp_path / "g.spz", params).read_bytes())  # one gzip stream, read independently
    magic, version, count, degree, bits, flags, reserved = struct.unpack_from("<4sIIBBBB", raw)
    assert (magic, version, count, degree, bits, flags, reserved) == (b"NGSP", 3, 50, 2, 12, 0, 0)
    # positions 9 bytes, alpha 1, colour 3, scale 3, rotation 4 (smallest three), SH 8 coefficients x 3
    assert len(raw) == 16 + 50 * (9 + 1 + 3 + 3 + 4 + 8 * 3)
    # the first Gaussian's y, stored flipped (right-up-back axes), as a signed 24-bit fixed-point number
    y = int.from_bytes(raw[16 + 3: 16 + 6], "little", signed=True)
    assert y == round(-float(params["means"][0, 1]) * 4096)
    alpha = raw[16 + 9 * 50]
    assert alpha == round(255 * float(torch.sigmoid(params["opacity_logits"][0])))


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_is_within_the_quantisation_and_keeps_the_sh_degree(tmp_path, degree):
    params = random_params(300, degree=degree, seed=degree)
    back = load_spz(save_spz(tmp_path / "g.spz", params))
    assert_within_spz_steps(back, params)


def test_positions_far_from_the_origin_use_fewer_fractional_bits():
    params = random_params(20, degree=0)
    params["means"][0] = torch.tensor([5000.0, -3000.0, 10.0])  # beyond 2^23 / 2^12 = 2048
    raw = gzip.decompress(encode_spz(params))
    bits = raw[13]
    assert bits == 10  # the most that keeps 5000 * 2^bits below 2^23
    back = decode_spz(encode_spz(params))
    assert (back["means"] - params["means"]).abs().max() <= 0.5 / 2**bits + 5000 * 2.0**-24  # + float32 rounding at 5000


def test_pruning_and_sh_degree_options_of_the_writer(tmp_path):
    params = random_params(40, degree=3)
    keep = torch.arange(40) % 3 == 0
    back = load_spz(save_spz(tmp_path / "g.spz", params, keep=keep, sh_degree=1))
    assert len(back["means"]) == int(keep.sum()) and back["shN"].shape[1] == 3
    kept = {k: v[keep] for k, v in params.items()}
    assert_within_spz_steps(back, {**kept, "shN": kept["shN"][:, :3]})


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"not a gzip stream at all", "not a complete gzip stream"),
    (lambda data: data[: len(data) // 2], "not a complete gzip stream"),
    (lambda data: gzip.compress(b"XXXX" + gzip.decompress(data)[4:]), "magic"),
    (lambda data: gzip.compress(gzip.decompress(data)[:-7]), "truncated or corrupt"),
    (lambda data: gzip.compress(gzip.decompress(data)[:4] + struct.pack("<I", 9) + gzip.decompress(data)[8:]), "version 9"),
    (lambda data: b"NGSP" + struct.pack("<I", 4) + b"\0" * 24, "version 4 .*--spz-version 3"),
])
def test_bad_files_are_spz_format_errors(tmp_path, damage, message):
    path = tmp_path / "bad.spz"
    path.write_bytes(damage(encode_spz(random_params(10, degree=1))))
    with pytest.raises(SpzFormatError, match=message):
        load_spz(path)
    with pytest.raises(FileNotFoundError):
        load_spz(tmp_path / "missing.spz")


# Niantic's decoder undoes its axis flip F = diag(1, -1, -1) on both sides of a rotation (F R F), lift3d on one
# (F R, rotate_gaussians): the same covariance, since F commutes with the diagonal scales; q * HALF_TURN_X maps one
# quaternion to the other.
HALF_TURN_X = torch.tensor([0.0, 1.0, 0.0, 0.0])  # wxyz


def test_splat_transform_reads_our_spz_as_we_do(tmp_path):
    params = random_params(200, degree=3, seed=7)
    save_spz(tmp_path / "g.spz", params)
    splat_transform(tmp_path / "g.spz", tmp_path / "from_spz.ply")  # Niantic's decoder (wasm) inside splat-transform
    theirs, ours = load_ply(tmp_path / "from_spz.ply"), load_spz(tmp_path / "g.spz")
    for name in ("means", "log_scales", "opacity_logits", "sh0", "shN"):
        assert torch.allclose(theirs[name], ours[name], rtol=0, atol=1e-5), name
    mapped = quat_multiply(theirs["quats"], HALF_TURN_X.expand_as(theirs["quats"]))
    assert torch.allclose(same_sign(ours["quats"], mapped), ours["quats"], atol=1e-6)
    assert_within_spz_steps({**theirs, "quats": mapped}, params)


def test_spz_written_by_splat_transform_reads_back_within_the_quantisation(tmp_path):
    params = random_params(200, degree=3, seed=8)
    save_ply(tmp_path / "g.ply", params)
    splat_transform(tmp_path / "g.ply", "--spz-version", "3", tmp_path / "theirs.spz")  # Niantic's encoder
    back = load_spz(tmp_path / "theirs.spz")
    assert_within_spz_steps({**back, "quats": quat_multiply(back["quats"], HALF_TURN_X.expand_as(back["quats"]))}, params)


def test_files_read_through_load_gaussian_file(tmp_path):
    from lift3d.gaussians.files import load_gaussian_file

    params = random_params(30, degree=1)
    save_spz(tmp_path / "g.spz", params)
    assert np.array_equal(load_gaussian_file(tmp_path / "g.spz")["means"].numpy(), load_spz(tmp_path / "g.spz")["means"].numpy())
