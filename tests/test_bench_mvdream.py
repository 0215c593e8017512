"""The mvdream cases of benchmarks/bench_recipes.py run on the CPU with tiny MVDream-shaped models (so the GPU
benchmark cannot rot), and benchmarks/random_mvdream.py writes a folder the mvdream guidance loads."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tests.conftest import REPO
from tests.tiny_diffusion import one_thread  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_recipes", REPO / "benchmarks" / "bench_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_mvdream_cases_measure_both_stages_and_the_total(bench, capsys):
    assert bench.main(["--tiny", "--cases", "mvdream-64,mvdream-256"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    cases = {r["case"]: r for r in lines if "case" in r}
    assert cases["mvdream-64"]["batch"] == 8 and cases["mvdream-256"]["batch"] == 4  # objects x 4 views
    assert cases["mvdream-64"]["full_run_steps"] + cases["mvdream-256"]["full_run_steps"] == 10000
    total = cases["mvdream-total"]
    assert total["projected_full_run_s"] == pytest.approx(
        cases["mvdream-64"]["projected_full_run_s"] + cases["mvdream-256"]["projected_full_run_s"], abs=0.2)
    assert lines[-1]["failed"] == 0


def test_random_mvdream_folder_loads_as_an_mvdream_model(tmp_path):
    from benchmarks.random_mvdream import write_random_mvdream
    from lift3d.guidance.multiview import MultiViewAttnProcessor
    from lift3d.guidance.mvdream import load_mvdream

    folder = write_random_mvdream(tmp_path / "mvdream", tiny=True)
    models = load_mvdream(str(folder), torch.float32)
    assert models.unet.config.projection_class_embeddings_input_dim == 16
    assert any(isinstance(p, MultiViewAttnProcessor) for p in models.unet.attn_processors.values())
