# rule translate_shard: machine-translate one shard of the English units into {lang}.
import torch

from modsent.config import runtime_settings
from modsent.logs import start_job
from modsent.data.translation import translate_shard

start_job(snakemake)
torch.set_num_threads(snakemake.threads)
# batch_size, batch_tokens and checkpoint_every say how the job runs: read from the config, not the params
settings = {**snakemake.params.settings, **runtime_settings(snakemake.config, "translation")}
index, total = (int(x) for x in snakemake.wildcards.scatteritem.split("-of-"))
engine = settings["engine"]
translate_shard(
    snakemake.input.units,
    snakemake.output[0],
    shard=index - 1,
    n_shards=total,
    engine=engine,
    model=snakemake.input.model[0] if engine == "ctranslate2" else settings["model"],
    tokenizer=None,  # transformers: the checkpoint's own; ctranslate2: saved with the conversion
    tgt_lang=snakemake.wildcards.lang,
    batch_size=settings["batch_size"],
    batch_tokens=settings["batch_tokens"],
    beam_size=settings["beam_size"],
    max_length=settings["max_length"],
    compute_type=settings["compute_type"],
    checkpoint_every=settings["checkpoint_every"],
    revision=settings["revision"],
)
