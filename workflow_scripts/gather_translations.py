# rule gather_translations: one language's shards joined, every unit exactly once.
import pandas as pd

from modsent.logs import start_job
from modsent.io import write_parquet
from modsent.data.paraphrase import gather_shards

start_job(snakemake)
units = pd.read_parquet(snakemake.input.units)
write_parquet(gather_shards(units, list(snakemake.input.shards)), snakemake.output[0])
