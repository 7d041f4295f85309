# rule fasttext: token-level fastText vectors for FOCUS.
from modsent.modular.fasttext_embeddings import train_token_fasttext
from modsent.logs import start_job

start_job(snakemake)
settings = snakemake.params.settings
train_token_fasttext(
    snakemake.input.corpus,
    snakemake.input.tokenizer,
    snakemake.output[0],
    dim=settings["dim"],
    epochs=settings["epochs"],
    min_count=settings["min_count"],
    threads=snakemake.threads,
    model=settings["model"],
    max_sentences=settings["max_sentences"],
    bucket=settings["bucket"],
    keep_model=settings["keep_model"],
)
