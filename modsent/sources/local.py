"""Read records from local files: the ``local:`` sources of the workflow.

One function, :func:`iter_local_records`, turns a txt, tsv, jsonl, jsonl.gz or parquet file
into a stream of ``dict`` records. ``columns`` maps the names a stage expects (its contract,
e.g. ``text`` or ``anchor``/``positive``) to the names the file uses, so a user can point the
workflow at their own data without renaming columns.

Errors are :class:`~modsent.io.InputError` and say what a user can fix: the file, the line
(for the line-based formats), the missing column and the columns that are there.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from modsent.io import InputError, iter_utf8_lines

FORMATS = ("txt", "tsv", "jsonl", "jsonl.gz", "parquet")

# Longest suffix first, so "x.jsonl.gz" is jsonl.gz and not an unknown ".gz".
_SUFFIXES = (
    (".jsonl.gz", "jsonl.gz"),
    (".ndjson.gz", "jsonl.gz"),
    (".jsonl", "jsonl"),
    (".ndjson", "jsonl"),
    (".parquet", "parquet"),
    (".tsv", "tsv"),
    (".txt", "txt"),
)


def infer_format(path: str | os.PathLike) -> str:
    """The format of ``path`` from its suffix (``.jsonl.gz`` → ``"jsonl.gz"``)."""
    name = Path(path).name.lower()
    for suffix, fmt in _SUFFIXES:
        if name.endswith(suffix):
            return fmt
    raise InputError(
        f"{path}: cannot tell the format from the file name; use one of the suffixes "
        f"{', '.join(s for s, _ in _SUFFIXES)} or pass format= (one of {', '.join(FORMATS)})"
    )


class Record(dict):
    """A record of a local file, which knows where it is (``path`` and ``position``: ``"line
    3"``, or ``"row 3"`` of a parquet file), so that a later check of its fields names the
    file's line rather than the record's count (blank lines are skipped, so the two differ)."""

    __slots__ = ("path", "position")

    def __init__(self, fields, *, path: str, position: str):
        super().__init__(fields)
        self.path, self.position = path, position

    def like(self, fields) -> "Record":
        """Other fields at the same place (a projection of this record)."""
        return Record(fields, path=self.path, position=self.position)


def record_location(record, source: str, number: int) -> str:
    """Where ``record`` is, for an error: ``source`` and the file's line (a :class:`Record`),
    else ``source`` and the record's number among the records."""
    if not isinstance(record, Record):
        return f"{source}: record {number}"
    same = source == record.path or Path(source) == Path(record.path)  # ./p.jsonl is p.jsonl
    return f"{source}: {record.position}" if same else f"{source}: {record.path}: {record.position}"


def iter_local_records(
    path: str | os.PathLike,
    format: str | None = None,  # noqa: A002 - the name the config uses
    columns: Mapping[str, str] | None = None,
) -> Iterator[dict]:
    """Yield the records of a local file as dicts (:class:`Record`: each knows its line).

    ``format`` is one of :data:`FORMATS`, inferred from the suffix when ``None``:

    - ``txt``: one record per non-blank line, as ``{"text": line}`` (blank lines are skipped);
    - ``tsv``: tab-separated with a header row, no quoting; every row must have the header's
      number of fields;
    - ``jsonl`` / ``jsonl.gz``: one JSON object per non-blank line;
    - ``parquet``: one record per row.

    With ``columns`` (contract name → source column, e.g. ``{"text": "content"}``) each record
    holds exactly the contract names; without it, every source column under its own name.
    A missing column raises :class:`InputError` naming the file, the column and the columns
    found; so does invalid UTF-8 (with the line) and a file with no records.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: a directory; expected a file ({', '.join(FORMATS)})")
    fmt = format if format is not None else infer_format(path)
    if fmt not in FORMATS:
        raise InputError(f"{path}: unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    readers = {
        "txt": _iter_txt,
        "tsv": _iter_tsv,
        "jsonl": _iter_jsonl,
        "jsonl.gz": _iter_jsonl,
        "parquet": _iter_parquet,
    }
    count = 0
    for where, record in readers[fmt](path, fmt, dict(columns) if columns is not None else None):
        count += 1
        yield Record(record, path=str(path), position=where)
    if count == 0:
        raise InputError(f"{path}: the file holds no records (format {fmt})")


def _select(
    path: Path, record: dict, columns: dict[str, str] | None, where: str = ""
) -> dict:
    """Project ``record`` onto the contract names, or return it whole without ``columns``."""
    if columns is None:
        return record
    missing = [source for source in columns.values() if source not in record]
    if missing:
        raise _missing_column(path, missing, list(record), where)
    return {name: record[source] for name, source in columns.items()}


def _missing_column(path: Path, missing: list[str], found: list[str], where: str = "") -> InputError:
    return InputError(
        f"{path}{where}: missing column{'s' if len(missing) > 1 else ''} "
        f"{', '.join(repr(m) for m in missing)}; columns found: "
        f"{', '.join(repr(f) for f in found) or '(none)'}"
    )


def _iter_txt(path: Path, fmt: str, columns: dict[str, str] | None) -> Iterator[dict]:
    if columns is not None:
        missing = [source for source in columns.values() if source != "text"]
        if missing:
            raise _missing_column(path, missing, ["text"], " (a txt file has one column, 'text')")
    for number, line in iter_utf8_lines(path):
        if line.strip():
            yield f"line {number}", _select(path, {"text": line}, columns)


def _iter_tsv(path: Path, fmt: str, columns: dict[str, str] | None) -> Iterator[dict]:
    lines = iter_utf8_lines(path)
    header: list[str] | None = None
    for number, line in lines:
        if not line.strip():
            continue
        fields = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE))
        if header is None:
            header = fields
            duplicated = sorted({f for f in header if header.count(f) > 1})
            if duplicated:
                raise InputError(f"{path}: line {number}: duplicated header column(s) {duplicated}")
            if columns is not None:
                missing = [source for source in columns.values() if source not in header]
                if missing:
                    raise _missing_column(path, missing, header, " (header row)")
            continue
        if len(fields) != len(header):
            raise InputError(
                f"{path}: line {number}: {len(fields)} tab-separated fields, but the header has "
                f"{len(header)} ({', '.join(header)})"
            )
        yield f"line {number}", _select(path, dict(zip(header, fields)), columns)


def _iter_gzip_utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Like :func:`modsent.io.iter_utf8_lines`, for a gzip-compressed text file."""
    try:
        with gzip.open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise InputError(
                        f"{path}: line {number}: invalid UTF-8 at byte {err.start} of the line "
                        f"({raw[max(0, err.start - 10):err.start + 10]!r}); the file must be "
                        "gzip-compressed UTF-8 text"
                    ) from None
                if number == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                yield number, text.rstrip("\r\n")
    except (OSError, EOFError, zlib.error) as err:
        raise InputError(f"{path}: not a readable gzip file ({err})") from None


def _iter_jsonl(path: Path, fmt: str, columns: dict[str, str] | None) -> Iterator[dict]:
    lines = _iter_gzip_utf8_lines(path) if fmt == "jsonl.gz" else iter_utf8_lines(path)
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: line {number}: invalid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise InputError(
                f"{path}: line {number}: expected a JSON object per line, got {type(record).__name__}"
            )
        yield f"line {number}", _select(path, record, columns, f": line {number}")


def _iter_parquet(path: Path, fmt: str, columns: dict[str, str] | None) -> Iterator[dict]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
        raise InputError(f"{path}: not a readable parquet file ({err})") from None
    found = parquet.schema_arrow.names
    if columns is not None:
        missing = [source for source in columns.values() if source not in found]
        if missing:
            raise _missing_column(path, missing, found)
        wanted = list(dict.fromkeys(columns.values()))
    else:
        wanted = found
    number = 0
    for batch in parquet.iter_batches(columns=wanted):
        for row in batch.to_pylist():
            number += 1
            yield f"row {number}", _select(path, row, columns)
