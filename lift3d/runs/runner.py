"""Runs an experiment: run folder, Lightning trainer, loggers, checkpoints, resume, RNG state."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lift3d import aftercare
from lift3d.checkpoints import AtomicCheckpointIO, check_recipe, load_checkpoint
from lift3d.config import ConfigError, ExperimentConfig
from lift3d.interrupts import (
    Interrupted,
    StopAndSaveCallback,
    StopRequested,
    StopSignals,
    checkpoint_step,
    newest_checkpoint,
)
from lift3d.progress import ProgressFileCallback, update_progress
from lift3d.registry import find
from lift3d.rng import capture_rng_state, restore_rng_state
from lift3d.runs import run_dirs
from lift3d.runs.progress_bar import TrainingProgress
from lift3d.runs.rescale import apply_rescale
from lift3d.runs.run_dirs import (
    RUN_DIR_ENV,
    process_rank,
    run_dir_name,
    run_dir_of_checkpoint,
    shared_run_dir,
    write_configs,
)
from lift3d.runs.trainer_checks import check_trainer
from lift3d.runs.world import launch_layout, rank_line, training_layout, training_processes

log = logging.getLogger("lift3d")
# the callbacks a caller adds to a training run, given its config and run folder (the commands add the live viewer)
CallbackFactory = Callable[[ExperimentConfig, Path], Sequence[Callback]]


class RNGStateCallback(Callback):
    """Checkpoints every random generator and restores it before the first step after a resume."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return capture_rng_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the checkpoint holds rank 0's generators: other DDP ranks keep their own (seeded with seed + rank), or
        # every rank would draw rank 0's noise from the resume on
        if trainer.global_rank != 0:
            self._pending = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._pending is not None:
            restore_rng_state(self._pending)
            self._pending = None


