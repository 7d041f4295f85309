# rule english_embeddings: the frozen English encoder embeds every English sentence once.
import torch

from modsent.modular.alignment import embed_english
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
embed_english(
    snakemake.input.base,
    snakemake.input.get("language_adapter"),
    snakemake.input.sentence_adapter,
    snakemake.input.units,
    snakemake.output.embeddings,
)
