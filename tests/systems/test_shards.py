"""Gaussians sharded over ranks (lift3d.systems.shards, shard_rows; render.splats.distributed), the CPU twin of gsplat's
distributed rasterization: two gloo processes each holding half the Gaussians and rendering one view render what one
process with every Gaussian renders, with the same gradients and statistics, and densify to the same Gaussians."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.gaussians.model import PARAMETER_NAMES, GaussianModel
from lift3d.gaussians.ops import remove
from lift3d.gaussians.strategies import DefaultStrategy
from lift3d.registry import find
from lift3d.systems.shard_rows import gather_checkpoint, keep_shard, rebalance, shard_range, slice_checkpoint, transfers

DENSIFY = {"refine_start": 0, "refine_every": 1, "reset_every": 0, "grow_grad2d": 0.002, "grow_scale3d": 0.05}
N = 61  # odd: the shards differ by one


def _scene() -> tuple[GaussianModel, Cameras, torch.Tensor]:
    """61 Gaussians of SH degree 1, two cameras 90 degrees apart (16x16) and a target image per camera."""
    model = GaussianModel({"sh_degree": 1})
    g = torch.Generator().manual_seed(3)
    model.initialize(torch.randn(N, 3, generator=g) * 0.9, torch.rand(N, 3, generator=g), g)
    with torch.no_grad():
        model.log_scales.copy_(torch.log(torch.rand(N, 3, generator=g) * 0.08 + 0.01))
        model.opacity_logits.copy_(torch.randn(N, generator=g))
        model.shN.copy_(torch.randn(N, 3, 3, generator=g) * 0.2)
        model.quats.copy_(torch.randn(N, 4, generator=g))
    cameras = Cameras(orbit_c2w(2, 20.0, 3.0, start_azimuth_deg=10.0), intrinsics_from_fovy(torch.full((2,), 0.6), 16, 16),
                      16, 16)
    return model, cameras, torch.rand(2, 16, 16, 3, generator=g)


def _render(model: GaussianModel, cameras: Cameras, distributed: bool) -> dict[str, torch.Tensor]:
    renderer = find("splat-rasterizer")({"tile_size": 4, "backend": "torch"})
    renderer.distributed = distributed
    return renderer(model, cameras, torch.ones(len(cameras), 3), 1)


def _one_process() -> dict:
    """The reference: every Gaussian, both views in one batch, the loss their mean."""
    model, cameras, targets = _scene()
    out = _render(model, cameras, False)
    (out["rgb"] - targets).abs().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    strategy = DefaultStrategy(DENSIFY)
    strategy.update(out)
    stats = (strategy.grad2d.clone(), strategy.count.clone())
    report = strategy.step(model, None, 1, extent=1.0)
    return {"rgb": out["rgb"].detach(), "grads": grads, "stats": stats, "report": report,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _rank(rank: int, rendezvous: str, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        torch.manual_seed(100 + rank)  # the ranks' own generators differ, as in a run
        model, cameras, targets = _scene()
        start, stop = keep_shard(model, rank, 2)
        out = _render(model, cameras[rank : rank + 1], True)
        # each rank's loss is the mean over its own view: the sums over both ranks, halved, are the mean over both
        (out["rgb"] - targets[rank : rank + 1]).abs().mean().backward()
        grads = {name: p.grad / 2 for name, p in model.named_parameters()}
        strategy = DefaultStrategy(DENSIFY)
        strategy.sharded = True
        strategy.update(out)
        stats = (strategy.grad2d.clone(), strategy.count.clone())
        report = strategy.step(model, None, 1, extent=1.0)
        densified = {n: p.detach().clone() for n, p in model.named_parameters()}
        # a checkpoint of the whole model from the shards, with Adam's moments, then the shards evened out
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for p in model.parameters():
            p.grad = torch.full_like(p, float(rank + 1))
        optimizer.step()
        stepped = model.means.detach().clone()
        checkpoint = {"state_dict": {f"gaussians.{n}": p.detach() for n, p in model.named_parameters()},
                      "optimizer_states": [optimizer.state_dict()]}
        statistics = {"grad2d": torch.arange(len(model), dtype=torch.float32) + 1000 * rank, "count": None}
        gather_checkpoint(checkpoint, model, optimizer, statistics=statistics)
        if rank == 0:  # rank 0 prunes 20 of its Gaussians: the shards are uneven
            remove(model, optimizer, torch.arange(len(model)) < 20)
        before = len(model)
        held = torch.cat([model.means.detach(), optimizer.state[model.means]["exp_avg"]], dim=1)
        moved, _ = rebalance(model, optimizer)
        record = {"range": torch.tensor([start, stop]), "rgb": out["rgb"].detach(), "grads": grads, "stats": stats,
                  "report": torch.tensor([report["cloned"], report["split"], report["pruned"]]), "params": densified,
                  "means2d_shape": torch.tensor(out["means2d"].shape), "moved": torch.tensor([before, moved, len(model)]),
                  "stepped": stepped,
                  "held": held.clone(),
                  "now": torch.cat([model.means.detach(), optimizer.state[model.means]["exp_avg"]], dim=1)}
        if rank == 0:
            record["checkpoint"] = checkpoint
            record["statistics"] = statistics
        torch.save(record, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path: Path) -> list[dict]:
    torch.set_num_threads(1)
    ranks = mp.start_processes(_rank, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, start_method="spawn",
                               join=False)
    deadline = time.monotonic() + 240
    while not ranks.join(timeout=5):  # raises if a rank failed
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("the two ranks did not finish in 240 s")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def _rows(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every Gaussian as one row of its parameters, sorted (the same Gaussians in any order give the same rows)."""
    rows = torch.cat([params[name].reshape(len(params["means"]), -1) for name in PARAMETER_NAMES], dim=1)
    return rows[torch.argsort(rows[:, 0] * 1e4 + rows[:, 1] * 1e2 + rows[:, 2])]