class AnnounceCallback(Callback):
    """Says once where the run writes, so users can find their results; in a run of several processes each one says
    that it joined (its rank, machine and device)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:
            print("lift3d: " + rank_line(trainer.global_rank, trainer.world_size, trainer.local_rank, trainer.node_rank,
                                         trainer.strategy.root_device), flush=True)
        if trainer.is_global_zero:
            print(f"lift3d: writing to {self.run_dir}", flush=True)


def _progress_bar() -> Callback:
    # steps of the run's total, rate, time left and losses: a status line in a terminal, plain lines when piped
    return TrainingProgress()


def resolve_precision(precision: str, accelerator: str) -> str:
    """The configured precision, or 32-true where mixed/half precision would run on the CPU (Lightning
    would turn 16-mixed into slow bf16 autocast there), with one log line."""
    import torch

    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    if on_cpu and precision not in ("32-true", "32", "64-true", "64"):
        log.info("trainer.precision=%s needs a CUDA GPU; running 32-true on the CPU", precision)
        return "32-true"
    return precision


def build_trainer(cfg: ExperimentConfig, run_dir: Path, train: bool, devices: Any = None,
                  signals: StopSignals | None = None, callbacks: Sequence[Callback] = ()) -> L.Trainer:
    """A Lightning trainer for ``cfg``; ``devices`` overrides the config (the CLI's --gpus). With ``signals`` (the
    runner's), SIGINT / SIGTERM stop training at the end of a step with a checkpoint of it. ``callbacks`` are added
    to a training run after the runner's own (the commands pass the live viewer's)."""
    extra_callbacks = list(callbacks)
    tcfg = cfg.trainer
    processes = training_processes(tcfg, devices)
    devices, num_nodes = launch_layout(tcfg, devices)
    callbacks: list[Callback] = []
    if tcfg.enable_progress_bar:
        callbacks.append(_progress_bar())
    kwargs: dict[str, Any] = {}
    if train:
        every = cfg.checkpoint.every_n_train_steps
        callbacks += [
            ModelCheckpoint(
                dirpath=run_dir / "ckpts",
                filename="step{step:07d}",
                auto_insert_metric_name=False,
                every_n_train_steps=every if every > 0 else None,
                save_top_k=cfg.checkpoint.keep_periodic if every > 0 else 0,
                monitor="step" if every > 0 and cfg.checkpoint.keep_periodic > 0 else None,
                mode="max",
                save_last=cfg.checkpoint.save_last,
                save_on_train_epoch_end=True,
                # last.ckpt is always the run's newest checkpoint: a resumed run (its folder moved or copied, other
                # checkpoint settings) overwrites it instead of writing last-v1.ckpt beside a stale last.ckpt
                enable_version_counter=False,
            ),
            RNGStateCallback(),
            AnnounceCallback(run_dir),
            ProgressFileCallback(run_dir),
        ]
        callbacks.append(StopAndSaveCallback(signals or StopSignals(), run_dir / "ckpts", cfg.checkpoint.save_last,
                                             cfg.checkpoint.every_n_minutes, every, tcfg.sigterm_check_every))
        callbacks += extra_callbacks
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        kwargs["logger"] = [
            TensorBoardLogger(save_dir=str(run_dir), name="tb_logs", version="", default_hp_metric=False),
            CSVLogger(save_dir=str(run_dir), name="csv_logs", version=""),
        ]
        if tcfg.val_check_interval > 0:
            kwargs["val_check_interval"] = tcfg.val_check_interval
            kwargs["limit_val_batches"] = tcfg.limit_val_batches
        else:
            kwargs["limit_val_batches"] = 0
    else:
        kwargs["logger"] = False
        kwargs["limit_val_batches"] = tcfg.limit_val_batches
    strategy = tcfg.strategy
    if strategy == "auto" and processes > 1:
        strategy = ddp_strategy(find(cfg.system_type))
    trainer = L.Trainer(
        max_steps=tcfg.max_steps,
        max_epochs=-1,
        check_val_every_n_epoch=None,
        log_every_n_steps=tcfg.log_every_n_steps,
        precision=resolve_precision(tcfg.precision, tcfg.accelerator),
        accelerator=tcfg.accelerator,
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        num_sanity_val_steps=tcfg.num_sanity_val_steps,
        gradient_clip_val=tcfg.gradient_clip_val,
        enable_progress_bar=tcfg.enable_progress_bar,
        enable_model_summary=False,
        deterministic=tcfg.deterministic,
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(run_dir),
        enable_checkpointing=train,
        use_distributed_sampler=False,  # training samples per step and rank; evaluation runs on rank 0 (one writer)
        **kwargs,
    )
    if processes > 1 and tcfg.sigterm_check_every != 1:
        throttle_sigterm_broadcast(trainer, tcfg.sigterm_check_every)
    return trainer


def ddp_strategy(system_class: type) -> Any:
    """The strategy for several devices: the system's own (``ddp_strategy()``, e.g. the Gaussians' replicas), else
    DDP where parameters a step leaves without gradient (a background or shading branch not taken) do not stall
    the reduction. Each rank renders its own views (per-rank seeds)."""
    chosen = getattr(system_class, "ddp_strategy", None)
    strategy = chosen() if chosen is not None else None
    return "ddp_find_unused_parameters_true" if strategy is None else strategy


def throttle_sigterm_broadcast(trainer: L.Trainer, every: int) -> None:
    """Run Lightning's per-step SIGTERM agreement between DDP ranks only every ``every`` steps (0: never).

    Before each training step Lightning (2.5+) broadcasts rank 0's SIGTERM flag and reads it back with
    ``.item()``: a host sync per step, so the CPU cannot queue the next step while the GPU runs. Every rank is at
    the same global step, so the throttled collective still matches across ranks. Without that private hook
    (other Lightning versions) nothing changes."""
    loop = trainer.fit_loop.epoch_loop
    broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
    if broadcast is None:
        return

    def throttled() -> None:
        if every > 0 and trainer.global_step % every == 0:
            broadcast()

    loop._broadcast_sigterm_tensor = throttled


def build_parts(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The data module and system named by the config, the system given the data module's scene summary."""
    from lift3d.systems.base import BaseSystem

    # a data module refuses bad values of its config as a system's parts do: a config error naming it, exit 2
    datamodule = BaseSystem.build_part(cfg.data_type, cfg.data)
    system = find(cfg.system_type)(cfg.system)
    system.set_scene(datamodule.scene_summary())  # what the system may know of its data, handed over explicitly
    if hasattr(system, "set_training_layout"):  # what each rank renders a step: the Gaussians' memory estimate
        system.set_training_layout(*training_layout(cfg.data, cfg.data_type))
    return datamodule, system


def run_experiment(
    mode: str,
    cfg: ExperimentConfig,
    config_paths: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    devices: Any = None,
    callbacks: CallbackFactory | None = None,
) -> Path:
    """Run ``mode`` (train, validate, test, export) and return the run folder. ``callbacks(cfg, run_dir)``
    gives the callbacks to add to a training run (the commands' live viewer); the runner adds none of its own.
    A new training run that fails (an error, not a stop signal) is marked failed and set aside
    (``run_dirs.set_aside_failed``), so it never sits among the good runs as the newest one."""
    made: list[Path] = []  # the run folder this call made, if it made one
    try:
        return _run_experiment(mode, cfg, config_paths, overrides, devices, callbacks, made)
    except BaseException as error:
        if made and process_rank() == 0 and not isinstance(error, (KeyboardInterrupt, SystemExit, StopRequested)):
            run_dirs.set_aside_failed(made[0], error)
        raise


