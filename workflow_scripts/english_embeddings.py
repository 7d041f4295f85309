# rules english_embeddings and english_embeddings_provided: the frozen English encoder embeds
# every English sentence once: the translation units, or the English of the provided translations
# that alignment.provided_translations trains the pl adapters on (params.max_provided per language).
import pandas as pd
import torch

from modsent.data.paraphrase import provided_sample
from modsent.modular.alignment import embed_english
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
if "provided" in snakemake.input.keys():
    sentences = [text for path in snakemake.input.provided
                 for text in provided_sample(pd.read_parquet(path), snakemake.params.max_provided,
                                             source=str(path))["english"]]
else:
    sentences = [str(snakemake.input.units)]
embed_english(
    snakemake.input.base,
    snakemake.input.get("language_adapter"),
    snakemake.input.sentence_adapter,
    sentences,
    snakemake.output.embeddings,
)
