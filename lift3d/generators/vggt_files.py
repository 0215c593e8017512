"""Finding VGGT's released weights on this machine and loading them by their key names, with one-line errors.

Where the weights come from, first found wins: ``--vggt-weights PATH`` (a ``model.safetensors`` or ``model.pt``,
or a folder holding one), the ``LIFT3D_VGGT_WEIGHTS`` environment variable, then the local Hugging Face cache of
``facebook/VGGT-1B-Commercial`` and ``facebook/VGGT-1B``. Nothing is ever downloaded here: ``hf download`` does that.
The sizes of the network are read from the state dict's shapes (VGGT-1B's, or any smaller model of the same
layout), then every tensor must be there with its shape: a wrong or truncated file is refused with what is
missing or unexpected, the file tried, where to put the weights and the licenses.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch
from torch import Tensor

from lift3d.generators.base import GeneratorLoadError
from lift3d.generators.files import read_weights
from lift3d.generators.vggt_model import VggtArchitecture, VggtNetwork

log = logging.getLogger(__name__)

ENV_VAR = "LIFT3D_VGGT_WEIGHTS"
OFF = ("off", "none", "false", "0")  # $LIFT3D_VGGT_WEIGHTS values that keep auto from picking VGGT
WEIGHT_FILES = ("model.safetensors", "model.pt")
# the released weights, in the order the Hugging Face cache is searched, and the license each one carries
RELEASES = {
    "facebook/VGGT-1B-Commercial": "the VGGT license (commercial use allowed; a gated download: accept it on its page)",
    "facebook/VGGT-1B": "CC-BY-NC-4.0 (non-commercial use only)",
}
IGNORED_PREFIXES = ("point_head.", "track_head.")  # released heads lift3d does not run (depth + cameras suffice)


class VggtWeightsError(GeneratorLoadError):
    """VGGT weights that are missing or do not fit the network; the message says where to put the right ones."""


def where_to_get() -> str:
    """The fix for missing weights, with the license of each release."""
    releases = "; ".join(f"{repo} ({license})" for repo, license in RELEASES.items())
    return (f"download one release with `hf download REPO model.safetensors` and pass --vggt-weights PATH (or set "
            f"{ENV_VAR}=PATH); releases: {releases}; or pose the photos by structure from motion (--method sfm)")


def cached_release() -> tuple[Path, str] | None:
    """A released weights file already in the local Hugging Face cache, and its hub id (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for repo in RELEASES:
        for name in WEIGHT_FILES:
            found = try_to_load_from_cache(repo, name)
            if isinstance(found, str) and Path(found).is_file():
                return Path(found), repo
    return None


def _weights_in(path: Path, source: str) -> Path:
    """The weights file ``path`` names: the file itself or the first of ``WEIGHT_FILES`` in the folder."""
    if path.is_dir():
        for name in WEIGHT_FILES:
            if (path / name).is_file():
                return path / name
        raise VggtWeightsError(f"{path} ({source}) holds no {' or '.join(WEIGHT_FILES)}: {where_to_get()}")
    if not path.is_file():
        raise VggtWeightsError(f"{path} ({source}) does not exist: {where_to_get()}")
    return path


def find_weights(given: str | Path | None = None) -> Path | None:
    """The weights file to load: ``given``, else ``$LIFT3D_VGGT_WEIGHTS``, else a cached release; None when none is
    named or cached, or the variable says ``off`` (never VGGT unless asked by path). A named path that holds no weights
    is an error (never a silent fall back)."""
    if given:
        return _weights_in(Path(given).expanduser(), "--vggt-weights")
    named = os.environ.get(ENV_VAR, "").strip()
    if named.lower() in OFF:
        return None
    if named:
        return _weights_in(Path(named).expanduser(), ENV_VAR)
    cached = cached_release()
    return cached[0] if cached is not None else None


def require_weights(given: str | Path | None = None) -> Path:
    """``find_weights``, refusing in one line when there are none."""
    found = find_weights(given)
    if found is None:
        raise VggtWeightsError(f"no VGGT weights: none given (--vggt-weights, {ENV_VAR}) and none in the Hugging Face "
                               f"cache ({', '.join(RELEASES)}): {where_to_get()}")
    return found


def license_of(path: Path) -> str:
    """The license of a weights file from the Hugging Face cache (its hub id is in the path), else unknown."""
    text = str(path)
    for repo, license in RELEASES.items():
        if f"models--{repo.replace('/', '--')}{os.sep}" in text:
            return f"{repo}: {license}"
    return "a local file: the license of the release it came from applies"


# ----------------------------------------------------------------------------------------------- the sizes
def _count(state: dict[str, Tensor], prefix: str) -> int:
    """How many numbered modules ``prefix.N.`` the state dict has (the highest N + 1)."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    found = [int(m.group(1)) for key in state if (m := pattern.match(key))]
    return max(found) + 1 if found else 0


def architecture_from_state(state: dict[str, Tensor], path: Path) -> VggtArchitecture:
    """The sizes of the network whose state dict this is (refused when it is not VGGT's layout)."""
    needed = ("aggregator.camera_token", "aggregator.register_token", "aggregator.frame_blocks.0.attn.q_norm.weight",
              "aggregator.patch_embed.patch_embed.proj.weight", "aggregator.patch_embed.pos_embed",
              "depth_head.scratch.layer1_rn.weight", *(f"depth_head.projects.{i}.weight" for i in range(4)))
    absent = [key for key in needed if key not in state]
    if absent:
        raise VggtWeightsError(f"{path} is not a VGGT checkpoint: it lacks {', '.join(absent[:3])}"
                               f"{f' and {len(absent) - 3} more' if len(absent) > 3 else ''}; {where_to_get()}")
    dim = state["aggregator.camera_token"].shape[-1]
    patch = state["aggregator.patch_embed.patch_embed.proj.weight"].shape[-1]
    grid = int(round((state["aggregator.patch_embed.pos_embed"].shape[1] - 1) ** 0.5))
    return VggtArchitecture(
        embed_dim=dim, depth=max(_count(state, "aggregator.frame_blocks"), _count(state, "aggregator.global_blocks")),
        num_heads=dim // state["aggregator.frame_blocks.0.attn.q_norm.weight"].shape[0],
        backbone_depth=_count(state, "aggregator.patch_embed.blocks"),
        num_register_tokens=state["aggregator.register_token"].shape[2], patch_size=patch, img_size=grid * patch,
        camera_trunk_depth=_count(state, "camera_head.trunk"),
        dpt_features=state["depth_head.scratch.layer1_rn.weight"].shape[0],
        dpt_channels=tuple(state[f"depth_head.projects.{i}.weight"].shape[0] for i in range(4)))


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_fit(path: Path, state: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Refuse ``state`` unless it holds exactly the ``expected`` tensors (name -> shape), besides ignored heads."""
    found = {k: v for k, v in state.items() if not k.startswith(IGNORED_PREFIXES)}
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = sorted(k for k in set(found) & set(expected) if tuple(found[k].shape) != tuple(expected[k]))
    problems = [f"{len(missing)} missing ({_listed(missing)})"] if missing else []
    problems += [f"{len(unexpected)} unexpected ({_listed(unexpected)})"] if unexpected else []
    if shapes:
        problems.append(f"{len(shapes)} of another shape ({shapes[0]}: {tuple(found[shapes[0]].shape)} in the file, "
                        f"{tuple(expected[shapes[0]])} in a network of its other tensors' sizes)")
    if problems:
        raise VggtWeightsError(f"{path} does not fit VGGT's released layout: tensors {'; '.join(problems)}. Give the "
                               f"unmodified model.safetensors or model.pt of a release: {where_to_get()}")


def load_network(path: Path, device: torch.device | str = "cpu") -> VggtNetwork:
    """The network of the weights file ``path`` on ``device`` (float32), every tensor checked by name and shape."""
    try:
        state = read_weights(path)  # safetensors, or torch.load(weights_only=True): never unpickles objects
    except VggtWeightsError:
        raise
    except GeneratorLoadError as error:
        raise VggtWeightsError(f"{error}: {where_to_get()}") from None
    arch = architecture_from_state(state, path)
    with torch.device("meta"):
        network = VggtNetwork(arch)
    expected = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    check_fit(path, state, expected)
    network = network.to_empty(device=device)
    network.load_state_dict({k: v for k, v in state.items() if k in expected})
    network.aggregator.reset_constants()
    log.info("VGGT loaded from %s (%.1f M parameters: %d frame and %d global blocks %d wide)", path,
             sum(v.numel() for v in expected_tensors(state, expected)) / 1e6, arch.depth, arch.depth, arch.embed_dim)
    return network.eval().requires_grad_(False)


def expected_tensors(state: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> list[Tensor]:
    """The tensors of ``state`` the network uses."""
    return [v for k, v in state.items() if k in expected]
