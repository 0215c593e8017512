#!/usr/bin/env bash
# Issue 39's device calls: the GPU suite on the redesigned tree, and lego 3DGS / NeRF benchmarks of the new tree
# against the previous main in one call. `bash benchmarks/device_redesign_check.sh suite1|suite2|bench` on the device
# from the repository root, with .whl (and, for bench, .data_lego and .old = `git archive <previous main> lift3d
# benchmarks`) carried; logs and JSON lines to $OUT.
set -u
source benchmarks/device_env.sh || exit 1
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions LIFT3D_TEST_DATA=$PWD/.data
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
gpu_tests() {  # the test files with a gpu mark, whose first letter after test_ is in the class $1
    grep -l "mark.gpu" tests/test_*.py | grep -E "tests/test_[$1]" | tr '\n' ' '
}
bench() {  # tree (new|old), benchmark script, then its arguments
    local tree=$1 script=$2; shift 2
    local dir=$ROOT; [ "$tree" = old ] && dir=$ROOT/.old
    echo "=== $tree $script $(date -u +%T)" | tee -a "$OUT/log.txt"
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 200 python3 "$script" --data "$ROOT/.data_lego/lego" "$@" \
        2>>"$OUT/stderr.txt") | grep '^{' | sed "s/^{/{\"tree\": \"$tree\", /" | tee -a "$OUT/results.jsonl" | cut -c1-300
}
case "${1:-suite1}" in
suite1|suite2)
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    files=$(gpu_tests "$([ "$1" = suite1 ] && echo a-l || echo m-z)")
    echo "files: $files"
    set -o pipefail
    timeout 540 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $files 2>&1 | tee "$OUT/$1.log" | tail -25
    ;;
bench)
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    timeout 220 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider tests/test_recipes_gpu.py tests/test_recipes_image.py \
        tests/test_splat_parity.py tests/test_generators_triposr.py 2>&1 | tee "$OUT/retest.log" | tail -4
    for tree in new old new old; do
        bench $tree benchmarks/bench_lego_gaussians.py --steps 7000 --eval-at 7000 "system.export.formats=[]"
    done
    for tree in new old new old; do
        bench $tree benchmarks/bench_lego_nerf.py --steps 3000 --skip-profile
    done
    ;;
esac
