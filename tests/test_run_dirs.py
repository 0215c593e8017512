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
