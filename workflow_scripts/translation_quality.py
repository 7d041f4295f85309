# rule translation_quality: the quality report of one language's translations.
from modsent.logs import start_job
from modsent.data.translation_quality import write_quality_report

start_job(snakemake)
write_quality_report(snakemake.input.translations, snakemake.wildcards.lang, snakemake.output.report,
                     snakemake.output.plot, units_path=snakemake.input.units)
