"""The image-to-3D benchmark's triposr-refine case (`lift3d generate --image --method triposr --refine`) runs end to
end in its --tiny CPU mode: a record per stage, the time until the refined .glb, and that time beside
dreamgaussian-image's in the same call."""

from __future__ import annotations

from benchmarks.records import json_lines
from benchmarks.suite import image_to_3d as bench
from tests.tiny_diffusion import one_thread  # noqa: F401  (autouse fixture)


def test_triposr_refine_time_to_glb_beside_dreamgaussian_image(tmp_path, capsys):
    args = ["--tiny", "--steps-cap", "1", "--cases", "dreamgaussian-image,triposr-refine", "--models", str(tmp_path)]
    assert bench.main(args) == 0
    records = json_lines(capsys.readouterr().out)
    assert records[0]["to_glb"] is True and records[0]["tiny"] is True
    stages = [r for r in records if r.get("case") == "triposr-refine" and "stage" in r]
    assert [r["stage"] for r in stages] == ["triposr", "triposr-refine"]
    assert [r["steps"] for r in stages] == [1, 1]  # the feed-forward stage is its one step; the refinement is capped
    for record in stages:
        for key in ("wall_s", "train_s", "steps_per_s", "peak_mem_gib", "glb_mb"):
            assert record[key] > 0, (key, record)
    (total,) = [r for r in records if r.get("case") == "triposr-refine" and "time_to_glb_s" in r]
    assert total["glb_written"] is True
    assert abs(total["time_to_glb_s"] - sum(r["wall_s"] for r in stages)) < 0.01
    compare = records[-1]
    assert compare["compare"] == "time_to_glb"
    assert compare["triposr-refine_s"] == total["time_to_glb_s"] and compare["dreamgaussian-image_s"] > 0
    assert compare["ratio_triposr_refine_to_dreamgaussian"] > 0


def test_tiny_refuses_cases_without_tiny_models(capsys):
    assert bench.main(["--tiny", "--cases", "magic123"]) == 1
    assert "magic123" in json_lines(capsys.readouterr().out)[0]["error"]
