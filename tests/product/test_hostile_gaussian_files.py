"""Gaussian files as attackers and broken tools make them, through the CLI: NaN values (one policy for every reader:
the bad Gaussians are left out with a warning that counts them; a file of nothing else is refused), headers claiming
more Gaussians than lift3d reads, compressed streams that inflate past what their header implies (gzip and zstd
bombs), and textures inside a .sog whose header claims a giant canvas. Each refusal: exit 2, one line, no traceback,
in seconds."""

from __future__ import annotations

import gzip
import io
import json
import struct
import zipfile

import numpy as np
import pytest
import torch

from lift3d.cli import main
from lift3d.gaussians.formats.files import PlyFormatError, load_gaussian_file
from lift3d.gaussians.formats.gltf import encode_gltf_splat
from lift3d.gaussians.formats.ksplat import encode_ksplat
from lift3d.gaussians.formats.sog import encode_sog
from lift3d.gaussians.formats.splat import SPLAT_DTYPE
from lift3d.gaussians.formats.spz import HEADER, MAGIC, encode_spz
from lift3d.viewer.models import load_view_model
from tests.gaussian_params import random_params
from tests.hostile import forged_webp, gzip_bomb, refused

NAN = np.float32("nan")


def splat_records(n: int, seed: int = 0) -> np.ndarray:
    """``n`` .splat records as web viewers' converters write them (32 bytes each, no header)."""
    rng = np.random.default_rng(seed)
    records = np.zeros(n, dtype=SPLAT_DTYPE)
    records["position"] = rng.normal(size=(n, 3))
    records["scale"] = rng.uniform(0.01, 0.1, size=(n, 3))
    records["rgba"] = rng.integers(0, 256, size=(n, 4))
    records["rotation"] = [[255, 128, 128, 128]] * n
    return records


