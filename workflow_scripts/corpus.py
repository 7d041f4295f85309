# rule corpus: resources/corpora/{lang}.txt from the configured source.
from modsent.logs import setup_logging
from modsent.sources import prepare_corpus

setup_logging(snakemake.log[0])
prepare_corpus(snakemake.wildcards.lang, snakemake.params.settings, snakemake.output[0])
