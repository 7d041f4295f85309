"""Length-grouped batches (``training.pairs.no_duplicate_batches(length_groups=k)``): the same
rules as random batches, less padding, and every dataset in its share of each batch."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from modsent.io import InputError
from modsent.modular.sentence_adapter import SentenceAdapterConfig
from modsent.testing import two_length_datasets
from modsent.training import checkpoints
from modsent.training.pairs import (PAIR_TEXT_COLUMNS, batches_of_steps, fingerprinted, grouped_runs,
                                    length_grouped_order, no_duplicate_batches, read_pairs, row_strata, text_lengths)
from conftest import load_benchmark


@pytest.fixture(scope="module")
def pairs() -> pd.DataFrame:
    """Two datasets of different lengths: short names and long docstring sentences."""
    return two_length_datasets()


def _padding(pairs: pd.DataFrame, batches, columns=PAIR_TEXT_COLUMNS) -> float:
    """The share of padding when each batch is one pass padded to its longest text (characters)."""
    real = padded = 0
    for batch in batches:
        texts = [len(t) for c in columns for t in pairs.loc[batch, c] if isinstance(t, str)]
        real += sum(texts)
        padded += max(texts) * len(texts)
    return 1 - real / padded


def _texts(pairs, index):
    return {t for t in pairs.loc[index, list(PAIR_TEXT_COLUMNS)] if isinstance(t, str)}


def test_grouped_batches_keep_the_rules_of_random_ones(pairs):
    for seed, epoch in ((0, 0), (0, 1), (5, 0)):
        random = no_duplicate_batches(pairs, 16, seed, epoch)
        grouped = no_duplicate_batches(pairs, 16, seed, epoch, length_groups=4)
        placed = [i for batch in grouped for i in batch]
        assert len(placed) == len(set(placed)) >= len(pairs) - 16  # each row once (a clash may wait)
        assert len(placed) >= len([i for batch in random for i in batch]) - 1  # a left-over row may differ
        for batch in grouped:
            assert 2 <= len(batch) <= 16
            seen = set()
            for i in batch:  # no text of one row in another row of the batch
                assert not _texts(pairs, i) & seen
                seen |= _texts(pairs, i)
        assert grouped == no_duplicate_batches(pairs, 16, seed, epoch, length_groups=4)  # seeded
    assert no_duplicate_batches(pairs, 16, 0, 0, length_groups=4) != no_duplicate_batches(pairs, 16, 0, 1,
                                                                                          length_groups=4)


def test_the_order_is_the_pools_sorted_by_length_or_by_its_quantile_in_the_dataset(pairs):
    order = np.random.default_rng(3).permutation(len(pairs)).tolist()
    lengths = text_lengths(pairs)
    assert lengths[0] == max(len(t) for t in pairs.loc[0, list(PAIR_TEXT_COLUMNS)] if isinstance(t, str))
    pool = 64
    expected = []
    for start in range(0, len(order), pool):  # Python's sort is stable: ties keep the shuffled order
        expected += sorted(order[start:start + pool], key=lambda i: lengths[i])
    assert length_grouped_order(order, lengths, pool) == expected
    # with datasets: each row's rank among its dataset's rows of the pool (ties in shuffled
    # order), as a share of them, computed with pandas
    expected = []
    for start in range(0, len(order), pool):
        chunk = pd.DataFrame({"row": order[start:start + pool]})
        chunk["length"] = lengths[chunk["row"]]
        chunk["dataset"] = pairs["dataset"].to_numpy()[chunk["row"]]
        rank = chunk.groupby("dataset")["length"].rank(method="first")
        chunk["key"] = (rank - 0.5) / chunk.groupby("dataset")["row"].transform("size")
        expected += chunk.sort_values("key", kind="stable")["row"].tolist()
    assert length_grouped_order(order, lengths, pool, pairs["dataset"]) == expected


def test_grouped_batches_pad_less_and_keep_each_dataset_in_its_share(pairs):
    share = (pairs["dataset"] == "docstrings").mean()
    random = no_duplicate_batches(pairs, 16, 0)
    grouped = no_duplicate_batches(pairs, 16, 0, length_groups=8)
    by_length_alone = no_duplicate_batches(pairs, 16, 0, length_groups=8, strata_column=None)
    assert _padding(pairs, grouped) < 0.8 * _padding(pairs, random)
    assert _padding(pairs, by_length_alone) < _padding(pairs, grouped)  # the price of the shares

    def docstring_shares(batches):
        return [(pairs.loc[b, "dataset"] == "docstrings").mean() for b in batches if len(b) == 16]

    # sorted by length alone, the short names and the long sentences fill batches of their own
    assert sum(s in (0.0, 1.0) for s in docstring_shares(by_length_alone)) > 0.5 * len(by_length_alone)
    # sorted by the quantile within each dataset, every batch holds both, about in their shares
    shares = docstring_shares(grouped)
    assert len(shares) > 0.8 * len(grouped)
    assert all(abs(s - share) <= 0.2 for s in shares), (share, shares)
    assert abs(np.mean(shares) - share) < 0.05


def test_grouped_steps_resume_where_an_unbroken_run_was(pairs):
    """A resumed run asks for the batches from its step on: the unbroken run's, epoch after epoch."""
    per_epoch = len(no_duplicate_batches(pairs, 16, 0, 0, length_groups=4))
    total = 2 * per_epoch + 3
    unbroken = list(batches_of_steps(pairs, 16, 0, total, length_groups=4))
    assert unbroken[per_epoch] == no_duplicate_batches(pairs, 16, 0, 1, length_groups=4)[0]
    for start in (1, per_epoch, total - 1):
        assert list(batches_of_steps(pairs, 16, 0, total, start, length_groups=4)) == unbroken[start:]
    counts = Counter(len(b) for b in unbroken)
    assert counts[16] > 0.8 * len(unbroken)


