"""Catalog of the Hugging Face Hub datasets the workflow reads (``hf:`` sources), and a loader.

Every entry of :data:`CATALOG` is a :class:`HubDataset`: where the data lives, how to load it
with ``datasets.load_dataset`` (datasets >= 4, which runs no loading scripts), which columns hold
what, and which languages it covers. :func:`iter_hub_records` streams an entry's rows as
records in the names of our contracts:

- ``documents`` / ``sentences``: ``{"text": ...}`` (a document may hold several lines);
- ``pairs``: ``{"anchor": ..., "positive": ...}``;
- ``triplets``: ``{"anchor": ..., "positive": ..., "negative": ...}``.

Language codes: the workflow's registry uses ISO 639-1 where one exists (``de``, ``zh``); each
source has its own codes (CC-100 ``zh-Hans``, ``ns``). :meth:`HubDataset.source_codes` maps one
to the other, and a language a source lacks raises :class:`~modsent.io.InputError` naming the
language and the source before anything is downloaded.

Every id, file name, config, split and column here was read off the dataset's card or file
listing on the Hub; each entry's ``evidence`` and ``tests/fixtures/hub/README.md`` say where. The test suite loads
each entry from ``tests/fixtures/hub/``: a local copy of the repository's layout with the same
file names, column names and types, through the same ``load_dataset`` call, with the repository
(or base URL) swapped for the fixture folder via :func:`dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal
from urllib.parse import quote

from modsent.io import InputError

Kind = Literal["documents", "sentences", "pairs", "triplets"]

KIND_COLUMNS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "documents": ("text",),
        "sentences": ("text",),
        "pairs": ("anchor", "positive"),
        "triplets": ("anchor", "positive", "negative"),
    }
)


@dataclass(frozen=True)
class HubDataset:
    """How to load one dataset with ``datasets.load_dataset`` and read its rows.

    Two ways to load, chosen by ``builder``:

    - ``builder=None``: ``load_dataset(repo_id, config, split=split)``: for repositories whose
      card declares configs over parquet files (the Hub's standard layout);
    - ``builder="json" | "text" | "parquet"``: a packaged builder over ``data_files``, a glob
      relative to the repository root (``hf://datasets/{repo_id}``) or to ``base_url``. Used for
      file-based repositories (MADLAD-400, embedding-training-data) and for CC-100, whose files
      live on statmt.org.

    ``config`` and ``data_files`` may hold ``{code}``, replaced by the source's language code.
    """

    name: str  # catalog key
    dataset: str  # logical name written to the contract's ``dataset`` column
    kind: Kind
    columns: Mapping[str, str]  # contract name → source column
    repo_id: str | None = None  # Hub repository, or a local directory laid out like it
    base_url: str | None = None  # root of data files outside the Hub (CC-100)
    builder: str | None = None
    config: str | None = None
    data_files: str | None = None
    split: str = "train"
    builder_kwargs: Mapping[str, object] = field(default_factory=dict)
    revision: str | None = None  # default revision of the repository
    # Languages, in the source's own codes; None = per-language but not enumerated here, so a
    # language is checked by resolving its data files; frozenset({"en"}) = English only.
    languages: frozenset[str] | None = frozenset({"en"})
    # ISO 639-1 (or registry) code → candidate source codes, tried in order.
    lang_map: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # "columns": rows are dicts; "json-line": rows are {"text": line} whose line is one JSON
    # value (embedding-training-data: [a, b], [a, b, c], {"set": [...]}, {"query", "pos", "neg"}).
    row_format: Literal["columns", "json-line"] = "columns"
    # "nli-triplets": rows are NLI pairs, turned into (premise, entailed, contradicted) triplets.
    transform: Literal["nli-triplets"] | None = None
    # The text holds the two characters backslash-n where a line break belongs.
    literal_newlines: bool = False
    evidence: str = ""  # the pages its facts were read from
    notes: str = ""

    @property
    def per_language(self) -> bool:
        return self.languages != frozenset({"en"})

    def source_codes(self, lang: str | None) -> tuple[str, ...]:
        """The source's candidate codes for registry language ``lang`` (the first that exists wins).

        Raises :class:`InputError` when ``lang`` is missing for a per-language source, or when the
        source is known not to cover it.
        """
        if not self.per_language:
            if lang not in (None, "en"):
                raise InputError(
                    f"language {lang!r} is not available in source {self.name!r}: it is English only "
                    "(other languages get translated paraphrases, not this source)"
                )
            return ()
        if not lang:
            raise InputError(f"source {self.name!r} is per-language: a language code is required")
        candidates = self.lang_map.get(lang, (lang,))
        if self.languages is not None:
            present = tuple(code for code in candidates if code in self.languages)
            if not present and lang in self.languages:
                present = (lang,)
            if not present:
                looked_for = ""
                if candidates != (lang,):
                    looked_for = f" (looked for {', '.join(repr(c) for c in candidates)})"
                raise InputError(
                    f"language {lang!r} is not available in source {self.name!r}{looked_for}; "
                    f"it covers {len(self.languages)} codes: {', '.join(sorted(self.languages))}"
                )
            return present
        return candidates


# --- language coverage ---------------------------------------------------------------------

# CC-100 file names are https://data.statmt.org/cc-100/{code}.txt.xz. The list is the one of
# the Hub's statmt/cc100 card ("Add list of languages to dataset card", 7517c8e) and of its
# loading script (_LANGUAGES, dd27e7f), the same as torchtext's CC100 VALID_CODES plus "af".
# *_rom are romanised, my_zaw is Burmese in the Zawgyi encoding, zh-Hans/zh-Hant the scripts.
CC100_CODES = frozenset(
    """
    af am ar as az be bg bn bn_rom br bs ca cs cy da de el en eo es et eu fa ff fi fr fy ga gd
    gl gn gu ha he hi hi_rom hr ht hu hy id ig is it ja jv ka kk km kn ko ku ky la lg li ln lo
    lt lv mg mk ml mn mr ms my my_zaw ne nl no ns om or pa pl ps pt qu rm ro ru sa sc sd si sk
    sl so sq sr ss su sv sw ta ta_rom te te_rom th tl tn tr ug uk ur ur_rom uz vi wo xh yi yo
    zh-Hans zh-Hant zu
    """.split()
)

CC100_LANG_MAP: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "zh": ("zh-Hans",),  # the registry's zh is Simplified Chinese; pass zh-Hant for Traditional
        "nso": ("ns",),  # Northern Sotho has no ISO 639-1 code; CC-100 calls it ns
        "fil": ("tl",),
        "nb": ("no",),  # CC-100 has one Norwegian file, no
    }
)

# MADLAD-400's folders use Google LangID codes: mostly ISO 639-1/-3, some with a script suffix
# (ber_Latn, bg_Latn). Hebrew and Filipino have two plausible spellings (he/iw, fil/tl), so both
# are tried; the first whose files exist is used.
MADLAD_LANG_MAP: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "he": ("he", "iw"),
        "fil": ("fil", "tl"),
        "tl": ("tl", "fil"),
        "nb": ("nb", "no"),
        "no": ("no", "nb"),
    }
)


# --- the catalog ---------------------------------------------------------------------------

CC100 = HubDataset(
    name="cc100",
    dataset="cc100",
    kind="documents",
    columns={"text": "text"},
    base_url="https://data.statmt.org/cc-100",
    builder="text",
    data_files="{code}.txt.xz",
    builder_kwargs={"sample_by": "paragraph"},
    languages=CC100_CODES,
    lang_map=CC100_LANG_MAP,
    evidence=(
        "huggingface.co/datasets/statmt/cc100: main holds only cc100.py (a loading script that "
        "datasets>=4 refuses) and README.md; the script reads _BASE_URL = "
        "'https://data.statmt.org/cc-100/{}.txt.xz'. Format (statmt page, quoted by the Hub card): "
        "documents separated by double newlines, paragraphs within a document by a newline."
    ),
    notes=(
        "Loaded with the packaged 'text' builder straight from the statmt.org files the Hub "
        "script used, one record per document (sample_by='paragraph' splits on blank lines)."
    ),
)

CC100_PARQUET_EXPORT = HubDataset(
    name="cc100-parquet-export",
    dataset="cc100",
    kind="documents",
    columns={"text": "text"},
    repo_id="statmt/cc100",
    revision="refs/convert/parquet",
    builder="parquet",
    data_files="{code}/*train/*.parquet",
    languages=None,
    lang_map=CC100_LANG_MAP,
    evidence=(
        "huggingface.co/datasets/statmt/cc100/tree/refs%2Fconvert%2Fparquet/be/train "
        "(0000.parquet ... 0009.parquet) and .../am/train; columns id, text (dataset_info)."
    ),
    notes=(
        "The Hub's automatic parquet export of the script dataset: only the languages the "
        "converter ran on, big ones truncated to a 'partial-train' folder; one row per "
        "paragraph, documents separated by a row holding a lone newline."
    ),
)

MADLAD400 = HubDataset(
    name="madlad-400",
    dataset="madlad-400",
    kind="documents",
    columns={"text": "text"},
    repo_id="allenai/MADLAD-400",
    builder="json",
    data_files="data/{code}/{code}_clean_*.jsonl.gz",
    languages=None,
    lang_map=MADLAD_LANG_MAP,
    literal_newlines=True,
    evidence=(
        "huggingface.co/datasets/allenai/MADLAD-400/tree/main/data/<lang>: <lang>_clean_0000.jsonl.gz"
        " and <lang>_noisy_NNNN.jsonl.gz; madlad-400.py _DATA_URL = .../data/{language}/"
        "{language}_{split}_{index:04d}.jsonl.gz; one JSON object {\"text\": ...} per line."
    ),
    notes=(
        "The repository ships madlad-400.py, so load_dataset('allenai/madlad-400', 'de') needs "
        "a script and fails on datasets>=4; the 'json' builder over the clean shards does not. "
        "Documents are lines joined by newlines, written in places as the two characters \\n."
    ),
)

_ETD = "sentence-transformers/embedding-training-data"
_ETD_EVIDENCE = (
    "huggingface.co/datasets/sentence-transformers/embedding-training-data: files "
    "sentence-compression.jsonl.gz, SimpleWiki.jsonl.gz, altlex.jsonl.gz, quora_duplicates.jsonl.gz, "
    "quora_duplicates_triplets.jsonl.gz; README 'Data Format': one JSON value per line, pairs "
    "[\"text1\", \"text2\"], triplets [\"anchor\", \"positive\", \"negative\"], sets {\"set\": [...]}."
)


def _etd(name: str, file: str, kind: Kind) -> HubDataset:
    # Lines are JSON lists, which the 'json' builder cannot read (it wants objects): the 'text'
    # builder hands us each line and we parse it.
    return HubDataset(
        name=name,
        dataset=name.removesuffix("-triplets"),
        kind=kind,
        columns={"text": "text"},
        repo_id=_ETD,
        builder="text",
        data_files=file,
        row_format="json-line",
        evidence=_ETD_EVIDENCE,
    )


ETD_SENTENCE_COMPRESSION = _etd("sentence-compression", "sentence-compression.jsonl.gz", "pairs")
ETD_SIMPLE_WIKI = _etd("simple-wiki", "SimpleWiki.jsonl.gz", "pairs")
ETD_ALTLEX = _etd("altlex", "altlex.jsonl.gz", "pairs")
ETD_QUORA = _etd("quora-duplicates", "quora_duplicates.jsonl.gz", "pairs")
ETD_QUORA_TRIPLETS = _etd("quora-duplicates-triplets", "quora_duplicates_triplets.jsonl.gz", "triplets")


def _st(name: str, repo: str, config: str, kind: Kind, columns: Mapping[str, str], evidence: str) -> HubDataset:
    return HubDataset(
        name=name,
        dataset=name.removeprefix("st-").removesuffix("-triplets"),
        kind=kind,
        columns=columns,
        repo_id=repo,
        config=config,
        evidence=evidence,
    )


ST_SENTENCE_COMPRESSION = _st(
    "st-sentence-compression",
    "sentence-transformers/sentence-compression",
    "pair",
    "pairs",
    {"anchor": "text", "positive": "simplified"},
    "card: config 'pair', data_files pair/train-*, columns text, simplified (str); 180,000 rows",
)
ST_SIMPLE_WIKI = _st(
    "st-simple-wiki",
    "sentence-transformers/simple-wiki",
    "pair",
    "pairs",
    {"anchor": "text", "positive": "simplified"},
    "card: config 'pair', data_files pair/train-*, columns text, simplified; 102,225 rows",
)
ST_ALTLEX = _st(
    "st-altlex",
    "sentence-transformers/altlex",
    "pair",
    "pairs",
    {"anchor": "text", "positive": "simplified"},
    "card: config 'pair', data_files pair/train-*, columns text, simplified; 112,696 rows",
)
ST_QUORA = _st(
    "st-quora-duplicates",
    "sentence-transformers/quora-duplicates",
    "pair",
    "pairs",
    {"anchor": "anchor", "positive": "positive"},
    "card: configs pair (anchor, positive; 149,263), pair-class, triplet (101,762), triplet-all",
)
ST_QUORA_TRIPLETS = _st(
    "st-quora-duplicates-triplets",
    "sentence-transformers/quora-duplicates",
    "triplet",
    "triplets",
    {"anchor": "anchor", "positive": "positive", "negative": "negative"},
    "card: config triplet, data_files triplet/train-*, columns anchor, positive, negative",
)

MNLI = HubDataset(
    name="mnli",
    dataset="mnli",
    kind="triplets",
    columns={"premise": "premise", "hypothesis": "hypothesis", "label": "label"},
    repo_id="nyu-mll/multi_nli",
    split="train",
    transform="nli-triplets",
    evidence=(
        "huggingface.co/datasets/nyu-mll/multi_nli: converted to parquet (#5), data/"
        "train-00000-of-00001.parquet, validation_matched-..., validation_mismatched-...; "
        "features promptID, pairID, premise, hypothesis, genre, label (0 entailment, 1 neutral, "
        "2 contradiction); 392,702 train rows."
    ),
    notes=(
        "One triplet per premise: (premise, its first entailed hypothesis, its first contradicted "
        "one) in file order, about 128K. sentence-transformers/all-nli's triplet config is "
        "SNLI + MNLI (557,850 rows), so it is not used."
    ),
)

SNLI = HubDataset(
    name="snli",
    dataset="snli",
    kind="triplets",
    columns={"premise": "premise", "hypothesis": "hypothesis", "label": "label"},
    repo_id="stanfordnlp/snli",
    config="plain_text",
    split="train",
    transform="nli-triplets",
    evidence=(
        "huggingface.co/datasets/stanfordnlp/snli: converted to parquet (#6), config plain_text, data_files "
        "plain_text/{test,validation,train}-*; features premise, hypothesis (string), label (0 entailment, "
        "1 neutral, 2 contradiction; -1 where the annotators gave no gold label); 550,152 train rows."
    ),
    notes=(
        "English only: m-ST5's English NLI set is SNLI + MNLI triplets (mSimCSE's); declare it with "
        "english_only: true (paraphrases.{name}.english_only). One triplet per premise as for mnli; rows "
        "without a gold label (-1) are skipped."
    ),
)

CATALOG: Mapping[str, HubDataset] = MappingProxyType(
    {
        d.name: d
        for d in (
            CC100,
            CC100_PARQUET_EXPORT,
            MADLAD400,
            MNLI,
            SNLI,
            ETD_SENTENCE_COMPRESSION,
            ETD_SIMPLE_WIKI,
            ETD_ALTLEX,
            ETD_QUORA,
            ETD_QUORA_TRIPLETS,
            ST_SENTENCE_COMPRESSION,
            ST_SIMPLE_WIKI,
            ST_ALTLEX,
            ST_QUORA,
            ST_QUORA_TRIPLETS,
        )
    }
)

# The English paraphrase data of the paper (~600K pairs): MNLI triplets, SentenceCompression,
# SimpleWiki, Altlex and Quora duplicates, as embedding-training-data ships them.
PAPER_PARAPHRASE_DATASETS = ("mnli", "sentence-compression", "simple-wiki", "altlex", "quora-duplicates")


def get_definition(name: str) -> HubDataset:
    """The catalog entry called ``name``; :class:`InputError` listing the known ones otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise InputError(
            f"unknown Hub source {name!r}; known sources: {', '.join(sorted(CATALOG))}"
        ) from None


# --- loading -------------------------------------------------------------------------------


def _is_local_dir(location: str | None) -> bool:
    return bool(location) and "://" not in location and Path(location).is_dir()


def _files_root(definition: HubDataset, revision: str | None) -> str:
    if definition.base_url:
        return definition.base_url.rstrip("/")
    if not definition.repo_id:
        raise InputError(f"source {definition.name!r} names neither repo_id nor base_url")
    if _is_local_dir(definition.repo_id):
        return str(Path(definition.repo_id))
    root = f"hf://datasets/{definition.repo_id}"
    if revision:
        root += "@" + quote(revision, safe="")  # refs/convert/parquet → refs%2Fconvert%2Fparquet
    return root


def _load(definition: HubDataset, code: str | None, streaming: bool, revision: str | None):
    import datasets

    fill = (lambda s: s.format(code=code)) if code is not None else (lambda s: s)
    if definition.builder is None:
        kwargs: dict = {"split": definition.split, "streaming": streaming}
        if revision and not _is_local_dir(definition.repo_id):
            kwargs["revision"] = revision
        config = fill(definition.config) if definition.config else None
        return datasets.load_dataset(definition.repo_id, config, **kwargs)
    pattern = f"{_files_root(definition, revision)}/{fill(definition.data_files or '')}"
    if pattern.startswith(("http://", "https://")) and not any(c in pattern for c in "*?["):
        files = [pattern]  # a plain URL: load_dataset reports a missing one itself
    else:
        # Resolved here: for a glob that matches nothing, load_dataset with a packaged builder
        # does not raise FileNotFoundError but fails later inside the builder.
        from datasets.data_files import resolve_pattern

        files = sorted(resolve_pattern(pattern, base_path=""))
    return datasets.load_dataset(
        definition.builder,
        data_files={definition.split: files},
        split=definition.split,
        streaming=streaming,
        **dict(definition.builder_kwargs),
    )


def _open(
    definition: HubDataset,
    lang: str | None,
    codes: tuple[str, ...],
    streaming: bool,
    revision: str | None,
):
    """Load the dataset for ``lang``, trying the source's candidate ``codes`` in order."""
    from datasets.exceptions import DatasetNotFoundError

    per_code_files = "{code}" in (definition.data_files or "") + (definition.config or "")
    if not codes:
        codes = (None,)
    missing: list[str] = []
    for code in codes:
        try:
            return _load(definition, code, streaming, revision)
        except DatasetNotFoundError as err:
            raise InputError(f"source {definition.name!r}: {err}") from None
        except FileNotFoundError as err:
            if not per_code_files:
                raise InputError(f"source {definition.name!r}: data files not found ({err})") from None
            missing.append(f"{code!r}")
    raise InputError(
        f"language {lang!r} is not available in source {definition.name!r}: no data files for "
        f"source code{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
        f"(pattern {definition.data_files or definition.config!r})"
    )


def iter_hub_records(
    definition: HubDataset | str,
    lang: str | None = None,
    limit: int | None = None,
    streaming: bool = True,
    revision: str | None = None,
) -> Iterator[dict]:
    """Yield the records of a catalog entry, in the names of its kind's contract.

    ``lang`` is a registry code (ISO 639-1 where one exists); it is mapped to the source's code
    and checked before anything is downloaded (:class:`InputError` when the source lacks it).
    ``limit`` caps the records yielded; with ``streaming`` (the default) nothing but what is
    read is downloaded. ``revision`` pins the repository's commit (default: the entry's own).
    """
    if isinstance(definition, str):
        definition = get_definition(definition)
    if limit is not None and limit < 0:
        raise InputError(f"limit must be >= 0, got {limit}")
    revision = revision or definition.revision
    # Checked here, not in the generator, so a missing language fails at the call.
    codes = definition.source_codes(lang)
    return _generate(definition, lang, codes, limit, streaming, revision)


def _generate(
    definition: HubDataset,
    lang: str | None,
    codes: tuple[str, ...],
    limit: int | None,
    streaming: bool,
    revision: str | None,
) -> Iterator[dict]:
    if limit == 0:
        return
    rows = _rows(definition, _open(definition, lang, codes, streaming, revision))
    if definition.row_format == "json-line":
        records = _json_line_records(definition, rows)
    else:
        records = rows
    if definition.transform == "nli-triplets":
        records = _nli_triplets(records)
    elif definition.literal_newlines:
        records = ({**r, "text": _unescape_newlines(r["text"])} for r in records)
    for count, record in enumerate(records, start=1):
        yield record
        if limit is not None and count >= limit:
            return


def _rows(definition: HubDataset, dataset) -> Iterator[dict]:
    """Rows projected onto the contract names, with a clear error for a missing column."""
    wanted = dict(definition.columns)
    first = True
    read = 0
    try:
        for row in dataset:
            read += 1
            if first:
                missing = [source for source in wanted.values() if source not in row]
                if missing:
                    raise InputError(
                        f"source {definition.name!r}: missing column(s) {', '.join(map(repr, missing))}; "
                        f"columns found: {', '.join(map(repr, row))}"
                    )
                first = False
            yield {name: row[source] for name, source in wanted.items()}
    except UnicodeDecodeError as err:
        files = ", ".join(map(str, definition.data_files and [definition.data_files] or [definition.repo_id]))
        raise InputError(f"source {definition.name!r} ({files}): invalid UTF-8 in record {read + 1} "
                         f"of the stream ({err})") from None


def _json_line_records(definition: HubDataset, rows: Iterator[dict]) -> Iterator[dict]:
    """Parse embedding-training-data lines into anchor/positive(/negative) records."""
    for number, row in enumerate(rows, start=1):
        line = row["text"]
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"source {definition.name!r}: line {number}: invalid JSON ({err.msg})") from None
        texts: list = []
        negative = None
        if isinstance(value, list):
            texts = value
            if definition.kind == "triplets" and len(value) >= 3:
                negative = value[2]
        elif isinstance(value, dict) and "set" in value:
            texts = value["set"]  # a set of paraphrases: its first two form the pair
        elif isinstance(value, dict) and "query" in value:
            texts = [value["query"], *(value.get("pos") or [])[:1]]
            negative = (value.get("neg") or [None])[0] if definition.kind == "triplets" else None
        if len(texts) < 2 or not all(isinstance(t, str) for t in texts[:2]):
            raise InputError(
                f"source {definition.name!r}: line {number}: expected [anchor, positive(, negative)], "
                f'{{"set": [...]}} or {{"query", "pos"}}; got {line[:80]!r}'
            )
        record = {"anchor": texts[0], "positive": texts[1]}
        if definition.kind == "triplets":
            if not isinstance(negative, str):
                raise InputError(f"source {definition.name!r}: line {number}: a triplet needs a negative")
            record["negative"] = negative
        yield record


ENTAILMENT, NEUTRAL, CONTRADICTION = 0, 1, 2


def _nli_triplets(rows: Iterator[dict]) -> Iterator[dict]:
    """(premise, entailed hypothesis, contradicted hypothesis), once per premise.

    A premise's triplet is emitted as soon as both of its hypotheses have been seen, so it is
    built from the first entailment and the first contradiction in file order and the stream
    never waits for the end of the file.
    """
    pending: dict[str, list] = {}
    done: set[str] = set()
    for row in rows:
        premise, hypothesis, label = row["premise"], row["hypothesis"], row["label"]
        if label not in (ENTAILMENT, CONTRADICTION) or not premise or not hypothesis:
            continue
        if premise in done:
            continue
        slots = pending.setdefault(premise, [None, None])
        index = 0 if label == ENTAILMENT else 1
        if slots[index] is None:
            slots[index] = hypothesis
        if slots[0] is not None and slots[1] is not None:
            del pending[premise]
            done.add(premise)
            yield {"anchor": premise, "positive": slots[0], "negative": slots[1]}


def _unescape_newlines(text: str) -> str:
    return text.replace("\\n", "\n") if "\\n" in text else text


def with_location(definition: HubDataset, location: str | os.PathLike) -> HubDataset:
    """The same entry read from ``location`` (a mirror or a local copy of the repository)."""
    if definition.base_url is not None:
        return dataclasses.replace(definition, base_url=str(location))
    return dataclasses.replace(definition, repo_id=str(location))
