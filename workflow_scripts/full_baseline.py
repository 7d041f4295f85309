# rule full_baseline: every weight of the base model trained with MNRL (Full_en/m/c/mc).
import torch

from modsent.baselines import FullTrainingConfig, train_full_baseline
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
pairs = snakemake.input.pairs
pairs = [pairs] if isinstance(pairs, str) else list(pairs)
train_full_baseline(
    snakemake.wildcards.name,
    snakemake.input.get("init") or snakemake.input.base,  # Full_mc continues from Full_m
    dict(zip(snakemake.params.languages, pairs, strict=True)),
    snakemake.output[0],
    FullTrainingConfig.from_config(snakemake.params.settings),
)
