# rules english_embeddings and english_embeddings_provided: the frozen English encoder embeds
# every English sentence once: the translation units, or the English of one language's provided
# translations that alignment.provided_translations trains its pl adapter on (params.max_provided).
import pandas as pd
import torch

from modsent.data.paraphrase import provided_sample
from modsent.modular.alignment import embed_english
from modsent.logs import start_job

start_job(snakemake)
torch.set_num_threads(snakemake.threads)
if "provided" in snakemake.input.keys():
    path = str(snakemake.input.provided)
    sentences = provided_sample(pd.read_parquet(path), snakemake.params.max_provided, source=path)["english"].tolist()
else:
    sentences = [str(snakemake.input.units)]
embed_english(
    snakemake.input.base,
    snakemake.input.get("language_adapter"),
    snakemake.input.sentence_adapter,
    sentences,
    snakemake.output.embeddings,
)
