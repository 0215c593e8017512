"""Loading: the offline error message, dtype policy, and the lazily loaded, cached text encoder."""

from __future__ import annotations

import shutil

import pytest
import torch

from lift3d.guidance.loading import ModelLoadError, load_stable_diffusion, resolve_dtype
from lift3d.guidance.sds import StableDiffusionGuidance
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)


def test_offline_hub_id_names_model_what_was_tried_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError) as info:
        StableDiffusionGuidance({"pretrained_model_name_or_path": "someone/missing-model", "prompt": "a cat"})
    message = str(info.value)
    assert "'someone/missing-model'" in message
    assert "HF_HUB_OFFLINE is set" in message and "Hub was not contacted" in message
    assert " system.guidance.pretrained_model_name_or_path=/path/to/folder" in message
    assert "hf download someone/missing-model" in message
    assert "\n" not in message  # one line for the CLI


def test_local_files_only_and_missing_folders(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ModelLoadError, match="local_files_only is on"):
        load_stable_diffusion("someone/missing-model", torch.float32, local_files_only=True)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_stable_diffusion(str(tmp_path / "no" / "such" / "model"), torch.float32, local_files_only=True)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_sd_path(), broken)
    shutil.rmtree(broken / "unet")
    with pytest.raises(ModelLoadError, match=r"local folder .*broken \(its 'unet/' part\)"):
        load_stable_diffusion(str(broken), torch.float32)


def test_cli_reports_model_load_errors_in_one_line():
    from lift3d.cli import _user_errors

    assert ModelLoadError in _user_errors()


def test_dtype_policy():
    assert resolve_dtype("auto", cuda=False) == torch.float32
    assert resolve_dtype("auto", cuda=True) == torch.float16
    assert resolve_dtype("bf16", cuda=True) == torch.bfloat16
    assert resolve_dtype("fp16", cuda=False) == torch.float32  # half weights need a GPU
    with pytest.raises(ValueError, match="guidance.dtype"):
        resolve_dtype("int8", cuda=True)


def test_text_encoder_runs_only_on_cache_misses(tmp_path):
    cfg = {"pretrained_model_name_or_path": str(tiny_sd_path()), "prompt": "a cat", "resolution": 64,
           "prompt_cache_dir": str(tmp_path), "latent_input": True}
    first = StableDiffusionGuidance(cfg)
    batch = {"elevation_deg": torch.tensor([0.0]), "azimuth_deg": torch.tensor([0.0])}
    first(torch.randn(1, 8, 8, 4), batch)
    assert first.prompts.encoder_calls == 1
    second = StableDiffusionGuidance(cfg)
    second(torch.randn(1, 8, 8, 4), batch)
    assert second.prompts.encoder_calls == 0  # every embedding came from the disk cache
    a = first.prompts.embeddings(torch.device("cpu"), torch.float32)
    b = second.prompts.embeddings(torch.device("cpu"), torch.float32)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
