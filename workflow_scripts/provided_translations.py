# rule provided_translations: human translations EN→{lang} (english, translation).
from modsent.logs import setup_logging
from modsent.sources import prepare_translations

setup_logging(snakemake.log[0])
prepare_translations(snakemake.params.source, snakemake.wildcards.lang, snakemake.output[0])
