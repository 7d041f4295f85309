# rule full_baseline: every weight of the base model trained with MNRL (Full_en/m/c/mc); resumes
# from results/{base}/baselines/{name}.checkpoint. baselines.gpus > 1 on a node with GPUs: the
# training runs under torchrun, one process per GPU (python -m modsent.methods.baselines), data-parallel;
# otherwise in this process.
import sys

import torch

from modsent import distributed
from modsent.config import runtime_settings
from modsent.methods.baselines import FullTrainingConfig, cli_arguments, train_full_baseline
from modsent.logs import start_job

log = start_job(snakemake)
# The training settings are the rule's params; gpus, checkpoint_every and log_every say how the
# job runs, not what it trains, and are read from the config so that changing them reruns no
# finished job.
settings = {**snakemake.params.settings, **runtime_settings(snakemake.config, "baselines")}
cfg = FullTrainingConfig.from_config(settings)
pairs = snakemake.input.pairs
pairs = [pairs] if isinstance(pairs, str) else list(pairs)
pairs = dict(zip(snakemake.params.languages, pairs, strict=True))
start_dir = snakemake.input.get("init") or snakemake.input.base  # Full_mc continues from Full_m
processes = distributed.launched_processes(settings["gpus"], "baselines.gpus")

if processes > 1:
    threads = max(1, snakemake.threads // processes)
    log.info("%d GPUs, %d threads each", processes, threads)
    command = distributed.launch_command("modsent.methods.baselines", cli_arguments(
        snakemake.wildcards.name, start_dir, pairs, snakemake.output[0], cfg,
        log_path=snakemake.log[0], threads=threads), processes)
    sys.exit(distributed.run_launched(command, snakemake.log[0], threads))
else:
    torch.set_num_threads(snakemake.threads)
    train_full_baseline(snakemake.wildcards.name, start_dir, pairs, snakemake.output[0], cfg)
