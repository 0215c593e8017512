"""The same result, sooner (lift3d.runs.rescale): a recipe on several processes keeps its result with every step count
divided by the batch factor and Adam's rates by the square-root rule; every config field that counts steps is marked
where it is declared, so the one walk reaches it."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import math
import re
import tokenize

import pytest

from lift3d.config import load_config, to_yaml
from lift3d.config.declarations import step_kind
from lift3d.recipes import recipe_config
from lift3d.runs.rescale import apply_rescale, rescale_config, scaled_count, scaled_schedule
from lift3d.runs.run_dirs import to_container
from tests.config_walk import config_schemas

# fields whose name or comment speaks of steps without counting training steps (the walk below asks the rest to be
# marked with step_count, or scheduled)
OTHER_STEPS = {
    "num_train_timesteps": "the diffusion model's timesteps",
    "min_step_percent": "a diffusion timestep as a fraction of T (InstructPix2Pix's is no schedule)",
    "max_step_percent": "a diffusion timestep as a fraction of T",
    "lora_max_step_percent": "a diffusion timestep as a fraction of T",
    "diffusion_steps": "denoising steps of one edit",
    "lora_steps": "LoRA updates per guidance call",
    "inherit_texture_steps": "steps of a texture fit before training starts",
    "steps_per_diagonal": "ray-marching steps",
    "march_segment": "ray-marching steps",
    "num_sanity_val_steps": "validation batches before training",
    "every_n_minutes": "minutes",
    "holdout_every": "frames of a capture",
    "save_edits_every": "edits, not steps",
    "start_level": "hash-grid levels",
    "interval": "the unit a torch scheduler steps in",
    "rescale_steps": "the rescaling's own switch",
    "schedule_batch": "the rescaling's own record (views)",
}
NAME = re.compile(r"steps?$|^steps?_|_steps?_|every|interval|milestone|^refine_(start|stop)|schedule$", re.I)
COUNTS = re.compile(r"\b(?:N|n|this many|these|training|many)\s+steps\b|\bsteps? (?:at|from|over|between|until)\b|"
                    r"\bthis step\b|\bfirst step\b|\[step\b|\bstep 0\b", re.I)


def field_comments(schema: type) -> dict[str, str]:
    """Each field's comment in ``schema``'s source: on its line(s) and the comment lines just above it."""
    source = inspect.getsource(inspect.getmodule(schema))
    lines = source.splitlines()
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == schema.__name__:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    parts = [comments.get(n, "") for n in range(item.lineno, item.end_lineno + 1)]
                    above = item.lineno - 1
                    while above >= 1 and lines[above - 1].strip().startswith("#"):
                        parts.insert(0, comments.get(above, ""))
                        above -= 1
                    found[item.target.id] = " ".join(parts)
    return found


def test_every_config_field_that_counts_steps_is_marked_where_it_is_declared():
    """A field named like a step count (``*_steps``, ``*_every``, ``*_interval``, milestones, refine_start/stop,
    schedules) or whose comment counts steps ("every N steps", "first step", "[[step, ...]]") is ``scheduled`` or
    marked ``step_count`` (kind "kept" for counts that stay per step), unless it is one of OTHER_STEPS."""
    unmarked, checked = [], 0
    for schema in config_schemas():
        comments = field_comments(schema)
        for f in dataclasses.fields(schema):
            if not (NAME.search(f.name) or COUNTS.search(comments.get(f.name, ""))):
                continue
            checked += 1
            if f.metadata.get("scheduled") or step_kind(schema, f.name) or f.name in OTHER_STEPS:
                continue
            unmarked.append(f"{schema.__module__}.{schema.__qualname__}.{f.name}: {comments.get(f.name, '')}")
    assert not unmarked, "mark these with step_count(...) where they are declared:\n" + "\n".join(unmarked)
    assert checked > 40
    from lift3d.gaussians.strategies.default import DefaultConfig
    from lift3d.systems.optim import OptimizerConfig

    assert [step_kind(DefaultConfig, n) for n in ("refine_start", "refine_every", "grow_grad2d")] == ["count", "count", None]
    assert step_kind(OptimizerConfig, "params") == "optimizer-groups"


def test_values_rescale_by_their_kind():
    assert [scaled_count(v, 2) for v in (7000, 1, 0, -1, 3)] == [3500, 1, 0, -1, 2]  # off, unlimited stay; >= 1
    assert scaled_schedule([0, 1.6e-4, 1.6e-6, 30000, "log"], 2) == [0, 1.6e-4, 1.6e-6, 15000, "log"]
    assert scaled_schedule([[0, 0.0], [1000, 1.0e-4]], 4, lambda v: v * 2) == [[0, 0.0], [250, 2.0e-4]]
    assert scaled_schedule(0.98, 2) == 0.98 and scaled_schedule([0, 0.98, 0.5, 1000], 2) == [0, 0.98, 0.5, 500]


def _reconstruct(*overrides: str, recipe: str = "reconstruct-gaussians"):
    path = recipe_config(recipe)
    return load_config(path, overrides=list(overrides)), [path], list(overrides)


def test_two_gpus_train_the_one_gpu_recipe_in_half_the_steps_with_adams_square_root_rule():
    cfg, paths, overrides = _reconstruct("trainer.devices=[0,1]")
    report = apply_rescale(cfg, paths, overrides, processes=2)
    s, t = cfg.system, cfg.trainer
    assert (t.max_steps, t.val_check_interval, cfg.checkpoint.every_n_train_steps) == (15000, 5000, 5000)
    assert t.log_every_n_steps == 100 and t.sigterm_check_every == 100 and t.schedule_batch == 2  # kept; recorded
    assert [s["densify"][k] for k in ("refine_start", "refine_stop", "refine_every", "reset_every")] == [250, 7500, 50, 1500]
    assert s["gaussians"]["sh_degree_interval"] == 500
    assert s["pose_refinement"]["lr"] == [[0, 0], [500, 1e-4], [15000, 1e-6]]  # a scheduled value: its steps
    groups, args = s["optimizer"]["params"], s["optimizer"]["args"]
    root = math.sqrt(2)
    assert groups["gaussians.means"]["lr"] == pytest.approx([0, 1.6e-4 * root, 1.6e-6 * root, 15000, "log"])
    assert groups["gaussians.opacity_logits"]["lr"] == pytest.approx(0.05 * root)
    assert args["eps"] == pytest.approx(1e-15 / root) and args["betas"] == pytest.approx([0.8, 0.998])
    assert groups["appearance"]["betas"] == pytest.approx([0.8, 0.98])
    line = report.line()
    assert line.startswith("2 GPUs x 1 view: 15000 steps (the recipe's 30000 for 1 view), densify every 50 from 250 to "
                           "7500, SH degree up every 500, validate every 5000"), line
    assert "Adam's rates x1.41" in line and "trainer.rescale_steps=never" in line
    # the run's parsed.yaml loads back as it ran: schedule_batch says its steps are for 2 views a step already
    again = load_config(paths[0], overrides=[f"trainer.schedule_batch={t.schedule_batch}"])
    assert apply_rescale(again, paths, [], processes=2) is None and again.trainer.max_steps == 30000
    parsed = load_config(paths[0], overrides=["trainer.devices=[0,1]"])
    apply_rescale(parsed, paths, overrides, processes=2)
    assert to_yaml(to_container(parsed)) == to_yaml(to_container(cfg))


def test_keys_the_user_gives_win_and_interpolations_follow_their_key():
    """The CPU recipe validates at ${trainer.max_steps}: with max_steps given, both stay; the rest is rescaled. A
    batch of 4 per process on 2 processes is a factor of 8; a group's lr given by the user is not scaled."""
    cfg, paths, overrides = _reconstruct("trainer.max_steps=3000", "system.densify.refine_every=100",
                                         "system.optimizer.params.gaussians\\.sh0.lr=0.01", "data.batch_size=4",
                                         recipe="reconstruct-gaussians-cpu")
    report = apply_rescale(cfg, paths, overrides, processes=2)
    assert report.factor == 8 and cfg.trainer.max_steps == cfg.trainer.val_check_interval == 3000
    assert cfg.system["densify"]["refine_every"] == 100 and cfg.system["densify"]["refine_stop"] == 100
    assert cfg.system["optimizer"]["params"]["gaussians.sh0"]["lr"] == 0.01
    assert cfg.system["optimizer"]["params"]["gaussians.means"]["lr"][3] == 125
    assert report.line().startswith("2 GPUs x 4 views: 3000 steps (trainer.max_steps as given)")
    assert "as given: system.densify.refine_every" in report.line()
    # the recipe's own interpolation follows its rescaled key
    cfg, paths, overrides = _reconstruct(recipe="reconstruct-gaussians-cpu")
    apply_rescale(cfg, paths, overrides, processes=2)
    assert cfg.trainer.max_steps == cfg.trainer.val_check_interval == 500


