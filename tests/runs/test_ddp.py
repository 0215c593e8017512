"""Multi-process training (DDP through Lightning, gloo on the CPU): per-rank views, shared gradients, one writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from lift3d.config import load_config
from lift3d.runs.run_dirs import RUN_DIR_ENV, shared_run_dir
from lift3d.runs.runner import build_trainer, throttle_sigterm_broadcast
from tests.conftest import TEST_CONFIGS


@pytest.mark.slow
def test_two_ranks_train_on_their_own_views_and_one_writes(tmp_path):
    out, probe = tmp_path / "out", tmp_path / "probe"
    command = [sys.executable, "-m", "lift3d", "train", str(TEST_CONFIGS / "fit-image-ddp.yaml"), "trainer.accelerator=cpu",
               "trainer.devices=2", f"output_root={out}", f"system.probe_dir={probe}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", RUN_DIR_ENV)}
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and ranks[0]["pid"] != ranks[1]["pid"]
    # both ranks trained every step, each on its own views (the step sampler's seed includes the rank)
    assert [[s["step"] for s in r["seen"]] for r in ranks] == [list(range(12))] * 2
    assert all(a["view"] != b["view"] for a, b in zip(ranks[0]["seen"], ranks[1]["seen"]))
    # different views and dropout masks per rank, yet identical weights: the gradients were all-reduced
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"] and ranks[0]["param_abs_sum"] == ranks[1]["param_abs_sum"]
    # one run folder (rank 1 used rank 0's, whatever its clock said), written by rank 0 only
    runs = list((out / "fit-image-ddp").iterdir())
    assert len(runs) == 1
    run_dir = runs[0]
    assert ranks[1]["written"] == []
    assert sorted(ranks[0]["written"]) == sorted(f"it{s}-val/{i:04d}.png" for s in (6, 12) for i in range(3))
    assert json.loads((run_dir / "progress.json").read_text())["status"] == "finished"
    assert sorted(p.name for p in (run_dir / "ckpts").iterdir()) == ["last.ckpt", "step0000006.ckpt", "step0000012.ckpt"]
    assert sorted(p.name for p in (run_dir / "save").iterdir()) == ["it12-test", "it12-test.mp4", "it12-val", "it6-val"]


@pytest.mark.slow
def test_two_ranks_finish_cleanly_without_ffmpeg_when_the_test_video_is_a_gif(tmp_path):
    """CPU twin of tests/runs/test_ddp_gpu.py's NCCL run on a machine without imageio-ffmpeg (hidden here through a
    sitecustomize that every rank loads): with the probe's test video as a GIF the run exits 0 (an .mp4 would end it
    "trained, with problems", exit code 3)."""
    hide = tmp_path / "no_ffmpeg"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['imageio_ffmpeg'] = None\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", RUN_DIR_ENV)}
    paths = [str(hide), str(TEST_CONFIGS.parents[1]), *filter(None, [env.get("PYTHONPATH")])]
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(paths))
    probe = subprocess.run([sys.executable, "-c", "from lift3d.aftercare import require_ffmpeg; require_ffmpeg()"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode != 0 and "imageio-ffmpeg" in probe.stderr  # the writer is missing in these processes
    out = tmp_path / "out"
    command = [sys.executable, "-m", "lift3d", "train", str(TEST_CONFIGS / "fit-image-ddp.yaml"), "trainer.accelerator=cpu",
               "trainer.devices=2", f"output_root={out}", f"system.probe_dir={tmp_path / 'probe'}", "system.test_video=gif"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = list((out / "fit-image-ddp").iterdir())
    assert sorted(p.name for p in (run_dir / "save").iterdir()) == ["it12-test", "it12-test.gif", "it12-val", "it6-val"]


def test_multi_device_runs_use_ddp_and_no_distributed_sampler(tmp_path):
    cfg = load_config(TEST_CONFIGS / "fit-image.yaml", overrides=[f"output_root={tmp_path}", "trainer.accelerator=cpu"])
    trainer = build_trainer(cfg, tmp_path / "run_dir", train=True, devices=2)
    assert type(trainer.strategy).__name__ == "DDPStrategy" and trainer.strategy._ddp_kwargs.get("find_unused_parameters")
    assert trainer._accelerator_connector.use_distributed_sampler is False
    single = build_trainer(cfg, tmp_path / "run_dir", train=True, devices=1)
    assert type(single.strategy).__name__ == "SingleDeviceStrategy"


def test_ddp_runs_agree_on_sigterm_every_n_steps_not_every_step(tmp_path):
    """Lightning's per-step SIGTERM broadcast (a host sync) runs only on steps divisible by
    trainer.sigterm_check_every, the same steps on every rank; single-device trainers keep Lightning's loop."""
    cfg = load_config(TEST_CONFIGS / "fit-image.yaml", overrides=[f"output_root={tmp_path}", "trainer.accelerator=cpu",
                                                                    "trainer.sigterm_check_every=4"])
    trainer = build_trainer(cfg, tmp_path / "run_dir", train=True, devices=2)
    loop = trainer.fit_loop.epoch_loop
    assert "_broadcast_sigterm_tensor" in vars(loop)  # replaced on this loop only
    calls: list[int] = []

    def fake_trainer() -> SimpleNamespace:
        trainer = SimpleNamespace(global_step=0)
        loop = SimpleNamespace(_broadcast_sigterm_tensor=lambda: calls.append(trainer.global_step))
        trainer.fit_loop = SimpleNamespace(epoch_loop=loop)
        return trainer

    for every, expected in ((4, [0, 4, 8]), (0, []), (1, list(range(10)))):
        calls.clear()
        fake = fake_trainer()
        throttle_sigterm_broadcast(fake, every)
        for fake.global_step in range(10):
            fake.fit_loop.epoch_loop._broadcast_sigterm_tensor()
        assert calls == expected, every
    single = build_trainer(cfg, tmp_path / "run_dir", train=True, devices=1)
    assert "_broadcast_sigterm_tensor" not in vars(single.fit_loop.epoch_loop)


