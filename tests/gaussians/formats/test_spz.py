"""SPZ files: Niantic's header and layout (version 4: plain header and ZSTD streams; version 3: one gzip stream), round
trips within the format's quantization, SH degree and the antialiased flag kept, clear errors for bad files, and
PlayCanvas splat-transform (which embeds Niantic's own SPZ code) reading ours and writing files that we read."""

import gzip
import math
import struct

import numpy as np
import pytest
import torch
import zstandard

from lift3d.gaussians.formats.ply import load_ply, save_ply
from lift3d.gaussians.formats.spz import SpzFormatError, decode_spz, encode_spz, load_spz, save_spz, spz_info, unpack_rotations
from lift3d.rotations import quaternion_multiply
from tests.gaussian_params import random_params, same_sign, unit
from tests.validators import splat_transform

# Tolerances, each half of the format's quantization step (values stay inside the coded ranges, see random_params):
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
    """``back`` (decoded) equals ``params`` (written) to within half of each SPZ quantization step."""
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


def test_version_3_header_and_array_sizes_follow_the_spz_layout(tmp_path):
    params = random_params(50, degree=2)
    raw = gzip.decompress(save_spz(tmp_path / "g.spz", params, version=3).read_bytes())  # one gzip stream, read independently
    magic, version, count, degree, bits, flags, reserved = struct.unpack_from("<4sIIBBBB", raw)
    assert (magic, version, count, degree, bits, flags, reserved) == (b"NGSP", 3, 50, 2, 12, 0, 0)
    # positions 9 bytes, alpha 1, color 3, scale 3, rotation 4 (smallest three), SH 8 coefficients x 3
    assert len(raw) == 16 + 50 * (9 + 1 + 3 + 3 + 4 + 8 * 3)
    # the first Gaussian's y, stored flipped (right-up-back axes), as a signed 24-bit fixed-point number
    y = int.from_bytes(raw[16 + 3: 16 + 6], "little", signed=True)
    assert y == round(-float(params["means"][0, 1]) * 4096)
    alpha = raw[16 + 9 * 50]
    assert alpha == round(255 * float(torch.sigmoid(params["opacity_logits"][0])))


def test_version_4_header_table_and_zstd_streams_follow_the_spz_layout(tmp_path):
    params = random_params(50, degree=2)
    data = save_spz(tmp_path / "g.spz", params, antialiased=True).read_bytes()  # version 4 is the default
    magic, version, count, degree, bits, flags, streams, toc = struct.unpack_from("<4sIIBBBBI", data)
    assert (magic, version, count, degree, bits, flags, streams, toc) == (b"NGSP", 4, 50, 2, 12, 1, 6, 32)
    assert data[20:32] == b"\0" * 12  # reserved
    sizes = [struct.unpack_from("<QQ", data, 32 + 16 * i) for i in range(6)]
    # positions 9 bytes, alpha 1, color 3, scale 3, rotation 4, SH 8 coefficients x 3, each its own ZSTD frame
    assert [raw for _, raw in sizes] == [50 * k for k in (9, 1, 3, 3, 4, 24)]
    offset, streams = 32 + 16 * 6, []
    for packed, raw in sizes:
        assert data[offset: offset + 4] == b"\x28\xb5\x2f\xfd"  # the ZSTD frame magic
        streams.append(zstandard.ZstdDecompressor().decompress(data[offset: offset + packed], max_output_size=raw))
        offset += packed
    assert offset == len(data)
    y = int.from_bytes(streams[0][3:6], "little", signed=True)  # right-up-back: y stored flipped
    assert y == round(-float(params["means"][0, 1]) * 4096)
    assert streams[1][0] == round(255 * float(torch.sigmoid(params["opacity_logits"][0])))
    # version 3 holds the same arrays in one gzip stream
    legacy = gzip.decompress(encode_spz(params, version=3))
    assert legacy[16:] == b"".join(streams)


def test_degree_0_writes_five_streams(tmp_path):
    data = encode_spz(random_params(20, degree=0))
    assert data[15] == 5 and data[12] == 0  # no SH stream, as Niantic's writer leaves out empty ones
    assert decode_spz(data)["shN"].shape == (20, 0, 3)


@pytest.mark.parametrize("version", [3, 4])
@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_round_trip_is_within_the_quantization_and_keeps_the_sh_degree(tmp_path, degree, version):
    params = random_params(300, degree=degree, seed=degree)
    back = load_spz(save_spz(tmp_path / "g.spz", params, version=version))
    assert_within_spz_steps(back, params)


@pytest.mark.parametrize("version", [3, 4])
def test_the_antialiased_flag_is_kept(tmp_path, version):
    params = random_params(10, degree=1)
    assert spz_info(save_spz(tmp_path / "a.spz", params, version=version, antialiased=True)).antialiased
    info = spz_info(save_spz(tmp_path / "b.spz", params, version=version))
    assert not info.antialiased and (info.version, info.count, info.sh_degree) == (version, 10, 1)


