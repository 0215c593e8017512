"""Memory and speed options of a diffusion guidance: attention kernels, slicing, offload, channels-last,
torch.compile with optional CUDA graphs. Each falls back cleanly (with one log line) where it cannot apply.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lift3d.config import ConfigError, choice

log = logging.getLogger(__name__)

ATTENTION = ("sdpa", "xformers", "default")
VAE_ATTENTION = ("math", "sdpa", "same")
OFFLOAD = ("none", "model", "sequential")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")


@dataclass
class ModelOptionsConfig:
    """How the frozen diffusion model runs: memory savers and speed-ups.

    The VAE's attention defaults to plain matmuls: its one 512-wide head over 4096 tokens sends SDPA's backward to a
    slow kernel. ``cpu_offload=model`` keeps the UNet in CPU memory between calls; ``sequential`` moves it layer by
    layer (needs accelerate; SDS only). ``cuda_graphs`` with ``compile`` is inductor's reduce-overhead mode; without
    it, the eager UNet forward is captured as CUDA graphs in seconds.
    """

    # sdpa (PyTorch scaled_dot_product_attention), xformers (if installed, else sdpa), default
    attention: str = choice("sdpa", among=ATTENTION)
    # the VAE's attention: math (matmuls + softmax), sdpa, or same (as attention)
    vae_attention: str = choice("math", among=VAE_ATTENTION)
    attention_slicing: bool = False  # compute attention in slices: less memory, slower (replaces the attention kernel)
    vae_slicing: bool = False  # run the VAE one image at a time: less memory for large batches
    # none, model (UNet in CPU memory between calls) or sequential (layer by layer)
    cpu_offload: str = choice("none", among=OFFLOAD)
    channels_last: bool = True  # channels-last memory format for UNet and VAE (faster fp16/bf16 convolutions on GPUs)
    fuse_qkv: bool = False  # fuse the attention q/k/v projections into one matmul (not with VSD's LoRA)
    compile: bool = False  # torch.compile the UNet (and the VAE encoder, see compile_vae); CUDA only, skipped on CPU
    compile_vae: bool = True  # with compile: also compile the VAE encode (forward and backward)
    # torch.compile mode when cuda_graphs is off: default, max-autotune-no-cudagraphs, ...
    compile_mode: str = choice("default", among=COMPILE_MODES)
    compile_fallback: bool = True  # if compiling fails (no compiler, unsupported op), warn once and run eagerly
    cuda_graphs: bool = False  # replay the UNet as CUDA graphs (no kernel-launch overhead), with or without compile
    cudnn_benchmark: bool = True  # let cuDNN time and pick the fastest convolution algorithms (CUDA only)


def check_options(cfg: ModelOptionsConfig) -> None:
    """Reject option combinations that cannot work, naming the fix (each option's choices are declared on its field)."""
    if cfg.cpu_offload != "none" and cfg.compile:
        raise ConfigError("system.guidance.cpu_offload moves the UNet's weights every call, which defeats "
                          "system.guidance.compile: turn one off, e.g. system.guidance.compile=false")
    if cfg.fuse_qkv and cfg.attention_slicing:
        raise ConfigError("system.guidance.fuse_qkv and system.guidance.attention_slicing each replace the attention "
                          "kernel: pick one, e.g. system.guidance.attention_slicing=false")


def sdpa_processors(model: Any) -> dict[str, Any]:
    """PyTorch-SDPA attention processors for every attention layer of ``model``: the added-KV kind where a layer
    attends over extra key/value projections of the text (DeepFloyd IF's and Kandinsky's UNets), else the plain one."""
    from diffusers.models.attention_processor import Attention, AttnAddedKVProcessor2_0, AttnProcessor2_0

    processors = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            added_kv = getattr(module, "added_kv_proj_dim", None) is not None
            processors[f"{name}.processor"] = AttnAddedKVProcessor2_0() if added_kv else AttnProcessor2_0()
    return processors


def configure_attention(unet: Any, vae: Any | None, cfg: ModelOptionsConfig) -> None:
    """Choose the attention kernel, slicing and QKV fusion (device-independent); ``vae`` None: a pixel-space model."""
    attention = cfg.attention
    if attention == "xformers" and importlib.util.find_spec("xformers") is None:
        log.info("guidance.attention=xformers but xformers is not installed; using PyTorch SDPA")
        attention = "sdpa"
    if attention == "sdpa":
        unet.set_attn_processor(sdpa_processors(unet))
        if vae is not None:
            vae.set_attn_processor(sdpa_processors(vae))
    elif attention == "xformers":
        unet.enable_xformers_memory_efficient_attention()
    if vae is not None and cfg.vae_attention != "same":
        from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

        vae.set_attn_processor(AttnProcessor() if cfg.vae_attention == "math" else AttnProcessor2_0())
    if cfg.fuse_qkv:
        unet.fuse_qkv_projections()
    if cfg.attention_slicing:
        unet.set_attention_slice("auto")
    if cfg.vae_slicing and vae is not None:
        vae.enable_slicing()


def set_memory_format(modules: list[Any], channels_last: bool) -> None:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for module in modules:
        module.to(memory_format=fmt)


def compile_fn(fn: Callable[..., Any], cfg: ModelOptionsConfig) -> Callable[..., Any]:
    """``fn`` compiled with the configured mode (reduce-overhead when cuda_graphs is on), falling back to
    ``fn`` itself when compilation fails and ``compile_fallback`` is on."""
    mode = "reduce-overhead" if cfg.cuda_graphs else cfg.compile_mode
    compiled = torch.compile(fn, mode=mode, dynamic=False)
    return CompileFallback(compiled, fn, getattr(fn, "__name__", type(fn).__name__)) if cfg.compile_fallback else compiled


class GraphedForward:
    """``fn`` (a frozen model's forward without gradients) captured as one CUDA graph per input signature and
    replayed: one launch instead of hundreds, no compilation. Tensor inputs are copied into the graph's static
    buffers; the result is the graph's own output buffer, overwritten by the next replay (callers clone it).
    Calls with gradients enabled, or on CPU tensors, run ``fn`` eagerly."""

    def __init__(self, fn: Callable[..., Any], warmup: int = 2) -> None:
        self.fn, self.warmup = fn, warmup
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[Any], Any]] = {}

    @staticmethod
    def _signature(values: list[Any]) -> tuple:
        return tuple((tuple(v.shape), v.dtype, v.device, v.stride()) if isinstance(v, torch.Tensor) else repr(v) for v in values)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        names = list(kwargs)
        values = list(args) + [kwargs[k] for k in names]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if torch.is_grad_enabled() or not tensors or tensors[0].device.type != "cuda":
            return self.fn(*args, **kwargs)
        key = (len(args), tuple(names), self._signature(values))
        if key not in self.graphs:
            self.graphs[key] = self._capture(values, len(args), names)
        graph, static, out = self.graphs[key]
        for buffer, value in zip(static, values):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(value)
        graph.replay()
        return out

    def _capture(self, values: list[Any], n_args: int, names: list[str]) -> tuple[torch.cuda.CUDAGraph, list[Any], Any]:
        static = [v.clone(memory_format=torch.preserve_format) if isinstance(v, torch.Tensor) else v for v in values]

        def call() -> Any:
            return self.fn(*static[:n_args], **dict(zip(names, static[n_args:])))

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (cuDNN picks its algorithms, lazy buffers appear)
            for _ in range(self.warmup):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        log.info("captured a CUDA graph of %s for inputs %s", getattr(self.fn, "__name__", type(self.fn).__name__),
                 [tuple(v.shape) for v in values if isinstance(v, torch.Tensor)])
        return graph, static, out


