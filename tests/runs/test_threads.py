"""lift3d.runs.threads: the CLI makes OpenMP threads sleep instead of spin before torch loads, unless the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

from lift3d.runs.threads import configure_cpu_threads

# libgomp prints its settings when it loads (OMP_DISPLAY_ENV); GOMP_SPINCOUNT 0 is the passive wait, 300000 the default spin
PROBE = """
import sys
if sys.argv[1] == "cli":
    from lift3d import cli
    try:
        cli.main(["--version"])
    except SystemExit:
        pass
import torch
torch.ones(4).sum()
"""


def _spin_count(mode: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    env.update(OMP_DISPLAY_ENV="VERBOSE", **extra)
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, timeout=120, check=True)
    lines = [line.split("=", 1)[1].strip().strip("'") for line in done.stderr.splitlines() if "GOMP_SPINCOUNT =" in line]
    assert lines, f"libgomp printed no settings: {done.stderr[-500:]}"
    return lines[0]


def test_configure_sets_passive_in_a_clean_environment() -> None:
    env: dict[str, str] = {"PATH": "/usr/bin"}
    assert configure_cpu_threads(env) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_configure_leaves_a_users_choice_alone() -> None:
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "300000"), ("KMP_BLOCKTIME", "200")):
        env = {name: value}
        assert configure_cpu_threads(env) == {}
        assert env == {name: value}


def test_the_cli_makes_torchs_openmp_threads_wait_passively() -> None:
    # without the CLI torch's OpenMP spins 300000 times at each barrier; run through lift3d.cli.main it does not spin
    assert _spin_count("plain") == "300000"
    assert _spin_count("cli") == "0"


def test_the_cli_keeps_a_users_spin_count() -> None:
    assert _spin_count("cli", GOMP_SPINCOUNT="12345") == "12345"
