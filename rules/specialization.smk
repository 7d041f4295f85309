# Monolingual specialization, per language: tokenizer → fastText → FOCUS embeddings → LA.
# Each step is its own rule so that each reruns on its own.
#
# `priority:` (here 4, SE and English targets 3, CLA 2, ablations, full baselines and methods 1;
# the evaluation and summaries 0; the input rules 5, rules/inputs.smk) starts each language's chain tokenizer → LA → SE → CLA as early
# as the inputs allow, and every training before the evaluation: without it the scheduler may
# leave one language's LA until the other languages' evaluation is done, and the run ends with
# that language's chain alone on the machine (seen on the demo: the last LA started 20 minutes
# in and the last 5 minutes ran one job at a time).


rule tokenizer:
    """A new tokenizer of the base model's kind, trained on the language's corpus."""
    input:
        corpus=layout.CORPUS,
        base=base_model_input,
    output:
        directory(layout.TOKENIZER),
    params:
        settings=tokenizer_settings,
    threads: job_threads("cpu_heavy")
    resources:
        **job_resources("cpu_heavy"),
    priority: 4
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
        corpus=layout.CORPUS,
        tokenizer=layout.TOKENIZER,
    output:
        directory(layout.FASTTEXT),
    params:
        settings=job_settings("fasttext"),
    threads: config["fasttext"]["threads"]
    resources:
        **job_resources("cpu_heavy"),
    priority: 4
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
        base=base_model_input,
        tokenizer=layout.TOKENIZER,
        fasttext=layout.FASTTEXT,
    output:
        directory(layout.EMBEDDINGS),
    params:
        seed=focus_seed,
    threads: job_threads("cpu_heavy")
    resources:
        **job_resources("cpu_heavy"),
    priority: 4
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
        base=base_model_input,
        tokenizer=layout.TOKENIZER,
        embeddings=layout.EMBEDDINGS,
        corpus=layout.CORPUS,
    output:
        directory(layout.LANGUAGE_ADAPTER),
    params:
        settings=language_adapter_settings,
    threads: job_threads("gpu_train", gpus=language_adapter_gpus)
    resources:
        **job_resources("gpu_train", gpus=language_adapter_gpus),
    priority: 4
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
        table=layout.LANGUAGE_ADAPTER_SUMMARY,
        html=report(layout.LANGUAGE_ADAPTER_SUMMARY_HTML, category="2. Training", subcategory="Language adapters",
                    caption="../report/language_adapters.rst"),
        plot=report(layout.LANGUAGE_ADAPTER_PLOT, category="2. Training", subcategory="Language adapters",
                    caption="../report/language_adapters.rst"),
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/language_adapters/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/language_adapter_summary.py"
