"""English paraphrase data in the pairs contract: ``pair_id, dataset, anchor, positive, negative``.

Each paraphrase dataset (MNLI triplets, SentenceCompression, SimpleWiki, Altlex, Quora
duplicates) is read from the Hub (:mod:`modsent.sources.hub`) or from a local file
(:mod:`modsent.sources.local`) into records with ``anchor``, ``positive`` and, for triplets,
``negative``; :func:`pairs_frame` turns them into the contract's DataFrame.

``pair_id`` is a content hash of ``(dataset, anchor, positive, negative)``: a rerun, a reordered
source or a different mirror of the same data gives the same ids, and translated copies keep
the English pair's id. Exact duplicates (same id) are dropped, keeping the first.

``max_pairs`` is applied by :func:`cap_pairs`: the pairs with the ``max_pairs`` smallest
``hash(seed, pair_id)`` are kept, in their input order. This is a seeded shuffle whose result
depends only on which pairs exist, not on the order they arrive in, so the selection is stable
across reruns and reorderings, and a larger cap keeps every pair of a smaller one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from modsent.io import InputError, atomic_path
from modsent.sources.corpus import normalise_text
from modsent.sources.local import record_location

PAIR_COLUMNS = ("pair_id", "dataset", "anchor", "positive", "negative")


def make_pair_id(dataset: str, anchor: str, positive: str, negative: str | None) -> str:
    """A stable id: 32 hex characters of SHA-256 over the JSON array of the four fields."""
    payload = json.dumps([dataset, anchor, positive, negative], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def pairs_frame(records: Iterable[Mapping], dataset: str, *, source: str | None = None) -> pd.DataFrame:
    """The contract DataFrame for one dataset's records (dicts with anchor, positive(, negative)).

    Texts are normalised (:func:`~modsent.sources.corpus.normalise_text`). Records whose anchor or
    positive is empty, or whose anchor equals its positive (no training signal), are dropped, as
    are exact duplicates. ``negative`` is null where the record has none.
    """
    source = source or dataset
    rows: dict[str, list] = {column: [] for column in PAIR_COLUMNS}
    seen: set[str] = set()
    for number, record in enumerate(records, start=1):
        missing = [c for c in ("anchor", "positive") if c not in record]
        if missing:
            raise InputError(f"{record_location(record, source, number)}: missing field(s) {', '.join(missing)}; "
                             f"found {', '.join(record)}")
        anchor, positive, negative = record["anchor"], record["positive"], record.get("negative")
        for name, value in (("anchor", anchor), ("positive", positive), ("negative", negative)):
            if value is not None and not isinstance(value, str):
                raise InputError(f"{record_location(record, source, number)}: {name} must be a string, got "
                                 f"{type(value).__name__}")
        anchor = normalise_text(anchor or "")
        positive = normalise_text(positive or "")
        negative = normalise_text(negative) if negative is not None else None
        if not anchor or not positive or anchor == positive:
            continue
        negative = negative or None
        pair_id = make_pair_id(dataset, anchor, positive, negative)
        if pair_id in seen:
            continue
        seen.add(pair_id)
        for column, value in zip(PAIR_COLUMNS, (pair_id, dataset, anchor, positive, negative)):
            rows[column].append(value)
    return _frame(rows)


def _frame(rows: Mapping[str, Sequence]) -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(rows[column], dtype="string") for column in PAIR_COLUMNS})


def read_hub_pairs(
    definition,
    *,
    limit: int | None = None,
    revision: str | None = None,
    streaming: bool = True,
) -> pd.DataFrame:
    """A catalog entry (:data:`modsent.sources.hub.CATALOG`, name or object) as the contract."""
    from modsent.sources.hub import get_definition, iter_hub_records

    if isinstance(definition, str):
        definition = get_definition(definition)
    if definition.kind not in ("pairs", "triplets"):
        raise InputError(f"source {definition.name!r} holds {definition.kind}, not pairs or triplets")
    records = iter_hub_records(definition, limit=limit, streaming=streaming, revision=revision)
    return pairs_frame(records, definition.dataset, source=f"source {definition.name!r}")


def read_local_pairs(
    path: str | os.PathLike,
    dataset: str,
    *,
    format: str | None = None,  # noqa: A002
    columns: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """A local file of pairs or triplets as the contract; ``columns`` maps anchor/positive/negative."""
    from modsent.sources.local import iter_local_records

    if columns is None:
        # no mapping: each record's anchor, positive and, where it has one, hard negative (a later
        # record's negative counts as much as the first's; a record without a positive is an error)
        records = list(iter_local_records(path, format=format))
        missing = [c for c in ("anchor", "positive") if not records or c not in records[0]]
        if missing:
            found = sorted(records[0]) if records else []
            raise InputError(f"{path}: missing column(s) {missing}; found {found} "
                             "(map yours with columns: {anchor: ..., positive: ..., negative: ...})")
        fields = ("anchor", "positive", "negative")
        return pairs_frame((r.like({c: r[c] for c in fields if c in r}) for r in records), dataset, source=str(path))
    return pairs_frame(iter_local_records(path, format=format, columns=columns), dataset, source=str(path))


def combine_pairs(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate contract frames in order, dropping pairs whose id appeared before."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return _frame({c: [] for c in PAIR_COLUMNS})
    combined = pd.concat([f.loc[:, list(PAIR_COLUMNS)] for f in frames], ignore_index=True)
    return combined.drop_duplicates("pair_id", keep="first").reset_index(drop=True)


def cap_pairs(pairs: pd.DataFrame, max_pairs: int | None, *, seed: int = 0) -> pd.DataFrame:
    """At most ``max_pairs`` pairs: those with the smallest ``hash(seed, pair_id)``, in input order."""
    if max_pairs is not None and max_pairs < 0:
        raise InputError(f"max_pairs must be >= 0, got {max_pairs}")
    if max_pairs is None or len(pairs) <= max_pairs:
        return pairs.reset_index(drop=True)
    prefix = f"{seed}:".encode()
    ranks = pairs["pair_id"].map(
        lambda pid: hashlib.blake2b(prefix + pid.encode(), digest_size=8).digest()
    )
    keep = ranks.sort_values(kind="stable").index[:max_pairs]
    return pairs.loc[sorted(keep)].reset_index(drop=True)


def write_pairs(pairs: pd.DataFrame, path: str | os.PathLike) -> int:
    """Write a contract frame to parquet atomically (all columns string, negative nullable)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
    if missing:
        raise InputError(f"{path}: pairs lack column(s) {', '.join(missing)}; have {', '.join(pairs.columns)}")
    if len(pairs) == 0:
        raise InputError(f"{path}: no pairs to write")
    frame = pairs.loc[:, list(PAIR_COLUMNS)]
    for column in ("pair_id", "dataset", "anchor", "positive"):
        if frame[column].isna().any():
            raise InputError(f"{path}: column {column!r} has null values")
    duplicated = frame["pair_id"][frame["pair_id"].duplicated()]
    if len(duplicated):
        raise InputError(f"{path}: pair_id {duplicated.iloc[0]!r} appears more than once")
    schema = pa.schema(
        [pa.field(c, pa.string(), nullable=(c == "negative")) for c in PAIR_COLUMNS]
    )
    table = pa.Table.from_pydict(
        {c: [None if pd.isna(v) else str(v) for v in frame[c]] for c in PAIR_COLUMNS}, schema=schema
    )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return table.num_rows


def read_pairs(path: str | os.PathLike) -> pd.DataFrame:
    """Read a pairs parquet back, checking it has the contract's columns."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:
        raise InputError(f"{path}: not a readable parquet file ({err})") from None
    missing = [c for c in PAIR_COLUMNS if c not in table.column_names]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(table.column_names)}")
    return _frame({c: table.column(c).to_pylist() for c in PAIR_COLUMNS})
