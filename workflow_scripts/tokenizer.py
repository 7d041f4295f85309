# rule tokenizer: a tokenizer of the base model's kind trained on the language's corpus.
from modsent.logs import start_job
from modsent.modular.tokenizer_training import train_tokenizer

start_job(snakemake)
settings = snakemake.params.settings
train_tokenizer(
    snakemake.input.corpus,
    snakemake.input.base,
    snakemake.output[0],
    vocab_size=settings["vocab_size"],
    max_sentences=settings["max_sentences"],
)
