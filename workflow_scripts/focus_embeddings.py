# rule focus_embeddings: FOCUS initialisation of the language's embedding matrix.
from modsent.modular.focus import initialize_embeddings
from modsent.logs import start_job

start_job(snakemake)
initialize_embeddings(
    snakemake.input.base,
    snakemake.input.tokenizer,
    snakemake.input.fasttext,
    snakemake.output[0],
    seed=snakemake.params.seed,
)