def test_version_2_files_read_within_their_rotation_step():
    """Version 2 (gzip; rotations as three bytes of x, y, z with w >= 0) is written here from its layout."""
    params = random_params(100, degree=1, seed=4)
    legacy = bytearray(gzip.decompress(encode_spz(params, version=3)))
    n = 100
    start = 16 + n * (9 + 1 + 3 + 3)
    codes = np.frombuffer(bytes(legacy[start: start + 4 * n]), dtype="<u4")
    quats = unpack_rotations(codes)  # wxyz in SPZ's axes
    quats *= np.where(quats[:, :1] < 0, -1.0, 1.0)  # version 2 keeps w >= 0
    xyz = np.clip(np.round(quats[:, 1:] * 127.5 + 127.5), 0, 255).astype(np.uint8)
    struct.pack_into("<I", legacy, 4, 2)
    v2 = gzip.compress(bytes(legacy[:start]) + xyz.tobytes() + bytes(legacy[start + 4 * n:]))
    back, reference = decode_spz(v2), decode_spz(encode_spz(params, version=3))
    for name in ("means", "log_scales", "opacity_logits", "sh0", "shN"):
        assert torch.allclose(back[name], reference[name], rtol=0, atol=1e-6), name  # the same bytes
    # SPZ's x, y, z are stored to half a byte step and its w recomputed; in lift3d's axes (a half turn about x on
    # the left, q -> (-x, w, -z, y)) they are the components w, y, z, and x is the recomputed one
    got = same_sign(reference["quats"], back["quats"])
    assert (got[:, [0, 2, 3]] - reference["quats"][:, [0, 2, 3]]).abs().max() <= 0.5 / 127.5 + 1e-6
    assert torch.allclose(got.norm(dim=1), torch.ones(n), atol=1e-6)


def test_degree_4_files_keep_bands_up_to_3():
    params = random_params(30, degree=3, seed=5)
    data = bytearray(encode_spz(params))
    # the same file with a fourth band (9 more coefficients of 128, i.e. zero) in its SH stream
    toc = [struct.unpack_from("<QQ", data, 32 + 16 * i) for i in range(6)]
    offset = 32 + 16 * 6 + sum(packed for packed, _ in toc[:5])
    sh = bytes(zstandard.ZstdDecompressor().decompress(bytes(data[offset:]), max_output_size=toc[5][1]))
    sh4 = np.concatenate([np.frombuffer(sh, np.uint8).reshape(30, 45), np.full((30, 27), 128, np.uint8)], axis=1)
    frame = zstandard.ZstdCompressor().compress(sh4.tobytes())
    data[12] = 4
    struct.pack_into("<QQ", data, 32 + 16 * 5, len(frame), sh4.size)
    back = decode_spz(bytes(data[:offset]) + frame)
    assert torch.allclose(back["shN"], decode_spz(encode_spz(params))["shN"], rtol=0, atol=1e-6)


def test_extension_records_are_skipped_and_adobe_axes_applied():
    params = random_params(40, degree=1, seed=6)
    data = encode_spz(params)
    plain = decode_spz(data)

    def with_records(records: bytes) -> bytes:
        header = bytearray(data[:32])
        header[14] |= 2
        struct.pack_into("<I", header, 16, 32 + len(records))
        return bytes(header) + records + data[32:]

    unknown = struct.pack("<II", 0x12340001, 5) + b"abcde"
    back = decode_spz(with_records(unknown))
    assert all(torch.equal(back[k], plain[k]) for k in plain)
    # Adobe's coordinate-system record (0xADBE0003): the arrays are stored in right-down-front (6), a half turn about x
    # from right-up-back, so reading them as such turns the Gaussians by that half turn
    turned = decode_spz(with_records(struct.pack("<III", 0xADBE0003, 4, 6)))
    assert torch.allclose(turned["means"], plain["means"] * torch.tensor([1.0, -1.0, -1.0]), atol=1e-6)
    with pytest.raises(SpzFormatError, match="mirrored axes"):
        decode_spz(with_records(struct.pack("<III", 0xADBE0003, 4, 3)))  # left-up-back: a mirror image


def test_positions_far_from_the_origin_use_fewer_fractional_bits():
    params = random_params(20, degree=0)
    params["means"][0] = torch.tensor([5000.0, -3000.0, 10.0])  # beyond 2^23 / 2^12 = 2048
    raw = encode_spz(params)
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


