# rule language_adapter_summary: held-out MLM loss before/after LA, a table and a plot.
from modsent.modular.language_adapter import write_summary
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
write_summary(list(snakemake.input), snakemake.output.table, snakemake.output.plot)
