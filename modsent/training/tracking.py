"""Experiment tracking of every training stage: TensorBoard event files or a Weights & Biases run.

The config's ``tracking.report_to`` (the ``report_to`` convention of transformers' Trainer:
none, tensorboard, wandb) is a runtime setting. :func:`modsent.logs.start_job` puts it, with the
directory beside the rule's log and the job's name, into the environment (``MODSENT_TRACKING``),
so that every training loop of the job finds it, also in processes torchrun starts;
:class:`modsent.training.loop.TrainingLog` (SE, CLA, the baselines, the ablations, the methods)
and the language adapter report through :func:`job_tracker`. Only the main process reports.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from modsent.io import InputError

ENV = "MODSENT_TRACKING"
KINDS = ("none", "tensorboard", "wandb")


class Tracker:
    """Scalars to TensorBoard (``out_dir``) or to a Weights & Biases run (``project``/``run_name``)."""

    def __init__(self, kind: str, out_dir: str | Path, run_name: str, config: dict | None = None,
                 project: str = "modsent"):
        if kind not in KINDS:
            raise InputError(f"tracking: {kind!r} is not one of {', '.join(KINDS)}")
        self.kind, self.writer = kind, None
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise InputError("tracking: tensorboard needs the `tensorboard` package "
                                 "(pip install -e .[tracking])") from err
            self.writer = SummaryWriter(log_dir=str(out_dir))
        elif kind == "wandb":
            try:
                import wandb
            except ImportError as err:
                raise InputError("tracking: wandb needs the `wandb` package (pip install -e .[tracking])") from err
            self.writer = wandb.init(project=project, name=run_name, config=config or {}, reinit=True)

    def log(self, step: int, values: dict) -> None:
        if self.kind == "tensorboard":
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        elif self.kind == "wandb":
            self.writer.log(values, step=step)

    def close(self) -> None:
        if self.writer is not None:
            (self.writer.close if self.kind == "tensorboard" else self.writer.finish)()
            self.writer = None


def configure_job(settings: dict | None, log_path: str | Path | None, run_name: str) -> None:
    """Record the config's ``tracking`` section for the training loops of this job (and the
    processes it starts): the event files go to ``tensorboard/<log name>/`` beside the log."""
    settings = settings or {}
    kind = settings.get("report_to", "none")
    if kind == "none" or log_path is None:
        os.environ.pop(ENV, None)
        return
    log_path = Path(log_path)
    os.environ[ENV] = json.dumps({"report_to": kind, "project": settings.get("project", "modsent"),
                                  "dir": str(log_path.parent.resolve() / "tensorboard" / log_path.stem),
                                  "run": run_name})


def job_settings() -> dict | None:
    """This job's tracking settings (:func:`configure_job`), or None when it reports nowhere."""
    value = os.environ.get(ENV)
    return json.loads(value) if value else None


def job_tracker(desc: str, config: dict | None = None) -> Tracker | None:
    """A tracker for the training loop ``desc`` (e.g. "SE de") of this job, or None. Event
    files of several loops of one job go to subdirectories named after them."""
    settings = job_settings()
    if settings is None:
        return None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", desc).strip("_") or "train"
    return Tracker(settings["report_to"], Path(settings["dir"]) / slug, f"{settings['run']} {desc}", config,
                   project=settings.get("project", "modsent"))
