# rules sentence_adapter and ablation_sentence_adapter: LoRA on all linear layers over the
# frozen LA (none for Mod_m-LA), trained with MNRL; resumes from {output}.checkpoint.
# The runtime keys (checkpoint_every, log_every) are read from the config, not the params:
# changing them reruns no finished job.
import torch

from modsent.config import runtime_settings
from modsent.logs import start_job
from modsent.modular.sentence_adapter import SentenceAdapterConfig, train_sentence_adapter

start_job(snakemake)
torch.set_num_threads(snakemake.threads)
settings = {**snakemake.params.settings, **runtime_settings(snakemake.config, "sentence_adapter")}
train_sentence_adapter(
    snakemake.input.base,
    snakemake.input.get("language_adapter"),  # absent when the language skips its LA
    snakemake.input.pairs,
    snakemake.output[0],
    SentenceAdapterConfig.from_config(settings),
)
