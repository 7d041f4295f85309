# rule paraphrase_source: one English paraphrase dataset in the paraphrase contract.
from modsent.logs import setup_logging
from modsent.sources import prepare_paraphrase_dataset

setup_logging(snakemake.log[0])
prepare_paraphrase_dataset(snakemake.wildcards.dataset, snakemake.params.spec, snakemake.output[0])
