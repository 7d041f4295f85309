# rule translation_quality_summary: one table over languages.
from modsent.logs import setup_logging
from modsent.data.translation_quality import write_quality_summary

setup_logging(snakemake.log[0])
write_quality_summary(list(snakemake.input), snakemake.output[0])
