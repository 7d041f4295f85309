"""From a config source spec to the design's contracts: the functions the input rules call.

A source spec is what the config says under ``source:`` (see modsent/schemas/config.schema.yaml):
``"builtin"``, ``"builtin:NAME"``, ``"hf:NAME"`` (an entry of :data:`modsent.sources.hub.CATALOG`),
``"local:PATH"`` (``{lang}`` in PATH becomes the language code), or a mapping for any Hub
dataset (``{hf: ID, config, split, data_files, columns, revision, streaming}``) or local file
(``{local: PATH, format, columns}``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from modsent.io import InputError, atomic_open, write_parquet

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # "builtin" | "hf" | "local"
    name: str | None = None  # builtin:NAME or hf:NAME
    path: str | None = None  # local path (may hold {lang})
    options: Mapping[str, object] = dataclasses.field(default_factory=dict)  # mapping form

    def describe(self) -> str:
        if self.kind == "local":
            return f"local:{self.path}"
        if self.kind == "hf" and self.name is None:
            return f"hf:{self.options['hf']}"
        return f"{self.kind}:{self.name}" if self.name else self.kind


def parse_source(spec: str | Mapping | None, key: str = "source") -> Source:
    """Parse a config source spec; :class:`InputError` names ``key`` when it is malformed."""
    if isinstance(spec, Mapping):
        if "hf" in spec:
            return Source("hf", options=dict(spec))
        if "local" in spec:
            return Source("local", path=str(spec["local"]), options=dict(spec))
        raise InputError(f"{key}: a source mapping needs an 'hf' or a 'local' key, got {sorted(spec)}")
    if not isinstance(spec, str) or not spec:
        raise InputError(f"{key}: expected a source such as 'builtin', 'hf:NAME' or 'local:PATH', got {spec!r}")
    if spec == "builtin":
        return Source("builtin")
    kind, _, value = spec.partition(":")
    if kind == "builtin" and value:
        return Source("builtin", name=value)
    if kind == "hf" and value:
        return Source("hf", name=value)
    if kind == "local" and value:
        return Source("local", path=value)
    raise InputError(f"{key}: {spec!r} is not a source: expected 'builtin', 'hf:NAME' or 'local:PATH'")


def _custom_hub_definition(source: Source, kind: str, dataset: str):
    """A :class:`~modsent.sources.hub.HubDataset` for a mapping-form Hub source."""
    from modsent.sources.hub import KIND_COLUMNS, HubDataset

    opts = dict(source.options)
    templated = lambda s: s.replace("{lang}", "{code}") if isinstance(s, str) else s  # noqa: E731
    data_files = templated(opts.get("data_files"))
    config = templated(opts.get("config"))
    per_language = "{code}" in (data_files or "") + (config or "")
    builder = None
    if data_files:
        suffixes = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".jsonl.gz": "json",
                    ".json.gz": "json", ".txt": "text", ".txt.gz": "text", ".csv": "csv", ".tsv": "csv"}
        builder = next((b for s, b in suffixes.items() if data_files.endswith(s)), None)
        if builder is None:
            raise InputError(f"source hf:{opts['hf']}: cannot tell the format of data_files {data_files!r}")
    columns = dict(opts.get("columns") or {})
    for column in KIND_COLUMNS[kind]:
        columns.setdefault(column, column)
    return HubDataset(
        name=str(opts["hf"]), dataset=dataset, kind=kind, columns=columns, repo_id=str(opts["hf"]),
        builder=builder, config=config, data_files=data_files, split=str(opts.get("split", "train")),
        builder_kwargs={"delimiter": "\t"} if (data_files or "").endswith(".tsv") else {},
        revision=opts.get("revision"), languages=None if per_language else frozenset({"en"}),
    )


# ---- corpora ------------------------------------------------------------------------------


def corpus_records(source: Source, lang: str, *, split_documents) -> tuple[Iterable, bool]:
    """The records of a corpus source for ``lang`` and whether they are documents."""
    if source.kind == "builtin":
        from modsent.sources.builtin import builtin_corpus

        if source.name is not None:
            raise InputError(f"corpora.source: 'builtin:{source.name}': the built-in corpus has no named sets; "
                             "write 'builtin'")
        return builtin_corpus(lang), split_documents is True
    if source.kind == "local":
        from modsent.sources.local import iter_local_records

        path = source.path.replace("{lang}", lang)
        columns = source.options.get("columns") or None
        records = iter_local_records(path, format=source.options.get("format"), columns=columns)
        return records, split_documents is True
    from modsent.sources.hub import get_definition, iter_hub_records

    if source.name is not None:
        definition = get_definition(source.name)
    else:
        kind = "documents" if split_documents is True else "sentences"
        definition = _custom_hub_definition(source, kind, dataset=f"corpus-{lang}")
    documents = definition.kind == "documents" if split_documents == "auto" else bool(split_documents)
    streaming = bool(source.options.get("streaming", True))
    return iter_hub_records(definition, lang=lang, streaming=streaming,
                            revision=source.options.get("revision")), documents


def corpus_source_specs(spec) -> list:
    """The corpus sources of a language's ``source`` setting: one spec, or a list of them."""
    return list(spec) if isinstance(spec, (list, tuple)) else [spec]


