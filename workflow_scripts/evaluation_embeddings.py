# rule evaluation_embeddings: one variant's encoder for one language encodes that language's
# sentences of every evaluation dataset.
import logging
from pathlib import Path

import torch

from modsent import evaluation, variants
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
lang = snakemake.wildcards.lang
results_dir = Path("results") / snakemake.wildcards.base
encoder = variants.build_encoder(snakemake.wildcards.variant, results_dir, snakemake.input.base, [lang])
counts = evaluation.embed_language(encoder, lang, snakemake.params.datasets, snakemake.output[0],
                                   batch_size=snakemake.params.batch_size)
logging.getLogger("modsent").info("%s %s: %s", snakemake.wildcards.variant, lang, counts)
