"""One step of each hot path against its arithmetic floor: guidance (SDS eager vs fast path, VSD), rasterizer,
NeRF render and recipe steps, within one time budget. Prints one JSON line per case, then a table.

    python -m benchmarks step_floors                          # on a GPU: every case that fits in --budget-s (500 s)
    python -m benchmarks step_floors --cases sds-eager,sds-compile-cudagraphs --budget-s 300
    python -m benchmarks step_floors --tiny                   # tiny models on the CPU: a smoke test in seconds
    python -m benchmarks step_floors --list

Floors: FLOPs of one eager step (torch.utils.flop_counter) over the matmul rate measured at the start of
the same run in the case's precision; ``x_floor`` = measured / floor (see benchmarks/floor.py).
Recipe cases come from the recipes benchmark (``suite.recipes.suite_records``); records with ``median_ms``
(or ``ms_per_step``) and ``gflop_per_step`` get a floor in that record's ``precision`` (default fp16).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.floor import count_flops, floor_fields, measure_rates
from benchmarks.records import environment
from benchmarks.step_cases import Case, Context, SkipCase, all_cases
from benchmarks.timing import time_calls

RECIPE_RESERVE_S = 120.0  # budget kept for the recipe cases


def emit(record: dict[str, Any]) -> None:
    print(json.dumps({"bench": "step_floors", **record}, default=str), flush=True)


def run_case(case: Case, ctx: Context, rates: dict[str, float], flops: dict[str, int | None],
             time_left_s: float) -> dict[str, Any]:
    record: dict[str, Any] = {"case": case.name, "group": case.group}
    try:
        prepared = case.setup(ctx)
        record.update(prepared.info)
        if case.flops_from:
            count = flops.get(case.flops_from)
        else:
            prepared.step()  # warm: lazy set-up (prompt embeddings, placement) is not part of a step
            count = flops[case.name] = count_flops(prepared.step)
        record.update(time_calls(prepared.step, ctx.device, case.steps, case.warmup, time_left_s))
        record.update(precision=prepared.precision, **floor_fields(count, prepared.precision, rates, record["median_ms"]))
    except SkipCase as why:
        record["skipped"] = str(why)
    except Exception as error:  # noqa: BLE001  (one failing case must not hide the others)
        traceback.print_exc(file=sys.stderr)
        record["error"] = repr(error)[:400]
    finally:
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def recipe_records(budget_s: float, tiny: bool) -> list[dict[str, Any]]:
    """The recipe cases' records (the recipes benchmark, within ``budget_s``)."""
    from benchmarks.suite.recipes import suite_records

    return [dict(r) for r in suite_records(budget_s, tiny)]


def recipe_floor(record: dict[str, Any], rates: dict[str, float]) -> dict[str, Any]:
    ms = record.get("median_ms", record.get("ms_per_step"))
    gflop = record.get("gflop_per_step")
    out = {"case": record.get("case", record.get("name", "recipe")), "group": "recipes", **record}
    if ms is not None:
        out["median_ms"] = ms  # the recipe's timed window over its steps: the table's column
    if ms is not None and gflop:
        precision = record.get("precision", "fp16")
        out.update(median_ms=ms, precision=precision, **floor_fields(int(gflop * 1e9), precision, rates, ms))
    return out


