"""Levels of detail as PlayCanvas's streamed SOG: the pairwise merge keeps each pair's mass, mean and spread; the
lod-meta.json layout splat-transform writes (every leaf's ranges tile each level's file), each level's SOG read
by splat-transform with the counts lod-meta.json gives; `lift3d export --format sog-lod`; bundles of lift3d and of
splat-transform (several files per level, an environment) read back in export, view and render."""

import json

import numpy as np
import pytest
import torch

from lift3d.cameras import look_at
from lift3d.gaussians.formats.files import load_gaussian_file
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.formats.sog_lod import load_sog_lod, merge_pairs, save_sog_lod
from lift3d.rotations import quaternion_to_matrix_np
from lift3d.viewer.models import load_view_model
from tests.gaussian_params import random_params
from tests.validators import read_csv_columns, splat_transform


def covariance(params: dict, i: int) -> np.ndarray:
    r = quaternion_to_matrix_np(params["quats"][i: i + 1].double().numpy())[0]
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


def _matched(ours: dict, theirs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(distance to the nearest of ``theirs``' means, that one's index) for each of ``ours``."""
    distances = torch.cdist(ours["means"].double(), theirs["means"].double())
    nearest = distances.min(1)
    return nearest.values.numpy(), nearest.indices.numpy()


def assert_same_gaussians(ours: dict, theirs: dict) -> None:
    """The same Gaussians in any order, to SOG's quantization: one-to-one by position, with their colors, sizes and
    opacities."""
    assert len(ours["means"]) == len(theirs["means"])
    distance, index = _matched(ours, theirs)
    assert distance.max() < 0.01 and len(set(index.tolist())) == len(index)
    for key in ("sh0", "log_scales"):  # 256-entry codebooks: close on the whole, coarser at the extremes
        error = (ours[key] - theirs[key][index]).abs()
        assert error.mean() < 0.02 and error.max() < 0.25, (key, error.mean(), error.max())
    assert (torch.sigmoid(ours["opacity_logits"]) - torch.sigmoid(theirs["opacity_logits"][index])).abs().max() < 0.01
    assert ours["shN"].shape[1:] == theirs["shN"].shape[1:]


@pytest.fixture(scope="module")
def splat_transform_bundle(tmp_path_factory):
    """A streamed SOG as PlayCanvas' splat-transform writes one from two levels and an environment (``-l -1``):
    level 0 spread over two files (chunks of 1 K), the environment in env/meta.json."""
    folder = tmp_path_factory.mktemp("splat-transform")
    level0 = random_params(1300, degree=1, seed=4)
    levels = {0: level0, 1: merge_pairs(level0)}
    environment = random_params(16, degree=1, seed=5)
    environment["means"] = environment["means"] * 10 + 30
    for level, params in levels.items():
        save_ply(folder / f"level{level}.ply", params)
    save_ply(folder / "environment.ply", environment)
    splat_transform("-g", "cpu", "-i", "1", folder / "level0.ply", "-l", "0", folder / "level1.ply", "-l", "1",
                    folder / "environment.ply", "-l", "-1", "-C", "1", "-X", "2", folder / "theirs" / "lod-meta.json")
    return folder / "theirs", levels, environment


def test_a_splat_transform_bundle_reads_every_level_and_its_environment(splat_transform_bundle):
    folder, levels, environment = splat_transform_bundle
    meta = json.loads((folder / "lod-meta.json").read_text())
    assert sum(name.startswith("0_") for name in meta["filenames"]) >= 2 and meta["environment"] == "env/meta.json"
    for level, params in levels.items():
        expected = {k: torch.cat([params[k], environment[k]]) for k in params}
        assert_same_gaussians(load_sog_lod(folder, level), expected)
    assert_same_gaussians(load_gaussian_file(folder), {k: torch.cat([levels[0][k], environment[k]]) for k in environment})


def test_a_splat_transform_bundle_opens_in_the_viewer(splat_transform_bundle):
    folder, levels, environment = splat_transform_bundle
    model = load_view_model(folder / "lod-meta.json")
    assert len(model.system.gaussians) == len(levels[0]["means"]) + len(environment["means"])


def test_lift3d_reads_its_own_sog_lod_in_export_view_and_render(tmp_path, capsys):
    from lift3d.cli import main
    from lift3d.gaussians.formats.ply import load_ply
    from lift3d.viewer.path import CameraPath, Keyframe, save_camera_path

    params = random_params(400, degree=1, seed=7)
    save_ply(tmp_path / "model.ply", params)
    assert main(["export", str(tmp_path / "model.ply"), "--format", "sog-lod", "system.export.lod_levels=2"]) == 0
    (meta,) = tmp_path.glob("*-lod/lod-meta.json")
    bundle = meta.parent
    # the lod-meta.json and its folder convert as any Gaussian file: the finest level, beside the folder
    for source in (meta, bundle):
        capsys.readouterr()
        assert main(["export", str(source), "--format", "3dgs-ply"]) == 0, capsys.readouterr().err
    (converted,) = tmp_path.glob(f"{bundle.name}-gaussians.ply")
    assert_same_gaussians(load_ply(converted), params)
    # one level of it, as the unbundled SOG it is: the coarser level
    assert main(["export", str(bundle / "1_0" / "meta.json"), "--format", "3dgs-ply"]) == 0
    assert len(load_ply(bundle / "1_0-gaussians.ply")["means"]) == 200
    # the viewer and lift3d render take the folder
    assert len(load_view_model(bundle).system.gaussians) == 400
    c2w = look_at(torch.tensor([6.0, 0, 2]), torch.zeros(3), torch.tensor([0.0, 0, 1])).tolist()
    path = save_camera_path(tmp_path / "path.json", CameraPath([Keyframe(c2w, 50.0)], frames=1, width=16, height=16))
    out = tmp_path / "bundle.gif"
    assert main(["render", str(bundle), "--path", str(path), "--out", str(out), "--device", "cpu"]) == 0
    assert out.is_file()


def test_a_damaged_bundle_is_one_line(tmp_path, capsys):
    from lift3d.cli import main

    path = save_sog_lod(tmp_path / "model-lod", random_params(50, degree=0, seed=8), levels=2)
    (tmp_path / "model-lod" / "0_0" / "means_l.webp").unlink()
    assert main(["export", str(path.parent), "--format", "3dgs-ply"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "means_l.webp" in err and "internal error" not in err, err
    path.write_text("{\"version\": 1}")
    assert main(["view", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lodLevels" in err, err
