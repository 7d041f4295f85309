# rule translation_units: the distinct English sentences to translate.
import logging

import pandas as pd

from modsent.logs import start_job
from modsent.io import write_parquet
from modsent.data.paraphrase import translation_units

start_job(snakemake)
pairs = pd.read_parquet(snakemake.input[0])
units = translation_units(pairs)
write_parquet(units, snakemake.output[0])
logging.getLogger("modsent").info("%d pairs → %d distinct sentences to translate", len(pairs), len(units))
