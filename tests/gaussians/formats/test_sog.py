"""SOG files: PlayCanvas's meta.json v2 + lossless WebP layout, round trips within the format's quantization
(16-bit log-transformed means, 8-bit smallest-three quaternions, 256-entry codebooks, the SH palette), the SH
degree kept, clear errors for bad files, and PlayCanvas splat-transform reading ours and writing files we read."""

import io
import json
import math
import zipfile

import numpy as np
import pytest
import torch

from lift3d.gaussians.formats.ply import load_ply, save_ply
from lift3d.gaussians.formats.sog import SogFormatError, encode_sog, load_sog, save_sog
from tests.gaussian_params import random_params, same_sign, unit
from tests.validators import splat_transform

EPS = 1e-6  # float32 rounding of the decoded values
OPACITY_TOL = 0.5 / 255  # bytes of 255 * sigmoid(logit), compared after the sigmoid
QUAT_SMALL_TOL = 0.5 * (2 / 255) / math.sqrt(2)  # each of the three smallest: a byte over [-1, 1] / sqrt(2)
QUAT_LARGEST_TOL = 3 * QUAT_SMALL_TOL  # the largest (>= 1/2) from the others: |dL| <= sum|c_i| d / L <= 3 d


def means_tolerance(means: torch.Tensor) -> torch.Tensor:
    """Per value [N, 3]: half a 16-bit step of n = sign(x) ln(1 + |x|) over each axis's range, carried back
    through x = sign(n) (e^|n| - 1), whose slope is 1 + |x|."""
    n = means.double().sign() * means.double().abs().log1p()
    half_step = (n.max(0).values - n.min(0).values) / 65535 / 2
    return (1 + means.double().abs()) * half_step * (1 + 1e-3) + EPS


def nearest(codebook: list[float], values: torch.Tensor) -> torch.Tensor:
    """Each value's nearest codebook entry (what a 256-entry codebook quantizer must return)."""
    book = torch.tensor(codebook, dtype=torch.float64)
    flat = values.double().reshape(-1, 1)
    return book[(flat - book[None]).abs().argmin(dim=1)].reshape(values.shape).float()


def meta_of(path) -> dict:
    with zipfile.ZipFile(path) as bundle:
        return json.loads(bundle.read("meta.json"))


def assert_within_sog_steps(back: dict, params: dict, meta: dict, exact_sh_palette: bool = True) -> None:
    assert ((back["means"] - params["means"]).abs().double() <= means_tolerance(params["means"])).all()
    assert (torch.sigmoid(back["opacity_logits"]) - torch.sigmoid(params["opacity_logits"])).abs().max() <= OPACITY_TOL + EPS
    assert torch.allclose(back["log_scales"], nearest(meta["scales"]["codebook"], params["log_scales"]), atol=EPS)
    assert torch.allclose(back["sh0"], nearest(meta["sh0"]["codebook"], params["sh0"]), atol=EPS)
    assert back["shN"].shape == params["shN"].shape  # the SH degree is kept
    if exact_sh_palette and params["shN"].shape[1]:  # a palette as large as the count holds every Gaussian's vector
        assert torch.allclose(back["shN"], nearest(meta["shN"]["codebook"], params["shN"]), atol=EPS)
    reference = unit(params["quats"])
    error = (same_sign(reference, back["quats"]) - reference).abs()
    small = torch.ones_like(error, dtype=torch.bool)
    small[torch.arange(len(small)), reference.abs().argmax(dim=1)] = False
    assert error[small].max() <= QUAT_SMALL_TOL + EPS
    assert error.max() <= QUAT_LARGEST_TOL + EPS


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_round_trip_is_within_the_quantization_and_keeps_the_sh_degree(tmp_path, degree):
    params = random_params(150, degree=degree, seed=degree)
    path = save_sog(tmp_path / "g.sog", params, sort=False, sh_palette=150)
    assert_within_sog_steps(load_sog(path), params, meta_of(path))


