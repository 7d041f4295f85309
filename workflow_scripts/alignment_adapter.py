# rules alignment_adapter and ablation_alignment_adapter: the pp or pl parallel adapter of one
# language, on its LA + SE adapter (no SE input: Mod_c's adapter on the LA alone); resumes from
# {output}.checkpoint. pl with alignment.provided_translations also trains on the human
# translations (input `provided`). The runtime keys (checkpoint_every, log_every) are read from the config,
# not the params: changing them reruns no finished job.
import pandas as pd
import torch

from modsent.modular.alignment import AlignmentConfig, train_alignment_adapter
from modsent.config import runtime_settings
from modsent.logs import start_job
from modsent.data.paraphrase import crosslingual_paraphrase_pairs, parallel_pairs, provided_sample

start_job(snakemake)
torch.set_num_threads(snakemake.threads)
kind = snakemake.wildcards.kind
if kind == "pp":
    pairs = crosslingual_paraphrase_pairs(pd.read_parquet(snakemake.input.english_pairs),
                                          pd.read_parquet(snakemake.input.pairs))
else:
    provided = None
    if "provided" in snakemake.input.keys():
        provided = provided_sample(pd.read_parquet(snakemake.input.provided),
                                   snakemake.params.settings.get("max_provided"), source=str(snakemake.input.provided))
    pairs = parallel_pairs(pd.read_parquet(snakemake.input.translations), provided)
settings = {**snakemake.params.settings, **runtime_settings(snakemake.config, "alignment")}
train_alignment_adapter(
    kind,
    snakemake.input.base,
    snakemake.input.get("language_adapter"),
    snakemake.input.get("sentence_adapter"),
    pairs,
    [snakemake.input.english, snakemake.input.english_provided] if "english_provided" in snakemake.input.keys()
    else snakemake.input.english,
    snakemake.output[0],
    AlignmentConfig.from_config(settings),
    language=snakemake.wildcards.lang,
)
