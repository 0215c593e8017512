"""reconstruct-gaussians trained with its Gaussians sharded over two gloo processes (system.shard_gaussians=true) against
the replicated two-process run: the same densification decisions while the split draws fall on the same Gaussians, the
same held-out PSNR, validation during and after training, a checkpoint of the whole model, a resume that slices it,
and a refused combination in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lift3d.runs.run_dirs import RUN_DIR_ENV
from tests.conftest import TEST_CONFIGS

REPO = TEST_CONFIGS.parents[1]
SAMPLE_SCENE = REPO / "lift3d" / "assets" / "sample_scene"
CONFIG = "reconstruct-gaussians-ddp.yaml"


def _train(tmp_path: Path, label: str, *extra: str) -> tuple[list[dict], Path, subprocess.CompletedProcess]:
    """Run the DDP test recipe on two CPU processes; every rank's dump, the run folder and the process."""
    out, dump = tmp_path / f"out-{label}", tmp_path / f"dump-{label}"
    command = [sys.executable, "-m", "lift3d", "train", str(TEST_CONFIGS / CONFIG), "trainer.accelerator=cpu",
               "trainer.devices=2", f"output_root={out}", f"system.dump_dir={dump}", f"data.root={SAMPLE_SCENE}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", RUN_DIR_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])  # this tree's lift3d
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=400, env={**env, "OMP_NUM_THREADS": "1"})
    records = [torch.load(dump / f"rank{r}.pt", weights_only=True) for r in range(2)] if done.returncode == 0 else []
    return records, out / CONFIG.removesuffix(".yaml") / "run", done


def _summed_events(records: list[dict]) -> torch.Tensor:
    """[step, cloned, split, pruned, reset] of every refine step, summed over the shards."""
    steps = records[0]["events"][:, :1]
    assert all(torch.equal(r["events"][:, :1], steps) for r in records)  # every rank refines at the same steps
    return torch.cat([steps, sum(r["events"][:, 1:4] for r in records), records[0]["events"][:, 4:5]], dim=1)


def _sorted(means: torch.Tensor) -> torch.Tensor:
    return means[torch.argsort(means[:, 0] * 1e4 + means[:, 1] * 1e2 + means[:, 2])]


@pytest.mark.slow
def test_sharded_training_decides_as_the_replicated_run_and_checkpoints_the_whole_model(tmp_path):
    validated = "trainer.val_check_interval=25"  # at steps 25 and 50 (collective renders) and 60 (rank 0, after fit)
    sharded, run_dir, done = _train(tmp_path, "sharded", "system.shard_gaussians=true", "checkpoint.every_n_train_steps=25",
                                    validated)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharded over 2" in done.stderr
    replicated, replicated_dir, done = _train(tmp_path, "replicated", validated)
    assert done.returncode == 0, done.stderr[-3000:]
    scores, reference_scores = (json.loads((d / "save" / "metrics.json").read_text())["history"]
                                for d in (run_dir, replicated_dir))
    assert [s["step"] for s in scores] == [25, 50, 60] and all(s["views"] == 8 for s in scores)
    assert abs(scores[0]["psnr"] - reference_scores[0]["psnr"]) < 1e-3  # every view rendered from both shards
    shards = [len(r["params"]["means"]) for r in sharded]
    whole = len(replicated[0]["params"]["means"])
    assert shards[0] != whole and shards[1] != whole  # each rank held a shard, not a copy
    # the first two refine steps (growth, then growth and an opacity reset) decide exactly as the replicated run; later
    # splits draw their offsets in the shards' order of the Gaussians, so the runs part like two seeds
    events, reference = _summed_events(sharded), replicated[0]["events"][:, :5]
    assert torch.equal(events[:2], reference[:2]) and events[:2, 2].sum() > 0 and events[1, 4] == 1
    assert abs(sum(shards) - whole) < 0.15 * whole
    # the checkpoint holds the whole model and its Adam moments, written once by rank 0
    checkpoint = torch.load(run_dir / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)
    means = checkpoint["state_dict"]["gaussians.means"]
    held = torch.cat([r["params"]["means"] for r in sharded])
    assert len(means) == sum(shards) and torch.equal(_sorted(means), _sorted(held))  # every shard's Gaussians, once
    moments = [s["exp_avg"] for s in checkpoint["optimizer_states"][0]["state"].values() if s["exp_avg"].shape == means.shape]
    assert moments and torch.isfinite(moments[0]).all()
    # resumed from step 25 (sliced evenly over the two ranks, statistics included): the next refine step decides as the
    # uninterrupted sharded run did
    resumed, _, done = _train(tmp_path, "resumed", "system.shard_gaussians=true",
                              f"resume={run_dir / 'ckpts' / 'step0000025.ckpt'}")
    assert done.returncode == 0, done.stderr[-3000:]
    again = _summed_events(resumed)
    assert again[:, 0].tolist() == [30, 40, 50] and torch.equal(again[0], events[1])


def test_absolute_gradients_with_sharded_gaussians_are_refused_in_one_line_before_the_ranks_start(tmp_path):
    _, _, done = _train(tmp_path, "absgrad", "system.shard_gaussians=true", "system.densify.absgrad=true", "trainer.max_steps=2")
    assert done.returncode == 2, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("lift3d: error:")]
    assert len(said) == 1, done.stderr[-3000:]  # once
    assert "system.densify.absgrad" in said[0] and "system.shard_gaussians=false" in said[0]
    assert "Initializing distributed" not in done.stderr  # refused before the second process started
    assert "Traceback" not in done.stderr


class ViewerCallback:
    """Stands in for lift3d.viewer.training.ViewerCallback (found by its name: systems do not import the viewer)."""


def test_renders_by_one_rank_alone_are_refused_with_shards():
    from types import SimpleNamespace

    from lift3d.systems.shards import ShardedGaussians

    def run(absgrad: bool = False, callbacks: tuple = (), **extra: object) -> str | None:
        system = SimpleNamespace(densify=SimpleNamespace(needs_absgrad=absgrad), **extra)
        return ShardedGaussians.refused_with_shards(system, list(callbacks))

    assert run() is None
    assert "live viewer" in run(callbacks=(ViewerCallback(),))
    assert "lift3d edit" in run(edit_views=lambda step: None)
    assert "absgrad" in run(absgrad=True)
