# rule language_adapter_summary: held-out MLM loss before/after LA, a table and a plot.
from modsent.modular.language_adapter import write_summary
from modsent.logs import start_job
from modsent.reporting import write_html

start_job(snakemake)
write_summary(list(snakemake.input), snakemake.output.table, snakemake.output.plot)
write_html(snakemake.output.table, snakemake.output.html)
