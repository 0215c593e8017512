"""Finding a generator's released files (a hub id or a local folder) and reading its weights, with one-line errors.

Weights are read from ``.safetensors`` (no code runs) or, where a release ships a PyTorch ``.ckpt``, with
``torch.load(weights_only=True)``. ``check_state`` compares a file's tensors with the model's by name and
shape, so a wrong or truncated checkpoint is refused with what is missing, not a traceback from deep inside.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from lift3d.generators.base import GeneratorLoadError

CONFIG_KEY = "system.generator.pretrained_model_name_or_path"


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` asks for no network access (read at call time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def is_local(name: str) -> bool:
    """Whether ``name`` means a folder on this machine rather than a hub id (``owner/model``)."""
    return Path(name).expanduser().is_dir() or name.startswith(("/", ".", "~")) or name.count("/") > 1


def model_file(name: str, candidates: tuple[str, ...], local_files_only: bool = False) -> Path:
    """The first of ``candidates`` (file names) found in the folder ``name`` or the hub repository ``name``."""
    if not name:
        raise GeneratorLoadError(f"no generator model given: set {CONFIG_KEY}=HUB_ID or a local folder")
    if is_local(name):
        folder = Path(name).expanduser()
        if not folder.is_dir():
            raise GeneratorLoadError(f"the generator folder {folder} does not exist: set {CONFIG_KEY} to a folder holding "
                                     f"{' or '.join(candidates)}")
        for candidate in candidates:
            if (folder / candidate).is_file():
                return folder / candidate
        raise GeneratorLoadError(f"{folder} has no {' or '.join(candidates)}: give the folder of the released model "
                                 f"({CONFIG_KEY}=/path/to/folder)")
    from huggingface_hub import hf_hub_download

    from lift3d.guidance.loading import hub_unreachable  # one quick request, shared with the diffusion models' loading

    unreachable = None if local_files_only or hub_offline() else hub_unreachable()
    offline = local_files_only or hub_offline() or unreachable is not None
    last: Exception | None = None
    for candidate in candidates:
        try:
            return Path(hf_hub_download(repo_id=name, filename=candidate, local_files_only=offline))
        except Exception as error:  # noqa: BLE001  (missing file, no network, gated repo: try the next name, then say so)
            last = error
    from huggingface_hub import constants

    files = " or ".join(candidates)
    if offline:
        why = f"the hub is not reachable ({unreachable})" if unreachable else "HF_HUB_OFFLINE is set" if hub_offline() \
            else "local_files_only is on"
        problem = f"{why}, and the local Hugging Face cache ({constants.HF_HUB_CACHE}) has no {files} of '{name}'"
    else:
        problem = f"the Hugging Face hub gave no {files} of '{name}': {hub_failure(last)}"
    raise GeneratorLoadError(
        f"cannot load the generator: {problem}. On a machine with internet, `hf download {name} --local-dir "
        f"/path/to/folder` makes a local copy; then set {CONFIG_KEY}=/path/to/folder"
    )


def hub_failure(error: BaseException | None) -> str:
    """Why the hub gave no file, in lift3d's words (the hub library's own sentences name its arguments, which a
    lift3d user never set): a gated or missing repository, a missing file, or the network's reason."""
    from lift3d.guidance.loading import network_reason

    kind = type(error).__name__
    if kind == "GatedRepoError":
        return "the repository is gated: accept its terms on huggingface.co, then log in here with `hf auth login`"
    if kind == "RepositoryNotFoundError":
        return "there is no such repository (or it is private: log in with `hf auth login`)"
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return "the repository has no such file (is it the model's release?)"
    return network_reason(error) if error is not None else "no answer"


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a ``.safetensors`` or a ``.ckpt``/``.pt`` state dict (never unpickling objects)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  (a corrupt or truncated file, whatever the reader raises)
        raise GeneratorLoadError(f"{path} is not a readable checkpoint ({type(error).__name__}: "
                                 f"{str(error).strip().splitlines()[0] if str(error).strip() else 'no details'})") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise GeneratorLoadError(f"{path} holds no state dict of tensors")
    return state


def check_state(path: Path, found: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Refuse ``found`` (name -> tensor) unless it has exactly the ``expected`` names with the expected shapes."""

    def listed(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = sorted(k for k in set(found) & set(expected) if tuple(found[k].shape) != tuple(expected[k]))
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing ({listed(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected ({listed(unexpected)})")
    if shapes:
        first = shapes[0]
        problems.append(f"{len(shapes)} of another shape ({first}: {tuple(found[first].shape)} in the file, "
                        f"{tuple(expected[first])} in the model of its config.yaml)")
    if problems:
        raise GeneratorLoadError(f"{path} does not fit the model of its config.yaml: weights {'; '.join(problems)}. "
                                 "Give the config.yaml and weights of one release, unmodified")