def test_only_other_ranks_take_the_shared_run_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "from-rank-0"))
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(key, raising=False)
    assert shared_run_dir() is None  # rank 0 (or a plain run) never reuses a previous run's folder
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert shared_run_dir() == tmp_path / "from-rank-0"



@pytest.mark.slow
def test_bench_ddp_compares_views_per_second_and_psnr_at_equal_views_seen():
    """Two views per rank: one process with two, one with four (the same batch as two ranks), two ranks with two;
    one JSON line with every run, the views/s ratios and the PSNR difference at equal views seen."""
    repo = TEST_CONFIGS.parents[1]
    command = [sys.executable, "-m", "benchmarks", "ddp", "--cpu", "--config", "lift3d/configs/reconstruct-gaussians-sample.yaml",
               "--steps", "4", "--warmup", "2", "--views-per-rank", "2", "--same-batch", "--psnr",
               f"data.root={repo / 'lift3d' / 'assets' / 'sample_scene'}", "data.max_side=32",
               "system.gaussians.init_points=300", "system.export.formats=[]"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=repo, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    one, same, two = record["runs"]
    assert [(r["world_size"], r["views_per_step_per_rank"]) for r in (one, same, two)] == [(1, 2), (1, 4), (2, 2)]
    assert one["steps"] == two["steps"] == 4 and same["views_seen"] == two["views_seen"] == 24 == 2 * one["views_seen"]
    assert two["views_per_s"] == pytest.approx(two["steps_per_s"] * 2 * 2, rel=0.01)
    assert all(r["val_step"] == 6 and 5.0 < r["val_psnr"] < 60.0 for r in (one, same, two))
    (row,) = record["comparisons"]
    assert row["views_per_s_ratio"] == pytest.approx(two["views_per_s"] / one["views_per_s"], rel=0.01)
    assert row["views_per_s_ratio_same_batch"] == pytest.approx(two["views_per_s"] / same["views_per_s"], rel=0.01)
    assert row["val_psnr_minus_same_batch_db"] == pytest.approx(two["val_psnr"] - same["val_psnr"], abs=0.002)
    assert abs(row["val_psnr_minus_same_batch_db"]) < 0.2  # the same four views a step, summed in another order


def test_bench_ddp_plans_the_same_batch_reference_and_compares_at_equal_views_seen():
    from benchmarks.suite.ddp import compare, planned_runs

    assert planned_runs(["0", "0,1"], False, 4, True, "both") == [("0", 4, False), ("0", 8, False), ("0,1", 4, False),
                                                                  ("0,1", 4, True)]
    assert planned_runs(["0", "0,1", "0,1,2,3"], False, 2, False, "off") == [("0", 2, False), ("0,1", 2, False),
                                                                            ("0,1,2,3", 2, False)]
    assert planned_runs(["1", "2"], True, 0, True, "on") == [("1", 0, False), ("2", 0, True)]  # the config's batch

    def run(world: int, views: int, per_s: float, psnr: float, graphed: bool = False) -> dict:
        return {"device_set": ",".join(map(str, range(world))), "world_size": world, "views_per_step_per_rank": views,
                "views_per_s": per_s, "views_seen": 3000 * views * world, "val_psnr": psnr, "ddp_cuda_graphs": graphed}

    rows = compare([run(1, 4, 1000.0, 30.0), run(1, 8, 1100.0, 30.5), run(2, 4, 1900.0, 30.4), run(2, 4, 2100.0, 30.2, True)])
    assert [(r["ddp_cuda_graphs"], r["views_per_s_ratio"], r["target_met"]) for r in rows] == [(False, 1.9, True),
                                                                                                (True, 2.1, True)]
    assert [r["views_per_s_ratio_same_batch"] for r in rows] == [round(1900 / 1100, 3), round(2100 / 1100, 3)]
    assert [(r["val_psnr_minus_same_batch_db"], r["psnr_within_0.2db"]) for r in rows] == [(-0.1, True), (-0.3, False)]