def test_bundle_holds_lossless_webp_images_of_the_sog_size(tmp_path):
    path = save_sog(tmp_path / "g.sog", random_params(150, degree=2), sh_palette=100)
    meta = meta_of(path)
    assert meta["version"] == 2 and meta["count"] == 150 and meta["shN"]["bands"] == 2 and meta["shN"]["count"] == 100
    assert len(meta["scales"]["codebook"]) <= 256 and len(meta["sh0"]["codebook"]) <= 256
    from PIL import Image

    with zipfile.ZipFile(path) as bundle:
        names = set(bundle.namelist())
        assert names == {"meta.json", "means_l.webp", "means_u.webp", "quats.webp", "scales.webp", "sh0.webp",
                         "shN_centroids.webp", "shN_labels.webp"}
        for name in names - {"meta.json"}:
            data = bundle.read(name)
            assert data[:4] == b"RIFF" and data[8:12] == b"WEBP" and data[12:16] == b"VP8L", name  # VP8L: lossless
            size = Image.open(io.BytesIO(data)).size
            if name == "shN_centroids.webp":
                assert size == (64 * 8, 2)  # 64 palette entries a row, 8 coefficients each (degree 2), 100 entries
            else:
                assert size == (16, 12)  # W = 4 ceil(sqrt(150) / 4) = 16, H = 4 ceil(150 / 16 / 4) = 12


def test_morton_order_keeps_every_gaussian(tmp_path):
    params = random_params(200, degree=1, seed=4)
    path = save_sog(tmp_path / "g.sog", params, sh_palette=200)
    back = load_sog(path)
    match = torch.cdist(back["means"].double(), params["means"].double()).argmin(dim=1)
    assert sorted(match.tolist()) == list(range(200)) and not torch.equal(match, torch.arange(200))
    assert_within_sog_steps(back, {k: v[match] for k, v in params.items()}, meta_of(path))


def test_a_small_palette_keeps_the_nearest_palette_entry(tmp_path):
    params = random_params(300, degree=1, seed=5)
    path = save_sog(tmp_path / "g.sog", params, sort=False, sh_palette=16)
    back, meta = load_sog(path), meta_of(path)
    assert meta["shN"]["count"] == 16 and len(torch.unique(back["shN"].reshape(300, -1), dim=0)) <= 16
    assert_within_sog_steps(back, params, meta, exact_sh_palette=False)
    # k-means: the palette explains most of the spread of the SH vectors (a poor palette would not)
    residual = (back["shN"] - params["shN"]).pow(2).sum() / (params["shN"] - params["shN"].mean(0)).pow(2).sum()
    assert residual < 0.8


def _rezip(data: bytes, edit) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as source:
        files = {name: source.read(name) for name in source.namelist()}
    edit(files)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for name, content in files.items():
            target.writestr(name, content)
    return out.getvalue()


def _meta_edit(change):
    def edit(files):
        meta = json.loads(files["meta.json"])
        change(meta)
        files["meta.json"] = json.dumps(meta).encode()
    return edit


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"plainly not a zip", "not a SOG bundle"),
    (lambda data: data[: len(data) // 3], "not a SOG bundle"),
    (lambda data: _rezip(data, lambda files: files.pop("meta.json")), "without meta.json"),
    (lambda data: _rezip(data, _meta_edit(lambda meta: meta.pop("version"))), "meta version None"),
    (lambda data: _rezip(data, lambda files: files.pop("quats.webp")), "lacks quats.webp"),
    (lambda data: _rezip(data, lambda files: files.update({"sh0.webp": b"RIFF0000WEBPjunk"})), "sh0.webp is not a readable WebP"),
    (lambda data: _rezip(data, _meta_edit(lambda meta: meta.update(count=10**6))), "pixels, fewer than"),
    (lambda data: _rezip(data, _meta_edit(lambda meta: meta["shN"].update(count=1))), "past the 1 palette entries"),
    (lambda data: _rezip(data, _meta_edit(lambda meta: meta.pop("scales"))), "lacks or misstates 'scales'"),
])
def test_bad_files_are_sog_format_errors(tmp_path, damage, message):
    path = tmp_path / "bad.sog"
    path.write_bytes(damage(encode_sog(random_params(40, degree=1), sh_palette=8)))
    with pytest.raises(SogFormatError, match=message):
        load_sog(path)


