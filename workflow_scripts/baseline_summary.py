# rule full_baseline_summary: held-out retrieval accuracy before/after per baseline and language.
from modsent.methods.baselines import write_summary
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
write_summary(list(snakemake.input), snakemake.output[0])
