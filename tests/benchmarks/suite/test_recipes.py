"""``python -m benchmarks recipes --tiny`` runs every case on the CPU, so the GPU benchmark cannot rot."""

from __future__ import annotations

import pytest

from benchmarks.records import json_lines
from benchmarks.suite import recipes as bench


def test_tiny_benchmark_measures_every_case(capsys):
    assert bench.main(["--tiny"]) == 0
    lines = json_lines(capsys.readouterr().out)
    cases = {r["case"]: r for r in lines if "steps_per_s" in r}
    assert set(cases) == set(bench.DEFAULT_CASES) and set(bench.DEFAULT_CASES) <= set(bench.CASES)
    for record in cases.values():
        assert record["timed_steps"] == 3 and record["steps_per_s"] > 0
        assert record["projected_full_run_s"] == pytest.approx(record["full_run_steps"] / record["steps_per_s"], rel=1e-2)
    assert cases["dreamfusion"]["full_run_steps"] == 10000  # the recipe's trainer.max_steps
    for name in ("dreamfusion-if", "dreamfusion-if-eager"):  # IF stage I: the T5 embeddings come from the disk cache
        assert cases[name]["full_run_steps"] == 10000 and cases[name]["text_encoder_calls"] == 0
    assert cases["gaussian-sds"]["full_run_steps"] == 1500 and cases["gaussian-sds"]["batch"] == 4
    assert cases["prolificdreamer-64"]["full_run_steps"] + cases["prolificdreamer-512"]["full_run_steps"] == 25000
    total = next(r for r in lines if r.get("case") == "prolificdreamer-stage1-total")
    assert total["projected_full_run_s"] == pytest.approx(
        cases["prolificdreamer-64"]["projected_full_run_s"] + cases["prolificdreamer-512"]["projected_full_run_s"], abs=0.2)
    assert lines[-1]["failed"] == 0 and lines[-1]["cases_run"] == len(bench.DEFAULT_CASES)


def test_budget_and_case_filter(capsys):
    assert bench.main(["--tiny", "--budget-s", "0", "--cases", "gaussian-sds"]) == 0
    lines = json_lines(capsys.readouterr().out)
    assert [r["case"] for r in lines if "case" in r] == ["gaussian-sds"] and "skipped" in lines[0]
    assert bench.main(["--tiny", "--cases", "nope"]) == 1
    assert "unknown case" in json_lines(capsys.readouterr().out)[0]["error"]


def test_profiled_steps_name_each_sync_with_its_callers():
    """The sync hook counts sync warnings by their call chain (innermost first) and ignores other warnings."""
    import warnings

    from benchmarks.profiling import ProfiledSteps

    profiled = ProfiledSteps()

    def sync_site() -> None:
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)

    def caller() -> None:
        sync_site()

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = profiled._record_sync
        for _ in range(2):
            caller()
        warnings.warn("something else", UserWarning, stacklevel=1)
    (site, count), = profiled.syncs.items()
    first, second = site.split(" < ")[:2]
    assert count == 2 and first.startswith("test_recipes.py:") and second.startswith("test_recipes.py:")
    assert int(first.split(":")[1]) < int(second.split(":")[1])  # sync_site's line, then caller's