def test_pairs_without_a_dataset_label_form_a_group_of_their_own(pairs, tmp_path):
    """A pair file whose ``dataset`` has gaps (None, NaN) reads with "" there, and grouped
    batches treat those pairs as one more dataset."""
    gaps = pairs.assign(dataset=pairs["dataset"].astype(object))
    gaps.loc[gaps.index % 5 == 0, "dataset"] = None
    gaps.loc[gaps.index % 7 == 0, "dataset"] = float("nan")
    gaps.to_parquet(tmp_path / "pairs.parquet", index=False)
    read = read_pairs(tmp_path / "pairs.parquet")
    assert (read["dataset"] == "").sum() == ((pairs.index % 5 == 0) | (pairs.index % 7 == 0)).sum()
    for frame in (gaps, read):
        batches = no_duplicate_batches(frame, 16, 0, length_groups=4)
        placed = [i for batch in batches for i in batch]
        assert len(placed) == len(set(placed)) >= len(frame) - 16


def test_checkpoints_of_random_batches_hash_no_dataset_labels(pairs):
    """At ``length_groups: 1`` a checkpoint's fingerprint hashes the pairs without their labels
    (what was hashed before frames kept them: a run interrupted before the upgrade resumes);
    grouped by them, the labels decide the batches and are hashed."""
    settings = {"batch_size": 16, "seed": 0}
    assert checkpoints.fingerprint({**settings, "length_groups": 1}) == checkpoints.fingerprint(settings)
    assert checkpoints.fingerprint({**settings, "length_groups": 4}) != checkpoints.fingerprint(settings)
    earlier = pairs.drop(columns="dataset")  # the frame as read before it kept the labels
    relabelled = pairs.assign(dataset="one")
    assert checkpoints.fingerprint(settings, fingerprinted(pairs)) == checkpoints.fingerprint(settings, earlier)
    assert checkpoints.fingerprint(settings, fingerprinted(relabelled)) == checkpoints.fingerprint(settings, earlier)
    assert checkpoints.fingerprint(settings, fingerprinted(pairs, 4)) != checkpoints.fingerprint(
        settings, fingerprinted(relabelled, 4))


