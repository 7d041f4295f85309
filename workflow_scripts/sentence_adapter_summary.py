# rule sentence_adapter_summary: held-out retrieval accuracy before/after per language.
from modsent.logs import setup_logging
from modsent.modular.sentence_adapter import write_summary

setup_logging(snakemake.log[0])
write_summary(list(snakemake.input), snakemake.output.table, snakemake.output.plot)
