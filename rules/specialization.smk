# Monolingual specialization, per language: tokenizer → fastText → FOCUS embeddings → LA.
# Each step is its own rule so that each reruns on its own.


rule tokenizer:
    """A new tokenizer of the base model's kind, trained on the language's corpus."""
    input:
        corpus="resources/corpora/{lang}.txt",
        base="resources/base_models/{base}",
    output:
        directory("results/{base}/tokenizers/{lang}"),
    params:
        settings=tokenizer_settings,
    threads: job_threads("cpu_heavy")
    resources:
        **job_resources("cpu_heavy"),
    log:
        "logs/{base}/tokenizers/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/tokenizer/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/tokenizer.py"


rule fasttext:
    """Token-level fastText vectors: the corpus tokenised with the new tokenizer."""
    input:
        corpus="resources/corpora/{lang}.txt",
        tokenizer="results/{base}/tokenizers/{lang}",
    output:
        directory("results/{base}/fasttext/{lang}"),
    params:
        settings=job_settings("fasttext"),
    threads: config["fasttext"]["threads"]
    resources:
        **job_resources("cpu_heavy"),
    log:
        "logs/{base}/fasttext/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/fasttext/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/fasttext.py"


rule focus_embeddings:
    """FOCUS initialisation of the language's embedding matrix."""
    input:
        base="resources/base_models/{base}",
        tokenizer="results/{base}/tokenizers/{lang}",
        fasttext="results/{base}/fasttext/{lang}",
    output:
        directory("results/{base}/embeddings/{lang}"),
    params:
        seed=config["focus"]["seed"],
    threads: job_threads("cpu_heavy")
    resources:
        **job_resources("cpu_heavy"),
    log:
        "logs/{base}/embeddings/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/embeddings/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/focus_embeddings.py"


rule language_adapter:
    """Continued MLM: the new embeddings and a LoRA adapter on attention q/k/v.
    Resumes from results/{base}/language_adapters/{lang}.checkpoint when rerun after a kill."""
    input:
        base="resources/base_models/{base}",
        tokenizer="results/{base}/tokenizers/{lang}",
        embeddings="results/{base}/embeddings/{lang}",
        corpus="resources/corpora/{lang}.txt",
    output:
        directory("results/{base}/language_adapters/{lang}"),
    params:
        settings=language_adapter_settings,
    threads: job_threads("gpu_train", gpus=language_adapter_gpus)
    resources:
        **job_resources("gpu_train", gpus=language_adapter_gpus),
    log:
        "logs/{base}/language_adapters/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/language_adapter/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/language_adapter.py"


rule language_adapter_summary:
    """Held-out MLM loss before and after LA training, per language: a table and a plot."""
    input:
        language_adapter_dirs,
    output:
        table="results/{base}/language_adapters/summary.md",
        plot="results/{base}/language_adapters/summary.png",
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/language_adapters/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/language_adapter_summary.py"
