"""Logging for workflow scripts: every rule's script logs to the rule's `log:` file."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import re
import socket
import sys
import warnings
from pathlib import Path

from modsent.io import InputError

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ATTEMPT = "==== attempt"
# Warnings that say nothing about a job, kept out of its log: (category, message start). PEFT
# 0.21 asks every model it wraps through a transformers method renamed in 5.x (the tests filter
# it too: pyproject.toml's filterwarnings).
LIBRARY_NOISE = [(FutureWarning, "`is_gradient_checkpointing` is deprecated")]


def attempts_log(log_path: str | Path) -> Path:
    """The history of every attempt of the job whose log is ``log_path``: ``ky.log`` ->
    ``ky.attempts.log``."""
    path = Path(log_path)
    return path.with_name(f"{path.stem}.attempts{path.suffix or '.log'}")


def _user_error(kind) -> bool:
    return isinstance(kind, type) and issubclass(kind, InputError)


class ConsoleFormatter(logging.Formatter):
    """The console's records as the log's, but a record of bad input (:class:`modsent.io.InputError`)
    without its traceback: the message says what to change; the log keeps the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        if not (record.exc_info and _user_error(record.exc_info[0])):
            return super().format(record)
        kept = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text = kept


# after a GPU's out-of-memory error: a retry asks for more host memory, not a larger GPU, and a
# step's batch is a function of the step, so it fails the same way
GPU_MEMORY_HINT = (
    "the GPU ran out of memory: a retry with the same settings fails the same way (a step's batch is a "
    "function of the step); give the job a larger GPU (your config's resources: {KIND: {constraint: ...}} or "
    "gpu_model, a method's methods.NAME.resources; README: cluster use), fewer examples per GPU (a data-parallel stage's or method's gpus), or "
    "smaller batches (the stage's or method's batch_size, grad_accum where it has one: a change of the method)")


LOGGED = "_modsent_logged"  # set on an exception log_failure wrote down


def log_failure(error: BaseException) -> None:
    """Write the failure ``error`` to modsent's logger (the log's handlers, flushed) with its
    traceback, and an out-of-memory error on a GPU with :data:`GPU_MEMORY_HINT`; the exception
    is marked, so that the process's exception hook (:func:`log_warnings_and_failures`) does
    not write it again."""
    logger = logging.getLogger("modsent")
    logger.critical("the job failed: %s: %s", type(error).__name__, error,
                    exc_info=(type(error), error, error.__traceback__))
    if type(error).__name__ == "OutOfMemoryError":  # torch's, on a GPU (not imported here for it)
        logger.critical(GPU_MEMORY_HINT)
    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        setattr(error, LOGGED, True)
    except AttributeError:  # an exception type that takes no attributes: logged twice at worst
        pass


def log_warnings_and_failures() -> logging.Logger:
    """Python's warnings to the log (but :data:`LIBRARY_NOISE`), and an exception that ends the
    process written to the log with its traceback (an out-of-memory error on a GPU with
    :data:`GPU_MEMORY_HINT`); on the console, bad input (:class:`modsent.io.InputError`, whose
    message says what to change) is one line, any other failure its traceback as always. For
    the root logger's handlers as they are: :func:`setup_logging` (a workflow script) and
    :func:`modsent.distributed.process_logging` (each process torchrun starts) call it after
    setting them. Returns modsent's logger."""
    logging.captureWarnings(True)
    for category, message in LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category)
    logger = logging.getLogger("modsent")
    # set up again in this process: chain to the hook the first set-up found, not to the first's
    previous_hook = getattr(sys.excepthook, "_modsent_previous", sys.excepthook)

    def log_uncaught(kind, value, traceback):
        if not issubclass(kind, KeyboardInterrupt) and not getattr(value, LOGGED, False):
            log_failure(value)
        # bad input (InputError: its message names the file or key) is one line on the console, its
        # traceback in the log only; any other failure is also printed with its traceback, as always
        if not _user_error(kind):
            previous_hook(kind, value, traceback)

    log_uncaught._modsent_previous = previous_hook
    sys.excepthook = log_uncaught
    return logger


