# rule merge_alignment: weight-average the pp and pl adapters of one language.
from modsent.modular.alignment import merge_alignment_adapters
from modsent.logs import start_job

start_job(snakemake)
weight = float(snakemake.wildcards.weight)
merge_alignment_adapters(snakemake.input.pp, snakemake.input.pl, (weight, 1.0 - weight), snakemake.output[0])
