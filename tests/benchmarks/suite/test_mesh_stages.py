"""The mesh-stage benchmark runs end to end in its --tiny CPU mode and prints one JSON line per case."""

from __future__ import annotations

from benchmarks.records import json_lines
from benchmarks.suite import mesh_stages as bench
from tests.tiny_diffusion import one_thread  # noqa: F401  (autouse fixture)


def test_bench_mesh_stages_tiny_prints_one_record_per_case(capsys):
    cases = ["magic3d-refine", "prolificdreamer-texture", "texture-mesh-spot", "gaussian-sds-texture"]
    assert bench.main(["--tiny", "--steps", "2", "--warmup", "1", "--render-steps", "1", "--cases", ",".join(cases)]) == 0
    records = json_lines(capsys.readouterr().out)
    by_case = {r["case"]: r for r in records if "case" in r}
    assert list(by_case) == cases
    for record in by_case.values():
        assert "error" not in record, record
        assert record["steps"] == 2 and record["steps_per_s"] > 0 and record["median_ms"] > 0
        assert record["faces"] > 100 and record["resolution"] == 64
    assert by_case["prolificdreamer-texture"]["guidance"] == "vsd"
    assert by_case["magic3d-refine"]["grid_resolution"] == 16
    assert by_case["gaussian-sds-texture"]["convert_s"] > 0 and by_case["gaussian-sds-texture"]["gaussians"] == 2000
    assert records[-1]["summary"] is True