def setup_logging(log_path: str | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send modsent's and the libraries' log records to ``log_path`` and to stderr.

    The first record says where the job runs: host, SLURM job id and the GPUs it was given
    (CUDA_VISIBLE_DEVICES), so a log shows whether a cluster job got its GPU. Each attempt
    starts with a line naming it, and is also appended to :func:`attempts_log` (Snakemake
    removes the log itself before a retry or a resumed run: the history keeps the earlier
    attempts' records), and an exception that ends the script is written to the log with its
    traceback, not only to stderr (bad input, :class:`modsent.io.InputError`, is one line on stderr:
    its message says what to change). Python's warnings are logged too, but for
    :data:`LIBRARY_NOISE`."""
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(ConsoleFormatter(FORMAT))
    handlers: list[logging.Handler] = [console]
    if log_path:
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Snakemake removes a job's log before each attempt: every attempt is also appended
        # to a history next to it, which Snakemake does not know and so never removes
        history = attempts_log(path)
        attempt = 1 + (history.read_text(encoding="utf-8", errors="replace").count(ATTEMPT) if history.is_file() else 0)
        for target in (path, history):
            with open(target, "a", encoding="utf-8") as log:
                log.write(f"{ATTEMPT} {attempt} ====\n")
            handlers.append(logging.FileHandler(target, mode="a", encoding="utf-8"))
    logging.basicConfig(level=level, format=FORMAT, handlers=handlers, force=True)
    logger = log_warnings_and_failures()
    logger.info("host %s, SLURM job %s, CUDA_VISIBLE_DEVICES=%s", socket.gethostname(),
                os.environ.get("SLURM_JOB_ID", "none"), os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return logger


def start_job(snakemake) -> logging.Logger:
    """The start of every workflow script: logging to the rule's log (:func:`setup_logging`),
    a lease on each of the job's outputs (:mod:`modsent.leases`), so that a restart of the
    workflow does not start this job a second time while it still runs, and the config's
    ``tracking`` for the job's training loops (:mod:`modsent.training.tracking`), and, for a
    GPU job run without SLURM on a host with more GPUs than it asks for, GPUs of its own
    (:mod:`modsent.devices`); ``MODSENT_PEAK_TFLOPS`` checked (:mod:`modsent.training.efficiency`). Raises :class:`modsent.leases.LeaseError` when another job that
    still runs holds one of its outputs. The objects the script's imports made are kept out of
    the cyclic garbage collector's work (:func:`freeze_long_lived`)."""
    from modsent import devices, leases
    from modsent.io import InputError
    from modsent.training import efficiency, tracking

    log_path = snakemake.log[0] if snakemake.log else None
    logger = setup_logging(log_path)
    try:  # read when a training run ends: a bad value stops the job before its work, not after
        efficiency.environment_peak()
    except ValueError as error:
        raise InputError(str(error)) from None
    leases.take([str(path) for path in snakemake.output], rule=snakemake.rule)
    resources = getattr(snakemake, "resources", None)
    devices.claim(int((resources.get("gpu", 0) if resources is not None else 0) or 0))
    wildcards = ",".join(f"{key}={value}" for key, value in snakemake.wildcards.items())
    tracking.configure_job(snakemake.config.get("tracking"), log_path,
                           f"{snakemake.rule}[{wildcards}]" if wildcards else snakemake.rule)
    freeze_long_lived()
    return logger


def freeze_long_lived() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach
    (:func:`gc.freeze`), and every object alive at exit too. A job imports torch, transformers
    and often sentence-transformers: a few hundred thousand objects that live as long as the
    process, which each full collection walks again, and the interpreter's shutdown runs such
    collections while it tears the modules down. For a process that encodes with a
    SentenceTransformer, its end took 1.8 s against 0.3 s frozen, a ``gc.collect()`` after
    freeing the model 0.67 s against 0.36 s, the whole process 1.8-2.9 s less
    (``benchmarks/results/job_overhead_cpu.txt``). Frozen objects are still freed when their
    last reference goes; only a reference cycle among them that becomes garbage waits for the
    process's end, as the modules' own cycles do anyway. Objects made later (the models, the
    batches) are collected as before. For a workflow job's own process only (a library
    function must not freeze its caller's objects)."""
    gc.freeze()
    atexit.register(gc.freeze)