@pytest.mark.parametrize("value", [0, -2, 2.0, True])
def test_length_groups_must_be_a_positive_integer(value):
    with pytest.raises(InputError, match=r"sentence_adapter\.length_groups must be an integer of at least 1"):
        SentenceAdapterConfig(length_groups=value)


def test_the_batching_benchmark_counts_padding_as_these_tests_do(pairs):
    bench = load_benchmark("pair_batching")
    lengths = bench.lengths_of(pairs, PAIR_TEXT_COLUMNS, None, 128)
    for strata in ("dataset", None):
        batches = no_duplicate_batches(pairs, 16, 0, length_groups=8, strata_column=strata)
        padding, single, gap = bench.describe(pairs, batches, lengths, PAIR_TEXT_COLUMNS)
        assert padding == pytest.approx(_padding(pairs, batches))
        assert (single == 0) == (strata is not None) and 0 < gap < 1


def test_a_stage_makes_the_first_epoch_s_batches_once(pairs, monkeypatch):
    """Every stage counts its steps from the first epoch's batches and then trains on them: the
    epochs of ``epochs_of`` and of the baselines' and methods' ``TrainingData`` are made once each."""
    from modsent.methods.baselines import TrainingData, iter_steps
    from modsent.training import pairs as pairs_module

    made = []
    batches_of = pairs_module.no_duplicate_batches

    def counted(frame, batch_size, seed, epoch, **options):
        made.append(epoch)
        return batches_of(frame, batch_size, seed, epoch, **options)

    monkeypatch.setattr(pairs_module, "no_duplicate_batches", counted)
    epochs = pairs_module.epochs_of(pairs, 16, 0, length_groups=4)
    per_epoch = len(epochs(0))
    steps = list(pairs_module.steps_of_epochs(epochs, 2 * per_epoch + 1))
    assert made == [0, 1, 2] and steps[:per_epoch] == batches_of(pairs, 16, 0, 0, length_groups=4)
    made.clear()
    data = TrainingData(pairs, lambda epoch: counted(pairs, 16, 0, epoch))
    assert len(data.epoch_batches(0)) == per_epoch and list(iter_steps(data, per_epoch + 1))[:per_epoch] == \
        batches_of(pairs, 16, 0, 0)
    assert made == [0, 1]


def test_strata_of_several_columns_are_their_combinations(pairs):
    """``strata_column`` may name several columns (a recipe's dataset in each language): each
    combination is a stratum, a missing value reads as "", and absent columns are skipped."""
    frame = pd.DataFrame({"dataset": ["a", "a", "b", None], "lang": ["de", "ky", "de", "de"]})
    strata = row_strata(frame, ("dataset", "lang", "absent"))
    assert len(set(strata)) == 4 and strata[0] != strata[1] and strata[0] != strata[2]
    assert row_strata(frame, "dataset") == ["a", "a", "b", ""]
    assert row_strata(frame, ("absent",)) is None and row_strata(frame, None) is None
    # two languages of one dataset: grouped within (dataset, lang), each batch keeps both languages
    two = pd.concat([pairs.assign(lang="de"), pairs.assign(lang="ky", anchor=pairs["anchor"] + " ",
                                                            positive=pairs["positive"] + " ")], ignore_index=True)
    batches = no_duplicate_batches(two, 16, 0, length_groups=8, strata_column=("dataset", "lang"))
    full = [b for b in batches if len(b) == 16]
    assert all(abs((two.loc[b, "lang"] == "de").mean() - 0.5) <= 0.2 for b in full)
    assert _padding(two, batches) < 0.8 * _padding(two, no_duplicate_batches(two, 16, 0))


