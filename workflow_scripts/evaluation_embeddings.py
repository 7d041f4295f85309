# rule evaluation_embeddings: every evaluated system of a group encodes one language's sentences
# of every evaluation dataset (modular systems share one body; equal modules encode once).
from pathlib import Path

# sentence_transformers is imported here, not when the first system loads: start_job freezes what
# the imports made, and the collections between the group's systems (LazyEncoder.close) skip it
import sentence_transformers  # noqa: F401
import torch

from modsent import methods
from modsent.evaluation import suite as evaluation
from modsent.encoders import systems as variants
from modsent.config import runtime_settings
from modsent.logs import start_job
from modsent.training.precision import default_device, describe_device

log = start_job(snakemake)
torch.set_num_threads(snakemake.threads)
log.info("encoding on %s", describe_device(default_device()))  # where the systems are built
methods.load(snakemake.config["method_modules"])  # the training methods' systems
lang = snakemake.wildcards.lang
encoders = variants.build_language_encoders(
    snakemake.params.variants, Path("results") / snakemake.wildcards.base, snakemake.input.base, lang,
    merge_weights=snakemake.params.merge_weights)
evaluation.embed_language(encoders, lang, snakemake.params.datasets, snakemake.output[0],
                          batch_size=evaluation.encoding_batch_size(
                              runtime_settings(snakemake.config, "evaluation")["batch_size"]))
