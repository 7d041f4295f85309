# rule evaluation_subset: one subset of an evaluation dataset, normalised.
from modsent.sources import evaluation as evaluation_data
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
settings = snakemake.params.settings
evaluation_data.prepare_subset(snakemake.wildcards.dataset, snakemake.wildcards.subset, snakemake.output[0],
                               source=settings["source"], revision=settings["revision"])
