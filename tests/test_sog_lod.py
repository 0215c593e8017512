"""Levels of detail as PlayCanvas's streamed SOG: the pairwise merge keeps each pair's mass, mean and spread; the
lod-meta.json layout splat-transform writes (every leaf's ranges tile each level's file), each level's SOG read
by splat-transform with the counts lod-meta.json gives; `lift3d export --format sog-lod`."""

import json

import numpy as np
import torch

from lift3d.gaussians.formats.sog_lod import _rotmats, load_sog_lod, merge_pairs, save_sog_lod
from tests.gaussian_params import random_params
from tests.validators import read_csv_columns, splat_transform


def covariance(params: dict, i: int) -> np.ndarray:
    r = _rotmats(params["quats"][i: i + 1].double().numpy())[0]
    return r @ np.diag(np.exp(2 * params["log_scales"][i].double().numpy())) @ r.T


def test_a_merged_pair_has_the_mean_and_spread_of_the_mixture():
    params = random_params(2, degree=1, seed=1)
    params["means"] = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    merged = merge_pairs(params)
    assert len(merged["means"]) == 1 and merged["shN"].shape == (1, 3, 3)
    alpha = torch.sigmoid(params["opacity_logits"].double())
    w = alpha * params["log_scales"].double().exp().prod(1)
    w = w / w.sum()
    mean = (w[:, None] * params["means"].double()).sum(0)
    assert torch.allclose(merged["means"][0].double(), mean, atol=1e-6)
    spread = sum(float(w[i]) * (covariance(params, i) + np.outer(params["means"][i] - mean, params["means"][i] - mean))
                 for i in range(2))
    assert np.allclose(covariance(merged, 0), spread, atol=1e-6)
    assert torch.allclose(torch.sigmoid(merged["opacity_logits"][0]).double(), 1 - (1 - alpha).prod(), atol=1e-6)
    assert torch.allclose(merged["sh0"][0].double(), (w[:, None, None] * params["sh0"].double()).sum(0), atol=1e-6)


def test_each_level_halves_and_an_odd_one_is_kept():
    params = random_params(101, degree=0, seed=2)
    merged = merge_pairs(params)
    assert len(merged["means"]) == 51
    assert any(torch.equal(merged["means"][-1], m) for m in params["means"])  # the odd one, as it was


def test_lod_bundle_layout_and_splat_transform_reads_every_level(tmp_path):
    params = random_params(3000, degree=2, seed=3)
    params["means"][:1000] += torch.tensor([30.0, 0.0, 0.0])  # a second cluster, farther than one chunk's extent
    path = save_sog_lod(tmp_path / "model-lod", params, levels=3, chunk_count=800)
    meta = json.loads(path.read_text())
    assert path.name == "lod-meta.json" and meta["version"] == 1 and meta["lodLevels"] == 3
    assert meta["counts"] == [3000, 1500, 750] and meta["count"] == 5250
    assert meta["filenames"] == ["0_0/meta.json", "1_0/meta.json", "2_0/meta.json"]
    leaves, stack = [], [meta["tree"]]
    while stack:
        node = stack.pop()
        assert set(node["bound"]) == {"min", "max"}
        if "children" in node:
            assert len(node["children"]) == 2
            for child in node["children"]:
                assert np.all(np.array(child["bound"]["min"]) >= np.array(node["bound"]["min"]) - 1e-9)
                assert np.all(np.array(child["bound"]["max"]) <= np.array(node["bound"]["max"]) + 1e-9)
            stack += node["children"]
        else:
            leaves.append(node)
    assert len(leaves) >= 4  # 3000 Gaussians in chunks of at most 800, two clusters 30 units apart
    for level, count in enumerate(meta["counts"]):
        spans = sorted((leaf["lods"][str(level)]["offset"], leaf["lods"][str(level)]["count"])
                       for leaf in leaves if str(level) in leaf["lods"])
        assert all(leaf["lods"][str(level)]["file"] == level for leaf in leaves if str(level) in leaf["lods"])
        assert spans[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))
        assert spans[-1][0] + spans[-1][1] == count  # the leaves' ranges tile the level's file
        splat_transform(tmp_path / "model-lod" / f"{level}_0" / "meta.json", tmp_path / f"level{level}.csv")
        columns = read_csv_columns(tmp_path / f"level{level}.csv")
        assert len(columns["x"]) == count
        ours = load_sog_lod(path, level)
        assert np.allclose(np.stack([columns[a] for a in "xyz"], 1), ours["means"].numpy(), atol=1e-4)
        for leaf in leaves:  # each leaf's Gaussians of this level lie inside its bound
            if str(level) in leaf["lods"]:
                span = leaf["lods"][str(level)]
                inside = ours["means"][span["offset"]: span["offset"] + span["count"]].numpy()
                assert np.all(inside >= np.array(leaf["bound"]["min"]) - 1e-3)
                assert np.all(inside <= np.array(leaf["bound"]["max"]) + 1e-3)
    # the coarse levels keep the scene's extent and color
    level2 = load_sog_lod(path, 2)
    assert abs(float(level2["means"][:, 0].max() - params["means"][:, 0].max())) < 1.0
    assert abs(float(level2["sh0"].mean() - params["sh0"].mean())) < 0.05


def test_lift3d_export_writes_levels_of_detail(tmp_path, capsys):
    from lift3d.cli import main
    from lift3d.gaussians.formats.ply import save_ply

    save_ply(tmp_path / "model.ply", random_params(400, degree=1, seed=4))
    assert main(["export", str(tmp_path / "model.ply"), "--format", "sog-lod", "system.export.lod_levels=2"]) == 0, \
        capsys.readouterr().err
    (meta,) = tmp_path.glob("*-lod/lod-meta.json")
    assert json.loads(meta.read_text())["counts"] == [400, 200]
    assert main(["export", str(tmp_path / "model.ply"), "--format", "sog-lod", "system.export.lod_levels=0"]) == 2
    assert "system.export.lod_levels must be a number >= 1; got 0" in capsys.readouterr().err
