# rule english_training_pairs: the English pairs and the English-only datasets, results/paraphrase/en.all.parquet.
import logging

from modsent.data.paraphrase import english_training_pairs
from modsent.logs import start_job
from modsent.sources.paraphrase import write_pairs

start_job(snakemake)
english_only = snakemake.input.english_only
pairs = english_training_pairs(snakemake.input.english, [english_only] if isinstance(english_only, str) else english_only)
write_pairs(pairs, snakemake.output[0])
logging.getLogger("modsent").info("English pairs with the English-only datasets: %d pairs; per dataset %s",
                                  len(pairs), pairs["dataset"].value_counts().to_dict())
