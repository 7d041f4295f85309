# rule alignment_summary: held-out English→L retrieval accuracy of pp and pl per language.
from modsent.modular.alignment import write_summary
from modsent.logs import start_job
from modsent.reporting import write_html

start_job(snakemake)
write_summary(list(snakemake.input), snakemake.output.table)
write_html(snakemake.output.table, snakemake.output.html)
