# rule inputs_summary: one table of what every prepared input holds.
from modsent.logs import setup_logging
from modsent.sources import write_inputs_summary

setup_logging(snakemake.log[0])
write_inputs_summary(
    corpora=list(snakemake.input.corpora),
    paraphrases=list(snakemake.input.paraphrases),
    translations=list(snakemake.input.translations),
    out_path=snakemake.output[0],
)