def rezipped(data: bytes, replace: dict[str, bytes]) -> bytes:
    """A .sog bundle with some members replaced, as a zip tool rewrites it."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as bundle:
        for name in source.namelist():
            bundle.writestr(name, replace.get(name, source.read(name)))
    return out.getvalue()


def sog_meta(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        return json.loads(bundle.read("meta.json"))


def test_a_splat_with_nan_bytes_converts_without_them_and_says_how_many(tmp_path, capsys):
    records = splat_records(50)
    records["position"][[3, 17, 40], 1] = NAN  # a NaN's bytes (00 00 c0 7f), as a diverged run writes them
    records["scale"][9, 0] = np.float32("inf")
    (tmp_path / "scene.splat").write_bytes(records.tobytes())
    assert main(["export", str(tmp_path / "scene.splat"), "--format", "3dgs-ply", "spz"]) == 0
    err = capsys.readouterr().err
    assert "4 of its 50 Gaussians hold NaN or infinite values and are left out" in err, err
    for name in ("scene-splat-gaussians.ply", "scene-splat.spz"):  # what lift3d writes, lift3d reads back whole
        params = load_gaussian_file(tmp_path / name)
        assert len(params["means"]) == 46 and all(torch.isfinite(v).all() for v in params.values())
    assert len(load_view_model(tmp_path / "scene.splat").system.gaussians.means) == 46  # what `lift3d view` shows


def test_files_of_nothing_but_nan_are_refused_by_every_reader(tmp_path, capsys):
    records = splat_records(8)
    records["position"][:] = NAN
    (tmp_path / "all.splat").write_bytes(records.tobytes())
    sog = encode_sog(random_params(40, degree=1))
    meta = sog_meta(sog)
    meta["means"]["mins"] = [float("nan")] * 3  # json writes NaN, and json reads it
    (tmp_path / "nan.sog").write_bytes(rezipped(sog, {"meta.json": json.dumps(meta).encode()}))
    glb = bytearray(encode_gltf_splat(random_params(6, degree=0), up_axis="z"))
    at = glb.index(b"BIN\x00") + 4  # POSITION is the first attribute of the binary chunk
    glb[at: at + 6 * 12] = np.full(18, NAN, "<f4").tobytes()
    (tmp_path / "nan.glb").write_bytes(bytes(glb))
    path = tmp_path / "path.json"
    path.write_text(json.dumps({"keyframes": [{"c2w": np.eye(4).tolist()}]}))
    for name in ("all.splat", "nan.sog", "nan.glb"):
        refused(["export", str(tmp_path / name), "--format", "splat"], capsys, str(tmp_path / name), "NaN or infinite")
        refused(["render", str(tmp_path / name), "--path", str(path), "--out", str(tmp_path / "v.gif"), "--width", "32",
                 "--height", "32"], capsys, "NaN or infinite")
        with pytest.raises(PlyFormatError, match="NaN or infinite"):  # what `lift3d view FILE` loads before it serves
            load_view_model(tmp_path / name)
    assert not (tmp_path / "v.gif").exists() and not list(tmp_path.glob("*-*.splat"))


def test_header_counts_over_the_limit_are_refused_before_anything_is_allocated(tmp_path, capsys, monkeypatch):
    # a PLY header claiming four billion vertices over a body of a few bytes
    (tmp_path / "huge.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 4000000000\n"
                                        b"property float x\nproperty float y\nproperty float z\nend_header\n" + bytes(64))
    refused(["export", str(tmp_path / "huge.ply")], capsys, "4,000,000,000 Gaussians", "LIFT3D_MAX_GAUSSIANS")
    # an SPZ v4 whose header counts two billion Gaussians
    data = bytearray(encode_spz(random_params(10, degree=0)))
    struct.pack_into("<I", data, 8, 2_000_000_000)
    (tmp_path / "huge.spz").write_bytes(bytes(data))
    refused(["export", str(tmp_path / "huge.spz")], capsys, "2,000,000,000 Gaussians")
    # a .sog whose meta.json counts a billion
    sog = encode_sog(random_params(20, degree=0))
    meta = {**sog_meta(sog), "count": 1_000_000_000}
    (tmp_path / "huge.sog").write_bytes(rezipped(sog, {"meta.json": json.dumps(meta).encode()}))
    refused(["export", str(tmp_path / "huge.sog")], capsys, "1,000,000,000 Gaussians")
    # a genuine file over a lowered limit: the variable the message names raises it again
    (tmp_path / "ten.splat").write_bytes(splat_records(10).tobytes())
    monkeypatch.setenv("LIFT3D_MAX_GAUSSIANS", "5")
    refused(["export", str(tmp_path / "ten.splat")], capsys, "10 Gaussians", "LIFT3D_MAX_GAUSSIANS=10")
    monkeypatch.setenv("LIFT3D_MAX_GAUSSIANS", "10")
    assert main(["export", str(tmp_path / "ten.splat"), "--format", "spz"]) == 0, capsys.readouterr().err


def test_compressed_streams_inflate_no_further_than_their_header_implies(tmp_path, capsys):
    # SPZ v3: one gzip stream whose header counts 10 Gaussians, then a gigabyte of zeros (a 1 MB file)
    head = HEADER.pack(MAGIC, 3, 10, 0, 12, 0, 0)
    (tmp_path / "bomb.spz").write_bytes(gzip_bomb(head, 2**30))
    assert (tmp_path / "bomb.spz").stat().st_size < 2 * 2**20
    refused(["export", str(tmp_path / "bomb.spz")], capsys, "bomb.spz", "inflates past", seconds=60)
    # SPZ v4: a table of contents that claims a stream of a terabyte
    data = bytearray(encode_spz(random_params(10, degree=0)))
    struct.pack_into("<Q", data, 32 + 8, 2**40)  # the first stream's uncompressed size
    (tmp_path / "toc.spz").write_bytes(bytes(data))
    refused(["export", str(tmp_path / "toc.spz")], capsys, "table of contents", "1,099,511,627,776")
    # .ksplat: a bucket table that would expand to billions of entries
    data = bytearray(encode_ksplat(random_params(10, degree=0), level=1))
    struct.pack_into("<I", data, 4096 + 32, 4_000_000_000)  # the first section's full-bucket count
    (tmp_path / "buckets.ksplat").write_bytes(bytes(data))
    refused(["export", str(tmp_path / "buckets.ksplat")], capsys, "bucket table")


def test_a_giant_webp_canvas_inside_a_sog_is_refused_by_its_header(tmp_path, capsys):
    sog = encode_sog(random_params(20, degree=0))
    (tmp_path / "canvas.sog").write_bytes(rezipped(sog, {"means_l.webp": forged_webp(16384, 16384)}))
    refused(["export", str(tmp_path / "canvas.sog")], capsys, "means_l.webp", "16384 x 16384 px",
            "LIFT3D_MAX_TEXTURE_PIXELS")
    # a member whose zip directory promises more bytes than any SOG image needs
    with zipfile.ZipFile(io.BytesIO(sog)) as bundle:
        infos = bundle.infolist()
    assert infos[0].filename == "meta.json"
    data = bytearray(sog)
    offset = data.index(b"PK\x01\x02")  # the central directory's first entry: meta.json's declared size
    struct.pack_into("<I", data, offset + 24, 2**31)
    (tmp_path / "meta.sog").write_bytes(bytes(data))
    refused(["export", str(tmp_path / "meta.sog")], capsys, "meta.json")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_broken_compressed_files_are_named(tmp_path, capsys, damage):
    payload = np.random.default_rng(0).integers(0, 256, 1000 * 20, dtype=np.uint8).tobytes()  # 20 bytes a Gaussian
    data = gzip.compress(HEADER.pack(MAGIC, 3, 1000, 0, 12, 0, 0) + payload)
    data = data[: len(data) // 2] if damage == "truncated" else data + b"this is not gzip"
    (tmp_path / "broken.spz").write_bytes(data)
    refused(["export", str(tmp_path / "broken.spz")], capsys, "broken.spz", "gzip stream")