class CompileFallback:
    """Calls ``compiled``; if it raises a compiler error (not an error of the inputs, which the eager ``fn``
    would raise too), logs one warning and calls ``fn`` from then on. ``failed`` says which one runs."""

    def __init__(self, compiled: Callable[..., Any], fn: Callable[..., Any], what: str) -> None:
        self.compiled, self.fn, self.what = compiled, fn, what
        self.failed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed:
            return self.fn(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as error:  # noqa: BLE001  (compiler failures come in many types; the eager call re-raises real errors)
            if not is_compiler_error(error):
                raise
            self.failed = True
            log.warning("torch.compile of %s failed (%s: %s); running it eagerly (guidance.compile_fallback)",
                        self.what, type(error).__name__, str(error).strip().splitlines()[0][:200] if str(error).strip() else "")
            return self.fn(*args, **kwargs)


def is_compiler_error(error: BaseException) -> bool:
    """True for errors raised by torch.compile's machinery (dynamo, inductor, triton, the C++ toolchain)."""
    for e in _chain(error):
        module, name = type(e).__module__, type(e).__name__
        if module.startswith(("torch._dynamo", "torch._inductor", "triton")) or name in COMPILER_ERRORS:
            return True
    return False


COMPILER_ERRORS = ("BackendCompilerFailed", "InductorError", "CompilationError", "CppCompileError")


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


class ModelOffload:
    """Keeps a module in CPU memory between uses (``cpu_offload=model``) or streams it layer by layer
    (``sequential``, via accelerate); a no-op on CPU or with ``none``."""

    def __init__(self, module: torch.nn.Module, mode: str) -> None:
        self.module, self.mode, self.device = module, mode, torch.device("cpu")
        self._hooked = False

    @property
    def active(self) -> bool:
        return self.mode != "none" and self.device.type == "cuda"

    def place(self, device: torch.device) -> None:
        """Where the module runs; with offload active its weights stay in CPU memory."""
        if self.mode != "none" and device.type != "cuda":
            log.info("guidance.cpu_offload=%s has no effect on %s", self.mode, device)
        self.device = device
        if not self.active:
            self.module.to(device)
            return
        self.module.to("cpu")
        if self.mode == "sequential" and not self._hooked:
            try:
                from accelerate import cpu_offload
            except ImportError:
                raise ImportError("guidance.cpu_offload=sequential needs accelerate: pip install accelerate") from None
            cpu_offload(self.module, execution_device=device)
            self._hooked = True

    def __enter__(self) -> torch.nn.Module:
        if self.active and self.mode == "model":
            self.module.to(self.device)
        return self.module

    def __exit__(self, *exc: Any) -> None:
        if self.active and self.mode == "model":
            self.module.to("cpu")
