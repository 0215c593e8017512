"""NCCL all-reduce time of a dreamfusion hash-table gradient (12.6M values), fp32 and bf16, between the GPUs.

    torchrun --nproc_per_node 2 -m benchmarks allreduce    # one JSON line from rank 0 (needs torchrun's processes)
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist

from benchmarks.timing import Stopwatch

HASH_TABLE_VALUES = 12_601_568  # dreamfusion-sd: 16 levels, 2^19 rows at most, 2 features


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks allreduce", description=__doc__.splitlines()[0]).parse_args(argv)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    record: dict[str, object] = {"bench": "allreduce", "world_size": dist.get_world_size(), "values": HASH_TABLE_VALUES}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.ones(HASH_TABLE_VALUES, device="cuda", dtype=dtype)
        for _ in range(5):
            dist.all_reduce(x)
        with Stopwatch("cuda") as clock:
            for _ in range(20):
                dist.all_reduce(x)
        ms = clock.seconds / 20 * 1000
        record[f"{name}_ms"] = round(ms, 3)
        record[f"{name}_algbw_GBps"] = round(x.numel() * x.element_size() / ms / 1e6, 1)
    if rank == 0:
        print(json.dumps(record))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
