"""The mvdream cases of the recipes benchmark run on the CPU with tiny MVDream-shaped models (so the GPU benchmark
cannot rot), and the random MVDream stand-in writes a folder the mvdream guidance loads."""

from __future__ import annotations

import pytest
import torch

from benchmarks.records import json_lines
from benchmarks.suite import recipes as bench
from tests.tiny_diffusion import one_thread  # noqa: F401  (fixture)


def test_tiny_mvdream_cases_measure_both_stages_and_the_total(capsys):
    assert bench.main(["--tiny", "--cases", "mvdream-64,mvdream-256"]) == 0
    lines = json_lines(capsys.readouterr().out)
    cases = {r["case"]: r for r in lines if "case" in r}
    assert cases["mvdream-64"]["batch"] == 8 and cases["mvdream-256"]["batch"] == 4  # objects x 4 views
    assert cases["mvdream-64"]["full_run_steps"] + cases["mvdream-256"]["full_run_steps"] == 10000
    for record in (cases["mvdream-64"], cases["mvdream-256"]):  # without --field-start: the blob, from step 0
        assert record["field_start"] == "fresh" and record["start_step"] == 0 and "pretrained" not in record["occupied_fraction"]
        assert 0 < record["occupied_fraction"]["timed_start"] <= 1 and record["rays_per_step"] == record["batch"] * 32 * 32
        assert record["samples_per_ray"]["first"] >= record["samples_per_ray"]["second"] > 0
        assert record["rays_over_budget"] == 0 and "over_budget" not in record["samples_per_ray"]  # no budgets on a CPU
        assert record["budget_per_ray"]["first"] >= record["samples_per_ray"]["first"]  # sized for the densest chunk
    total = cases["mvdream-total"]
    assert total["projected_full_run_s"] == pytest.approx(
        cases["mvdream-64"]["projected_full_run_s"] + cases["mvdream-256"]["projected_full_run_s"], abs=0.2)
    assert lines[-1]["failed"] == 0


def test_field_start_times_the_late_stage_from_a_pretrained_field(capsys):
    """--field-start analytic:N trains the case's field with the analytic multi-view prior first, then times the
    256 stage from that field and occupancy grid, its step counter resumed at the stage's first step (5000)."""
    assert bench.main(["--tiny", "--cases", "mvdream-256", "--field-start", "analytic:20"]) == 0
    lines = json_lines(capsys.readouterr().out)
    record = next(r for r in lines if r.get("case") == "mvdream-256")
    assert record["field_start"] == "analytic:20" and record["start_step"] == 5000 and record["field_start_s"] > 0
    assert record["timed_steps"] == 3 and record["warmup_steps"] == 1
    assert all(5001 < step <= 5004 for step, _ in record["slowest_steps_ms"])  # the steps of the late stage
    occupied = record["occupied_fraction"]
    assert 0 < occupied["pretrained"] < 1 and 0 < occupied["timed_start"] < 1  # empty space pruned, and handed over
    assert record["samples_per_ray"]["first"] > 0 and record["samples_per_step"]["first"] > 0
    assert lines[-1]["failed"] == 0


def test_the_pretrained_state_is_the_timed_systems_and_not_a_fresh_one():
    """The pretraining shares the timed case's field, renderer, background and optimizer config (radius 1, the
    recipe's), so its whole state loads strictly; a state of another shape is refused."""
    from benchmarks.stand_ins.field_start import load_pretrained, parse_field_start, pretrain, pretrain_config
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import build_parts

    args = bench.parse_args(["--tiny", "--cases", "mvdream-256", "--field-start", "analytic:8"])
    timed = load_config(recipe_config("mvdream"), overrides=bench.case_overrides("mvdream-256", args))
    assert timed.trainer.max_steps == 5000 + args.warmup + args.steps
    cfg = pretrain_config(timed, parse_field_start(args.field_start), tiny=True)
    assert cfg.system["guidance_type"] == "analytic-multiview" and cfg.trainer.max_steps == 8
    for key in ("field", "renderer", "background_type", "material", "optimizer"):
        assert cfg.system[key] == timed.system[key], key
    assert cfg.system["field"]["radius"] == 1.0 and cfg.system["background"]["random_probability"] == 0.0
    pretrained = pretrain(timed, 8, tiny=True)
    _, fresh = build_parts(timed)
    _, system = build_parts(timed)
    load_pretrained(system, pretrained)
    grid = "renderer.occupancy.occupied"
    assert torch.equal(system.state_dict()[grid], pretrained.state[grid])
    assert not torch.equal(system.state_dict()["field.encoding.table"], fresh.state_dict()["field.encoding.table"])
    pretrained.state["renderer.occupancy.opacity"] = torch.zeros(3)
    with pytest.raises(RuntimeError, match="other shapes"):
        load_pretrained(fresh, pretrained)
    for spec in ("analytic", "analytic:0", "mvdream:10"):
        with pytest.raises(ValueError, match="--field-start"):
            parse_field_start(spec)


def test_random_mvdream_folder_loads_as_an_mvdream_model(tmp_path):
    from benchmarks.stand_ins.random_mvdream import write_random_mvdream
    from lift3d.guidance.multiview import MultiViewAttnProcessor
    from lift3d.guidance.mvdream import load_mvdream

    folder = write_random_mvdream(tmp_path / "mvdream", tiny=True)
    models = load_mvdream(str(folder), torch.float32)
    assert models.unet.config.projection_class_embeddings_input_dim == 16
    assert any(isinstance(p, MultiViewAttnProcessor) for p in models.unet.attn_processors.values())
