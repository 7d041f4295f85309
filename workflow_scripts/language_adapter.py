# rule language_adapter: continued MLM with new embeddings and LoRA; resumes from checkpoints.
from pathlib import Path

import torch

from modsent.language_adapter import LanguageAdapterConfig, train_language_adapter
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
train_language_adapter(
    snakemake.input.base,
    snakemake.input.tokenizer,
    snakemake.input.embeddings,
    snakemake.input.corpus,
    snakemake.output[0],
    LanguageAdapterConfig.from_config(snakemake.params.settings),
    # TensorBoard event files (tracking: tensorboard) beside the job's log
    tracking_dir=Path(snakemake.log[0]).parent / "tensorboard" / snakemake.wildcards.lang,
)
