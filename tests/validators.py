"""Independent readers for lift3d's exports, from npm (pinned in tests/js/package-lock.json):
the Khronos glTF validator and PlayCanvas splat-transform. CI installs them with
``npm ci --prefix tests/js``; a missing install is an error that says so, never a skip."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

JS = Path(__file__).resolve().parent / "js"
INSTALL = "install them with `npm ci --prefix tests/js` (needs node >= 18)"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError(f"node is not on PATH: the export tests run npm validators; {INSTALL}")
    return node


def _require(package: str) -> None:
    if not (JS / "node_modules" / package / "package.json").is_file():
        raise RuntimeError(f"the npm package {package} is not installed in {JS}: {INSTALL}")


def validate_gltf(*paths: Path) -> list[dict]:
    """The Khronos glTF validator's report for each file (``report["issues"]["numErrors"]`` etc.)."""
    _require("gltf-validator")
    result = subprocess.run([_node(), str(JS / "validate-gltf.mjs"), *map(str, paths)], capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"gltf-validator failed ({result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def gltf_problems(report: dict) -> list[tuple[str, str, str]]:
    """(code, pointer, message) of every error and warning (severity 0 and 1) in a validator report."""
    return [(m["code"], m.get("pointer", ""), m["message"]) for m in report["issues"]["messages"] if m["severity"] <= 1]


def splat_transform(*args: str | Path) -> str:
    """Run ``splat-transform -w ARGS...`` (input, actions, output); its output text; errors raise."""
    _require("@playcanvas/splat-transform")
    cli = JS / "node_modules" / "@playcanvas" / "splat-transform" / "bin" / "cli.mjs"
    result = subprocess.run([_node(), str(cli), "-w", *map(str, args)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"splat-transform {' '.join(map(str, args))} failed ({result.returncode}):\n"
                           f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def read_csv_columns(path: Path) -> dict[str, np.ndarray]:
    """A CSV with a header row as float64 columns."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    header, values = rows[0], np.array(rows[1:], dtype=np.float64)
    return {name: values[:, i] for i, name in enumerate(header)}
