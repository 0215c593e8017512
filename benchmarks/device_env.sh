# Source on a GPU machine without network access, from the repository root, before running benchmarks there:
#     source benchmarks/device_env.sh && python -m benchmarks NAME [args]
# Installs the wheels carried in .whl/ (packages the machine's image lacks: diffusers, omegaconf, gsplat, trimesh,
# zstandard, ...) into /tmp/site and puts them and the repository on PYTHONPATH; then prints the versions it sees.
# (once per machine and set of wheels: reinstalling would touch gsplat's sources and its CUDA kernels would be rebuilt)
if [ -d .whl ] && [ "$(ls .whl)" != "$(cat /tmp/site/.installed-wheels 2>/dev/null)" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
    ls .whl > /tmp/site/.installed-wheels
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# imageio-ffmpeg's wheel is large; a machine that limits what it is sent can get .ffmpeg/ instead: the package without
# its binaries/ and the ffmpeg binary xz-compressed as .ffmpeg/ffmpeg.xz, unpacked here once
if [ -f .ffmpeg/ffmpeg.xz ]; then
    [ -x /tmp/ffmpeg ] ||
        python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.ffmpeg/ffmpeg.xz'), open('/tmp/ffmpeg', 'wb'))" &&
        chmod +x /tmp/ffmpeg
    export IMAGEIO_FFMPEG_EXE=/tmp/ffmpeg PYTHONPATH="$PYTHONPATH:$PWD/.ffmpeg"
fi
export PYTHONUNBUFFERED=1
# one build of gsplat's CUDA kernels for every run (a changed XDG_CACHE_HOME would otherwise move it: a rebuild)
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
# several GPUs of one host: NVLink multicast off (NCCL's NVLS and torch's symmetric memory)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 - <<'PY'
import importlib, importlib.util, torch
mods = ("diffusers", "omegaconf", "gsplat", "trimesh", "transformers", "lightning", "pycolmap", "cv2", "zstandard")
versions = {m: getattr(importlib.import_module(m), "__version__", "?") if importlib.util.find_spec(m) else None for m in mods}
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda"
print("device_env:", torch.__version__, gpu, versions, flush=True)
PY
