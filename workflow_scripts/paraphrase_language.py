# rule paraphrase_language: the English pairs in one language.
import logging

import pandas as pd

from modsent.logs import start_job
from modsent.io import write_parquet
from modsent.data.paraphrase import translate_pairs

start_job(snakemake)
english = pd.read_parquet(snakemake.input.english)
pairs = translate_pairs(english, pd.read_parquet(snakemake.input.translations))
write_parquet(pairs, snakemake.output[0])
logging.getLogger("modsent").info("%s: %d of %d pairs (%d dropped: a sentence without translation)",
                                  snakemake.wildcards.lang, len(pairs), len(english), len(english) - len(pairs))
