"""The VGGT benchmarks run end to end in their --tiny CPU modes: the speed benchmark's forward and poses cases, and
the oracle benchmark's learned-poses case (an oracle twin of VGGT posing the sample toy, then training with pose
refinement from the dense start)."""

from __future__ import annotations

import math

from benchmarks.records import json_lines
from benchmarks.suite import vggt_oracle, vggt_speed


def test_speed_benchmark_times_the_forward_pass_and_the_poses_command(tmp_path, capsys):
    assert vggt_speed.main(["--tiny", "--work", str(tmp_path)]) == 0
    records = json_lines(capsys.readouterr().out)
    forward = [r for r in records if r.get("case") == "forward"]
    assert [r["frames"] for r in forward] == [2, 3] and all(r["median_ms"] > 0 for r in forward)
    (poses,) = [r for r in records if r.get("case") == "poses"]
    assert poses["method"] == "vggt" and poses["exit"] == 0 and poses["registered"] == 3 and poses["points"] > 0
    assert poses["wall_s"] > 0


def test_oracle_benchmark_trains_from_learned_poses_with_refinement(tmp_path, capsys):
    args = ["--tiny", "--cases", "learned", "--steps", "4", "--views", "9", "--work", str(tmp_path)]
    assert vggt_oracle.main(args) == 0
    records = json_lines(capsys.readouterr().out)
    learned, summary = records
    assert learned["case"] == "learned" and learned["pose_refinement"] == "True"  # the record beside the model said so
    assert learned["registered"] == 9 and 0.5 < learned["rotation_err_deg"] < 5  # the stated noise, measured back
    assert math.isfinite(learned["psnr"]) and learned["val_views"] == 2
    assert summary["case"] == "summary" and summary["psnr"] == {"learned": learned["psnr"]}
    assert vggt_oracle.main(["--tiny", "--cases", "nope"]) == 1
