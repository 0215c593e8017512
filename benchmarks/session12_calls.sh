#!/usr/bin/env bash
# Twelfth session's one multi-GPU call (`bash benchmarks/session12_calls.sh` on nvidia-h100-x4 / h200-x4 from the
# repository root, .whl .data_lego .data_fox carried). Phase 1, all four GPUs: the fox under DDP at 1 and 4 GPUs after
# the shared-order sampling (issue 40's PSNR at equal views seen). Phase 2, one job per GPU at once: lego 7k against
# the plain gsplat loop and its variants (GPU 0); lego 30k then every Gaussian format of it (GPU 1); the fox 7k and
# its formats, then the fox at 30k (GPU 2); TripoSR's timings and --refine beside dreamgaussian-image (GPU 3).
# JSON lines and logs to $OUT.
set -u
source benchmarks/device_env.sh || exit 1
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
left() { local s=$(( ${DEADLINE_S:-585} - SECONDS )); echo $(( s > 1 ? s : 1 )); }  # seconds until every job must have ended (the call's 600 s limit)
python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
echo "phase 1 $(date -u +%T)"
XDG_CACHE_HOME=$ROOT/.data_fox/cache timeout 200 python3 benchmarks/bench_ddp.py --config reconstruct-gaussians \
    --device-sets "0;0,1,2,3" --views-per-rank 2 --same-batch --psnr --ddp-graphs on --warmup 100 --steps 1400 \
    --timeout-s 90 data.root="$ROOT/.data_fox/fox" system.appearance.enabled=false "system.export.formats=[]" \
    2>"$OUT/fox_ddp_stderr.txt" > "$OUT/fox_ddp.jsonl"
echo "phase 2 $(date -u +%T)"
formats() {  # run folder root, scene, views: export the run's .ply, then every format of it against it
    local ply
    timeout "$(left)" python3 -m lift3d export "$(ls -d "$1"/*/* | head -1)" --format 3dgs-ply >/dev/null 2>&1
    ply=$(find "$1" -name "*-gaussians.ply" | head -1)
    timeout "$(left)" python3 benchmarks/bench_splat_formats.py --ply "$ply" --cameras-from "$2" --views "$3" --output /tmp/formats_$$
}
(   export CUDA_VISIBLE_DEVICES=0
    timeout "$(left)" python3 benchmarks/bench_lego_gaussians.py --data .data_lego/lego --steps 7000 --eval-at 7000 \
        --reference plain "system.export.formats=[]"
    timeout "$(left)" python3 benchmarks/bench_lego_gaussians.py --data .data_lego/lego --steps 7000 --eval-at 7000 \
        "system.export.formats=[]" system.optimizer.visible_adam=true
    timeout "$(left)" python3 benchmarks/bench_lego_gaussians.py --data .data_lego/lego --steps 7000 --eval-at 7000 \
        "system.export.formats=[]" system.optimizer.visible_adam=true system.densify.max_gaussians=250000
) > "$OUT/gpu0.jsonl" 2> "$OUT/gpu0_stderr.txt" &
(   export CUDA_VISIBLE_DEVICES=1 OMP_NUM_THREADS=12
    timeout "$(left)" python3 benchmarks/bench_capture.py .data_lego/lego --steps 30000 --val-every 15000 --output-root /tmp/runs_lego
    formats /tmp/runs_lego .data_lego/lego 20
) > "$OUT/gpu1.jsonl" 2> "$OUT/gpu1_stderr.txt" &
(   export CUDA_VISIBLE_DEVICES=2 OMP_NUM_THREADS=12 XDG_CACHE_HOME=$ROOT/.data_fox/cache
    timeout "$(left)" python3 benchmarks/bench_capture.py .data_fox/fox --steps 7000 --output-root /tmp/runs_fox \
        --set system.appearance.enabled=false
    formats /tmp/runs_fox .data_fox/fox 7
    timeout "$(left)" python3 benchmarks/bench_capture.py .data_fox/fox --steps 30000 --val-every 7000 \
        --output-root /tmp/runs_fox30 --set system.appearance.enabled=false
) > "$OUT/gpu2.jsonl" 2> "$OUT/gpu2_stderr.txt" &
(   export CUDA_VISIBLE_DEVICES=3 OMP_NUM_THREADS=12
    timeout "$(left)" python3 benchmarks/bench_triposr.py
    timeout "$(left)" python3 benchmarks/bench_image_to_3d.py --cases triposr-refine,dreamgaussian-image
) > "$OUT/gpu3.jsonl" 2> "$OUT/gpu3_stderr.txt" &
wait
echo "done $(date -u +%T)"
for f in "$OUT"/*.jsonl; do echo "== $f"; grep '^{' "$f" | cut -c1-400; done
