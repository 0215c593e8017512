"""The Lightning loop end to end with the test-only fit-image system: outputs, resume, checkpoints, NaN."""

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lift3d.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from lift3d.cli import main
from lift3d.config import load_config
from lift3d.runs.runner import run_experiment
from lift3d.systems.base import NonFiniteLossError
from tests.conftest import REPO, TEST_CONFIGS

FIT_IMAGE = TEST_CONFIGS / "fit-image.yaml"
QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false"]


def _losses(run_dir: Path, key: str = "train/loss_mse") -> dict[int, float]:
    with open(run_dir / "csv_logs" / "metrics.csv") as handle:
        return {int(row["step"]): float(row[key]) for row in csv.DictReader(handle) if row.get(key)}


def test_train_writes_the_run_layout(tmp_path):
    cfg = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "tag=layout", *QUIET])
    run_dir = run_experiment("train", cfg, [FIT_IMAGE], [])
    assert run_dir == tmp_path / "fit-image" / "layout"
    for path in ["ckpts/last.ckpt", "ckpts/step0000020.ckpt", "ckpts/step0000060.ckpt", "configs/parsed.yaml",
                 "configs/fit-image.yaml", "save/it30-val/0000.png", "save/it60-val/0001.png", "save/it60-test.mp4",
                 "save/it60-test/0003.png", "csv_logs/metrics.csv"]:
        assert (run_dir / path).is_file(), path
    assert any((run_dir / "tb_logs").iterdir())
    parsed = load_config(run_dir / "configs" / "parsed.yaml")
    assert parsed.system["resolution"] == 16
    checkpoint = load_checkpoint(run_dir / "ckpts" / "last.ckpt")  # weights_only=True loads every Lightning field
    assert checkpoint["global_step"] == 60
    losses = _losses(run_dir)
    assert losses[max(losses)] < losses[min(losses)] * 0.5  # the fit made progress


def test_resume_continues_the_identical_loss_trajectory(tmp_path):
    overrides = [f"output_root={tmp_path}", "trainer.log_every_n_steps=1", "trainer.run_test_after_fit=false", *QUIET]
    full = run_experiment("train", load_config(FIT_IMAGE, overrides=overrides + ["tag=full"]), [FIT_IMAGE], [])
    middle = tmp_path / "step40.ckpt"
    shutil.copyfile(full / "ckpts" / "step0000040.ckpt", middle)
    cfg = load_config(FIT_IMAGE, overrides=overrides + ["tag=resumed", f"resume={middle}"])
    resumed = run_experiment("train", cfg, [FIT_IMAGE], [])
    a, b = _losses(full), _losses(resumed)
    later = sorted(step for step in b if step >= 40)
    assert later and later[-1] == 59 and min(later) == 40
    for step in later:
        assert a[step] == pytest.approx(b[step], rel=1e-6, abs=1e-9), step
    final_a = load_checkpoint(full / "ckpts" / "last.ckpt")["state_dict"]
    final_b = load_checkpoint(resumed / "ckpts" / "last.ckpt")["state_dict"]
    for key in final_a:
        assert torch.allclose(final_a[key], final_b[key], atol=1e-6), key


