# Sentence encoding, per language: the SE adapter on top of the language's frozen LA.


rule sentence_adapter:
    """LoRA on all linear layers, MNRL on the language's monolingual paraphrase pairs.
    Resumes from results/{base}/sentence_adapters/{lang}.checkpoint when rerun after a kill."""
    input:
        unpack(sentence_adapter_inputs),
    output:
        directory(layout.SENTENCE_ADAPTER),
    params:
        settings=sentence_adapter_settings,
    threads: job_threads("gpu_adapter")
    resources:
        **job_resources("gpu_adapter"),
    priority: 3
    log:
        "logs/{base}/sentence_adapters/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/sentence_adapter/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/sentence_adapter.py"


rule sentence_adapter_summary:
    """Held-out in-batch retrieval accuracy before and after SE training, per language."""
    input:
        sentence_adapter_dirs,
    output:
        table=layout.SENTENCE_ADAPTER_SUMMARY,
        html=report(layout.SENTENCE_ADAPTER_SUMMARY_HTML, category="2. Training", subcategory="Sentence adapters",
                    caption="../report/sentence_adapters.rst"),
        plot=report(layout.SENTENCE_ADAPTER_PLOT, category="2. Training", subcategory="Sentence adapters",
                    caption="../report/sentence_adapters.rst"),
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/sentence_adapters/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/sentence_adapter_summary.py"
