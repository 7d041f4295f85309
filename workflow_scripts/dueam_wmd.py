# rule dueam_wmd: one shard of the word mover's distances of the DuEAM methods whose WMD settings
# have digest {wmd} (modsent.methods.dueam.wmd). Its runtime key (wmd_batch_size) is read from
# the config, not the params (dueam.wmd_config).
import logging

import torch

from modsent import methods
from modsent.languages import PIVOT_LANGUAGE
from modsent.logs import start_job
from modsent.methods import dueam
from modsent.methods.dueam.wmd import run_shard

start_job(snakemake)
torch.set_num_threads(snakemake.threads)
methods.load(snakemake.config["method_modules"])
names, cfg = dueam.wmd_config(snakemake.config["methods"], snakemake.wildcards.wmd)
logging.getLogger("modsent").info("WMD settings %s: the pairs of %s", snakemake.wildcards.wmd, ", ".join(names))


def paths(key):
    value = snakemake.input.get(key, [])
    return [value] if isinstance(value, str) else list(value)


languages = list(snakemake.params.languages)
pairs = dict(zip(languages, paths("pairs"), strict=True))
translations = paths("translations")
if translations:  # every non-English language's, in the params' (sorted) order
    translations = dict(zip([lang for lang in languages if lang != PIVOT_LANGUAGE], translations, strict=True))
run_shard(pairs, translations or None, cfg, snakemake.input.get("base") or None, int(snakemake.wildcards.shard),
          int(snakemake.wildcards.shards), snakemake.output[0], cache_dir=dueam.wmd_cache_dir(snakemake.wildcards.base),
          progress=False, key=f"methods.{names[0]}")
