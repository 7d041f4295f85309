# rule language_adapter: continued MLM with new embeddings and LoRA; resumes from checkpoints.
# language_adapter.gpus > 1 on a node with GPUs: the training runs under torchrun, one process
# per GPU (python -m modsent.language_adapter), data-parallel; otherwise in this process.
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from modsent import distributed
from modsent.language_adapter import LanguageAdapterConfig, cli_arguments, train_language_adapter
from modsent.logs import FORMAT, setup_logging

log = setup_logging(snakemake.log[0])
settings = snakemake.params.settings
cfg = LanguageAdapterConfig.from_config(settings)
# TensorBoard event files (tracking: tensorboard) beside the job's log
tracking_dir = Path(snakemake.log[0]).parent / "tensorboard" / snakemake.wildcards.lang
gpus = settings.get("gpus", 1)
if gpus > 1 and not torch.cuda.is_available():
    log.warning("language_adapter.gpus is %d but this job sees no GPU: one process on the CPU", gpus)

if gpus > 1 and torch.cuda.is_available() and not distributed.is_launched():
    visible = torch.cuda.device_count()
    if visible < gpus:
        sys.exit(f"language_adapter.gpus is {gpus} but this job sees {visible} GPU(s) "
                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): "
                 f"the rule's resources must request {gpus}")
    threads = max(1, snakemake.threads // gpus)
    command = distributed.launch_command("modsent.language_adapter", cli_arguments(
        snakemake.input.base, snakemake.input.tokenizer, snakemake.input.embeddings,
        snakemake.input.corpus, snakemake.output[0], cfg, tracking_dir=tracking_dir,
        log_path=snakemake.log[0], threads=threads), gpus)
    log.info("%d GPUs, %d threads each: %s", gpus, threads, shlex.join(command))
    # The main training process appends to the log from now on: close ours first, so that
    # neither writes over the other's lines.
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()
    result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if result.returncode:
        handler = logging.FileHandler(snakemake.log[0], mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
        log.error("torchrun exited with status %d", result.returncode)
        sys.exit(result.returncode)
else:
    torch.set_num_threads(snakemake.threads)
    train_language_adapter(
        snakemake.input.base,
        snakemake.input.tokenizer,
        snakemake.input.embeddings,
        snakemake.input.corpus,
        snakemake.output[0],
        cfg,
        tracking_dir=tracking_dir,
    )
