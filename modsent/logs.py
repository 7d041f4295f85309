"""Logging for workflow scripts: every rule's script logs to the rule's `log:` file."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(log_path: str | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send modsent's and the libraries' log records to ``log_path`` and to stderr.

    The first record says where the job runs: host, SLURM job id and the GPUs it was given
    (CUDA_VISIBLE_DEVICES), so a log shows whether a cluster job got its GPU."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w", encoding="utf-8"))
    logging.basicConfig(level=level, format=FORMAT, handlers=handlers, force=True)
    logging.captureWarnings(True)
    logger = logging.getLogger("modsent")
    logger.info("host %s, SLURM job %s, CUDA_VISIBLE_DEVICES=%s", socket.gethostname(),
                os.environ.get("SLURM_JOB_ID", "none"), os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return logger
