"""Several machines through torchrun (no launcher of lift3d's own): two "nodes" of one gloo process each on this
machine train one run, each rank says it joined, and the result is the one-process run with the same total batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import torch

from lift3d.runs.run_dirs import RUN_DIR_ENV
from tests.conftest import TEST_CONFIGS

REPO = TEST_CONFIGS.parents[1]
SCENE = REPO / "lift3d" / "assets" / "sample_scene"
CONFIG = str(TEST_CONFIGS / "reconstruct-gaussians-nodes.yaml")
COMMON = ["trainer.accelerator=cpu", f"data.root={SCENE}", "system.cpu_threads=1", "system.replica_check_every=1"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                              "TORCHELASTIC_RUN_ID", RUN_DIR_ENV)}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_nodes_through_torchrun_train_the_one_process_result(tmp_path):
    port, dump = _free_port(), tmp_path / "dump"
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                               "-m", "lift3d", "train", CONFIG, *COMMON, f"output_root={tmp_path / 'out'}",
                               f"system.dump_dir={dump}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=tmp_path, env=_env()) for node in (0, 1)]
    one = subprocess.Popen([sys.executable, "-m", "lift3d", "train", CONFIG, *COMMON, f"output_root={tmp_path / 'one'}",
                            f"system.dump_dir={tmp_path / 'one-dump'}", "data.batch_size=2", "trainer.rescale_steps=always"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=_env())
    deadline, outputs = time.monotonic() + 240, []
    try:
        for process in [*nodes, one]:
            outputs.append(process.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    finally:
        for process in [*nodes, one]:
            if process.poll() is None:
                process.kill()
    assert [p.returncode for p in (*nodes, one)] == [0, 0, 0], "\n----\n".join(o[-3000:] for o in outputs)
    # each rank joined from its own "machine"; rank 0 says once what the rescaling did
    assert "rank 0 of 2" in outputs[0] and "(node 0, local rank 0), cpu" in outputs[0]
    assert "rank 1 of 2" in outputs[1] and "(node 1, local rank 0), cpu" in outputs[1]
    line = "2 processes x 1 view: 12 steps (the recipe's 24 for 1 view), densify every 2 from 2 to 10"
    assert outputs[0].count(line) == 1 and line not in outputs[1]
    assert "1 process x 2 views: 12 steps (the recipe's 24 for 1 view)" in outputs[2]
    ranks = [torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    single = torch.load(tmp_path / "one-dump" / "rank0.pt", weights_only=True)
    assert [r["world_size"] for r in ranks] == [2, 2] and ranks[0]["step"] == single["step"] == 12
    for name, p in ranks[0]["params"].items():
        assert torch.equal(p, ranks[1]["params"][name]), name  # the replicas stay identical
    assert torch.equal(ranks[0]["events"], single["events"]) and ranks[0]["events"][:, 1:3].sum() > 0
    assert [e[0] for e in ranks[0]["events"].tolist()] == [4, 6, 8]  # refines after step 2 every 2 until 10; reset at 6
    for name, p in ranks[0]["params"].items():  # one batch of two views: the same result to float rounding
        assert torch.allclose(p, single["params"][name], atol=0.05), name
