"""Variational score distillation (ProlificDreamer): SDS against a LoRA model of the renders themselves.

The gradient is ``w(t) (eps_pretrained_cfg - eps_lora)``, where ``eps_lora`` comes from a LoRA copy of
the UNet (peft adapters on the same frozen weights, toggled per call) conditioned on the camera. The
camera enters through diffusers' ``class_embedding`` hook: the UNet adds
``class_embedding(class_labels)`` to its timestep embedding, and we install a small MLP of the
flattened camera-to-world matrix there. Its labels carry a 17th "use camera" entry that multiplies
the MLP's output, so the pretrained calls (flag 0) see exactly the original embedding and every call
has the same signature (one compiled graph family). Each call also trains the LoRA and the MLP on the
rendered latents (diffusion loss at random t, own optimizer); the base weights never change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import bounded
from lift3d.guidance.loading import DiffusionModels
from lift3d.guidance.score import add_noise, to_epsilon, training_target
from lift3d.guidance.sds import StableDiffusionConfig, StableDiffusionGuidance
from lift3d.registry import register

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # the attention projections ProlificDreamer adapts


@dataclass
class VSDConfig(StableDiffusionConfig):
    """VSD: the Stable Diffusion options plus the LoRA model of the renders."""

    guidance_scale: float = 7.5  # classifier-free guidance scale of the pretrained estimate (ProlificDreamer: 7.5)
    lora_rank: int = bounded(4, low=1)  # rank of the LoRA adapters on the UNet's attention projections
    lora_alpha: float = bounded(4.0, above=0)  # LoRA scale numerator (the update is scaled by lora_alpha / lora_rank)
    lora_lr: float = bounded(1e-3, low=0)  # learning rate of the LoRA and camera-MLP optimizer (AdamW)
    lora_weight_decay: float = bounded(0.0, low=0)  # AdamW weight decay of the LoRA optimizer
    lora_steps: int = bounded(1, low=0)  # LoRA updates per guidance call
    lora_max_step_percent: float = bounded(1.0, above=0, high=1)  # the LoRA trains on t ~ U[0, this * T)
    camera_condition: bool = True  # condition the LoRA model on the camera (c2w) through an MLP
    # probability of training a view without its camera (keeps an unconditional mode)
    camera_dropout: float = bounded(0.1, low=0, high=1)
    camera_hidden: int = bounded(256, low=1)  # hidden width of the camera MLP


class CameraEmbedding(nn.Module):
    """class_labels [N, 17] = (flattened c2w [16], use flag [1]) -> flag * MLP(c2w) [N, E].

    The last layer starts at zero so the LoRA model starts as the pretrained one."""

    def __init__(self, out_dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.SiLU(), nn.Linear(hidden, out_dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, labels: Tensor) -> Tensor:
        labels = labels.to(self.net[0].weight.dtype)
        return labels[:, 16:17] * self.net(labels[:, :16])


@register("stable-diffusion-vsd")
class VSDGuidance(StableDiffusionGuidance):
    """ProlificDreamer guidance; ``loss_vsd`` carries the gradient, ``loss_lora`` reports the LoRA fit."""

    Config = VSDConfig
    graph_capture_safe = False  # LoRA adapters are switched off and on between UNet calls
    loss_name = "loss_vsd"

    def __init__(self, cfg: Any = None, models: DiffusionModels | None = None) -> None:
        super().__init__(cfg, models)
        cfg = self.cfg
        if cfg.fuse_qkv:
            raise ValueError("guidance.fuse_qkv cannot be used with VSD: its LoRA adapts the separate q/k/v projections")
        if cfg.cpu_offload == "sequential":
            raise ValueError("guidance.cpu_offload=sequential cannot train VSD's LoRA; use cpu_offload=model or none")
        from peft import LoraConfig

        unet = self.unet
        if unet.class_embedding is not None:
            raise ValueError("this UNet already has a class embedding; VSD's camera conditioning needs that slot free")
        unet.add_adapter(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=LORA_TARGETS))
        time_dim = unet.time_embedding.linear_2.out_features
        unet.class_embedding = CameraEmbedding(time_dim, cfg.camera_hidden)
        self.trainable: dict[str, nn.Parameter] = {}
        for name, param in unet.named_parameters():
            trainable = "lora_" in name or name.startswith("class_embedding.")
            param.requires_grad_(trainable)
            if trainable:
                param.data = param.data.float()  # trained in fp32 (autocast runs them in the model's dtype)
                self.trainable[name] = param
        self.optimizer = torch.optim.AdamW(self.trainable.values(), lr=cfg.lora_lr, weight_decay=cfg.lora_weight_decay)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.dtype == torch.float16)  # LoRA loss scaling in fp16
        self._synced = False

    # ------------------------------------------------------------------ helpers
    def _ready(self) -> None:
        placed = self._placed
        super()._ready()
        if placed != self.execution_device:
            for param in self.trainable.values():  # _ready casts the model to its dtype; LoRA weights stay fp32
                param.data = param.data.float()
            if self.scaler.is_enabled() and self.dtype != torch.float16:
                self.scaler = torch.amp.GradScaler("cuda", enabled=False)

    @contextlib.contextmanager
    def lora_disabled(self) -> Iterator[None]:
        self.unet.disable_adapters()
        try:
            yield
        finally:
            self.unet.enable_adapters()

    def _autocast(self) -> Any:
        device = self.execution_device.type
        return torch.autocast(device, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def camera_labels(self, batch: dict[str, Any], n: int, use: Tensor | None = None) -> Tensor:
        """class_labels [n, 17]: flattened c2w and the flag (1: conditioned, 0: as the pretrained model)."""
        labels = torch.zeros(n, 17, device=self.execution_device)
        if use is None:
            use = torch.ones(n, device=self.execution_device)
        if self.cfg.camera_condition and "cameras" in batch:
            labels[:, :16] = batch["cameras"].c2w.reshape(n, 16).to(self.execution_device)
            labels[:, 16] = use
        return labels

    def unet_forward(self, x: Tensor, t: Tensor, context: Tensor, class_labels: Tensor | None = None) -> Tensor:
        if class_labels is None:  # pretrained calls: the camera MLP adds exactly zero
            class_labels = torch.zeros(x.shape[0], 17, device=x.device)
        return super().unet_forward(x, t, context, class_labels)

    # ------------------------------------------------------------------ the VSD estimate
    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        with self.lora_disabled():
            return super().predict_noise(x_t, t, batch)

    def reference_noise(self, x_t: Tensor, t: Tensor, noise: Tensor, batch: dict[str, Any]) -> Tensor:
        n = x_t.shape[0]
        cond = self.prompts(batch, n, self.execution_device, self.dtype).cond
        with self._autocast():
            out = self.unet_forward(x_t, t, cond, self.camera_labels(batch, n)).float()
        return to_epsilon(out, x_t, self.alphas_cumprod[t], self.prediction_type)

    # ------------------------------------------------------------------ training the LoRA model
    def _sync_for_ddp(self, grads: bool) -> None:
        """Under torch.distributed: same initial LoRA on every rank, gradients averaged."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        params = self.trainable.values()
        tensors = [p.grad for p in params if p.grad is not None] if grads else [p.data for p in params]
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])  # one collective, not one per tensor
        if grads:
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
        else:
            dist.broadcast(flat, src=0)
        offset = 0
        for tensor in tensors:
            tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()

    def after_gradient(self, x: Tensor, batch: dict[str, Any]) -> dict[str, Tensor]:
        if torch.is_inference_mode_enabled():
            return {}
        if not self._synced:
            self._sync_for_ddp(grads=False)
            self._synced = True
        n = x.shape[0]
        x0 = x.float()
        cond = self.prompts(batch, n, self.execution_device, self.dtype).cond
        high = max(int(self.num_train_timesteps * self.cfg.lora_max_step_percent), 1)
        losses = []
        with torch.enable_grad():
            for _ in range(self.cfg.lora_steps):
                t = torch.randint(0, high, (n,), device=x0.device)
                noise = torch.randn_like(x0)
                alpha_bar = self.alphas_cumprod[t]
                keep = (torch.rand(n, device=x0.device) >= self.cfg.camera_dropout).float()
                with self._autocast():
                    out = self.unet_forward(add_noise(x0, noise, alpha_bar), t, cond, self.camera_labels(batch, n, keep))
                loss = F.mse_loss(out.float(), training_target(x0, noise, alpha_bar, self.prediction_type))
                self.optimizer.zero_grad(set_to_none=True)
                self.scaler.scale(loss).backward()
                self._sync_for_ddp(grads=True)
                self.scaler.step(self.optimizer)  # a plain optimizer step when the scaler is disabled (fp32/bf16)
                self.scaler.update()
                losses.append(loss.detach())
        return {"loss_lora": torch.stack(losses).mean()}

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """LoRA and camera-MLP weights, optimizer and grad-scaler state (plain tensors: weights_only-safe)."""
        return {
            "params": {name: p.detach().cpu().clone() for name, p in self.trainable.items()},
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        saved = state["params"]
        wrong = sorted(n for n, p in self.trainable.items() if n not in saved or saved[n].shape != p.shape)
        if wrong:
            raise KeyError(
                f"the VSD checkpoint state does not fit this LoRA ({len(wrong)} tensors missing or of another shape, e.g. "
                f"{wrong[:2]}): was it saved with another lora_rank or camera_hidden?"
            )
        with torch.no_grad():
            for name, param in self.trainable.items():
                param.copy_(state["params"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self._synced = True  # every rank loaded the same weights
