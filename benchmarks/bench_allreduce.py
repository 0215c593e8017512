"""NCCL all-reduce time of a dreamfusion hash-table gradient (12.6M values), fp32 and bf16, between the GPUs.

    torchrun --nproc_per_node 2 benchmarks/bench_allreduce.py    # one JSON line from rank 0
"""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist

HASH_TABLE_VALUES = 12_601_568  # dreamfusion-sd: 16 levels, 2^19 rows at most, 2 features


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    record: dict[str, object] = {"bench": "allreduce", "world_size": dist.get_world_size(), "values": HASH_TABLE_VALUES}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.ones(HASH_TABLE_VALUES, device="cuda", dtype=dtype)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / 20 * 1000
        record[f"{name}_ms"] = round(ms, 3)
        record[f"{name}_algbw_GBps"] = round(x.numel() * x.element_size() / ms / 1e6, 1)
    if rank == 0:
        print(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
