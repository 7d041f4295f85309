# rule translation_quality_summary: one table over languages.
from modsent.logs import start_job
from modsent.data.translation_quality import write_quality_summary
from modsent.reporting import write_html

start_job(snakemake)
write_quality_summary(list(snakemake.input), snakemake.output.table)
write_html(snakemake.output.table, snakemake.output.html)
