# rule ablation_alignment_adapter (Mod_c): the pp or pl parallel adapter of one language on its
# LA alone. alignment_adapter.py with no SE adapter; it would serve if it read
# snakemake.input.get("sentence_adapter").
import pandas as pd
import torch

from modsent.alignment import AlignmentConfig, train_alignment_adapter
from modsent.logs import setup_logging
from modsent.paraphrase_data import crosslingual_paraphrase_pairs, parallel_pairs

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
kind = snakemake.wildcards.kind
if kind == "pp":
    pairs = crosslingual_paraphrase_pairs(pd.read_parquet(snakemake.input.english_pairs),
                                          pd.read_parquet(snakemake.input.pairs))
else:
    pairs = parallel_pairs(pd.read_parquet(snakemake.input.translations))
settings = {k: v for k, v in snakemake.params.settings.items() if k != "merge_weights"}
train_alignment_adapter(
    kind,
    snakemake.input.base,
    snakemake.input.get("language_adapter"),
    None,  # no SE adapter: the Mod_c ablation
    pairs,
    snakemake.input.english,
    snakemake.output[0],
    AlignmentConfig.from_config(settings),
    language=snakemake.wildcards.lang,
)