def test_grouped_runs_are_the_plain_shuffle_at_one_and_pad_less_grouped(pairs):
    """The batches of a loss without in-batch negatives (DuEAM): at k = 1 the seeded
    permutation cut into runs, as before; grouped, every row once, less padding, each dataset
    in its share, the runs in a seeded random order."""
    lengths = text_lengths(pairs)
    order = np.random.default_rng([3, 2]).permutation(len(pairs)).tolist()
    assert grouped_runs(lengths, 16, 3, 2) == [order[i:i + 16] for i in range(0, len(order), 16)]
    strata = row_strata(pairs, "dataset")
    grouped = grouped_runs(lengths, 16, 3, 2, length_groups=8, strata=strata)
    assert sorted(i for b in grouped for i in b) == list(range(len(pairs)))
    assert grouped == grouped_runs(lengths, 16, 3, 2, length_groups=8, strata=strata)
    assert grouped != grouped_runs(lengths, 16, 3, 3, length_groups=8, strata=strata)
    assert _padding(pairs, grouped) < 0.8 * _padding(pairs, grouped_runs(lengths, 16, 3, 2))
    share = (pairs["dataset"] == "docstrings").mean()
    shares = [(pairs.loc[b, "dataset"] == "docstrings").mean() for b in grouped if len(b) == 16]
    assert all(abs(s - share) <= 0.2 for s in shares)
    # the steps are not short to long within a pool
    firsts = [max(lengths[b]) for b in grouped[:8]]
    assert firsts != sorted(firsts)


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """A run's pair files (en, de, ky: the built-in pairs and their human translations) and
    translation files (de, ky), as the workflow writes them."""
    from modsent.data.paraphrase import align_provided, translation_units
    from modsent.sources.builtin import builtin_paraphrases, builtin_translations
    from tiny_modules import pairs_in

    root = tmp_path_factory.mktemp("run")
    english = builtin_paraphrases()
    units = translation_units(english)
    pairs, translations = {}, {}
    for lang in ("en", "de", "ky"):
        pairs[lang] = root / f"pairs-{lang}.parquet"
        (english if lang == "en" else pairs_in(lang, english, units)).to_parquet(pairs[lang], index=False)
        if lang != "en":
            translated, _ = align_provided(units, builtin_translations(lang), lang)
            translations[lang] = root / f"translation-{lang}.parquet"
            translated[["unit_id", "text", "translation"]].to_parquet(translations[lang], index=False)
    return pairs, translations


@pytest.mark.parametrize("recipe", ["mst5", "intemats", "mexma", "dueam"])
def test_the_batching_benchmark_measures_each_recipe_s_own_batches(recipe, run_files, capsys):
    """``pair_batching.py --recipe``: the batches are the recipe's (its random ones at k = 1,
    each pass one micro-batch for MEXMA), every row at most once, grouped ones padding less."""
    bench = load_benchmark("pair_batching")
    pairs, translations = run_files
    rows, columns, strata, batches_of = bench.recipe_batches(recipe, pairs, translations, 8, 0)
    assert len(strata) == len(rows) and len(set(strata)) > 1
    random_, grouped = batches_of(1), batches_of(8)
    for batches in (random_, grouped):
        indices = [i for b in batches for i in b]
        assert len(indices) == len(set(indices)) and 0.9 * len(rows) <= len(indices) <= len(rows)
        assert all(len(b) <= 8 for b in batches)
    lengths = bench.lengths_of(rows, columns, None, 128)
    assert bench.describe(rows, grouped, lengths, columns, strata)[0] < bench.describe(
        rows, random_, lengths, columns, strata)[0]
    if recipe == "mexma":
        from modsent.methods.mexma import training as mx

        steps = mx.epoch_batches(rows, 16, 0)(0)
        assert random_ == [half for step in steps for half in (step[:8], step[8:])]
    files = [f"{lang}={path}" for lang, path in (translations if recipe == "mexma" else pairs).items()]
    option = "--translations" if recipe == "mexma" else "--pairs"
    assert bench.main(["--recipe", recipe, option, *files, "--batch-size", "8", "--groups", "1", "8"]) == 0
    out = capsys.readouterr().out
    assert out.count("%") == 2 * 2 and "length_groups 8" in out
