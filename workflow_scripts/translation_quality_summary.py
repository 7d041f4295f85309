# rule translation_quality_summary: one table over languages.
from modsent.logs import start_job
from modsent.data.translation_quality import write_quality_summary

start_job(snakemake)
write_quality_summary(list(snakemake.input), snakemake.output[0])
