# rule provided_translations: human translations EN→{lang} (english, translation).
from modsent.logs import start_job
from modsent.sources import prepare_translations

start_job(snakemake)
prepare_translations(snakemake.params.source, snakemake.wildcards.lang, snakemake.output[0])
