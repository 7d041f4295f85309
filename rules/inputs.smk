# Inputs: every source declared in the config, written in the design's contracts.
#
# The rules that read what the user gave (these, base_model and evaluation_subset) carry
# `priority: 5`, above every training rule (rules/specialization.smk says why those have theirs):
# they start first, so a local file with a missing column, invalid UTF-8 or a model directory without
# safetensors weights stops the run in its first minutes, and not when the evaluation's turn comes
# hours later (on several cores, a training job started beside the last of them ends first). They
# are quick and every chain waits on some of them.


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
    priority: 5
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
    priority: 5
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
    priority: 5
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
