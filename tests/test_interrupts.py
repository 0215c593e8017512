"""Ctrl-C and SIGTERM keep work: a real ``lift3d train`` process signalled mid-run writes a checkpoint of the step it
stopped at, exits 130 / 143 with one line naming it, records it in progress.json, and resuming from it ends with the
same parameters, bit for bit, as a run never interrupted. Time-based checkpoints refresh last.ckpt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lift3d.checkpoints
from lift3d.checkpoints import load_checkpoint
from lift3d.config import ConfigError, load_config
from lift3d.runs.runner import run_experiment
from tests.conftest import REPO, TEST_CONFIGS

FIT_IMAGE = TEST_CONFIGS / "fit-image.yaml"
STEPS = 1000
COMMON = ["trainer.enable_progress_bar=false", "use_timestamp=false", "trainer.run_test_after_fit=false",
          "trainer.val_check_interval=0", "checkpoint.every_n_train_steps=0", f"trainer.max_steps={STEPS}"]


def _state(checkpoint_path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint_path)["state_dict"]


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("full")
    cfg = load_config(FIT_IMAGE, overrides=[f"output_root={root}", "tag=full", *COMMON])
    run_dir = run_experiment("train", cfg, [FIT_IMAGE], [])
    return _state(run_dir / "ckpts" / "last.ckpt")


def _progress(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "progress.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_run_keeps_a_checkpoint_of_that_step_and_resumes_exactly(tmp_path, uninterrupted, signum, code):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "lift3d", "train", str(FIT_IMAGE), f"output_root={tmp_path}", "tag=cut",
                                *COMMON], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    run_dir = tmp_path / "fit-image" / "cut"
    try:
        deadline = time.monotonic() + 120
        while _progress(run_dir).get("step", 0) < 20:  # training is under way (progress.json: about once a second)
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signum)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, err
    record = _progress(run_dir)
    step = record["checkpoint_step"]
    assert record["status"] == "interrupted" and record["signal"] == signum.name and 20 <= step < STEPS
    checkpoint = Path(record["checkpoint"])
    assert checkpoint == run_dir / "ckpts" / "last.ckpt"
    assert load_checkpoint(checkpoint)["global_step"] == step
    lines = [line for line in err.splitlines() if line.startswith("lift3d:") and "writing to" not in line]
    assert lines == [f"lift3d: interrupted by {signum.name}; checkpoint at step {step} kept in {checkpoint} "
                     f"(continue: lift3d train {run_dir / 'configs' / 'parsed.yaml'} --resume {checkpoint})"], err
    assert "Traceback" not in err
    resumed = run_experiment("train", load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", f"resume={checkpoint}",
                                                                      *COMMON]), [FIT_IMAGE], [])
    assert resumed == run_dir  # a resumed run continues in its checkpoint's folder
    assert load_checkpoint(checkpoint)["global_step"] == STEPS
    _assert_same(_state(checkpoint), uninterrupted)
    assert _progress(run_dir)["status"] == "finished"


def test_time_interval_refreshes_last_ckpt_during_training(tmp_path, monkeypatch):
    written: list[int] = []
    save = lift3d.checkpoints.save_checkpoint

    def spy(checkpoint, path):
        written.append(int(checkpoint["global_step"]))
        save(checkpoint, path)

    monkeypatch.setattr(lift3d.checkpoints, "save_checkpoint", spy)
    # 6 ms: a checkpoint every few steps; without the interval only the end is written
    overrides = [f"output_root={tmp_path}", *COMMON, "trainer.max_steps=60", "checkpoint.every_n_minutes=0.0001"]
    run_dir = run_experiment("train", load_config(FIT_IMAGE, overrides=overrides), [FIT_IMAGE], [])
    assert len([step for step in written if step < 60]) >= 2, written
    assert written[-1] == 60 and load_checkpoint(run_dir / "ckpts" / "last.ckpt")["global_step"] == 60
    assert sorted(p.name for p in (run_dir / "ckpts").iterdir()) == ["last.ckpt"]
    with pytest.raises(ConfigError, match="every_n_minutes"):
        run_experiment("train", load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", *COMMON, "tag=bad",
                                                                 "checkpoint.every_n_minutes=-1"]), [FIT_IMAGE], [])


@pytest.mark.slow
def test_sigterm_to_rank_zero_stops_every_ddp_rank_at_one_step(tmp_path):
    """`timeout` and `docker stop` signal only the main process: the ranks agree on stopping (every
    trainer.sigterm_check_every steps), stop at the same step, and rank 0 writes the one checkpoint."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LIFT3D_RUN_DIR")}
    process = subprocess.Popen([sys.executable, "-m", "lift3d", "train", str(FIT_IMAGE), "trainer.accelerator=cpu",
                                "trainer.devices=2", f"output_root={tmp_path}", "tag=ddp", "trainer.sigterm_check_every=4",
                                *COMMON, "trainer.max_steps=100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    run_dir = tmp_path / "fit-image" / "ddp"
    try:
        deadline = time.monotonic() + 240
        while _progress(run_dir).get("step", 0) < 10:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, err
    record = _progress(run_dir)
    assert record["status"] == "interrupted" and record["checkpoint_step"] % 4 == 0
    assert load_checkpoint(run_dir / "ckpts" / "last.ckpt")["global_step"] == record["checkpoint_step"]
    assert len([line for line in err.splitlines() if line.startswith("lift3d: interrupted")]) == 1, err
    assert sorted(p.name for p in (run_dir / "ckpts").iterdir()) == ["last.ckpt"]


def test_a_second_ctrl_c_stops_mid_step_and_names_the_newest_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "lift3d", "train", str(TEST_CONFIGS / "app-mesh.yaml"),
                                f"output_root={tmp_path}", "tag=twice", *COMMON, "system.step_sleep_s=1.0",
                                "checkpoint.every_n_train_steps=2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=tmp_path)
    run_dir = tmp_path / "app-mesh" / "twice"
    try:
        deadline = time.monotonic() + 120
        while _progress(run_dir).get("step", 0) < 3:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)  # the step takes a second: the first asks to stop after it ...
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)  # ... the second stops now
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    record = _progress(run_dir)
    kept = load_checkpoint(run_dir / "ckpts" / "last.ckpt")["global_step"]
    assert record["status"] == "interrupted" and record["checkpoint_step"] == kept and kept % 2 == 0
    assert kept <= record["step"] < STEPS
    lines = [line for line in err.splitlines() if line.startswith("lift3d: interrupted")]
    assert len(lines) == 1 and f"checkpoint at step {kept} kept in {run_dir / 'ckpts' / 'last.ckpt'}" in lines[0], err
