# rule inputs_summary: one table of what every prepared input holds.
from modsent.logs import start_job
from modsent.reporting import write_html
from modsent.sources import write_inputs_summary

start_job(snakemake)
write_inputs_summary(
    corpora=list(snakemake.input.corpora),
    paraphrases=list(snakemake.input.paraphrases),
    translations=list(snakemake.input.translations),
    out_path=snakemake.output.table,
)
write_html(snakemake.output.table, snakemake.output.html)
