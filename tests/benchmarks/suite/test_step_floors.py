"""``python -m benchmarks step_floors --tiny``: the hot paths run on the CPU, report floors consistently, keep the budget."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from benchmarks.floor import count_flops, floor_fields, matmul_rate
from benchmarks.records import json_lines
from tests.conftest import REPO


def test_flop_count_of_a_matmul_is_2mnk():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4


def test_floor_fields_divide_flops_by_rate():
    fields = floor_fields(2_000_000_000, "fp16", {"fp16": 1e12}, median_ms=10.0)
    assert fields == {"gflop": 2.0, "floor_ms": 2.0, "x_floor": 5.0}
    assert floor_fields(None, "fp16", {"fp16": 1e12}, 10.0)["floor_ms"] is None
    with pytest.raises(ValueError, match="precision"):
        matmul_rate("fp8", torch.device("cpu"), 8)


@pytest.mark.slow
def test_tiny_suite_runs_and_reports_floors(tmp_path):
    cases = "sds-eager,sds-compile-cudagraphs,raster-torch-fwdbwd,raster-gsplat-fwd,nerf-64-fwdbwd,recipes"
    out = tmp_path / "suite.txt"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "step_floors", "--tiny", "--cases", cases, "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["case"]: r for r in json_lines(done.stdout)}
    rates = records["matmul-rates"]["flop_per_s"]
    assert set(rates) == {"fp16", "bf16", "tf32", "fp32"} and all(v > 0 for v in rates.values())
    for name in ("sds-eager", "sds-compile-cudagraphs", "raster-torch-fwdbwd", "nerf-64-fwdbwd"):
        r = records[name]
        assert "error" not in r, r
        assert r["median_ms"] > 0 and r["gflop"] > 0
        # floor = FLOPs / the rate measured in this run, and x_floor = measured / floor
        assert r["floor_ms"] == pytest.approx(r["gflop"] * 1e9 / rates[r["precision"]] * 1e3, rel=0.02)
        assert r["x_floor"] == pytest.approx(r["median_ms"] / r["floor_ms"], rel=0.02)
    # the compiled case falls back to eager on the CPU and reuses the eager FLOP count
    assert records["sds-compile-cudagraphs"]["gflop"] == records["sds-eager"]["gflop"]
    assert records["sds-compile-cudagraphs"]["speedup"] > 0
    assert "skipped" in records["raster-gsplat-fwd"]
    recipes = [r for r in records.values() if r.get("group") == "recipes"]
    assert recipes and not any("error" in r for r in recipes)
    assert "sds_speedup" in records["summary"]
    assert any(line.startswith("case") and "x_floor" in line for line in done.stdout.splitlines())  # the table
    # every case but "recipes" (the recipe records stand for it), the recipe records, the summary
    assert out.read_text().count('"bench": "step_floors"') == len(cases.split(",")) - 1 + len(recipes) + 1


def test_budget_skips_cases_that_do_not_fit():
    cases = "sds-compile-cudagraphs,vsd-compile-cudagraphs"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "step_floors", "--tiny", "--cases", cases, "--budget-s", "0.5",
                           "--no-recipes"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    records = json_lines(done.stdout)
    skipped = [r for r in records if "budget" in str(r.get("skipped", ""))]
    assert {r["case"] for r in skipped} == {"sds-compile-cudagraphs", "vsd-compile-cudagraphs"}


def test_unknown_case_is_an_error():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "step_floors", "--cases", "nope"], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.returncode != 0 and "--list" in done.stderr
