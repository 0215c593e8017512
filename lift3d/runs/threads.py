"""CPU thread set-up of a lift3d process: OpenMP threads that sleep, not spin, while they wait for each other.

torch's CPU kernels (and MKL's, in the same runtime) run on OpenMP. By default GNU OpenMP's idle threads spin for
300,000 iterations at every barrier before they sleep; on a machine whose cores are busy with other work, a spinning
thread holds a core that the thread it waits for needs, so each parallel region can stall for a scheduler time slice and
CPU training slows far more than sharing the cores explains. OpenMP reads its settings once, when torch loads it, so
they must be in the environment before torch is imported: the CLI calls :func:`configure_cpu_threads` first thing.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# a user who sets any of these has chosen how OpenMP threads wait: lift3d leaves them alone
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}  # idle OpenMP threads sleep at once (GNU and LLVM/Intel OpenMP alike)


def configure_cpu_threads(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Make idle OpenMP threads sleep instead of spin unless the user chose a wait policy; returns what was set.

    Takes effect only when called before torch is imported (OpenMP reads the environment when it loads); child
    processes (DDP ranks, subprocesses) inherit the setting through the environment.
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in WAIT_SETTINGS):
        return {}
    env.update(PASSIVE)
    return dict(PASSIVE)
