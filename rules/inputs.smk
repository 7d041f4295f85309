# Inputs: every source declared in the config, written in the design's contracts.


rule corpus:
    """Monolingual text of one language: cleaned, deduplicated, capped; one sentence a line."""
    input:
        local=corpus_local_files,
    output:
        layout.CORPUS,
    params:
        settings=corpus_settings,
    resources:
        **job_resources("cpu_heavy"),
    log:
        "logs/corpora/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/corpus.py"


rule paraphrase_source:
    """One English paraphrase dataset in the contract (pair_id, dataset, anchor, positive, negative)."""
    input:
        local=paraphrase_local_files,
    output:
        layout.PARAPHRASE_SOURCE,
    params:
        spec=paraphrase_spec,
    resources:
        **job_resources("cpu"),
    log:
        "logs/paraphrases/{dataset}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/paraphrase_source.py"


rule provided_translations:
    """Existing human translations EN→X (english, translation), used by the `provided` engine."""
    input:
        local=provided_translation_local_files,
    output:
        layout.PROVIDED_TRANSLATIONS,
    params:
        source=canonical(config["translation"]["provided"]),
    resources:
        **job_resources("cpu"),
    log:
        "logs/translations/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/provided_translations.py"


rule inputs_summary:
    """A table of what every input holds: rows, sources, and time of preparation."""
    input:
        corpora=expand(layout.CORPUS, lang=languages()),
        paraphrases=paraphrase_source_paths(),
        translations=translation_targets(),
    output:
        table=layout.INPUTS_SUMMARY,
        html=report(layout.INPUTS_SUMMARY_HTML, category="3. Data", subcategory="Inputs",
                    caption="../report/inputs.rst"),
    resources:
        **job_resources("cpu"),
    log:
        "logs/inputs_summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/inputs_summary.py"