def _run_experiment(mode: str, cfg: ExperimentConfig, config_paths: Sequence[str | Path], overrides: Sequence[str],
                    devices: Any, callbacks: CallbackFactory | None, made: list[Path]) -> Path:
    if mode not in ("train", "validate", "test", "export"):
        raise ValueError(f"unknown mode {mode!r}")
    aftercare.reset()
    check_trainer(cfg)  # Lightning's own refusals come as tracebacks: every entry point gets lift3d's one-line errors
    if mode != "train" and not cfg.resume:
        raise ConfigError(f"'lift3d {mode}' needs a checkpoint: pass --resume PATH/TO/ckpts/last.ckpt")
    if cfg.resume:
        check_recipe(load_checkpoint(cfg.resume), cfg.system_type, cfg.resume)
    if mode == "train":  # several processes: the recipe's result sooner (every step count / the batch factor)
        rescaled = apply_rescale(cfg, config_paths, overrides, training_processes(cfg.trainer, devices))
        if rescaled is not None and process_rank() == 0:
            log.info(rescaled.line())
    # a resumed run continues in its checkpoint's folder; DDP ranks > 0 use rank 0's; a new run gets a folder of its own
    run_dir = (run_dir_of_checkpoint(cfg.resume) if cfg.resume else None) or shared_run_dir()
    if process_rank() == 0:
        try:
            if run_dir is None:
                run_dir = run_dirs.make_run_dir(cfg)  # through the module: tests redirect it
                made += [run_dir] if mode == "train" else []
            os.environ[RUN_DIR_ENV] = str(run_dir)  # for the DDP ranks launched from this process
            run_dir.mkdir(parents=True, exist_ok=True)
            if mode == "train":
                write_configs(run_dir, cfg, config_paths, overrides)
        except OSError as error:
            raise ConfigError(f"cannot write the run's folder {run_dir or Path(cfg.output_root) / cfg.name}: "
                              f"{error.strerror or error}; set output_root= to a folder you can write") from None
    elif run_dir is None:  # a rank started by an outside launcher (torchrun): rank 0's name, which it creates
        run_dir = run_dir_name(cfg)
    train = mode == "train"
    signals = StopSignals()
    extra = list(callbacks(cfg, run_dir)) if callbacks is not None and train else []
    trainer = build_trainer(cfg, run_dir, train=train, devices=devices if train else (devices or 1), signals=signals,
                            callbacks=extra)
    L.seed_everything(cfg.seed + trainer.global_rank, workers=True, verbose=False)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(run_dir / "save")
    if train and hasattr(system, "check_launch"):  # what cannot work on these ranks, said before the others start
        system.check_launch(trainer.world_size, trainer.callbacks)
    if mode == "train" and process_rank() == 0 and hasattr(datamodule, "write_records"):
        datamodule.write_records(run_dir)  # what the data module read (a capture's split, its normalization)
    with signals:
        try:
            if mode == "train":
                _train(cfg, run_dir, trainer, system, datamodule)
            elif mode == "validate":
                trainer.validate(system, datamodule=datamodule, ckpt_path=cfg.resume)
            elif mode == "test":
                trainer.test(system, datamodule=datamodule, ckpt_path=cfg.resume)
        except (StopRequested, KeyboardInterrupt, SystemExit) as error:
            if not signals.signum:
                raise
            raise _interrupted(error, signals.signum, run_dir, train, process_rank() == 0) from None
    return run_dir


def needs_final_validation(val_check_interval: int, step: int) -> bool:
    """Whether training that ended at ``step`` still owes its held-out scores: validation runs every
    ``val_check_interval`` steps (0: never), so a run whose last step is no multiple of it (a short run, a changed
    max_steps) is validated once more at its end, and every run ends with its PSNR and a validation grid."""
    return val_check_interval > 0 and step > 0 and step % val_check_interval != 0


def _train(cfg: ExperimentConfig, run_dir: Path, trainer: L.Trainer, system: Any, datamodule: Any) -> None:
    trainer.fit(system, datamodule=datamodule, ckpt_path=cfg.resume)
    if not trainer.interrupted and needs_final_validation(cfg.trainer.val_check_interval, trainer.global_step):
        trainer.validate(system, datamodule=datamodule, verbose=False)
    if cfg.trainer.run_test_after_fit and trainer.is_global_zero and not trainer.interrupted:
        tester = build_trainer(cfg, run_dir, train=False, devices=1)
        aftercare.attempt("the test renders", tester.test, system, datamodule=datamodule)
    if trainer.is_global_zero:
        status = "interrupted" if trainer.interrupted else "finished"
        last = run_dir / "ckpts" / "last.ckpt"
        update_progress(run_dir, status=status, problems=aftercare.problems(), checkpoint=str(last) if last.is_file() else None)


def _interrupted(error: BaseException, signum: int, run_dir: Path, train: bool, rank_zero: bool) -> Interrupted:
    """What a stop signal left: the checkpoint written at the step boundary, or (stopped at once: a second signal, or
    outside the training loop) the newest checkpoint on disk. Rank 0 records it in progress.json."""
    if isinstance(error, StopRequested):
        checkpoint, step = error.checkpoint, error.step
    elif train:
        checkpoint = newest_checkpoint(run_dir / "ckpts")
        step = checkpoint_step(checkpoint)
    else:
        checkpoint, step = None, None
    if train and rank_zero:
        from lift3d.interrupts import SIGNAL_NAMES

        reached = {"step": step} if isinstance(error, StopRequested) else {}  # else the callback wrote the step reached
        update_progress(run_dir, status="interrupted", **reached, checkpoint=str(checkpoint) if checkpoint else None,
                        checkpoint_step=step, signal=SIGNAL_NAMES.get(signum, str(signum)), error=None)
    return Interrupted(signum, step, checkpoint, run_dir if train else None, quiet=not rank_zero)
