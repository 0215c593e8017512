"""One method table: every front end (lift3d reconstruct, lift3d generate, the Python API, the web app, the docs) offers
exactly its methods, each method's recipes exist, and every entry point picks the CPU variant on a machine without
CUDA."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lift3d.method_table import IMAGE, PHOTOS, TEXT, MethodError, find_method, method_names, methods, stage_recipes
from lift3d.recipes import recipe_config, recipe_names


def _method_choices(command: str) -> list[str]:
    from lift3d.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return list(next(a for a in sub._actions if a.dest == "method").choices)


def test_the_commands_offer_exactly_the_table():
    assert _method_choices("reconstruct") == method_names(PHOTOS)
    assert _method_choices("generate") == method_names(TEXT) + method_names(IMAGE)


def test_the_app_offers_exactly_the_table():
    from lift3d.app.recipes import default_recipes

    for on_cpu in (False, True):
        entries = default_recipes(on_cpu)
        assert [e.method for e in entries] == method_names()
        assert [e.label for e in entries] == [m.label for m in methods()]
        for entry, method in zip(entries, methods()):
            assert entry.configs == (stage_recipes(method, on_cpu=on_cpu)[0],)
            assert entry.input == {PHOTOS: "photos", TEXT: "prompt", IMAGE: "image"}[method.task]


def test_the_docs_offer_exactly_the_table():
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    rows = [line for line in hooks.methods_markdown().splitlines()[2:]]
    assert [row.split("`")[1] for row in rows] == method_names()
    assert "<!-- lift3d:methods -->" in (REPO / "docs" / "methods.md").read_text()


def test_every_recipe_of_the_table_exists_and_names_its_weights_key():
    from omegaconf import OmegaConf

    from lift3d.config import load_config

    names = recipe_names()
    for method in methods():
        assert set(method.recipes) <= set(names), method.name
        if method.offline_twin:
            assert method.offline_twin in names and method.offline_twin.endswith("-analytic"), method.name
        if method.weights_key:
            cfg = OmegaConf.structured(load_config(recipe_config(method.stages[0])))
            assert OmegaConf.select(cfg, method.weights_key) is not None, (method.name, method.weights_key)
    assert sum(m.default for m in methods(PHOTOS)) == sum(m.default for m in methods(TEXT)) == 1


def test_find_method_names_the_task_and_the_closest_method():
    assert find_method(None, TEXT).name == "gaussian-sds" and find_method(None, IMAGE).name == "dreamgaussian"
    with pytest.raises(MethodError, match="one photo: give a photo .*methods are gaussian-sds"):
        find_method("triposr", TEXT)
    with pytest.raises(MethodError, match="Did you mean 'nerf'"):
        find_method("nerff", PHOTOS)


def test_variants_follow_the_machine_and_the_scene():
    nerf, gaussians = find_method("nerf"), find_method("gaussians")
    assert stage_recipes(nerf, sample=True, on_cpu=True) == ["reconstruct-nerf-cpu"]  # no sample variant: the CPU one
    assert stage_recipes(nerf, sample=True, on_cpu=False) == ["reconstruct-nerf"]
    assert stage_recipes(gaussians, sample=True, on_cpu=True) == ["reconstruct-gaussians-sample"]
    assert stage_recipes(gaussians, on_cpu=True) == ["reconstruct-gaussians-cpu"]
    assert stage_recipes(nerf, on_cpu=True, unbounded=True) == ["reconstruct-nerf-unbounded-cpu"]
    triposr = find_method("triposr")
    assert stage_recipes(triposr) == ["triposr"] and stage_recipes(triposr, refine=True) == ["triposr", "triposr-refine"]
    assert stage_recipes(find_method("dreamgaussian")) == ["dreamgaussian-image", "dreamgaussian-image-texture"]


@pytest.fixture
def no_cuda_runs(monkeypatch, tmp_path):
    """No CUDA, and training replaced by a record of the config each entry point would train."""
    import torch

    import lift3d.runs.runner as runner

    trained: list[str] = []

    def record(mode, cfg, config_paths, *args, **kwargs):
        trained.append(Path(config_paths[0]).stem)
        return tmp_path

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runner, "run_experiment", record)
    return trained


def test_without_cuda_every_entry_point_runs_the_cpu_variant(no_cuda_runs):
    import lift3d
    from lift3d.cli import main

    lift3d.reconstruct(method="nerf")
    assert main(["reconstruct", "--method", "nerf"]) == 0
    assert main(["reconstruct"]) == 0
    assert no_cuda_runs == ["reconstruct-nerf-cpu", "reconstruct-nerf-cpu", "reconstruct-gaussians-sample"]


def test_the_app_runs_a_method_through_its_front_end(tmp_path):
    from lift3d.app.jobs import JobSpec, job_command

    spec = JobSpec(recipe_config("reconstruct-nerf-cpu"), [], tmp_path, method="nerf", task="photos", input="/scene")
    assert job_command(spec) == ["reconstruct", "/scene", "--method", "nerf"]
    spec = JobSpec(recipe_config("magic123"), [], tmp_path, method="magic123", task="image", input="/cat.png",
                   prompt="a cat statue")
    assert job_command(spec)[:5] == ["generate", "a cat statue", "--image", "/cat.png", "--method"]
    spec = JobSpec(recipe_config("dreamgaussian-image"), [], tmp_path, method="dreamgaussian", task="image", input="/c.png")
    assert job_command(spec)[:4] == ["generate", "--image", "/c.png", "--method"]  # no prompt: all stages of the method
