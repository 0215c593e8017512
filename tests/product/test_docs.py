"""The documentation site builds with no warning (mkdocs --strict), its generated reference covers every config key with a
description, and the Python example in docs/python.md runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lift3d.config import ExperimentConfig
from lift3d.config.describe import describe, field_comments, part_schemas
from tests.conftest import REPO


def test_every_config_key_has_a_one_line_description():
    keys = list(describe(ExperimentConfig))
    for name, schema in part_schemas().items():
        if schema.__module__.startswith("lift3d."):  # not the parts other tests register
            keys += list(describe(schema, f"{name}:"))
    assert len(keys) > 1000  # every registered part was walked
    missing = [k.key for k in keys if not k.description]
    assert missing == []


def test_descriptions_come_from_the_comment_beside_or_above_the_field(tmp_path, monkeypatch):
    import importlib.util

    (tmp_path / "sample_config.py").write_text(
        'from dataclasses import dataclass\n\n\n@dataclass\nclass Sample:\n    """Doc."""\n\n    a: int = 1  # the first\n'
        '    # the second,\n    # on two lines\n    b: str = "#not a comment"\n    c: list = None\n')
    spec = importlib.util.spec_from_file_location("sample_config", tmp_path / "sample_config.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sample_config", module)  # where inspect finds a class's source file
    spec.loader.exec_module(module)
    assert field_comments(module.Sample) == {"a": "the first", "b": "the second, on two lines", "c": ""}


def test_the_site_builds_with_no_warning(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    methods = (tmp_path / "site" / "methods" / "index.html").read_text()
    assert "triposr-refine" in methods and "reconstruct-nerf-unbounded-cpu" in methods
    reference = (tmp_path / "site" / "config-reference" / "index.html").read_text()
    assert "trainer.max_steps" in reference and "densify-mcmc" in reference
    api = (tmp_path / "site" / "api-reference" / "index.html").read_text()
    assert "Reconstruct a scene and return its run" in api


@pytest.mark.slow
def test_the_custom_guidance_example_runs_as_written(tmp_path):
    text = (REPO / "docs" / "python.md").read_text()
    example = re.search(r"<!-- example: custom-guidance -->\n```python\n(.*?)```", text, re.S).group(1)
    assert len(example.strip().splitlines()) <= 30
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                            env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Run(" in result.stdout and (tmp_path / "outputs" / "gaussian-sds-analytic").is_dir()
