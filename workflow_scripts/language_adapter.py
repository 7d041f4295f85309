# rule language_adapter: continued MLM with new embeddings and LoRA; resumes from checkpoints.
# language_adapter.gpus > 1 on a node with GPUs: the training runs under torchrun, one process
# per GPU (python -m modsent.modular.language_adapter), data-parallel; otherwise in this process.
import sys
from pathlib import Path

import torch

from modsent import distributed
from modsent.config import runtime_settings
from modsent.modular.language_adapter import LanguageAdapterConfig, cli_arguments, train_language_adapter
from modsent.logs import start_job

log = start_job(snakemake)
# The training settings are the rule's params; how the job runs (gpus, checkpoint_every,
# log_every, tracking) is read from the config, so that changing it reruns no finished job.
settings = {**snakemake.params.settings,
            **runtime_settings(snakemake.config, "language_adapter", snakemake.wildcards.lang)}
if settings.get("tracking", "none") == "none":  # tracking.report_to: every stage's
    settings["tracking"] = (snakemake.config.get("tracking") or {}).get("report_to", "none")
cfg = LanguageAdapterConfig.from_config(settings)
# TensorBoard event files (tracking: tensorboard) beside the job's log
tracking_dir = Path(snakemake.log[0]).parent / "tensorboard" / snakemake.wildcards.lang
processes = distributed.launched_processes(settings["gpus"], "language_adapter.gpus")

if processes > 1:
    threads = max(1, snakemake.threads // processes)
    log.info("%d GPUs, %d threads each", processes, threads)
    command = distributed.launch_command("modsent.modular.language_adapter", cli_arguments(
        snakemake.input.base, snakemake.input.tokenizer, snakemake.input.embeddings,
        snakemake.input.corpus, snakemake.output[0], cfg, tracking_dir=tracking_dir,
        log_path=snakemake.log[0], threads=threads), processes)
    sys.exit(distributed.run_launched(command, snakemake.log[0], threads))
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
