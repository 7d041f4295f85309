# rule sentence_adapter_summary: held-out retrieval accuracy before/after per language.
from modsent.logs import start_job
from modsent.reporting import write_html
from modsent.modular.sentence_adapter import write_summary

start_job(snakemake)
write_summary(list(snakemake.input), snakemake.output.table, snakemake.output.plot)
write_html(snakemake.output.table, snakemake.output.html)