def prepare_corpus(lang: str, settings: Mapping, out_path: str | Path) -> int:
    """Write ``resources/corpora/{lang}.txt`` from the language's corpus settings: its source, or
    its sources interleaved sentence by sentence (:func:`modsent.sources.corpus.iter_corpus`),
    written as they are read."""
    from modsent.sources.corpus import iter_corpus, write_corpus

    specs = corpus_source_specs(settings["source"])
    key = f"corpora source of {lang!r}"
    sources = [parse_source(spec, key=key if len(specs) == 1 else f"{key} [{i}]") for i, spec in enumerate(specs)]
    names = [source.describe() for source in sources]
    # two mappings of one repository (MADLAD-400's clean and noisy files) describe alike: numbered
    names = [f"{name} [{i}]" if names.count(name) > 1 else name for i, name in enumerate(names)]
    start = time.perf_counter()
    streams = []
    for source, name in zip(sources, names):
        records, documents = corpus_records(source, lang, split_documents=settings["split_documents"])
        streams.append((records, documents, f"{name} ({lang})"))
    described = " + ".join(names)
    stats: dict[str, int] = {}
    sentences = iter_corpus(streams, settings["max_sentences"], settings["min_chars"], settings["max_chars"],
                            lang, stats=stats)
    count = write_corpus(sentences, out_path, source=f"{described} ({lang})")
    log.info("corpus %s from %s: %d sentences in %.1f s; %s", lang, described, count,
             time.perf_counter() - start, stats)
    return count


# ---- paraphrases --------------------------------------------------------------------------


# the ``dataset`` labels of the built-in paraphrase set's subsets (sources.builtin.builtin_paraphrases;
# a test checks them), known here without importing it while planning
BUILTIN_PARAPHRASE_SETS = ("builtin-countries", "builtin-languages", "builtin-currencies", "builtin-scripts",
                           "builtin-pivot")


def present_builtin_paraphrase_sets() -> frozenset[str]:
    """The built-in paraphrase sets that hold pairs with the packages installed here (a set whose
    names no installed catalog translates into every demo language has none): builds the
    built-in pairs (about 2 s), so only the checks that name a set call it."""
    from modsent.sources.builtin import builtin_paraphrases

    return frozenset(builtin_paraphrases()["dataset"].unique())


