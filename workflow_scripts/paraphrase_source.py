# rule paraphrase_source: one English paraphrase dataset in the paraphrase contract.
from modsent.logs import start_job
from modsent.sources import prepare_paraphrase_dataset

start_job(snakemake)
prepare_paraphrase_dataset(snakemake.wildcards.dataset, snakemake.params.spec, snakemake.output[0])
