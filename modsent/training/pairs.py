"""Paraphrase pairs for training: reading a pair file, the held-out slice, and batches in which
no text occurs twice (and, on request, no group twice), every stage's way of feeding MNRL and the
other in-batch objectives of :mod:`modsent.losses`."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from modsent.io import InputError

PAIR_TEXT_COLUMNS = ("anchor", "positive", "negative")
_GROUP = object()  # marks a row's group among its texts (never equal to a text)


def read_pairs(path: str | Path) -> pd.DataFrame:
    """anchor, positive, negative (None where absent) of a pair file, empty texts dropped."""
    frame = pd.read_parquet(path)
    missing = {"anchor", "positive"} - set(frame.columns)
    if missing:
        raise InputError(f"{path}: missing pair columns {sorted(missing)} "
                         "(expected anchor, positive, negative)")
    out = pd.DataFrame({c: frame[c] if c in frame.columns else None for c in PAIR_TEXT_COLUMNS})
    if "pair_id" in frame.columns:
        out.insert(0, "pair_id", frame["pair_id"].astype(str))
    if "dataset" in frame.columns:  # length-grouped batches keep each dataset's share
        out["dataset"] = dataset_labels(frame["dataset"])
    for column in PAIR_TEXT_COLUMNS:
        out[column] = out[column].map(lambda t: t.strip() if isinstance(t, str) and t.strip() else None)
    out = out.dropna(subset=["anchor", "positive"]).reset_index(drop=True)
    # a "negative" equal to its own anchor or positive contradicts the pair: no negative then
    contradictory = (out["negative"] == out["anchor"]) | (out["negative"] == out["positive"])
    out.loc[contradictory, "negative"] = None
    if len(out) < 2:
        raise InputError(f"{path}: {len(out)} usable pairs; MNRL needs at least 2")
    return out


def dataset_labels(values) -> list[str]:
    """A ``dataset`` column as strings, a missing label as "" (one group of its own)."""
    return ["" if pd.isna(value) else str(value) for value in values]


def fingerprinted(pairs: pd.DataFrame, length_groups: int = 1) -> pd.DataFrame:
    """What of a training frame a checkpoint's fingerprint hashes: the pairs without their
    ``dataset`` labels, which decide nothing unless batches are grouped by them (so a checkpoint
    made before the frames kept the labels still resumes with random batches)."""
    return pairs if length_groups > 1 else pairs.drop(columns="dataset", errors="ignore")


def split_heldout(pairs: pd.DataFrame, count: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, heldout): the held-out pairs are those with the smallest hash of their anchor and
    positive (order-independent), at most a tenth of the pairs. Held-out pairs whose anchor or
    positive repeats a text of another held-out pair are dropped (retrieval would be ambiguous)."""
    count = min(count, len(pairs) // 10)
    keys = [hashlib.sha1(f"{a}\t{p}".encode()).digest() for a, p in zip(pairs["anchor"], pairs["positive"])]
    ranked = sorted(range(len(pairs)), key=keys.__getitem__)
    held = sorted(ranked[:count])
    train = pairs.drop(index=held).reset_index(drop=True)
    heldout = pairs.iloc[held]
    heldout = heldout[~heldout["anchor"].duplicated(keep=False) & ~heldout["positive"].duplicated(keep=False)]
    return train, heldout.reset_index(drop=True)


def no_duplicate_batches(pairs: pd.DataFrame, batch_size: int, seed: int, epoch: int = 0,
                         *, min_size: int = 2, group_column: str | None = None,
                         length_groups: int = 1, length_columns: Sequence[str] = PAIR_TEXT_COLUMNS,
                         strata_column: str | Sequence[str] | None = "dataset") -> list[list[int]]:
    """Row indices of the batches of one epoch: a seeded shuffle, then each batch takes, in that
    order, the next rows none of whose texts (anchor, positive, negative) is already in the batch
    (sentence-transformers' NoDuplicatesBatchSampler). Rows that clash wait for a later batch.
    The last batch may be smaller; batches under ``min_size`` rows are dropped.

    ``group_column`` (e.g. ``pair_id``): rows of one group never share a batch either, so the
    copies of one pair in other languages are not each other's in-batch negatives.

    ``length_groups`` k > 1: batches grouped by length (:func:`length_grouped_order`): the
    shuffled rows are ordered by length within pools of k batches' worth before the batches are
    taken as above, and the epoch's batches are then shuffled. A batch holds texts of similar
    length (less padding where it is encoded in one pass, as on a GPU), while each dataset of
    ``strata_column`` keeps its share of the pool in every batch, so the in-batch negatives are
    not all short sentences of one dataset (several columns: each combination of their values is
    a stratum, e.g. a dataset in one language; :func:`row_strata`). k = 1: the random batches
    above, unchanged."""
    order = np.random.default_rng([seed, epoch]).permutation(len(pairs)).tolist()
    if length_groups > 1:
        order = length_grouped_order(order, text_lengths(pairs, length_columns), length_groups * batch_size,
                                     row_strata(pairs, strata_column))
    texts = row_texts(pairs)
    if group_column is not None:
        if group_column not in pairs.columns:
            raise InputError(f"no_duplicate_batches: no column {group_column!r} to group rows by")
        # a group is one more "text" of every row in it: two rows of a group clash
        texts = [row + ((_GROUP, str(group)),) for row, group in zip(texts, pairs[group_column])]
    remaining = dict.fromkeys(order)  # insertion-ordered set
    batches = []
    while remaining:
        batch, seen = [], set()
        for index in remaining:
            row = texts[index]  # anchor == positive within a row is allowed (as in s-t)
            if any(t in seen for t in row):
                continue
            batch.append(index)
            seen.update(row)
            if len(batch) == batch_size:
                break
        for index in batch:
            del remaining[index]
        if len(batch) >= min_size:
            batches.append(batch)
    if length_groups > 1:  # steps in random order, not from short to long within each pool
        batches = shuffled_steps(batches, seed, epoch)
    return batches


def row_texts(pairs: pd.DataFrame) -> list[tuple[str, ...]]:
    """Each row's texts (anchor, positive, negative; missing ones left out): what a batch must not
    hold twice."""
    return [tuple(t for t in row if isinstance(t, str)) for row in pairs[list(PAIR_TEXT_COLUMNS)].itertuples(index=False)]


def shuffled_steps(batches: list[list[int]], seed: int, epoch: int) -> list[list[int]]:
    """An epoch's length-grouped batches in a seeded random order (seed, epoch), so its steps
    do not run from short to long within each pool."""
    return [batches[i] for i in np.random.default_rng([seed, epoch, 1]).permutation(len(batches))]


def row_strata(pairs: pd.DataFrame, columns: str | Sequence[str] | None) -> list[str] | None:
    """Each row's stratum for :func:`length_grouped_order`: its value of ``columns`` (one name
    or several, those the frame has; a missing value reads as ""), several joined into one
    label; None where the frame has none of them."""
    if columns is None:
        return None
    present = [c for c in ([columns] if isinstance(columns, str) else columns) if c in pairs.columns]
    if not present:
        return None
    labels = [dataset_labels(pairs[c]) for c in present]
    return labels[0] if len(labels) == 1 else ["\x1f".join(values) for values in zip(*labels)]


def grouped_runs(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, length_groups: int = 1,
                 strata: Sequence | None = None) -> list[list[int]]:
    """The batches of an epoch for a loss without in-batch negatives (every row once, no
    duplicate rule): a seeded shuffle of (seed, epoch) cut into runs of ``batch_size`` (the last
    may be shorter). ``length_groups`` k > 1: the shuffle ordered by :func:`length_grouped_order`
    in pools of k batches (``lengths``: each row's, ``strata``: each row's stratum or None)
    before it is cut, the batches then shuffled (:func:`shuffled_steps`)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths)).tolist()
    if length_groups > 1:
        order = length_grouped_order(order, lengths, length_groups * batch_size, strata)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return shuffled_steps(batches, seed, epoch) if length_groups > 1 else batches


def check_length_groups(value, key: str) -> None:
    """``value`` is a ``length_groups`` setting (an integer >= 1), or an :class:`InputError`
    naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{key} must be an integer of at least 1 (1: random batches), got {value!r}")


def text_lengths(pairs: pd.DataFrame, columns: Sequence[str] = PAIR_TEXT_COLUMNS) -> np.ndarray:
    """Each row's longest text among ``columns`` (those the frame has), in characters: a batch
    encoded in one pass is padded to its longest text."""
    lengths = np.zeros(len(pairs), dtype=np.int64)
    for column in columns:
        if column in pairs.columns:
            lengths = np.maximum(lengths, pairs[column].map(lambda t: len(t) if isinstance(t, str) else 0)
                                 .to_numpy(dtype=np.int64))
    return lengths


def length_grouped_order(order: Sequence[int], lengths: np.ndarray, pool: int,
                         strata: Sequence | None = None) -> list[int]:
    """``order`` (shuffled row indices) in consecutive pools of ``pool`` rows, each pool sorted by
    its rows' ``lengths``; rows of equal key keep their shuffled order. With ``strata`` (each
    row's dataset), a row's key is its length's rank among the pool's rows of its dataset, as a
    share of them (its length quantile within its dataset): the pool's shortest rows of every
    dataset come first, then the next, so the rows a batch takes in turn hold each dataset about
    in its share of the pool, each at a similar length quantile."""
    order = np.asarray(order, dtype=np.int64)
    lengths = np.asarray(lengths)
    codes = None if strata is None else pd.factorize(pd.Series(dataset_labels(strata)), sort=True)[0]
    out = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        position = np.arange(len(chunk))
        length = lengths[chunk]
        if codes is None:
            key = length.astype(np.float64)
        else:
            stratum = codes[chunk]
            by_stratum = np.lexsort((position, length, stratum))  # each dataset's rows, shortest first
            counts = np.bincount(stratum)
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            rank = np.empty(len(chunk), dtype=np.float64)
            rank[by_stratum] = np.arange(len(chunk)) - starts[stratum[by_stratum]]
            key = (rank + 0.5) / counts[stratum]
        out.extend(chunk[np.lexsort((position, key))].tolist())
    return out


def steps_of_epochs(epoch_batches: Callable[[int], list[list[int]]], total_steps: int,
                    start: int = 0) -> Iterator[list[int]]:
    """The batches of steps ``start`` to ``total_steps - 1``: epoch after epoch of
    ``epoch_batches(epoch)``, so the batch of a step depends on (epoch, step) only and a run
    resumed at ``start`` gets the batches the unbroken run had there."""
    step, epoch = 0, 0
    while step < total_steps:
        batches = epoch_batches(epoch)
        if not batches:
            raise InputError("no batch of at least 2 pairs without duplicate texts can be formed")
        for batch in batches:
            if step == total_steps:
                return
            if step >= start:
                yield batch
            step += 1
        epoch += 1


def last_epoch_kept(epoch_batches: Callable[[int], list[list[int]]]) -> Callable[[int], list[list[int]]]:
    """``epoch_batches`` keeping the batches of the epoch asked last: a stage counts the first
    epoch's batches for its number of steps and then trains on them, made once."""
    return functools.lru_cache(maxsize=1)(epoch_batches)


def epochs_of(pairs: pd.DataFrame, batch_size: int, seed: int, **options) -> Callable[[int], list[list[int]]]:
    """The batches of each epoch of ``pairs``: :func:`no_duplicate_batches` with ``options``
    (``group_column``, ``length_groups``, ``length_columns``), the last epoch kept."""
    return last_epoch_kept(lambda epoch: no_duplicate_batches(pairs, batch_size, seed, epoch, **options))


def batches_of_steps(pairs: pd.DataFrame, batch_size: int, seed: int, total_steps: int, start: int = 0,
                     **options) -> Iterator[list[int]]:
    """:func:`steps_of_epochs` over the batches of :func:`epochs_of` ``pairs``."""
    return steps_of_epochs(epochs_of(pairs, batch_size, seed, **options), total_steps, start)
