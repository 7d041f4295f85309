# Cross-lingual alignment: English embeddings once per base, pp and pl parallel adapters per
# non-English language, and their weight-averaged merges.


rule english_embeddings:
    """The frozen English encoder (English LA + SE) embeds every English training sentence once."""
    input:
        unpack(english_encoder_inputs),
        units=layout.TRANSLATION_UNITS,
    output:
        embeddings=layout.ENGLISH_EMBEDDINGS,
        units=layout.ENGLISH_EMBEDDING_UNITS,
    threads: job_threads("gpu_encode")
    resources:
        **job_resources("gpu_encode"),
    priority: 3
    log:
        "logs/{base}/alignment/english_embeddings.log",
    conda:
        ENV
    script:
        "../workflow_scripts/english_embeddings.py"


rule english_embeddings_provided:
    """alignment.provided_translations: the frozen English encoder embeds the English sentences
    of one language's provided human translations (its pl adapter trains on them too)."""
    input:
        unpack(english_encoder_inputs),
        provided=layout.PROVIDED_TRANSLATIONS,
    output:
        embeddings=layout.ENGLISH_EMBEDDINGS_PROVIDED,
        units=layout.ENGLISH_EMBEDDING_UNITS_PROVIDED,
    params:
        max_provided=provided_alignment_limit,
    threads: job_threads("gpu_encode")
    resources:
        **job_resources("gpu_encode"),
    priority: 3
    log:
        "logs/{base}/alignment/english_provided/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/english_embeddings.py"


rule alignment_adapter:
    """pp: MNRL on (English sentence, its paraphrase in L); pl: cosine loss on (English
    sentence, its translation in L); a parallel adapter on L's frozen LA + SE.
    Resumes from results/{base}/alignment/{kind}/{lang}.checkpoint when rerun after a kill."""
    input:
        unpack(alignment_inputs),
        english=layout.ENGLISH_EMBEDDINGS,
    output:
        directory(layout.ALIGNMENT_ADAPTER),
    params:
        settings=alignment_settings,
    threads: job_threads("gpu_adapter")
    resources:
        **job_resources("gpu_adapter"),
    priority: 2
    log:
        "logs/{base}/alignment/{kind}/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/alignment/{kind}/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/alignment_adapter.py"


rule merge_alignment:
    """w * pp + (1 - w) * pl: an ordinary adapter directory."""
    input:
        pp=layout.ALIGNMENT_ADAPTER.replace("{kind}", "pp"),
        pl=layout.ALIGNMENT_ADAPTER.replace("{kind}", "pl"),
    output:
        directory(layout.MERGED_ALIGNMENT),
    resources:
        **job_resources("cpu"),
    priority: 2
    log:
        "logs/{base}/alignment/merged-{weight}/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/merge_alignment.py"


rule alignment_summary:
    """Held-out English→L retrieval accuracy before and after pp and pl, per language."""
    input:
        alignment_dirs,
    output:
        table=layout.ALIGNMENT_SUMMARY,
        html=report(layout.ALIGNMENT_SUMMARY_HTML, category="2. Training", subcategory="Alignment adapters",
                    caption="../report/alignment.rst"),
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/alignment/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/alignment_summary.py"
