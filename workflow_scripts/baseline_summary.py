# rule full_baseline_summary: held-out retrieval accuracy before/after per baseline and language.
from modsent.methods.baselines import write_summary
from modsent.logs import start_job
from modsent.reporting import write_html

start_job(snakemake)
write_summary(list(snakemake.input), snakemake.output.table)
write_html(snakemake.output.table, snakemake.output.html)
