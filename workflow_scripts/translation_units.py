# rule translation_units: the distinct English sentences to translate.
import logging

import pandas as pd

from modsent.logs import setup_logging
from modsent.io import write_parquet
from modsent.data.paraphrase import translation_units

setup_logging(snakemake.log[0])
pairs = pd.read_parquet(snakemake.input[0])
units = translation_units(pairs)
write_parquet(units, snakemake.output[0])
logging.getLogger("modsent").info("%d pairs → %d distinct sentences to translate", len(pairs), len(units))