def paraphrase_labels(name: str, spec: Mapping) -> set[str]:
    """The values of the ``dataset`` column that paraphrases.``name``'s file will hold, known
    without reading it: a catalog entry's ``dataset``, a built-in subset's name (the whole
    built-in set: every subset's), else ``name`` (local files, other Hub repositories)."""
    source = parse_source(spec["source"], key=f"paraphrases.{name}.source")
    if source.kind == "builtin":
        return set(BUILTIN_PARAPHRASE_SETS) if source.name is None else {source.name}
    if source.kind == "hf" and source.name is not None:
        from modsent.sources.hub import get_definition

        return {get_definition(source.name).dataset}
    return {name}


def prepare_paraphrase_dataset(name: str, spec: Mapping, out_path: str | Path) -> int:
    """Write one English paraphrase dataset in the contract to ``out_path``."""
    from modsent.sources.paraphrase import (cap_pairs, combine_pairs, pairs_frame,
                                            read_hub_pairs, read_local_pairs, write_pairs)

    source = parse_source(spec["source"], key=f"paraphrases.{name}.source")
    if source.kind == "builtin":
        from modsent.sources.builtin import builtin_paraphrases

        pairs = builtin_paraphrases()
        if source.name is not None:
            pairs = pairs[pairs["dataset"] == source.name]
            if pairs.empty:
                raise InputError(f"paraphrases.{name}.source: no built-in paraphrase set {source.name!r}; "
                                 f"built-in sets: {', '.join(sorted(builtin_paraphrases()['dataset'].unique()))}")
        # each built-in subset keeps its own name in `dataset` (it says where a pair comes from)
        pairs = combine_pairs(pairs_frame(group.to_dict("records"), subset, source="builtin")
                              for subset, group in pairs.groupby("dataset", sort=True))
    elif source.kind == "local":
        pairs = read_local_pairs(source.path, name, format=source.options.get("format"),
                                 columns=source.options.get("columns") or None)
    elif source.name is not None:
        pairs = read_hub_pairs(source.name)
    else:
        columns = source.options.get("columns") or {}
        kind = "triplets" if "negative" in columns else "pairs"
        definition = _custom_hub_definition(source, kind, dataset=name)
        pairs = read_hub_pairs(definition, streaming=bool(source.options.get("streaming", True)))
    before = len(pairs)
    pairs = cap_pairs(pairs, spec.get("max_pairs"))
    if pairs.empty:
        raise InputError(f"paraphrases.{name}: source {source.describe()} gave no pairs")
    count = write_pairs(pairs, out_path)
    log.info("paraphrases %s from %s: %d pairs (%d before the cap)", name, source.describe(), count, before)
    return count


# ---- provided translations ----------------------------------------------------------------


