# rule provided_translation: human translations aligned on the English units.
import pandas as pd

from modsent.logs import start_job
from modsent.io import write_parquet
from modsent.data.paraphrase import align_provided

start_job(snakemake)
units = pd.read_parquet(snakemake.input.units)
translated, dropped = align_provided(units, pd.read_parquet(snakemake.input.provided), snakemake.wildcards.lang)
write_parquet(translated, snakemake.output[0])
