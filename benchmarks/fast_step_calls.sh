#!/usr/bin/env bash
# The device calls of issue 40's 3DGS-step work (2026-11-26, tenth session): `bash benchmarks/fast_step_calls.sh N`
# on the device from the repository root, with .whl and .data_lego (and .data_fox) carried; JSON lines to $OUT.
set -u
source benchmarks/device_env.sh || exit 1
# one gsplat build for every run: the fox's XDG_CACHE_HOME would otherwise move torch's extension folder (a rebuild)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LEGO=.data_lego/lego
bench() {  # name, then bench_lego_gaussians arguments
    local name=$1; shift
    echo "=== $name $(date -u +%T)" | tee -a "$OUT/log.txt"
    timeout 300 python3 benchmarks/bench_lego_gaussians.py --data $LEGO "$@" 2>>"$OUT/stderr.txt" \
        | grep '^{' | sed "s/^{/{\"run\": \"$name\", /" | tee -a "$OUT/results.jsonl" | cut -c1-400
}
fox() {  # name, then bench_capture arguments: the fox, 7k steps, held-out photos
    local name=$1; shift
    echo "=== $name $(date -u +%T)" | tee -a "$OUT/log.txt"
    XDG_CACHE_HOME=$PWD/.data_fox/cache timeout 200 python3 benchmarks/bench_capture.py .data_fox/fox --steps 7000 \
        --output-root /tmp/fox-runs "$@" 2>>"$OUT/stderr.txt" | grep '^{' | sed "s/^{/{\"run\": \"$name\", /" \
        | tee -a "$OUT/results.jsonl" | cut -c1-600
}
case "${1:-1}" in
1)
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    bench baseline --steps 7000 --eval-at 7000 --reference plain
    bench profile_3k --steps 3200 --eval-at 3200 --val-views 5 --profile 200 --profile-start 3000
    bench visible_adam --steps 7000 --eval-at 7000 system.optimizer.visible_adam=true
    bench res_4_2 --steps 7000 --eval-at 7000 "system.resolution_schedule=[[0,4],[1000,2],[2500,1]]"
    bench budget_200k --steps 7000 --eval-at 7000 system.densify.max_gaussians=200000
    timeout 200 python3 -m pytest -m gpu -q -x tests/test_fast_splat_step_gpu.py tests/test_graphed_splats_gpu.py \
        tests/test_captured_step_gpu.py 2>&1 | tail -15 | tee -a "$OUT/log.txt"
    bench res_2 --steps 7000 --eval-at 7000 "system.resolution_schedule=[[0,2],[2000,1]]"
    ;;
2)
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    timeout 150 python3 -m pytest -m gpu -q tests/test_fast_splat_step_gpu.py tests/test_graphed_splats_gpu.py \
        tests/test_captured_step_gpu.py 2>&1 | tail -8 | tee -a "$OUT/log.txt"
    bench baseline --steps 7000 --eval-at 7000 --reference plain
    bench visible_adam --steps 7000 --eval-at 7000 system.optimizer.visible_adam=true
    bench visible_adam_res_2 --steps 7000 --eval-at 7000 system.optimizer.visible_adam=true \
        "system.resolution_schedule=[[0,2],[2000,1]]"
    fox fox_default
    fox fox_visible_adam --set system.optimizer.visible_adam=true
    bench sched15k_visible_adam --steps 15000 --eval-at 7500,15000 system.densify.refine_stop=7500 \
        system.densify.reset_every=1500 system.gaussians.sh_degree_interval=500 system.optimizer.visible_adam=true \
        "system.optimizer.params={gaussians.means: {lr: [0, 1.6e-4, 1.6e-6, 15000, log]}}"
    bench profile_3k --steps 3100 --eval-at 3100 --val-views 5 --profile 100 --profile-start 3000 \
        system.optimizer.visible_adam=true
    ;;
3)  # the captured Adam restored (commit 5510b78): to be measured
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    bench baseline --steps 7000 --eval-at 7000 --reference plain
    bench visible_adam --steps 7000 --eval-at 7000 system.optimizer.visible_adam=true
    fox fox_default
    fox fox_visible_adam --set system.optimizer.visible_adam=true
    bench sched15k_visible_adam --steps 15000 --eval-at 7500,15000 system.densify.refine_stop=7500 \
        system.densify.reset_every=1500 system.gaussians.sh_degree_interval=500 system.optimizer.visible_adam=true \
        "system.optimizer.params={gaussians.means: {lr: [0, 1.6e-4, 1.6e-6, 15000, log]}}"
    ;;
4)  # tenth session, lead's call 1: captured Adam back, pose refinement's effect on the fox, the fox's plain loop
    export XDG_CACHE_HOME=$PWD/.data_fox/cache
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    bench baseline --steps 7000 --eval-at 7000 --reference plain
    fox fox_default
    fox fox_pose_off --set system.pose_refinement.enabled=false
    bench fox_no_appearance_plain --data .data_fox/fox --steps 7000 --eval-at 7000 --reference plain \
        system.appearance.enabled=false system.pose_refinement.enabled=false
    bench visible_adam --steps 7000 --eval-at 7000 system.optimizer.visible_adam=true
    ;;
5)  # tenth session, lead's call 2: the GPU tests of this session's work, TripoSR's timings, lego at 15k and 30k
    export LIFT3D_TEST_DATA=$PWD/.data
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    timeout 240 python3 -m pytest -m gpu -q -rfE tests/test_pose_refinement.py tests/test_graphed_splats_mixed_sizes.py \
        tests/test_fast_splat_step_gpu.py tests/test_generators_triposr.py 2>&1 | tail -15 | tee -a "$OUT/log.txt"
    timeout 90 python3 benchmarks/bench_triposr.py 2>>"$OUT/stderr.txt" | grep '^{' | tee -a "$OUT/results.jsonl"
    bench sched15k_visible_adam --steps 15000 --eval-at 7500,15000 system.densify.refine_stop=7500 \
        system.densify.reset_every=1500 system.gaussians.sh_degree_interval=500 system.optimizer.visible_adam=true \
        "system.optimizer.params={gaussians.means: {lr: [0, 1.6e-4, 1.6e-6, 15000, log]}}"
    bench default_30k --steps 30000 --eval-at 7000,30000
    ;;
6)  # tenth session, lead's call 3: TripoSR's export modes and GPU tests, lego on a 20k schedule
    export LIFT3D_TEST_DATA=$PWD/.data
    timeout 150 python3 -m pytest -m gpu -q -rfE tests/test_generators_triposr.py 2>&1 | tail -6 | tee -a "$OUT/log.txt"
    timeout 120 python3 benchmarks/bench_triposr.py 2>>"$OUT/stderr.txt" | grep '^{' | tee -a "$OUT/results.jsonl"
    python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
    bench sched20k_visible_adam --steps 20000 --eval-at 10000,20000 system.densify.refine_stop=10000 \
        system.densify.reset_every=2000 system.gaussians.sh_degree_interval=700 system.optimizer.visible_adam=true \
        "system.optimizer.params={gaussians.means: {lr: [0, 1.6e-4, 1.6e-6, 20000, log]}}"
    ;;
esac