def test_splat_transform_reads_our_sog_as_we_do(tmp_path):
    params = random_params(200, degree=3, seed=6)
    save_sog(tmp_path / "g.sog", params, sh_palette=64)
    splat_transform(tmp_path / "g.sog", tmp_path / "from_sog.ply")
    theirs, ours = load_ply(tmp_path / "from_sog.ply"), load_sog(tmp_path / "g.sog")
    for name in ("means", "log_scales", "opacity_logits", "sh0", "shN", "quats"):
        assert torch.allclose(theirs[name], ours[name], rtol=1e-6, atol=1e-5), name


def test_sog_written_by_splat_transform_reads_back_within_the_quantization(tmp_path):
    params = random_params(256, degree=0, seed=9)  # no SH palette: their k-means is not ours to bound
    save_ply(tmp_path / "g.ply", params)
    splat_transform(tmp_path / "g.ply", "-g", "cpu", tmp_path / "theirs.sog")
    back = load_sog(tmp_path / "theirs.sog")
    match = torch.cdist(back["means"].double(), params["means"].double()).argmin(dim=1)  # they reorder (Morton)
    assert sorted(match.tolist()) == list(range(256))
    meta = meta_of(tmp_path / "theirs.sog")
    # splat-transform truncates (not rounds) 16-bit means and 8-bit quaternions: a whole step, not half
    params = {k: v[match] for k, v in params.items()}
    assert ((back["means"] - params["means"]).abs().double() <= 2 * means_tolerance(params["means"])).all()
    reference = unit(params["quats"])
    assert (same_sign(reference, back["quats"]) - reference).abs().max() <= 2 * QUAT_LARGEST_TOL + EPS
    assert torch.allclose(back["log_scales"], nearest(meta["scales"]["codebook"], params["log_scales"]), atol=EPS)
    assert torch.allclose(back["sh0"], nearest(meta["sh0"]["codebook"], params["sh0"]), atol=EPS)
    assert (torch.sigmoid(back["opacity_logits"]) - torch.sigmoid(params["opacity_logits"])).abs().max() <= 2 * OPACITY_TOL + EPS
    assert np.isfinite(back["opacity_logits"].numpy()).all()


def _clustered_points(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[2000, 45] points around 20 well-separated centers (SH-palette-sized vectors), and those centers."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(20, 45, generator=generator) * 4
    points = centers.repeat_interleave(100, 0) + 0.05 * torch.randn(2000, 45, generator=generator)
    return points, centers


def test_kmeans_on_the_cpu_finds_separated_clusters():
    from lift3d.gaussians.formats.sog import kmeans

    points, _ = _clustered_points()
    centroids, labels = kmeans(points, 64, iterations=10, device="cpu")
    assert labels.device.type == "cpu" and centroids.shape == (64, 45)
    # every point lies within its cluster's spread of its centroid; each true cluster maps to its own entries
    assert (points - centroids[labels]).norm(dim=1).max() < 1.0
    groups = labels.reshape(20, 100)
    assert len({int(g) for row in groups for g in row.unique()}) == len(labels.unique())
    assert all(not set(groups[i].tolist()) & set(groups[j].tolist()) for i in range(20) for j in range(i + 1, 20))


@pytest.mark.gpu
def test_kmeans_on_cuda_matches_the_cpu():
    from lift3d.gaussians.formats.sog import kmeans

    points, _ = _clustered_points(1)
    cpu_centroids, cpu_labels = kmeans(points, 64, iterations=10, device="cpu")
    gpu_centroids, gpu_labels = kmeans(points, 64, iterations=10)  # CUDA by default when there is one
    assert gpu_labels.device.type == "cpu"
    # near-ties between two entries of one cluster may fall the other way (TF32 / summation order); the clustering
    # and its distortion are the same
    assert (gpu_labels == cpu_labels).float().mean() > 0.98
    assert torch.allclose(gpu_centroids, cpu_centroids, atol=0.05)
    cpu_error = (points - cpu_centroids[cpu_labels]).square().sum(1).mean()
    gpu_error = (points - gpu_centroids[gpu_labels]).square().sum(1).mean()
    assert abs(gpu_error - cpu_error) < 0.01 * cpu_error
