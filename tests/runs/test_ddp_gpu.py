"""DDP on two GPUs through NCCL (run on nvidia-h200-x2: pytest -m gpu tests/runs/test_ddp_gpu.py). CPU twin: test_ddp.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import TEST_CONFIGS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


def test_gpus_0_1_trains_with_ddp_on_nccl(tmp_path):
    """Two ranks over NCCL: their own views, identical weights, one writer. The test video is a GIF (Pillow): the
    test does not depend on imageio-ffmpeg, which a GPU machine may lack (the run would end "trained, with problems",
    exit code 3, on the .mp4)."""
    command = [sys.executable, "-m", "lift3d", "train", str(TEST_CONFIGS / "fit-image-ddp.yaml"), "--gpus", "0,1",
               f"output_root={tmp_path / 'out'}", f"system.probe_dir={tmp_path / 'probe'}", "system.test_video=gif"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LIFT3D_RUN_DIR")}
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nccl" in (done.stdout + done.stderr)
    ranks = [json.loads((tmp_path / "probe" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert all(a["view"] != b["view"] for a, b in zip(ranks[0]["seen"], ranks[1]["seen"]))
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"] and ranks[1]["written"] == []
    runs = list((tmp_path / "out" / "fit-image-ddp").iterdir())
    assert len(runs) == 1
    assert sorted(p.name for p in (runs[0] / "save").iterdir()) == ["it12-test", "it12-test.gif", "it12-val", "it6-val"]


@pytest.mark.parametrize(("views", "graphs"), [(1, "0"), (2, "0"), (2, "1")], ids=["1view", "2views", "2views-graphed"])
def test_gpus_0_1_trains_gaussians_with_identical_replicas_on_nccl(tmp_path, views, graphs):
    """reconstruct-gaussians over NCCL (gsplat when installed) across densification and an opacity reset, with one or
    two views per step per rank, and with the captured step (render, loss, backward as a CUDA graph; Adam eager after
    the all-reduce) under LIFT3D_DDP_CUDA_GRAPHS=1: the ranks end with bit-identical Gaussians and Adam state (the
    CPU twins: tests/systems/test_ddp_gaussians.py, tests/systems/test_ddp_views.py)."""
    from lift3d.render.splats.gsplat_backend import gsplat_available
    from lift3d.systems.replicas import DDP_GRAPHS_ENV

    scene = TEST_CONFIGS.parents[1] / "lift3d" / "assets" / "sample_scene"
    command = [sys.executable, "-m", "lift3d", "train", str(TEST_CONFIGS / "reconstruct-gaussians-ddp.yaml"), "--gpus", "0,1",
               f"output_root={tmp_path / 'out'}", f"system.dump_dir={tmp_path / 'dump'}", f"data.root={scene}",
               "system.replica_check_every=1", f"data.batch_size={views}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LIFT3D_RUN_DIR")}
    env[DDP_GRAPHS_ENV] = graphs
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = (torch.load(tmp_path / "dump" / f"rank{r}.pt", map_location="cpu", weights_only=True) for r in (0, 1))
    assert a["world_size"] == b["world_size"] == 2 and a["events"][:, 4].sum() == 1 and a["events"][:, 1:3].sum() > 0
    assert torch.equal(a["events"], b["events"])
    assert all(torch.equal(p, b["params"][name]) for name, p in a["params"].items())
    assert all(torch.equal(v, b["optimizer"][n][k]) for n, state in a["optimizer"].items() for k, v in state.items())
    assert (a["captures"] > 0) == (b["captures"] > 0) == (graphs == "1" and gsplat_available())
