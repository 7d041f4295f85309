# rule corpus: resources/corpora/{lang}.txt from the configured source.
from modsent.logs import start_job
from modsent.sources import prepare_corpus

start_job(snakemake)
prepare_corpus(snakemake.wildcards.lang, snakemake.params.settings, snakemake.output[0])
