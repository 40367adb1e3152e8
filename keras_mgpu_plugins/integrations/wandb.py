"""`WandbLogger`: one W&B record of a multi-device, multi-worker `fit`.

W&B's own Keras callbacks are not worker-aware: N workers make N unrelated runs
and upload N copies of each checkpoint. `WandbLogger` makes one run for the job
(`mode="chief"`) or one run per worker in a shared group (`mode="group"`),
records how the job was distributed, and logs the checkpoints that
`kmp.callbacks.ModelCheckpoint` writes and the metrics of
`kmp.callbacks.DeviceMetricsLogger` (through `keras_mgpu_plugins.callbacks.events`,
so the order of the callbacks does not matter). `wandb` is imported only by the
processes that log.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Any

import keras

from keras_mgpu_plugins import runtime
from keras_mgpu_plugins.callbacks import _freq, events
from keras_mgpu_plugins.integrations._wandb_artifacts import ArtifactQueue
from keras_mgpu_plugins.integrations._wandb_job import (
    agreed_group,
    job_config,
    measured_batch_sizes,
)
from keras_mgpu_plugins.integrations._wandb_logic import (
    StepCounter,
    worker_run_name,
)
from keras_mgpu_plugins.integrations._wandb_resume import Resume, agreed

MODES = ("chief", "group")
INSTALL_HINT = 'pip install "keras_mgpu_plugins[wandb]"'
JOB_ID_ENV = "KMP_JOB_ID"
logger = logging.getLogger("keras_mgpu_plugins")
FLUSH_TOPIC = "flush"  # proposed events topic: "publish what you still hold, now"


class WandbLogger(keras.callbacks.Callback):
    """Logs a (multi-worker) `fit` to Weights & Biases, once per job or per worker.

    Records in the run's config how the job was distributed (strategy, workers,
    replicas, global and per-replica batch size, devices and GPU models,
    versions of Python, TensorFlow, Keras and this package), merged with
    `config` (your keys win). Logs every epoch's logs with `"epoch"` (0-based, as
    Keras) at step = global batches done, and the `batch/`-prefixed logs every
    `log_freq` batches. Logs the per-device metrics that a
    `kmp.callbacks.DeviceMetricsLogger` of the same `fit` publishes, and each
    checkpoint that a `kmp.callbacks.ModelCheckpoint` completes as an artifact
    `model-<run id>` of type `"model"` with aliases `latest`, `epoch-N` (N as
    `{epoch}` in the checkpoint's file name) and `best` when it improved.

    An active run (`wandb.run`) is used, not replaced, and not finished; a run
    this logger starts is finished at the end of `fit`.

    With a `kmp.callbacks.BackupAndRestore` in the same `fit`, the run's id and last
    step are kept beside the backup: a job stopped (exit 75) and run again, or restarted
    by `kmp-launch --max-restarts`, continues the same run (`resume="allow"`), its steps
    monotonic (steps already logged are not logged again). An `id` of your own in
    `init_kwargs` is used as given instead.

    Args:
        project: W&B project (default: W&B's, e.g. `WANDB_PROJECT`).
        entity: W&B entity.
        name: Run name. In `"group"` mode each worker's run is
            `f"{name or 'run'}-worker{i}"`.
        group: W&B group. In `"group"` mode, if not given: `KMP_JOB_ID` if set
            (the same on every worker). If a worker has neither, the chief
            draws an id and broadcasts it to every worker at the start of `fit`.
        mode: `"chief"`: one run for the job, made by the chief; other workers
            make nothing and never import `wandb`. `"group"`: one run per
            worker, all in one group.
        config: Your config, merged over the recorded one.
        log_freq: `"epoch"`, `"batch"` (every batch) or a positive int: also log
            the batch logs every `log_freq` batches.
        log_checkpoints: Log completed `kmp` checkpoints as artifacts (chief only).
        **init_kwargs: Passed to `wandb.init` (e.g. `tags`, `dir`). W&B's own
            `mode` is taken by `mode` here: use `WANDB_MODE=offline` or
            `settings=wandb.Settings(mode="offline")`.

    Raises:
        ValueError: For an unknown `mode` or a bad `log_freq`.
        ImportError: If `wandb` is not installed.

    Example:
        >>> from keras_mgpu_plugins.integrations.wandb import WandbLogger
        >>> model.fit(x, y, epochs=10, callbacks=[
        ...     kmp.callbacks.ModelCheckpoint("ckpt/best.keras", save_best_only=True),
        ...     WandbLogger(project="mnist", mode="group"),
        ... ])
    """

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        mode: str = "chief",
        config: dict[str, Any] | None = None,
        log_freq: str | int = "epoch",
        log_checkpoints: bool = True,
        **init_kwargs: Any,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f'mode must be "chief" or "group". Received: mode={mode!r}')
        self.log_every = _freq.batches_between("log_freq", log_freq, batch=True)
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"config must be a dict. Received: config={config!r}")
        require_wandb()
        self.init_kwargs = dict(project=project, entity=entity, name=name, **init_kwargs)
        self.group, self.mode, self.config = group, mode, dict(config or {})
        self.log_checkpoints = bool(log_checkpoints)
        self.run: Any = None
        self._owns_run = False
        self._logs_here: bool | None = None  # None: fit not begun (events wait)
        self._sized = False
        self._steps: StepCounter | None = None
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._resume: Resume | None = None
        if self.log_every:  # a batch hook only when batch logs are asked for
            self.on_train_batch_end = self._log_batch
        self._listeners = (events.weak_listener(self, "_on_checkpoint"),
                           events.weak_listener(self, "_on_device_metrics"))
        self._artifacts = ArtifactQueue()

    def set_model(self, model: Any) -> None:
        previous = getattr(self, "_model", None)
        super().set_model(model)
        self._logs_here, self._pending = None, []
        for topic, listener in zip(("checkpoint_saved", "device_metrics"), self._listeners, strict=True):
            if previous is not None and previous is not model:
                events.unsubscribe(previous, topic, listener)
            events.subscribe(model, topic, listener)  # kept after fit: late events are reported

    def on_train_begin(self, logs: dict | None = None) -> None:
        here = runtime.of(self.model)
        if self.mode == "group":
            self.group = agreed_group(self.group or os.environ.get(JOB_ID_ENV), here)
        self._logs_here = self.mode == "group" or here.is_chief
        self._resume: Resume | None = agreed(self.model, here, self.mode, self.init_kwargs)
        # a failed wandb.init raises on every worker, naming the cause (none is left waiting)
        here.together(lambda: self._logs_here and self._open_run(here), "WandbLogger: wandb.init")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._steps is not None:
            self._steps.begin_epoch(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.run is not None and batch > 0 and not self._sized:
            self._record_batch_sizes(batch)

    def _log_batch(self, batch: int, logs: dict | None = None) -> None:
        if self.run is not None and (batch + 1) % self.log_every == 0 and logs:  # {}: skipped
            row = {f"batch/{k}": v for k, v in logs.items()}                     # on resuming
            self._log(row, self._steps.at(batch=batch))

    def _log(self, row: dict[str, Any], step: int) -> None:
        """`run.log` at `step`, unless a run this one resumes logged that step already."""
        if self._resume is None or step > self._resume.last_step:
            self.run.log(row, step=step)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.run is None:
            return
        if not self._sized and not any(k.startswith("val_") for k in logs or {}):
            self._record_batch_sizes(self.params.get("steps") or 1)  # 1-step epochs
        step = self._steps.at()
        self._log({**(logs or {}), "epoch": epoch}, step)
        if self._resume is not None and here_is_chief(self.model):
            self._resume.save(step)  # beside the backup: a resumed job continues this run

    def on_train_end(self, logs: dict | None = None) -> None:
        # Ask producers to publish what is still pending (an async checkpoint write)
        # before the run closes, whether their on_train_end runs before or after.
        events.publish(self.model, FLUSH_TOPIC, {"reason": "train_end"})
        self._artifacts.wait()
        run, self.run, self._steps, self._logs_here = self.run, None, None, False
        if run is not None and self._owns_run:
            run.finish()

    # --- the run -----------------------------------------------------------------

    def _open_run(self, here: runtime.Runtime) -> None:
        import wandb

        recorded = job_config(here, self.mode)
        if wandb.run is not None:
            self.run, self._owns_run = wandb.run, False
            self.run.config.setdefaults(recorded)
            self.run.config.update(self.config, allow_val_change=True)
        else:
            kwargs = dict(self.init_kwargs, config={**recorded, **self.config})
            if self.mode == "group":
                index = here.worker_index
                kwargs.update(group=self.group, name=worker_run_name(kwargs["name"], index))
            elif self.group is not None:
                kwargs["group"] = self.group
            if self._resume is not None:
                kwargs.update(id=self._resume.run_id, resume="allow")
            self.run, self._owns_run = wandb.init(**kwargs), True
            if self._resume is not None and here.is_chief:
                self._resume.save(self._resume.last_step)
        self._steps = StepCounter(self.params.get("steps"), start=int(self.run.step or 0))
        self._sized = False
        pending, self._pending = self._pending, []
        for topic, payload in pending:
            (self._on_checkpoint if topic == "checkpoint_saved" else self._on_device_metrics)(payload)

    def _record_batch_sizes(self, batches_done: int) -> None:
        self._sized = True
        measured = measured_batch_sizes(self.model, runtime.of(self.model), batches_done)
        self.run.config.setdefaults({k: v for k, v in measured.items() if k not in self.config})

    def _wait_or_drop(self, topic: str, payload: dict[str, Any]) -> bool:
        """Whether to handle `payload` now; keeps it if the run is not open yet."""
        if self._logs_here is None:  # published before on_train_begin
            self._pending.append((topic, payload))
        elif self._logs_here is False and topic == "checkpoint_saved":  # after fit ended
            logger.warning(
                "WandbLogger: checkpoint %s was completed after the W&B run was finished and "
                "is not logged. List WandbLogger after the checkpoint callback.", payload["path"],
            )
        return self.run is not None

    def _on_device_metrics(self, payload: dict[str, Any]) -> None:
        if not self._wait_or_drop("device_metrics", payload):
            return
        batch = payload.get("batch")  # DeviceMetricsLogger: batches done in the epoch
        step = self._steps.at(epoch=payload.get("epoch"), batch=None if batch is None else batch - 1)
        self._log(dict(payload.get("metrics", {})), step)

    def _on_checkpoint(self, payload: dict[str, Any]) -> None:
        if not self.log_checkpoints or not runtime.of(self.model).is_chief:
            return
        if not self._wait_or_drop("checkpoint_saved", payload):
            return
        self._artifacts.log(self.run, payload)  # hashed and uploaded off the training thread


# --- what the run records -------------------------------------------------------------


def here_is_chief(model: Any) -> bool:
    return runtime.of(model).is_chief


def require_wandb() -> None:
    """Raises an ImportError with the install hint when `wandb` is missing (not importing it)."""
    if "wandb" in sys.modules:
        missing = sys.modules["wandb"] is None
    else:
        missing = importlib.util.find_spec("wandb") is None
    if missing:
        raise ImportError(f"WandbLogger needs the wandb package: {INSTALL_HINT}")
