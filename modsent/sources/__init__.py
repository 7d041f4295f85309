"""Data sources: the Hub catalog, local files and the built-in offline data, and the
functions that write them in the design's contracts (see :mod:`modsent.sources.prepare`); the
evaluation datasets' catalogue and loaders (:mod:`modsent.sources.evaluation`)."""

from modsent.sources.prepare import (
    parse_source,
    prepare_builtin_eval,
    prepare_corpus,
    prepare_paraphrase_dataset,
    prepare_translations,
    write_inputs_summary,
)

__all__ = [
    "parse_source",
    "prepare_builtin_eval",
    "prepare_corpus",
    "prepare_paraphrase_dataset",
    "prepare_translations",
    "write_inputs_summary",
]