@pytest.mark.parametrize("version, damage, message", [
    (3, lambda data: b"not a gzip stream at all", "not a complete gzip stream"),
    (3, lambda data: data[: len(data) // 2], "not a complete gzip stream"),
    (3, lambda data: gzip.compress(b"XXXX" + gzip.decompress(data)[4:]), "magic"),
    (3, lambda data: gzip.compress(gzip.decompress(data)[:-7]), "truncated or corrupt"),
    (3, lambda data: gzip.compress(gzip.decompress(data)[:4] + struct.pack("<I", 9) + gzip.decompress(data)[8:]), "version 9"),
    (4, lambda data: data[:20], "too short"),
    (4, lambda data: data[:4] + struct.pack("<I", 5) + data[8:], "version 5 .*--spz-version 4"),
    (4, lambda data: data[:-3], "truncated: stream 5"),
    (4, lambda data: data[:16] + struct.pack("<I", 4000) + data[20:], "table of contents"),
    (4, lambda data: data[:-4] + b"\xff" * 4, "corrupt: stream 5"),
    (4, lambda data: data[:12] + b"\x02" + data[13:], "truncated or corrupt: .* expected"),  # SH degree 2, not 1
])
def test_bad_files_are_spz_format_errors(tmp_path, version, damage, message):
    path = tmp_path / "bad.spz"
    path.write_bytes(damage(encode_spz(random_params(10, degree=1), version=version)))
    with pytest.raises(SpzFormatError, match=message):
        load_spz(path)
    with pytest.raises(FileNotFoundError):
        load_spz(tmp_path / "missing.spz")


# Niantic's decoder undoes its axis flip F = diag(1, -1, -1) on both sides of a rotation (F R F), lift3d on one
# (F R, rotate_gaussians): the same covariance, since F commutes with the diagonal scales; q * HALF_TURN_X maps one
# quaternion to the other.
HALF_TURN_X = torch.tensor([0.0, 1.0, 0.0, 0.0])  # wxyz


@pytest.mark.parametrize("version", [3, 4])
def test_splat_transform_reads_our_spz_as_we_do(tmp_path, version):
    params = random_params(200, degree=3, seed=7)
    save_spz(tmp_path / "g.spz", params, version=version)
    splat_transform(tmp_path / "g.spz", tmp_path / "from_spz.ply")  # Niantic's decoder (wasm) inside splat-transform
    theirs, ours = load_ply(tmp_path / "from_spz.ply"), load_spz(tmp_path / "g.spz")
    assert len(theirs["means"]) == len(ours["means"]) == 200
    for name in ("means", "log_scales", "opacity_logits", "sh0", "shN"):
        assert torch.allclose(theirs[name], ours[name], rtol=0, atol=1e-5), name
    mapped = quaternion_multiply(theirs["quats"], HALF_TURN_X.expand_as(theirs["quats"]))
    assert torch.allclose(same_sign(ours["quats"], mapped), ours["quats"], atol=1e-6)
    assert_within_spz_steps({**theirs, "quats": mapped}, params)


@pytest.mark.parametrize("version", [3, 4])
def test_spz_written_by_splat_transform_reads_back_within_the_quantization(tmp_path, version):
    params = random_params(200, degree=3, seed=8)
    save_ply(tmp_path / "g.ply", params)
    splat_transform(tmp_path / "g.ply", "--spz-version", str(version), tmp_path / "theirs.spz")  # Niantic's encoder
    assert spz_info(tmp_path / "theirs.spz").version == version
    back = load_spz(tmp_path / "theirs.spz")
    assert_within_spz_steps({**back, "quats": quaternion_multiply(back["quats"], HALF_TURN_X.expand_as(back["quats"]))}, params)


def test_files_read_through_load_gaussian_file(tmp_path):
    from lift3d.gaussians.formats.files import load_gaussian_file

    params = random_params(30, degree=1)
    save_spz(tmp_path / "g.spz", params)
    assert np.array_equal(load_gaussian_file(tmp_path / "g.spz")["means"].numpy(), load_spz(tmp_path / "g.spz")["means"].numpy())


def test_lift3d_export_keeps_the_antialiased_flag_and_writes_the_asked_version(tmp_path, capsys):
    from lift3d.cli import main

    params = random_params(40, degree=2, seed=9)
    save_spz(tmp_path / "model.spz", params, version=3, antialiased=True)
    assert main(["export", str(tmp_path / "model.spz"), "--format", "spz", "gltf-splat"]) == 0, capsys.readouterr().err
    written = [path for path in tmp_path.glob("*.spz") if path.name != "model.spz"]
    assert len(written) == 1
    info = spz_info(written[0])
    assert (info.version, info.count, info.sh_degree, info.antialiased) == (4, 40, 2, True)
    assert_within_spz_steps(load_spz(written[0]), load_spz(tmp_path / "model.spz"))  # one more quantization: no drift
    written[0].unlink()
    assert main(["export", str(tmp_path / "model.spz"), "--format", "spz", "system.export.spz_version=3"]) == 0
    (again,) = [path for path in tmp_path.glob("*.spz") if path.name != "model.spz"]
    assert spz_info(again).version == 3 and spz_info(again).antialiased
    save_spz(tmp_path / "plain.spz", params)
    assert main(["export", str(tmp_path / "plain.spz"), "--format", "spz", "system.export.stem=plain-copy"]) == 0
    assert not spz_info(tmp_path / "plain-copy.spz").antialiased
    capsys.readouterr()
    assert main(["export", str(tmp_path / "plain.spz"), "--format", "spz", "system.export.spz_version=2"]) == 2
    assert "system.export.spz_version must be one of 4, 3; got 2" in capsys.readouterr().err
