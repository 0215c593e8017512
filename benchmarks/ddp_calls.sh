#!/usr/bin/env bash
# Issue 40's multi-GPU calls: `bash benchmarks/ddp_calls.sh lego|fox` on an nvidia-h100-x4 (or x2) machine from the
# repository root, with .whl and .data_lego / .data_fox carried. lego: reconstruct-gaussians
# on 1, 2 and 4 GPUs (4 views a step per rank, each set against one GPU with the same batch); fox: the same at 2
# views a rank (540x960 photos, appearance off), then the DDP GPU tests. Logs and the JSON lines to $OUT.
set -u
source benchmarks/device_env.sh || exit 1
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
n_gpus=$(nvidia-smi -L | wc -l)
sets="0;0,1"; [ "$n_gpus" -ge 4 ] && sets="0;0,1;0,1,2,3"
python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
case "${1:-lego}" in
lego)
    timeout 470 python3 benchmarks/bench_ddp.py --config reconstruct-gaussians --device-sets "$sets" --views-per-rank 4 \
        --same-batch --psnr --ddp-graphs on --warmup 100 --steps 1900 --timeout-s 120 data.root="$PWD/.data_lego/lego" \
        "system.export.formats=[]" 2>"$OUT/lego_stderr.txt" | tee "$OUT/lego.jsonl" | cut -c1-600
    ;;
fox)
    export XDG_CACHE_HOME=$PWD/.data_fox/cache
    timeout 360 python3 benchmarks/bench_ddp.py --config reconstruct-gaussians --device-sets "$sets" --views-per-rank 2 \
        --same-batch --psnr --ddp-graphs on --warmup 100 --steps 1400 --timeout-s 150 data.root="$PWD/.data_fox/fox" \
        system.appearance.enabled=false "system.export.formats=[]" 2>"$OUT/fox_stderr.txt" | tee "$OUT/fox.jsonl" | cut -c1-600
    timeout 200 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_ddp_gpu.py 2>&1 | tee "$OUT/ddp_tests.log" | tail -6
    ;;
esac
