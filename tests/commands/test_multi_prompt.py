"""Prompt lists sharded across GPUs (``lift3d generate --prompts``): round-robin, one process per asset, isolation."""

from __future__ import annotations

import json
import sys

import pytest

from lift3d.commands import multi_prompt
from lift3d.commands.multi_prompt import generate_many, read_prompts, report_path, run_sharded, shard

FAKE = (  # stands in for `lift3d generate`: reports its run (named after its GPU) to --report, fails on "bad" prompts
    "import json, os, pathlib, sys, time; prompt = sys.argv[1]; report = sys.argv[sys.argv.index('--report') + 1]; "
    "time.sleep(0.3); gpu = os.environ.get('CUDA_VISIBLE_DEVICES', 'none'); "
    "pathlib.Path(report).write_text(json.dumps({'run_dir': 'run-' + prompt.replace(' ', '_') + '-gpu' + gpu})); "
    "sys.exit(3 if 'bad' in prompt else 0)"
)


def test_read_prompts_skips_blanks_and_comments(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("# my prompts\na hamburger\n\n  a corgi  \n#a skipped one\n")
    assert read_prompts(path) == ["a hamburger", "a corgi"]
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="one prompt per line"):
        read_prompts(tmp_path / "missing.txt")


def test_shard_is_round_robin_and_complete():
    assert shard(5, 2) == [[0, 2, 4], [1, 3]]
    assert shard(1, 3) == [[0], [], []]
    assert sorted(i for part in shard(17, 4) for i in part) == list(range(17))
    with pytest.raises(ValueError):
        shard(3, 0)


def test_each_gpu_runs_its_share_and_failures_stay_local(tmp_path):
    prompts = ["a cat", "a bad dog", "a cow", "an owl"]
    commands = [[sys.executable, "-c", FAKE, p, "--report", str(report_path(tmp_path / "logs", i))]
                for i, p in enumerate(prompts)]
    results = run_sharded(commands, ["0", "1"], tmp_path / "logs")
    assert [r["device"] for r in results] == ["0", "1", "0", "1"]
    # a failed asset reports no run folder, even when its process wrote one
    assert [r["run_dir"] for r in results] == ["run-a_cat-gpu0", None, "run-a_cow-gpu0", "run-an_owl-gpu1"]
    assert [r["status"] for r in results] == ["finished", "failed", "finished", "finished"]  # the failure did not stop GPU 1
    assert results[1]["returncode"] == 3 and (tmp_path / "logs" / "0001.log").exists()


def test_generate_many_writes_a_summary(tmp_path, monkeypatch):
    (tmp_path / "prompts.txt").write_text("a cat\na cow\n")
    seen = []

    def fake_command(prompt, method, overrides, on_gpu, report):
        seen.append((prompt, method, tuple(overrides), on_gpu))
        return [sys.executable, "-c", FAKE, prompt, "--report", str(report)]

    monkeypatch.setattr(multi_prompt, "generate_command", fake_command)
    summary, results = generate_many(tmp_path / "prompts.txt", "gaussian-sds", ["trainer.max_steps=10"], [2, 5],
                                     tmp_path / "out" / "summary.json")
    record = json.loads(summary.read_text())
    assert record["devices"] == ["2", "5"] and [r["prompt"] for r in record["results"]] == ["a cat", "a cow"]
    assert [r["run_dir"] for r in results] == ["run-a_cat-gpu2", "run-a_cow-gpu5"]
    steps = ("trainer.max_steps=10",)
    assert seen == [("a cat", "gaussian-sds", steps, True), ("a cow", "gaussian-sds", steps, True)]


def test_run_prompt_list_takes_overrides_from_the_prompt_slot(tmp_path, monkeypatch):
    from argparse import Namespace

    from lift3d.commands.multi_prompt import run_prompt_list

    calls = []
    monkeypatch.setattr(multi_prompt, "generate_many", lambda *a: calls.append(a) or (None, [{"returncode": 0}]))
    args = Namespace(prompt="trainer.max_steps=5", config=["seed=1"], method="dreamfusion", gpus="0,1", prompts="p.txt")
    assert run_prompt_list(args) == 0
    assert calls == [("p.txt", "dreamfusion", ["trainer.max_steps=5", "seed=1"], [0, 1])]
    with pytest.raises(ValueError, match="not both"):
        run_prompt_list(Namespace(prompt="a cat", config=[], method="dreamfusion", gpus=None, prompts="p.txt"))
    monkeypatch.setattr(multi_prompt, "generate_many", lambda *a: (None, [{"returncode": 0}, {"returncode": 1}]))
    assert run_prompt_list(Namespace(prompt=None, config=[], method="gaussian-sds", gpus=None, prompts="p.txt")) == 1