def prepare_translations(spec, lang: str, out_path: str | Path) -> int:
    """Write human translations EN→``lang`` (``english, translation``) to ``out_path``."""
    source = parse_source(spec, key="translation.provided")
    if source.kind == "builtin" and source.name not in (None, "debian"):
        raise InputError(f"translation.provided: unknown built-in translations {source.describe()!r}; "
                         "use 'builtin' or 'builtin:debian' (plus the gettext catalogs of installed "
                         "Debian packages)")
    if source.kind == "builtin":
        from modsent.sources import builtin

        frame = builtin.builtin_translations(lang)
        notices = []
        if source.name == "debian":
            extra = builtin.debian_translations(lang)
            for row in builtin.debian_provenance([lang]):
                notices.append(f"debian ({row['package']} {row['version']}): translations of "
                               f"{', '.join(row['domains'])}; {row['licence']}; {row['copyright']}")
                log.info("Debian catalogs: %s", notices[-1])
            log.info("translations en→%s: %d built-in + %d from Debian's catalogs", lang, len(frame), len(extra))
            frame = pd.concat([frame, extra], ignore_index=True)
    elif source.kind == "local":
        from modsent.sources.local import iter_local_records

        path = source.path.replace("{lang}", lang)
        columns = source.options.get("columns") or {"english": "english", "translation": "translation"}
        frame = pd.DataFrame(list(iter_local_records(path, format=source.options.get("format"),
                                                     columns=columns)))
        for column in ("english", "translation"):
            values = frame[column].tolist() if column in frame else []
            bad = next((i for i, value in enumerate(values) if value is not None and not isinstance(value, str)), None)
            if bad is not None:
                raise InputError(f"{path}: record {bad + 1}: {column!r} is {values[bad]!r}, not a text")
    elif source.kind == "hf" and (source.name == "xnli" or source.options.get("hf") == "facebook/xnli"):
        from modsent.sources.xnli import xnli_translations

        frame = xnli_translations(lang, revision=source.options.get("revision"))
    elif source.kind == "hf" and source.name is None and "xnli" in str(source.options.get("hf")).lower():
        from modsent.sources.xnli import xnli_translations  # a local mirror of facebook/xnli

        frame = xnli_translations(lang, repo_id=str(source.options["hf"]))
    else:
        raise InputError(f"translation.provided: {source.describe()} is not supported for provided "
                         "translations; use 'builtin', 'hf:xnli' or a local file with english and "
                         "translation columns")
    frame = frame[["english", "translation"]].astype("string")
    frame = frame.dropna()
    frame = frame[(frame["english"].str.strip() != "") & (frame["translation"].str.strip() != "")]
    frame = frame.drop_duplicates("english", keep="first").reset_index(drop=True)
    if frame.empty:
        raise InputError(f"translation.provided: {source.describe()} has no translations into {lang!r}")
    if source.kind == "builtin" and notices:
        frame.attrs["modsent_notices"] = notices    # parquet metadata: read back by cards.data_notices
    write_parquet(frame, out_path)
    log.info("translations en→%s from %s: %d", lang, source.describe(), len(frame))
    return len(frame)


# ---- built-in evaluation data -------------------------------------------------------------


def prepare_builtin_eval(task: str, lang: str, out_path: str | Path) -> int:
    """Held-out built-in data for one language.

    ``parallel``: ``id, text`` — the language's translations of the evaluation texts that every
    demo language (``builtin.DEMO_LANGUAGES``) translates: a fixed multi-parallel set (~500 ids)
    like FLORES, so a file never depends on which other languages are configured, and the demo
    encodes ~500 sentences per language instead of every catalog string (~4K for English).
    ``classification``: ``id, text, label, split``; ``paraphrase``: ``id, anchor, positive``.
    """
    from modsent.sources import builtin

    if task == "parallel":
        universe = set(builtin.builtin_parallel_eval(builtin.DEMO_LANGUAGES)["id"])
        frame = builtin.builtin_parallel_eval([lang]).rename(columns={lang: "text"})[["id", "text"]]
        frame = frame[frame["id"].isin(universe)].reset_index(drop=True)
    elif task == "classification":
        frame = builtin.builtin_classification(lang)
    elif task == "paraphrase":
        frame = builtin.builtin_paraphrase_eval(lang)
    else:
        raise ValueError(f"unknown built-in evaluation task {task!r}")
    write_parquet(frame, out_path)
    log.info("built-in %s evaluation data for %s: %d rows", task, lang, len(frame))
    return len(frame)


# ---- summary ------------------------------------------------------------------------------


def write_inputs_summary(corpora: list[str], paraphrases: list[str], translations: list[str],
                         out_path: str | Path) -> None:
    """A Markdown table of what each prepared input holds."""
    import pyarrow.parquet as pq

    lines = ["# Prepared inputs", "", "| input | rows | size (KiB) |", "|---|---:|---:|"]
    for path in corpora:
        with open(path, "rb") as handle:
            rows = sum(1 for _ in handle)
        lines.append(f"| {path} | {rows} | {Path(path).stat().st_size / 1024:.1f} |")
    for path in [*paraphrases, *translations]:
        rows = pq.ParquetFile(path).metadata.num_rows
        lines.append(f"| {path} | {rows} | {Path(path).stat().st_size / 1024:.1f} |")
    with atomic_open(out_path) as handle:
        handle.write("\n".join(lines) + "\n")
