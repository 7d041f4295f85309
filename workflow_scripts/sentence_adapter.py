# rule sentence_adapter: LoRA on all linear layers over the frozen LA, trained with MNRL.
import torch

from modsent.logs import setup_logging
from modsent.sentence_adapter import SentenceAdapterConfig, train_sentence_adapter

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
train_sentence_adapter(
    snakemake.input.base,
    snakemake.input.get("language_adapter"),  # absent when the language skips its LA
    snakemake.input.pairs,
    snakemake.output[0],
    SentenceAdapterConfig.from_config(snakemake.params.settings),
)
