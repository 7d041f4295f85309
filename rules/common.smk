# Helpers shared by all stages (config checking, names, input functions, targets).
# No rule lives here; each stage has its own file.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir)))  # import modsent from this checkout

from modsent import config as modsent_config
from modsent import languages as registry

LANGUAGE_REGEX = registry.wildcard_regex()
SLUG_REGEX = r"[A-Za-z0-9][A-Za-z0-9._-]*"
ENV = "../envs/modsent.yaml"


def check_and_fill_config(config):
    """Fail before planning when the config is wrong; messages name the key."""
    try:
        modsent_config.check_config(config)
    except modsent_config.ConfigError as err:
        raise WorkflowError(str(err)) from None


def base_name():
    return config["base_model"]["name"]


def languages():
    return list(config["languages"])


def non_english():
    return [lang for lang in languages() if lang != modsent_config.PIVOT_LANGUAGE]


# ---- inputs -------------------------------------------------------------------------------


def base_model_dir():
    """The base model as a local sentence-transformers directory (made by base_model)."""
    return f"resources/base_models/{base_name()}"


def corpus_path(lang):
    return f"resources/corpora/{lang}.txt"


def corpus_settings(wildcards):
    return modsent_config.corpus_settings(config, wildcards.lang)


def paraphrase_spec(wildcards):
    return config["paraphrases"][wildcards.dataset]


def paraphrase_source_paths():
    return expand("resources/paraphrases/{dataset}.parquet", dataset=list(config["paraphrases"]))


def translation_targets():
    if config["translation"]["engine"] != "provided":
        return []
    return expand("resources/translations/{lang}.parquet", lang=non_english())


def evaluation_data_targets():
    if not config["evaluation_data"]["builtin"]:
        return []
    return expand(
        "resources/eval/{task}/{lang}.parquet",
        task=["parallel", "classification"],
        lang=languages(),
    )


def input_targets():
    return (
        [base_model_dir()]
        + [corpus_path(lang) for lang in languages()]
        + paraphrase_source_paths()
        + translation_targets()
        + evaluation_data_targets()
        + ["resources/inputs_summary.md"]
    )


# ---- paraphrase data and translation ------------------------------------------------------


def translation_model_input(wildcards):
    """The converted CTranslate2 model for that engine; nothing for transformers (it loads
    the checkpoint itself, from the Hub or a local path)."""
    if config["translation"]["engine"] == "ctranslate2":
        return ["resources/mt_models/ct2"]
    return []


def paraphrase_targets():
    targets = expand("results/paraphrase/{lang}.parquet", lang=languages())
    if non_english():
        targets.append("results/translation/quality.md")
    return targets


# ---- monolingual specialization -----------------------------------------------------------


def tokenizer_settings(wildcards):
    return modsent_config.tokenizer_settings(config, wildcards.lang)


def language_adapter_settings(wildcards):
    return modsent_config.language_adapter_settings(config, wildcards.lang)


def language_adapter_dirs(wildcards):
    return expand(
        "results/{base}/language_adapters/{lang}",
        base=wildcards.base,
        lang=modsent_config.specialized_languages(config),
    )


def specialization_targets():
    if not modsent_config.specialized_languages(config):
        return []
    return [f"results/{base_name()}/language_adapters/summary.md"]


# ---- sentence encoding -----------------------------------------------------------------------


def sentence_adapter_inputs(wildcards):
    """Base model, the language's pairs and, unless the language skips it, its LA."""
    inputs = {
        "base": f"resources/base_models/{wildcards.base}",
        "pairs": f"results/paraphrase/{wildcards.lang}.parquet",
    }
    if wildcards.lang in modsent_config.specialized_languages(config):
        inputs["language_adapter"] = f"results/{wildcards.base}/language_adapters/{wildcards.lang}"
    return inputs


def sentence_adapter_dirs(wildcards):
    return expand("results/{base}/sentence_adapters/{lang}", base=wildcards.base, lang=languages())


def sentence_encoding_targets():
    return [f"results/{base_name()}/sentence_adapters/summary.md"]


# ---- cross-lingual alignment -------------------------------------------------------------------


def _language_modules(base, lang):
    """The inputs naming a language's frozen encoder: its LA (unless skipped) and SE adapter."""
    inputs = {
        "base": f"resources/base_models/{base}",
        "sentence_adapter": f"results/{base}/sentence_adapters/{lang}",
    }
    if lang in modsent_config.specialized_languages(config):
        inputs["language_adapter"] = f"results/{base}/language_adapters/{lang}"
    return inputs


def english_encoder_inputs(wildcards):
    return _language_modules(wildcards.base, modsent_config.PIVOT_LANGUAGE)


def alignment_inputs(wildcards):
    inputs = _language_modules(wildcards.base, wildcards.lang)
    if wildcards.kind == "pp":
        inputs["english_pairs"] = "results/paraphrase/en.parquet"
        inputs["pairs"] = f"results/paraphrase/{wildcards.lang}.parquet"
    else:
        inputs["translations"] = f"results/translation/{wildcards.lang}.parquet"
    return inputs


def alignment_settings(wildcards):
    return config["alignment"]


def merge_weight_names():
    return [f"{w:g}" for w in config["alignment"]["merge_weights"]]


def alignment_dirs(wildcards):
    return expand("results/{base}/alignment/{kind}/{lang}", base=wildcards.base,
                  kind=["pp", "pl"], lang=non_english())


def alignment_targets():
    if not non_english():
        return []
    return [f"results/{base_name()}/alignment/summary.md"] + expand(
        "results/{base}/alignment/merged-{weight}/{lang}", base=base_name(),
        weight=merge_weight_names(), lang=non_english())


def all_targets():
    """Everything the configured run produces: the target list of the default target."""
    return (
        input_targets()
        + paraphrase_targets()
        + specialization_targets()
        + sentence_encoding_targets()
        + alignment_targets()
    )
