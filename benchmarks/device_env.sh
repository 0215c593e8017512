# Source on the GPU machine (device tool) from the repository root: installs the wheels carried in .whl/
# (packages its image lacks: diffusers, omegaconf, gsplat, trimesh, ...) into /tmp/site and puts them and
# the repository on PYTHONPATH. Usage: `source benchmarks/device_env.sh && python benchmarks/...`
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# imageio-ffmpeg's wheel (68 MB) is over the device tool's 64 MiB: carry .ffmpeg/ instead, holding the package
# without its binaries/ and the binary xz-compressed as .ffmpeg/ffmpeg.xz (46 MiB); unpacked here once
if [ -f .ffmpeg/ffmpeg.xz ]; then
    [ -x /tmp/ffmpeg ] ||
        python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.ffmpeg/ffmpeg.xz'), open('/tmp/ffmpeg', 'wb'))" &&
        chmod +x /tmp/ffmpeg
    export IMAGEIO_FFMPEG_EXE=/tmp/ffmpeg PYTHONPATH="$PYTHONPATH:$PWD/.ffmpeg"
fi
export PYTHONUNBUFFERED=1
# several-GPU kinds: NVLink multicast stays off (the device tool's KINDS.md says why)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 - <<'PY'
import importlib, importlib.util, torch
mods = ("diffusers", "omegaconf", "gsplat", "trimesh", "transformers", "lightning", "pycolmap", "cv2", "zstandard")
versions = {m: getattr(importlib.import_module(m), "__version__", "?") if importlib.util.find_spec(m) else None for m in mods}
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no cuda"
print("device_env:", torch.__version__, gpu, versions, flush=True)
PY