def table(records: list[dict[str, Any]]) -> str:
    """A fixed-width table of the records (one row per case)."""
    columns = ("case", "median_ms", "floor_ms", "x_floor", "gflop", "precision", "peak_mem_gib", "speedup")
    rows = [columns]
    for r in records:
        status = r.get("skipped") and f"skipped: {r['skipped']}" or r.get("error") and f"error: {r['error'][:60]}"
        cells = tuple("" if r.get(c) is None else str(r.get(c)) for c in columns)
        rows.append((r.get("case", "?"), status) if status else cells)
    widths = [max(len(row[i]) for row in rows if len(row) == len(columns)) for i in range(len(columns))]
    lines = []
    for row in rows:
        if len(row) == 2:
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
        else:
            lines.append("  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(row)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cases = all_cases()
    parser = argparse.ArgumentParser(prog="python -m benchmarks step_floors", description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=500.0, help="total seconds; cases that would not fit are skipped")
    parser.add_argument("--cases", default="", help="comma-separated case names or groups (default: all, in priority order)")
    parser.add_argument("--tiny", action="store_true", help="tiny models and images on the CPU: a smoke test")
    parser.add_argument("--no-recipes", action="store_true", help="skip the recipe cases")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON lines and the table to this file")
    args = parser.parse_args(argv)
    if args.list:
        for case in cases:
            print(f"{case.name:<32} {case.group:<11} ~{case.cost_s:>4.0f}s  {case.note}")
        print(f"{'recipes':<32} {'recipes':<11} {'':>6}  the recipes benchmark's default cases")
        return 0
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        torch.set_num_threads(1)  # tiny models are all overhead
    wanted = [w for w in args.cases.split(",") if w]
    known = {c.name for c in cases} | {c.group for c in cases} | {"recipes"}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        parser.error(f"unknown cases {unknown}; run with --list to see them")
    if not args.tiny and not torch.cuda.is_available():
        # the cases are sized for a data-center GPU: on a CPU they run for hours and measure nothing of use
        print("python -m benchmarks step_floors: no CUDA GPU here, and these cases are sized for one; run python -m "
              "benchmarks step_floors --tiny for a CPU smoke test (seconds), or run on a CUDA machine", file=sys.stderr)
        return 2
    selected = [c for c in cases if not wanted or c.name in wanted or c.group in wanted]
    with_recipes = not args.no_recipes and (not wanted or "recipes" in wanted)
    env = environment(device)
    rates = measure_rates(device, args.tiny)
    emit({"case": "matmul-rates", "tflops": {k: round(v / 1e12, 2) for k, v in rates.items()}, "flop_per_s": rates, **env})
    scale = 0.02 if args.tiny else 1.0  # rough costs are H100 seconds; tiny cases take about a second
    reserve = RECIPE_RESERVE_S * scale if with_recipes else 0.0
    ctx, flops, records = Context(device, args.tiny), {}, []
    for case in selected:
        elapsed = time.perf_counter() - started
        if elapsed + case.cost_s * scale > args.budget_s - reserve:
            record = {"case": case.name, "group": case.group,
                      "skipped": f"budget ({elapsed:.0f}s used, ~{case.cost_s * scale:.0f}s needed)"}
        else:
            record = run_case(case, ctx, rates, flops, time_left_s=max(args.budget_s - reserve - elapsed, 1.0) * 0.2)
        eager = next((r for r in records if r["case"] == f"{case.name.split('-')[0]}-eager" and "median_ms" in r), None)
        if eager and "median_ms" in record:
            record["speedup"] = round(eager["median_ms"] / record["median_ms"], 2)  # vs the eager step of this run
        records.append(record)
        emit({**record, **env})
    ctx.shared.clear()
    if with_recipes:
        left = args.budget_s - (time.perf_counter() - started)
        try:
            recipes = recipe_records(max(left, 10.0), args.tiny)
        except Exception as error:  # noqa: BLE001  (the table of the other cases must still print)
            traceback.print_exc(file=sys.stderr)
            recipes = [{"case": "recipes", "group": "recipes", "error": repr(error)[:400]}]
        for record in recipes:
            record = recipe_floor(record, rates)
            records.append(record)
            emit({**record, **env})
    by_name = {r["case"]: r for r in records if "median_ms" in r}
    summary: dict[str, Any] = {"case": "summary", "total_s": round(time.perf_counter() - started, 1)}
    sds = {k: v for k, v in by_name.items() if k.startswith("sds-")}
    if "sds-eager" in sds:
        best = min(sds, key=lambda k: sds[k]["median_ms"])
        speedup = sds["sds-eager"]["median_ms"] / sds[best]["median_ms"]
        summary.update(sds_eager_ms=sds["sds-eager"]["median_ms"], sds_best=best, sds_best_ms=sds[best]["median_ms"],
                       sds_speedup=round(speedup, 2), sds_target_3x_met=speedup >= 3.0)
    emit({**summary, **env})
    text = table(records)
    print(text, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"bench": "step_floors", **r, **env}, default=str) for r in records]
        args.out.write_text("\n".join(lines + [json.dumps({"bench": "step_floors", **summary, **env}), "", text, ""]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
