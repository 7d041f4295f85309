# rule english_paraphrases: the configured datasets merged into results/paraphrase/en.parquet.
import logging

from modsent.logs import start_job
from modsent.io import write_parquet
from modsent.data.paraphrase import merge_english

start_job(snakemake)
pairs = merge_english(list(snakemake.input))
write_parquet(pairs, snakemake.output[0])
logging.getLogger("modsent").info("English paraphrases: %d pairs; per dataset %s",
                                  len(pairs), pairs["dataset"].value_counts().to_dict())
