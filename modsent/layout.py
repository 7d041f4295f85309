"""The workflow's file layout, in one place: where each stage's inputs and outputs live,
relative to the working directory. The rules (rules/common.smk), the methods registry and the
command line build paths with these functions, so no code rebuilds another stage's paths.
"""

from __future__ import annotations


def base_model(base: str) -> str:
    """The base model as a sentence-transformers directory."""
    return f"resources/base_models/{base}"


def pairs(lang: str) -> str:
    """The paraphrase pairs in ``lang`` (the same pair_ids in every language)."""
    return f"results/paraphrase/{lang}.parquet"


def translations(lang: str) -> str:
    """``unit_id, text, translation`` of every English sentence, translated into ``lang``."""
    return f"results/translation/{lang}.parquet"


def results(base: str) -> str:
    """The results tree of one base model."""
    return f"results/{base}"


METHODS_DIR = "methods"


def method_output(base: str, system: str) -> str:
    """A training method's trained system (a sentence-transformers directory)."""
    return f"{results(base)}/{METHODS_DIR}/{system}"


def method_relative(system: str) -> str:
    """:func:`method_output` relative to the results tree (``results/{base}``)."""
    return f"{METHODS_DIR}/{system}"
