"""A training step's loss and gradients replayed as one CUDA graph.

A NeRF step is a few hundred small kernels; launched one by one from Python the GPU waits on the host (most of
the step's time is launch overhead, not device work). Captured once into a CUDA graph, the whole forward and
backward is one launch. A captured step needs static shapes and no host syncs: the volume renderer's sample
budgets give both, and the graph is captured again whenever they (or anything else in the caller's ``key``) change.

Inputs are copied into static buffers before each replay; the gradients land in tensors the graph owns and are
handed to the parameters afterwards (``assign_gradients``), so the optimizer, gradient clipping and the
non-finite checks run eagerly as before; or a caller's ``update`` (a capturable optimizer's step) is captured after
the backward pass and consumes them inside the graph. A capture that fails leaves CUDA's random-number generator unusable for
the rest of the process, so there is no silent fallback: the error names the option that turns capture off.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

from lift3d.aftercare import describe

Compute = Callable[[dict[str, Tensor]], tuple[Tensor, dict[str, Tensor]]]


class GraphCaptureError(RuntimeError):
    """The training step could not be captured as a CUDA graph (it waits on the host, or a kernel cannot be
    captured)."""


class CapturedStep:
    """Replays ``compute(inputs) -> (loss, outputs)`` followed by ``loss.backward()`` as one CUDA graph.

    ``run`` returns the graph's outputs (valid until the next ``run``), with ``grad:<name>`` the gradient of each
    output that retained it (``retain_grad``); ``assign_gradients`` then sets each parameter's ``.grad`` to the
    gradient the replay wrote. ``hint`` ends the message of a failed capture: how the user turns capture off.
    ``rewarm_steps`` eager passes precede every capture after the first (kernels are compiled by then). An
    ``update`` given to ``run`` is captured after the backward pass (never run in the warm-up passes, so
    they change no parameter) and replayed with it."""

    def __init__(self, params: list[Tensor], warmup_steps: int = 2, hint: str = "", rewarm_steps: int | None = None) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.warmup_steps = warmup_steps
        self.rewarm_steps = warmup_steps if rewarm_steps is None else rewarm_steps
        self.captures = 0  # how many times a graph was captured (a new key each time)
        self.replays = 0
        self.hint = hint
        self._key: Hashable | None = None
        self._graph: Any = None
        self._inputs: dict[str, Tensor] = {}
        self._outputs: dict[str, Tensor] = {}
        self._grads: list[Tensor | None] = []

    def run(self, key: Hashable, inputs: dict[str, Tensor], compute: Compute,
            update: Callable[[], None] | None = None) -> dict[str, Tensor]:
        """Copy ``inputs`` into the graph's buffers and replay it (capturing first when ``key``, the shapes of the
        inputs or the parameters' storage changed). ``update``, captured after the backward pass, must keep the
        same tensors for as long as ``key`` stays the same; ``key`` must tell runs with and without it apart."""
        full_key = (key, tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(inputs.items())),
                    tuple(p.data_ptr() for p in self.params))
        if full_key != self._key:
            try:
                self._capture(full_key, inputs, compute, update)
            except Exception as error:
                self._release()
                raise GraphCaptureError(f"the training step could not be captured as a CUDA graph ({describe(error)})"
                                        f"{'; ' + self.hint if self.hint else ''}") from error
        else:
            for name, value in inputs.items():
                self._inputs[name].copy_(value, non_blocking=True)
        self._graph.replay()
        self.replays += 1
        return self._outputs

    def set_params(self, params: list[Tensor]) -> None:
        """Train these parameters from now on (a model that replaces its tensors, as densification does); the next
        ``run`` captures again."""
        self.params = [p for p in params if p.requires_grad]

    def assign_gradients(self) -> None:
        """Give every parameter the gradient of the last replay (after the trainer has zeroed them)."""
        for param, grad in zip(self.params, self._grads):
            param.grad = grad

    def _capture(self, key: Hashable, inputs: dict[str, Tensor], compute: Compute,
                 update: Callable[[], None] | None) -> None:
        self._release()
        self._inputs = {name: value.detach().clone() for name, value in inputs.items()}
        saved = [p.grad for p in self.params]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles kernels and sizes cuBLAS workspaces outside the capture
            for _ in range(self.warmup_steps if self.captures == 0 else self.rewarm_steps):
                for param in self.params:
                    param.grad = None
                loss, _ = compute(self._inputs)
                loss.backward()
                del loss  # a live autograd graph would keep its gradient accumulators bound to this pass
        torch.cuda.current_stream().wait_stream(side)
        for param in self.params:
            param.grad = None  # so the captured backward allocates every gradient inside the graph's pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            loss, outputs = compute(self._inputs)
            loss.backward()
            if update is not None:
                update()
        self._grads = [p.grad for p in self.params]
        for param, grad in zip(self.params, saved):
            param.grad = grad
        retained = {f"grad:{name}": value.grad for name, value in outputs.items() if value.retains_grad}
        self._outputs = {"loss": loss.detach(), **{name: value.detach() for name, value in outputs.items()},
                         **{name: grad for name, grad in retained.items() if grad is not None}}
        self._graph, self._key = graph, key
        self.captures += 1

    def _release(self) -> None:
        self._graph, self._key, self._outputs, self._grads = None, None, {}, []
