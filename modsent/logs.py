"""Logging for workflow scripts: every rule's script logs to the rule's `log:` file."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ATTEMPT = "==== attempt"


def setup_logging(log_path: str | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send modsent's and the libraries' log records to ``log_path`` and to stderr.

    The first record says where the job runs: host, SLURM job id and the GPUs it was given
    (CUDA_VISIBLE_DEVICES), so a log shows whether a cluster job got its GPU. Each attempt
    appends to the log after a line naming it (a retried or resumed job keeps the earlier
    attempts' records), and an exception that ends the script is written to the log with its
    traceback, not only to stderr."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        attempt = 1 + (path.read_text(encoding="utf-8", errors="replace").count(ATTEMPT) if path.is_file() else 0)
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{ATTEMPT} {attempt} ====\n")
        handlers.append(logging.FileHandler(path, mode="a", encoding="utf-8"))
    logging.basicConfig(level=level, format=FORMAT, handlers=handlers, force=True)
    logging.captureWarnings(True)
    logger = logging.getLogger("modsent")
    previous_hook = sys.excepthook

    def log_uncaught(kind, value, traceback):
        if not issubclass(kind, KeyboardInterrupt):
            logger.critical("the job failed: %s: %s", kind.__name__, value, exc_info=(kind, value, traceback))
            for handler in logging.getLogger().handlers:
                handler.flush()
        if previous_hook is not log_uncaught:
            previous_hook(kind, value, traceback)

    sys.excepthook = log_uncaught
    logger.info("host %s, SLURM job %s, CUDA_VISIBLE_DEVICES=%s", socket.gethostname(),
                os.environ.get("SLURM_JOB_ID", "none"), os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return logger