def test_one_process_never_and_resumed_runs_keep_the_recipes_steps():
    cfg, paths, _ = _reconstruct()
    assert apply_rescale(cfg, paths, [], processes=1) is None and cfg.trainer.max_steps == 30000
    cfg, paths, overrides = _reconstruct("trainer.rescale_steps=never")
    assert apply_rescale(cfg, paths, overrides, processes=4) is None and cfg.trainer.max_steps == 30000
    cfg, paths, overrides = _reconstruct("resume=/nowhere/last.ckpt")
    assert apply_rescale(cfg, paths, overrides, processes=2) is None and cfg.trainer.max_steps == 30000
    # always: a larger batch on one GPU is rescaled too (2 views a step: half the steps)
    cfg, paths, overrides = _reconstruct("trainer.rescale_steps=always", "data.batch_size=2")
    assert apply_rescale(cfg, paths, overrides, processes=1).factor == 2 and cfg.trainer.max_steps == 15000


def test_text_to_3d_recipes_follow_the_same_rule():
    """gaussian-sds renders 4 views a step on one GPU: two GPUs of 4 halve its steps, its densification, its
    timestep annealing (a scheduled guidance value) and its position-lr schedule; data written as a list keeps it."""
    path = recipe_config("gaussian-sds")
    cfg = load_config(path, overrides=["trainer.devices=[0,1]"])
    report = apply_rescale(cfg, [path], ["trainer.devices=[0,1]"], processes=2)
    assert report.factor == 2 and cfg.trainer.max_steps == 750 and cfg.system["densify"]["refine_every"] == 50
    assert cfg.system["guidance"]["max_step_percent"] == [0, 0.98, 0.5, 500]
    assert cfg.system["optimizer"]["params"]["gaussians.means"]["lr"][3] == 750
    # milestones of a random-views resolution schedule (a plain list of steps)
    cfg = load_config(path, overrides=["data.resolution_milestones=[200,600]", "data.batch_size=[4,2,1]"])
    rescale_config(cfg, 2.0)
    assert cfg.data["resolution_milestones"] == [100, 300] and cfg.data["batch_size"] == [4, 2, 1]