def test_interrupted_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)

    def broken_save(obj, handle, *args, **kwargs):
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # Ctrl-C in the middle of serializing

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["global_step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp file left behind


def test_killed_writer_process_leaves_a_loadable_checkpoint(tmp_path):
    # a real process writing a large checkpoint over and over, killed with SIGKILL mid-write
    path = tmp_path / "last.ckpt"
    script = (
        "import sys, torch; sys.path.insert(0, %r)\n"
        "from lift3d.checkpoints import save_checkpoint\n"
        "step = 0\n"
        "while True:\n"
        "    step += 1\n"
        "    save_checkpoint({'w': torch.full((4_000_000,), float(step)), 'global_step': step}, %r)\n"
        "    print(step, flush=True)\n"
    ) % (str(REPO), str(path))
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        for _ in range(3):
            process.stdout.readline()  # a few complete writes
        time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    checkpoint = load_checkpoint(path)
    assert checkpoint["global_step"] >= 3
    assert torch.all(checkpoint["w"] == float(checkpoint["global_step"]))


class Payload:
    """Any class: unpickling it would run code chosen by whoever wrote the file."""


def test_unsafe_checkpoint_is_refused(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"payload": Payload()}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "cut.ckpt").write_bytes(path.read_bytes()[:40])
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "cut.ckpt")


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "system.nan_at_step=45", *QUIET])
    with pytest.raises(NonFiniteLossError, match="step 45.*mse.*last good checkpoint"):
        run_experiment("train", cfg, [FIT_IMAGE], [])
    run_dir = tmp_path / "fit-image" / "run"
    assert load_checkpoint(run_dir / "ckpts" / "last.ckpt")["global_step"] == 40
    assert not (run_dir / "ckpts" / "step0000060.ckpt").exists()


def test_nonfinite_loss_can_skip_the_step(tmp_path):
    cfg = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "system.nan_at_step=45", "system.nonfinite_loss=skip",
                                            *QUIET])
    run_dir = run_experiment("train", cfg, [FIT_IMAGE], [])
    checkpoint = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_cli_train_validate_test_and_errors(tmp_path, capsys):
    args = ["train", str(FIT_IMAGE), f"output_root={tmp_path}", "tag=cli", *QUIET, "trainer.max_steps=20"]
    assert main(args) == 0
    run_dir = tmp_path / "fit-image" / "cli"
    assert main(["validate", str(run_dir / "configs" / "parsed.yaml"), "--resume", str(run_dir / "ckpts" / "last.ckpt")]) == 0
    assert (run_dir / "save" / "it20-val" / "0000.png").is_file()
    last = run_dir / "ckpts" / "last.ckpt"
    assert main(["test", str(FIT_IMAGE), "--resume", str(last), "trainer.enable_progress_bar=false"]) == 0
    assert (run_dir / "save" / "it20-test.mp4").is_file()
    capsys.readouterr()
    assert main(["train", str(FIT_IMAGE), "system.hiden=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'system.hiden'" in err and "system.hidden" in err
    assert main(["validate", str(FIT_IMAGE), "--resume", str(tmp_path / "nope.ckpt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_console_script_help_and_info():
    out = subprocess.run([sys.executable, "-m", "lift3d", "--help"], capture_output=True, text=True, check=True).stdout
    assert shutil.which("lift3d") or Path(sys.executable).with_name("lift3d").is_file()  # the console script is installed
    for command in ("train", "validate", "test", "export", "info"):
        assert command in out
    info = subprocess.run([sys.executable, "-m", "lift3d", "info"], capture_output=True, text=True, check=True).stdout
    assert "torch" in info and "gsplat rasterizer" in info and "CUDA" in info


def test_progress_file_follows_the_run(tmp_path):
    from lift3d.progress import read_progress

    cfg = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "tag=progress", *QUIET])
    run_dir = run_experiment("train", cfg, [FIT_IMAGE], [])
    record = read_progress(run_dir)
    assert record["status"] == "finished" and record["step"] == 60 and record["max_steps"] == 60
    assert record["latest_image"].endswith("it60-val/0001.png") or record["latest_image"].endswith("it60-val/0000.png")
    failed = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "tag=fails", "system.nan_at_step=5", *QUIET])
    with pytest.raises(NonFiniteLossError):
        run_experiment("train", failed, [FIT_IMAGE], [])
    [failed_run] = (tmp_path / ".failed" / "fit-image").glob("fails*")  # no checkpoint yet: set aside (test_run_dirs.py)
    record = read_progress(failed_run)
    assert record["status"] == "failed" and "NonFiniteLossError" in record["error"]
