# rules builtin_parallel_eval / builtin_classification_eval: held-out demo evaluation data.
from modsent.logs import setup_logging
from modsent.sources import prepare_builtin_eval

setup_logging(snakemake.log[0])
task = "parallel" if snakemake.rule == "builtin_parallel_eval" else "classification"
prepare_builtin_eval(task, snakemake.wildcards.lang, snakemake.output[0])
