# rule evaluation_subset: one subset of an evaluation dataset, normalised.
from modsent.sources import evaluation as evaluation_data
from modsent.logs import start_job

start_job(snakemake)
settings = snakemake.params.settings
evaluation_data.prepare_subset(snakemake.wildcards.dataset, snakemake.wildcards.subset, snakemake.output[0],
                               source=settings["source"], revision=settings["revision"])
