# rule evaluation_scores: one variant on one dataset, by the paper's protocol.
from pathlib import Path

from modsent.evaluation import suite as evaluation
from modsent.logs import start_job

start_job(snakemake)
settings = snakemake.params.settings
dataset = snakemake.wildcards.dataset
variant = snakemake.wildcards.variant
root = Path(settings["embeddings"])
result = evaluation.score_dataset(
    dataset, settings["subsets"], {lang: root / lang / variant / f"{dataset}.parquet" for lang in settings["languages"]},
    settings["languages"], variant=variant, k=settings["k"], margin=settings["margin"], seed=settings["seed"])
evaluation.write_scores(snakemake.output[0], result)
