"""The training progress display: steps of the run's total, rate, time left and losses; a status line in a terminal,
plain throttled lines when piped; a resumed run keeps its total; every run ends with its held-out scores."""

import io
import json
import os
import subprocess
import sys
from types import SimpleNamespace

from lift3d.runs import progress_bar
from lift3d.runs.progress_bar import AboveStatus, StatusLine, TrainingProgress, step_text
from lift3d.runs.runner import needs_final_validation
from tests.conftest import REPO


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fake_trainer(step: int = 0, max_steps: int = 100, **metrics) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=max_steps, progress_bar_metrics=dict(metrics), callback_metrics={},
                           sanity_checking=False, state=SimpleNamespace(fn="fit"), num_val_batches=[8],
                           num_sanity_val_batches=[0], num_test_batches=[4], is_global_zero=True)


def test_the_line_counts_steps_of_the_total_from_the_resumed_step():
    assert step_text(120, 1000, 0, 10.0, {"train/loss": 0.08678, "train/psnr": 24.1234}) == (
        "step 120/1000 (12%), 12 steps/s, 1 min 13 s left, loss 0.08678, psnr 24.12")
    # resumed at 900: 20 steps in 10 s, 80 steps left, at the rate of the steps this process ran
    assert step_text(920, 1000, 900, 10.0, {}) == "step 920/1000 (92%), 2 steps/s, 40 s left"
    assert step_text(900, 1000, 900, 0.0, {}) == "step 900/1000 (90%)"  # no rate before the first step
    assert step_text(5, 10, 0, 50.0, {}) == "step 5/10 (50%), 10 s/step, 50 s left"  # slow steps read as s/step


def test_piped_output_is_plain_throttled_lines_and_one_closing_line():
    out, clock = io.StringIO(), Clock()
    bar = TrainingProgress(every_s=10.0, stream=out, clock=clock)
    trainer = fake_trainer(0, 100)
    bar._trainer = trainer
    bar.on_train_start(trainer, None)
    for step in range(1, 101):
        clock.now += 0.5  # 2 steps/s: 50 s of training
        trainer.global_step = step
        trainer.progress_bar_metrics = {"train/loss": 1.0 / step}
        bar.on_train_batch_end(trainer, None, None, None, step - 1)
    bar.on_train_end(trainer, None)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert lines[0] == "lift3d: step 20/100 (20%), 2 steps/s, 40 s left, loss 0.05"
    assert len(lines) == 5 and all(line.startswith("lift3d: step ") for line in lines[:-1])  # one every 10 s
    assert lines[-1] == "lift3d: trained to step 100 in 50 s (2 steps/s); loss 0.01"


def test_a_resumed_run_keeps_its_total_and_says_where_it_started():
    out, clock = io.StringIO(), Clock()
    bar = TrainingProgress(every_s=1.0, stream=out, clock=clock)
    trainer = fake_trainer(600, 1000)
    bar.on_train_start(trainer, None)
    clock.now += 100.0
    trainer.global_step = 800
    bar.on_train_batch_end(trainer, None, None, None, 200)
    bar.on_train_end(trainer, None)
    lines = out.getvalue().splitlines()
    assert lines[0] == "lift3d: step 800/1000 (80%), 2 steps/s, 1 min 40 s left"
    assert lines[1] == "lift3d: trained to step 800 from step 600 in 1 min 40 s (2 steps/s)"


def test_in_a_terminal_other_output_goes_above_the_status_line(monkeypatch):
    terminal, clock = Terminal(), Clock()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("TERM", "xterm")
    bar = TrainingProgress(stream=terminal, clock=clock)
    trainer = fake_trainer(0, 10)
    bar._trainer = trainer
    bar.on_train_start(trainer, None)
    assert isinstance(sys.stderr, AboveStatus) and isinstance(sys.stdout, AboveStatus)
    clock.now += 1.0
    trainer.global_step = 1
    bar.on_train_batch_end(trainer, None, None, None, 0)
    print("lift3d: a log line")  # what the logging handler and print do while training
    trainer.callback_metrics = {"val/psnr": 31.789, "val/ssim": 0.97}
    bar.on_validation_end(trainer, None)
    bar.on_train_end(trainer, None)
    assert sys.stdout is terminal and sys.stderr is terminal  # the streams are given back
    text = terminal.getvalue()
    status = "[##------------------] step 1/10 (10%), 1 steps/s, 9 s left"
    assert text.startswith(f"\r{status}\x1b[K")
    # the log line: the status line erased first, drawn again after it; never glued onto it
    assert f"{status}\x1b[K\r\x1b[Klift3d: a log line\n\r{status}\x1b[K" in text
    assert "\r\x1b[Klift3d: step 1: held-out views: PSNR 31.79 dB, SSIM 0.9700\n" in text
    assert text.endswith("\r\x1b[Klift3d: trained to step 1 in 1 s (1 steps/s)\n")


def test_a_status_line_is_cut_to_the_terminal_width(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(progress_bar.shutil, "get_terminal_size", lambda fallback: os.terminal_size((30, 20)))
    StatusLine(terminal).show("x" * 100)
    assert terminal.getvalue() == "\r" + "x" * 29 + "\x1b[K"


def test_validation_is_owed_when_the_last_step_is_no_multiple_of_the_interval():
    assert needs_final_validation(1000, 100) and needs_final_validation(40, 60)
    assert not needs_final_validation(50, 100) and not needs_final_validation(0, 100)  # 0: validation is off
    assert not needs_final_validation(10, 0)


def test_a_short_piped_run_ends_with_its_scores_and_a_grid(tmp_path):
    """max_steps=6 with validation every 4 steps: validated at 4 and, once more, at the end; then resumed to 10 (the
    bar counts from 6 to 10). The output is plain lines with no tqdm escape codes and one closing line a stage."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    common = [f"output_root={tmp_path}", "tag=short", "use_timestamp=false", "trainer.val_check_interval=4",
              "trainer.run_test_after_fit=false", "system.export.formats=[]", "system.gaussians.init_points=300",
              "trainer.log_every_n_steps=1"]
    done = subprocess.run([sys.executable, "-m", "lift3d", "train", "reconstruct-gaussians-sample", "trainer.max_steps=6",
                           *common], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "\r" not in output and "\x1b" not in output and "Epoch" not in output, output
    assert output.count("lift3d: trained to step 6 in ") == 1, output
    assert "lift3d: step 4: held-out views: PSNR" in output and "lift3d: step 6: held-out views: PSNR" in output
    run = tmp_path / "reconstruct-gaussians-sample" / "short"
    assert (run / "save" / "it6-val" / "0000.png").is_file()
    assert json.loads((run / "save" / "metrics.json").read_text())["val"]["step"] == 6
    resumed = subprocess.run([sys.executable, "-m", "lift3d", "train", str(run / "configs" / "parsed.yaml"),
                              "--resume", str(run / "ckpts" / "last.ckpt"), "trainer.max_steps=10", *common],
                             capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "lift3d: trained to step 10 from step 6 in " in resumed.stderr, resumed.stderr
    assert "lift3d: step 10: held-out views: PSNR" in resumed.stderr