def test_two_shards_render_grade_and_densify_like_one_process_with_every_gaussian(tmp_path):
    ranks, single = _run_ranks(tmp_path), _one_process()
    assert [r["range"].tolist() for r in ranks] == [[0, 31], [31, 61]]
    for r, record in enumerate(ranks):
        start, stop = record["range"].tolist()
        assert record["means2d_shape"].tolist() == [2, stop - start, 2]  # its Gaussians in both ranks' views
        assert torch.allclose(record["rgb"][0], single["rgb"][r], atol=1e-5)  # its view, from both shards
        for name, grad in record["grads"].items():
            assert torch.allclose(grad, single["grads"][name][start:stop], atol=1e-6, rtol=1e-4), name
        assert torch.allclose(record["stats"][0], single["stats"][0][start:stop], rtol=1e-4, atol=1e-9)
        assert torch.equal(record["stats"][1], single["stats"][1][start:stop])
    report = single["report"]
    assert (ranks[0]["report"] + ranks[1]["report"]).tolist() == [report["cloned"], report["split"], report["pruned"]]
    assert report["cloned"] > 0 and report["split"] > 0 and single["stats"][1].max() == 2
    shards = {name: torch.cat([r["params"][name] for r in ranks]) for name in PARAMETER_NAMES}
    assert torch.allclose(_rows(shards), _rows(single["params"]), atol=1e-5)  # the same Gaussians, splits included
    # the checkpoint holds the whole model: the shards in rank order, Adam's moments alike, the statistics too
    checkpoint, (before0, moved, after0), (before1, _, after1) = ranks[0]["checkpoint"], *[r["moved"].tolist() for r in ranks]
    whole = checkpoint["state_dict"]["gaussians.means"]
    shard0 = len(ranks[0]["stepped"])
    assert torch.equal(whole, torch.cat([r["stepped"] for r in ranks])) and shard0 == before1 == len(whole) // 2
    states = checkpoint["optimizer_states"][0]["state"].values()
    moments = next(s["exp_avg"] for s in states if s["exp_avg"].shape == whole.shape)
    assert torch.allclose(moments[:shard0], torch.tensor(0.1)) and torch.allclose(moments[shard0:], torch.tensor(0.2))
    assert ranks[0]["statistics"]["grad2d"][shard0:].min() >= 1000 and ranks[0]["statistics"]["count"] is None
    # evened out: the rows moved with their moments, no Gaussian lost
    assert before0 == before1 - 20 and abs(after0 - after1) <= 1 and moved == after0 - before0 == 10
    held, now = (torch.cat([r[key] for r in ranks]) for key in ("held", "now"))
    assert torch.equal(_rows_of(now), _rows_of(held))  # each Gaussian kept its own moments
    assert torch.equal(ranks[0]["now"][:before0], ranks[0]["held"])  # the receiver keeps its rows first
    # resumed on three ranks: each takes its slice of the whole model and of every per-Gaussian state
    for index in range(3):
        copy = {"state_dict": dict(checkpoint["state_dict"]),
                "optimizer_states": [{"state": {k: dict(v) for k, v in checkpoint["optimizer_states"][0]["state"].items()},
                                      "param_groups": checkpoint["optimizer_states"][0]["param_groups"]}]}
        assert slice_checkpoint(copy, index, 3) == len(whole)
        start, stop = shard_range(len(whole), index, 3)
        assert torch.equal(copy["state_dict"]["gaussians.means"], whole[start:stop])
        assert all(len(s["exp_avg"]) == stop - start for s in copy["optimizer_states"][0]["state"].values())


def _rows_of(rows: torch.Tensor) -> torch.Tensor:
    """Rows sorted by their first three columns (a Gaussian's center)."""
    return rows[torch.argsort(rows[:, 0] * 1e4 + rows[:, 1] * 1e2 + rows[:, 2])]


def test_shards_are_even_and_surpluses_go_to_the_deficits_in_rank_order():
    assert [shard_range(10, r, 3) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert transfers([10, 2, 3]) == [[0, 3, 2], [0, 0, 0], [0, 0, 0]]
    assert transfers([1, 9, 2, 8]) == [[0, 0, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0], [0, 0, 3, 0]]
