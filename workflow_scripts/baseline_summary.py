# rule full_baseline_summary: held-out retrieval accuracy before/after per baseline and language.
from modsent.methods.baselines import write_summary
from modsent.logs import start_job

start_job(snakemake)
write_summary(list(snakemake.input), snakemake.output[0])
