"""Each run has a folder of its own (runs started together never share one) and ``ckpts/last.ckpt`` is always the
run's newest checkpoint, also after its folder was moved or it was resumed with other checkpoint settings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from lift3d.checkpoints import load_checkpoint
from lift3d.config import load_config
from lift3d.runs.run_dirs import make_run_dir
from lift3d.runs.runner import run_experiment
from tests.conftest import REPO, TEST_CONFIGS

FIT_IMAGE = TEST_CONFIGS / "fit-image.yaml"
QUIET = ["trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false", "trainer.val_check_interval=0"]


def _make_together(cfg, n: int) -> list[Path]:
    """``make_run_dir(cfg)`` from ``n`` threads released at the same moment."""
    made: list[Path] = []
    start = threading.Barrier(n)

    def make() -> None:
        start.wait()
        made.append(make_run_dir(cfg))

    threads = [threading.Thread(target=make) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made


def test_folders_made_at_the_same_moment_are_all_different(tmp_path):
    for stamped in ("true", "false"):
        cfg = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path / stamped}", "tag=same", f"use_timestamp={stamped}"])
        made = _make_together(cfg, 8)
        assert len(set(made)) == 8 and all(p.is_dir() for p in made)
        names = sorted(p.name for p in made)
        if stamped == "false":
            assert names == sorted(["same", *[f"same-{i}" for i in range(1, 8)]])
        else:
            assert all(re.fullmatch(r"same@\d{8}-\d{6}(-\d)?", name) for name in names), names


def test_two_training_runs_started_together_get_two_folders(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "lift3d", "train", str(FIT_IMAGE), f"output_root={tmp_path}", "tag=twin",
               "use_timestamp=false", "trainer.max_steps=5", "checkpoint.every_n_train_steps=0", *QUIET]
    runs = [subprocess.Popen([*command, f"seed={seed}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for seed in (1, 2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    folders = sorted(p.name for p in (tmp_path / "fit-image").iterdir())
    assert folders == ["twin", "twin-1"]
    seeds = set()
    for name in folders:
        ckpts = tmp_path / "fit-image" / name / "ckpts"
        assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt"]
        seeds.add(load_config(tmp_path / "fit-image" / name / "configs" / "parsed.yaml", allow_imports=True).seed)  # our own run
        assert load_checkpoint(ckpts / "last.ckpt")["global_step"] == 5
    assert seeds == {1, 2}  # each folder holds its own run's configs
    said = {line.split("writing to ")[1] for out, _ in outputs for line in out.splitlines() if "writing to" in line}
    assert said == {str(tmp_path / "fit-image" / name) for name in folders}


def test_a_moved_run_resumed_overwrites_last_ckpt(tmp_path):
    overrides = [f"output_root={tmp_path}", "tag=moved", "use_timestamp=false", *QUIET, "checkpoint.every_n_train_steps=10",
                 "trainer.max_steps=20"]
    first = run_experiment("train", load_config(FIT_IMAGE, overrides=overrides), [FIT_IMAGE], [])
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(first, moved)
    last = moved / "ckpts" / "last.ckpt"
    # resumed in its new place, with other checkpoint settings: Lightning's ModelCheckpoint would write last-v1.ckpt
    again = run_experiment("train", load_config(FIT_IMAGE, overrides=[*overrides, "trainer.max_steps=35",
                                                                      "checkpoint.every_n_train_steps=15", f"resume={last}"]),
                           [FIT_IMAGE], [])
    assert again == moved
    assert load_checkpoint(last)["global_step"] == 35
    assert sorted(p.name for p in (moved / "ckpts").iterdir()) == [
        "last.ckpt", "step0000010.ckpt", "step0000020.ckpt", "step0000030.ckpt"]
    # a copy resumed leaves the original alone and updates its own last.ckpt
    copy = tmp_path / "copy"
    shutil.copytree(moved, copy)
    run_experiment("train", load_config(FIT_IMAGE, overrides=[*overrides, "trainer.max_steps=40",
                                                              f"resume={copy / 'ckpts' / 'last.ckpt'}"]), [FIT_IMAGE], [])
    assert load_checkpoint(copy / "ckpts" / "last.ckpt")["global_step"] == 40
    assert load_checkpoint(last)["global_step"] == 35
    assert not [p.name for p in (copy / "ckpts").iterdir() if "-v" in p.name]


def test_a_new_run_that_fails_is_set_aside_with_its_error(tmp_path):
    """No checkpoint yet: the run moves to <output_root>/.failed/<name>/, out of the good runs' way, its error in
    progress.json. With a checkpoint it stays (``--resume`` continues it), marked failed, and finders of the newest
    run skip it."""
    import pytest

    from lift3d.commands.edit import newest_reconstruction
    from lift3d.progress import read_progress
    from lift3d.runs.run_dirs import current_location, is_failed
    from lift3d.systems.base import NonFiniteLossError

    early = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "tag=early", "system.nan_at_step=3", *QUIET])
    with pytest.raises(NonFiniteLossError):
        run_experiment("train", early, [FIT_IMAGE], [])
    assert not list((tmp_path / "fit-image").glob("early*"))
    [aside] = list((tmp_path / ".failed" / "fit-image").glob("early@*"))
    record = read_progress(aside)
    assert record["status"] == "failed" and "NonFiniteLossError" in record["error"] and record["run_dir"] == str(aside)
    assert (aside / "configs" / "parsed.yaml").is_file()
    assert current_location(tmp_path / "fit-image" / aside.name) == aside  # followers of the run find it set aside
    late = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "tag=late", "system.nan_at_step=25", *QUIET])
    with pytest.raises(NonFiniteLossError):
        run_experiment("train", late, [FIT_IMAGE], [])
    [kept] = list((tmp_path / "fit-image").glob("late@*"))
    assert (kept / "ckpts" / "step0000020.ckpt").is_file() and is_failed(kept)
    # a folder of runs: the failed one (newest, with a checkpoint) is never "the newest reconstruction"
    runs = tmp_path / "reconstruct-gaussians"
    for name, status in (("good@1", "finished"), ("bad@2", "failed")):
        (runs / name / "configs").mkdir(parents=True)
        (runs / name / "configs" / "parsed.yaml").write_text("system_type: reconstruct-gaussians\n")
        (runs / name / "ckpts").mkdir()
        (runs / name / "ckpts" / "last.ckpt").write_bytes(b"")
        (runs / name / "progress.json").write_text(f'{{"status": "{status}"}}\n')
    assert newest_reconstruction(runs) == runs / "good@1"


def test_a_stopped_run_is_not_failed(tmp_path):
    """Ctrl-C (KeyboardInterrupt) is no failure: the run keeps its folder and is not marked failed."""
    import pytest
    from lightning.pytorch.callbacks import Callback

    from lift3d.runs.run_dirs import is_failed

    class CtrlC(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 4:
                raise KeyboardInterrupt

    cfg = load_config(FIT_IMAGE, overrides=[f"output_root={tmp_path}", "tag=stopped", *QUIET])
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        run_experiment("train", cfg, [FIT_IMAGE], [], callbacks=lambda cfg, run_dir: [CtrlC()])
    [run] = list((tmp_path / "fit-image").glob("stopped@*"))
    assert not is_failed(run) and not (tmp_path / ".failed").exists()
