"""The parts of a training step that every stage shares. Each stage writes its own loop with
them, top to bottom (set the rate, seed the step's dropout, the loss under autocast, backward,
clip and step, record, checkpoint), so a reader sees the whole step in one place and no stage
hands its step to a framework of callbacks. Precision and fp16's loss scaler:
modsent.training.precision.

    scaler = grad_scaler(device, cfg.precision)
    resumed = resume(checkpoint_dir, model, optimizer, fingerprint, scaler)
    log = TrainingLog(total_steps, start, "SE de", progress, cfg.log_every, resumed)
    model.train()
    for step, batch in enumerate(batches, start=start):
        lr = set_learning_rate(optimizer, learning_rate(step))
        torch.manual_seed(dropout_seed(step, cfg.seed))
        with autocast(device, cfg.precision):
            loss = batch_loss(batch)
        scaler.scale(loss).backward()
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        log.record(step, loss.item(), lr, len(batch))
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint, log.state(...), scaler)
    losses, history, pairs_seen, seconds = log.close()
"""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger(__name__)


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` on ``device``. From the CPU to a GPU the copy goes through pinned memory and
    does not block the host, which can go on queueing work while the GPU finishes the previous
    step (a plain ``.to(device)`` from pageable memory waits for the GPU). A tensor that is
    pinned already is sent itself: do not change it in place before the GPU has read it."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Every parameter group's rate for the coming step; returns it."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(optimizer: torch.optim.Optimizer, trainable, max_grad_norm: float,
                   scaler: torch.amp.GradScaler | None = None) -> None:
    """Clip the gradients of ``trainable`` to ``max_grad_norm`` (global L2), step, clear them.
    With fp16's ``scaler`` (modsent.training.precision.grad_scaler) the gradients are unscaled
    before clipping, and a step whose gradients overflowed is skipped and the scale lowered; a
    disabled scaler changes nothing."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def checkpoint_due(step: int, every: int, total_steps: int, checkpoint_dir) -> bool:
    """Whether a checkpoint is written after ``step`` steps: every ``every`` steps, not after
    the last (the output follows), only by the main process of a process group, and only when
    there is a ``checkpoint_dir``."""
    from modsent import distributed

    return (checkpoint_dir is not None and distributed.is_main()
            and step % every == 0 and step < total_steps)


def report_step(desc: str, step: int, total_steps: int, loss: float, lr: float, tracker=None) -> None:
    """A logged step, in the main process: a line of the log (the rule's log) and, when the
    job reports somewhere (modsent.training.tracking), the tracker's loss and rate."""
    log.info("%s: step %d/%d, loss %.4f, lr %.3g", desc, step, total_steps, loss, lr)
    if tracker is not None:
        tracker.log(step, {"train/loss": loss, "train/lr": lr})


class TrainingLog:
    """The losses of every step, the logged history (``[step, loss, lr]`` every ``log_every``
    steps, the first and the last), pairs seen and seconds of this run, and a progress bar.
    ``resumed``: the checkpoint's extra state (its ``losses`` and ``history`` continue). Each
    logged step also goes to the log (the rule's log) and, in the main process, to the job's
    tracker (config ``tracking.report_to``: modsent.training.tracking)."""

    def __init__(self, total_steps: int, start_step: int, desc: str, progress: bool, log_every: int,
                 resumed: dict | None = None):
        from tqdm.auto import tqdm

        from modsent import distributed
        from modsent.training import tracking

        self.main = distributed.is_main()
        self.tracker = tracking.job_tracker(desc) if self.main else None
        self.desc = desc
        self.total_steps, self.log_every = total_steps, log_every
        self.losses: list[float] = list(resumed["losses"]) if resumed else []
        self.history: list[list[float]] = [list(row) for row in resumed["history"]] if resumed else []
        self.pairs_seen, self.start_time = 0, time.perf_counter()
        self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, disable=not progress, unit="step")

    def record(self, step: int, loss: float, lr: float, pairs: int) -> None:
        """Step ``step`` (0-based) is done: its loss, rate and number of pairs."""
        self.pairs_seen += pairs
        self.losses.append(loss)
        if (step + 1) % self.log_every == 0 or step == 0 or step + 1 == self.total_steps:
            self.history.append([step + 1, loss, lr])
            self.bar.set_postfix(loss=f"{loss:.3f}")
            if self.main:
                report_step(self.desc, step + 1, self.total_steps, loss, lr, self.tracker)
        self.bar.update(1)

    def state(self, **extra) -> dict:
        """What a checkpoint keeps of the log (and ``extra``), as JSON."""
        return {"losses": self.losses, "history": self.history, **extra}

    def close(self) -> tuple[list[float], list[list[float]], int, float]:
        """(losses, history, pairs seen, seconds); the last two count this run's steps only."""
        self.bar.close()
        if self.tracker is not None:
            self.tracker.close()
        return self.losses, self.history, self.pairs_seen, time.perf_counter() - self.start_time
