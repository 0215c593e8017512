#!/usr/bin/env bash
# Thirteenth session's one-GPU calls (device tool, nvidia-h100-x1, from the repository root, .whl carried):
#   bash benchmarks/session13_calls.sh formats   # .data_lego .data_fox carried too: issue 41's compression on trained
#       scenes: lego 30k and the fox 7k trained side by side on the one GPU, each exported to its .ply, then every
#       Gaussian format of it scored against it from the scene's held-out cameras (sizes, worst-view PSNR)
#   bash benchmarks/session13_calls.sh image     # issue 42 on a quiet GPU: TripoSR's timings at the released sizes,
#       then --refine (Zero123-XL-sized weights) to its .glb beside dreamgaussian-image from scratch, then the
#       TripoSR GPU tests and the GPU tests of the volume renderer and the SOG writer
#   bash benchmarks/session13_calls.sh refine    # the same without bench_triposr's timings
#   bash benchmarks/session13_calls.sh dreamgaussian   # (.data carried too) dreamgaussian-image alone to its .glb, then
#       the volume renderer's GPU tests
# Each ends before the call's 600 s; JSON lines and logs (at most 8 files) to $OUT.
set -u
source benchmarks/device_env.sh || exit 1
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ROOT=$PWD
left() { local s=$(( ${DEADLINE_S:-585} - SECONDS )); echo $(( s > 1 ? s : 1 )); }  # seconds until every job must end
echo "gsplat build $(date -u +%T)"
python3 -c "import gsplat.cuda._backend" 2>&1 | tail -1
echo "start $(date -u +%T)"
formats() {  # run folder root, scene, views: export the run's .ply, then every format of it against it
    local ply
    timeout "$(left)" python3 -m lift3d export "$(ls -d "$1"/*/* | head -1)" --format 3dgs-ply >/dev/null 2>&1
    ply=$(find "$1" -name "*-gaussians.ply" | sort | tail -1)
    echo "{\"formats_of\": \"$ply\"}"
    timeout "$(left)" python3 benchmarks/bench_splat_formats.py --ply "$ply" --cameras-from "$2" --views "$3" \
        --output /tmp/formats_$$
}
case "${1:-}" in
formats)
    (   export OMP_NUM_THREADS=8
        timeout "$(left)" python3 benchmarks/bench_capture.py .data_lego/lego --steps 30000 --val-every 30000 \
            --output-root /tmp/runs_lego
        formats /tmp/runs_lego .data_lego/lego 20
    ) > "$OUT/lego.jsonl" 2> "$OUT/lego_stderr.txt" &
    (   export OMP_NUM_THREADS=8 XDG_CACHE_HOME=$ROOT/.data_fox/cache
        timeout "$(left)" python3 benchmarks/bench_capture.py .data_fox/fox --steps 7000 --output-root /tmp/runs_fox \
            --set system.appearance.enabled=false
        formats /tmp/runs_fox .data_fox/fox 7
    ) > "$OUT/fox.jsonl" 2> "$OUT/fox_stderr.txt" &
    wait
    timeout "$(left)" python3 -m pytest -q -m gpu tests/test_export_sog.py tests/test_export_gpu.py -p no:cacheprovider \
        > "$OUT/pytest.txt" 2>&1
    ;;
image|refine)  # refine: the same without bench_triposr (measured in the image call)
    {   [ "$1" = image ] && timeout "$(left)" python3 benchmarks/bench_triposr.py
        timeout "$(left)" python3 benchmarks/bench_image_to_3d.py --cases triposr-refine,dreamgaussian-image --models /tmp/models
    } > "$OUT/image.jsonl" 2> "$OUT/image_stderr.txt"
    timeout "$(left)" python3 -m pytest -q -m gpu tests/test_generators_triposr.py tests/test_export_sog.py tests/test_proposal_sampling.py \
        tests/test_volume_gpu.py -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
    ;;
dreamgaussian)  # dreamgaussian-image from scratch to its .glb (until 480 s), then the volume renderer's GPU tests
    DEADLINE_S=480
    timeout "$(left)" python3 benchmarks/bench_image_to_3d.py --cases dreamgaussian-image --to-glb --models /tmp/models \
        > "$OUT/image.jsonl" 2> "$OUT/image_stderr.txt"
    DEADLINE_S=585
    LIFT3D_TEST_DATA=$ROOT/.data timeout "$(left)" python3 -m pytest -q -m gpu tests/test_volume_gpu.py -p no:cacheprovider \
        > "$OUT/pytest.txt" 2>&1
    ;;
*) echo "usage: bash benchmarks/session13_calls.sh formats|image|refine|dreamgaussian"; exit 2 ;;
esac
echo "done $(date -u +%T)"
for f in "$OUT"/*.jsonl; do echo "== $f"; grep '^{' "$f" | cut -c1-600; done
tail -3 "$OUT/pytest.txt"
