"""Evaluation metrics for multilingual sentence encoders, computed on embeddings.

Every function takes embeddings (or scores) that were computed elsewhere and returns the raw
value: a correlation in [-1, 1], an error rate or accuracy in [0, 1]. A report multiplies by 100.

    cosine_rows            row-wise cosine of two (n, d) arrays
    sts_spearman           semantic textual similarity: Spearman between cosine and gold scores
    xsim_error_rate        bitext retrieval error of one aligned pair of languages (LASER's xsim)
    xsim_predictions       the target row retrieved for each source row
    xsim_all_pairs         the same for every ordered pair of multi-parallel languages, fast
    rsim                   representational similarity of languages (Pearson of cosine matrices)
    language_bias          bilingual vs pooled multilingual STS Spearman
    symmetric_average      de-fr and fr-de averaged into one entry
    classification_accuracy, classification_macro_f1
                           logistic regression on frozen embeddings

xsim follows LASER's ``source/xsim.py`` (facebookresearch/LASER): row i of the source array is
the translation of row i of the target array. With NN_k(x) the k targets nearest to source x and
NN_k(y) the k sources nearest to target y (cosine), the score of a candidate pair is

    a = cos(x, y)
    b = mean_{z in NN_k(x)} cos(x, z) / 2  +  mean_{v in NN_k(y)} cos(y, v) / 2
    ratio: a / b      distance: a - b      absolute: a

The candidates of x are its k nearest targets by cosine (LASER searches them with an exact
inner-product index and rescores only those); x is an error when its best-scoring candidate is
not target i. Ties between candidates go to the one with the higher cosine, then to the lower
row (an exact tie at the k-th nearest may keep either; the k-NN mean is the same);
``candidates="all"`` scores every target instead (an argmax over all of them, lowest row on
ties), which can differ from LASER where a low-b target lies outside x's k nearest. With
k = 1 LASER's margins retrieve what plain cosine retrieves. As in LASER, the ratio margin
assumes positive k-NN means (b > 0), which holds for any realistic encoder.

Vectors are L2-normalised in float32 (a zero vector stays zero: cosine 0 with everything); the
similarity matrix is computed in chunks of ``batch_size`` source rows, so memory stays at about
16 x ``batch_size`` x n bytes; top-k is exact (``np.argpartition``). :func:`xsim_all_pairs`
normalises each language once and computes each unordered pair's similarity matrix once: the
row top-k of S serves l1 -> l2, the column top-k l2 -> l1, and the margins of both directions
come from the same two top-k tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np

from modsent.io import InputError

MARGINS = ("ratio", "distance", "absolute")
CANDIDATES = ("knn", "all")
DEFAULT_BATCH_SIZE = 1024


# --- input checks ----------------------------------------------------------------------------

def _matrix(name: str, a, *, min_rows: int = 2) -> np.ndarray:
    """``a`` as a finite 2-D array with at least ``min_rows`` rows, or an InputError."""
    arr = np.asarray(a)
    if arr.ndim != 2:
        raise InputError(f"{name}: expected a 2-D array (n, d), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise InputError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    if arr.shape[0] < min_rows:
        raise InputError(f"{name}: {arr.shape[0]} row(s); at least {min_rows} are needed")
    if arr.shape[1] < 1:
        raise InputError(f"{name}: embeddings of dimension 0")
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{name}: contains NaN or infinite values")
    return arr


def _vector(name: str, a, *, min_items: int = 2) -> np.ndarray:
    """``a`` as a finite 1-D float64 array with at least ``min_items`` items, or an InputError."""
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise InputError(f"{name}: expected a 1-D array of scores, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise InputError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    if len(arr) < min_items:
        raise InputError(f"{name}: {len(arr)} item(s); at least {min_items} are needed")
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{name}: contains NaN or infinite values")
    return arr.astype(np.float64)


def _same_shape(names: tuple[str, str], a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise InputError(f"{names[0]} {a.shape} and {names[1]} {b.shape}: shapes differ "
                         "(row i of one must be aligned with row i of the other)")


def _check_xsim_options(k: int, margin: str, candidates: str, batch_size: int, n: int) -> None:
    if margin not in MARGINS:
        raise InputError(f"xsim margin must be one of {', '.join(MARGINS)}, not {margin!r}")
    if candidates not in CANDIDATES:
        raise InputError(f"xsim candidates must be one of {', '.join(CANDIDATES)}, not {candidates!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise InputError(f"xsim k must be an integer between 1 and the number of sentences ({n}), got {k!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"xsim batch_size must be a positive integer, got {batch_size!r}")


# --- cosine and correlations -----------------------------------------------------------------

def _normalise(a: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Rows scaled to unit L2 norm (norms taken in float64); zero rows stay zero."""
    norms = np.linalg.norm(a.astype(np.float64, copy=False), axis=1, keepdims=True)
    out = np.zeros(a.shape, dtype=np.float64)
    np.divide(a, norms, out=out, where=norms > 0)
    return out.astype(dtype, copy=False)


def cosine_rows(a, b) -> np.ndarray:
    """Cosine similarity of row i of ``a`` with row i of ``b`` (float64, shape (n,)).

    A zero vector has cosine 0 with everything.
    """
    a = _matrix("cosine_rows a", a, min_rows=1)
    b = _matrix("cosine_rows b", b, min_rows=1)
    _same_shape(("cosine_rows a", "cosine_rows b"), a, b)
    return np.einsum("ij,ij->i", _normalise(a, np.float64), _normalise(b, np.float64))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two float64 vectors; NaN when either is constant."""
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float(xc @ xc) * float(yc @ yc))
    if denom == 0.0:
        return float("nan")
    return float(np.clip((xc @ yc) / denom, -1.0, 1.0))


def _spearman(pred: np.ndarray, gold: np.ndarray, what: str) -> float:
    """Spearman correlation: Pearson of the ranks, ties given their average rank.

    Constant gold scores are bad input (InputError); constant predictions (a collapsed model)
    give NaN, as the correlation is undefined.
    """
    if len(pred) != len(gold):
        raise InputError(f"{what}: {len(pred)} predicted scores but {len(gold)} gold scores")
    if np.all(gold == gold[0]):
        raise InputError(f"{what}: all gold scores are equal; a correlation is undefined")
    from scipy.stats import rankdata  # SciPy's import is ~1 s: only the STS tasks rank

    return _pearson(rankdata(pred), rankdata(gold))


def sts_spearman(emb1, emb2, gold) -> float:
    """Spearman correlation between cos(emb1[i], emb2[i]) and ``gold[i]`` (an STS score).

    NaN when all cosines are equal (e.g. a collapsed model).
    """
    a = _matrix("sts_spearman emb1", emb1)
    b = _matrix("sts_spearman emb2", emb2)
    _same_shape(("sts_spearman emb1", "sts_spearman emb2"), a, b)
    gold = _vector("sts_spearman gold", gold)
    return _spearman(cosine_rows(a, b), gold, "sts_spearman")


# --- xsim ------------------------------------------------------------------------------------

def _topk(values: np.ndarray, k: int, columns: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the min(k, width) largest values and their column ids (``columns`` maps a
    position to an id; default: the position), sorted by value descending, then id ascending."""
    ids = np.broadcast_to(np.arange(values.shape[1]), values.shape) if columns is None else columns
    if values.shape[1] > k:
        part = np.argpartition(values, values.shape[1] - k, axis=1)[:, -k:]
        values = np.take_along_axis(values, part, axis=1)
        ids = np.take_along_axis(ids, part, axis=1)
    order = np.lexsort((ids, -values), axis=1)
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1)


def _chunks(xn: np.ndarray, yn: np.ndarray, batch_size: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first source row, cosine block of ``batch_size`` sources x all targets)."""
    for start in range(0, len(xn), batch_size):
        yield start, xn[start:start + batch_size] @ yn.T


def _margin(a: np.ndarray, b: np.ndarray, margin: str) -> np.ndarray:
    return a / b if margin == "ratio" else a - b


def _xsim_both(xn: np.ndarray, yn: np.ndarray, k: int, margin: str, candidates: str,
               batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Predicted rows x -> y and y -> x of two normalised, row-aligned arrays, from one pass over
    the similarity matrix S = xn @ yn.T (a second one only for margin scoring of all targets
    when S does not fit in one chunk)."""
    n = len(xn)
    rows = np.arange(n)
    if margin == "absolute":
        pred_xy = np.empty(n, dtype=np.int64)
        col_best = np.full(n, -np.inf, dtype=np.float32)
        pred_yx = np.zeros(n, dtype=np.int64)
        for start, s in _chunks(xn, yn, batch_size):
            pred_xy[start:start + len(s)] = s.argmax(axis=1)   # first maximum: the lowest row
            best = s.max(axis=0)
            better = best > col_best                          # strict: earlier chunks win ties
            pred_yx[better] = start + s.argmax(axis=0)[better]
            col_best[better] = best[better]
        return pred_xy, pred_yx

    row_cos = np.empty((n, k), dtype=np.float32)
    row_ids = np.empty((n, k), dtype=np.int64)
    col_cos = col_ids = None
    cached = None
    for start, s in _chunks(xn, yn, batch_size):
        row_cos[start:start + len(s)], row_ids[start:start + len(s)] = _topk(s, k)
        c_cos, c_ids = _topk(np.ascontiguousarray(s.T), k)
        c_ids = c_ids + start
        if col_cos is not None:
            c_cos, c_ids = _topk(np.concatenate([col_cos, c_cos], axis=1), k,
                                 np.concatenate([col_ids, c_ids], axis=1))
        col_cos, col_ids = c_cos, c_ids
        cached = s if start == 0 and len(s) == n else None
    avg_x = row_cos.astype(np.float64).mean(axis=1)   # mean cosine of x's k nearest targets
    avg_y = col_cos.astype(np.float64).mean(axis=1)   # mean cosine of y's k nearest sources

    if candidates == "knn":
        # x -> y: rescore x's k nearest targets; argmax takes the first best: higher cosine first
        score = _margin(row_cos, (avg_x[:, None] + avg_y[row_ids]) / 2, margin)
        pred_xy = row_ids[rows, score.argmax(axis=1)]
        score = _margin(col_cos, (avg_y[:, None] + avg_x[col_ids]) / 2, margin)
        pred_yx = col_ids[rows, score.argmax(axis=1)]
        return pred_xy, pred_yx

    # all targets: the score matrix is symmetric in its two margins, so y -> x is its column argmax
    pred_xy = np.empty(n, dtype=np.int64)
    col_best = np.full(n, -np.inf)
    pred_yx = np.zeros(n, dtype=np.int64)
    blocks = [(0, cached)] if cached is not None else _chunks(xn, yn, batch_size)
    for start, s in blocks:
        stop = start + len(s)
        score = _margin(s, (avg_x[start:stop, None] + avg_y[None, :]) / 2, margin)
        pred_xy[start:stop] = score.argmax(axis=1)
        best = score.max(axis=0)
        better = best > col_best
        pred_yx[better] = start + score.argmax(axis=0)[better]
        col_best[better] = best[better]
    return pred_xy, pred_yx


def _error_rate(pred: np.ndarray) -> float:
    """Share of rows i whose predicted row is not i."""
    return float(np.mean(pred != np.arange(len(pred))))


def _xsim_inputs(src, tgt, k: int, margin: str, candidates: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    x = _matrix("xsim src", src)
    y = _matrix("xsim tgt", tgt)
    _same_shape(("xsim src", "xsim tgt"), x, y)
    _check_xsim_options(k, margin, candidates, batch_size, len(x))
    return _normalise(x), _normalise(y)


def xsim_predictions(src, tgt, k: int = 4, margin: str = "ratio", batch_size: int = DEFAULT_BATCH_SIZE,
                     *, candidates: str = "knn") -> np.ndarray:
    """For each source row, the target row xsim retrieves (int64, shape (n,)): for error
    analysis, or for LASER's textual error (an error only when the retrieved target's text
    differs from the reference's, so that duplicate sentences are not counted)."""
    xn, yn = _xsim_inputs(src, tgt, k, margin, candidates, batch_size)
    return _xsim_both(xn, yn, int(k), margin, candidates, int(batch_size))[0]


def xsim_error_rate(src, tgt, k: int = 4, margin: str = "ratio", batch_size: int = DEFAULT_BATCH_SIZE,
                    *, candidates: str = "knn") -> float:
    """LASER's xsim: the share of source sentences whose best-scoring target is not their own
    translation (row i of ``src`` is aligned with row i of ``tgt``); see the module docstring
    for the scores. ``margin``: ratio (LASER's default), distance or absolute (plain cosine)."""
    return _error_rate(xsim_predictions(src, tgt, k, margin, batch_size, candidates=candidates))


def xsim_all_pairs(embeddings: Mapping[str, np.ndarray], k: int = 4, margin: str = "ratio",
                   batch_size: int = DEFAULT_BATCH_SIZE, *,
                   candidates: str = "knn") -> dict[tuple[str, str], float]:
    """xsim error rate of every ordered pair (l1, l2), l1 != l2, of multi-parallel languages
    (row i is the same sentence in every language). Each language is normalised once and each
    unordered pair's similarity matrix computed once for both directions."""
    langs = list(embeddings)
    if len(langs) < 2:
        raise InputError(f"xsim_all_pairs: {len(langs)} language(s); at least 2 are needed")
    arrays = {lang: _matrix(f"xsim_all_pairs {lang}", embeddings[lang]) for lang in langs}
    first = arrays[langs[0]]
    for lang in langs[1:]:
        _same_shape((f"xsim_all_pairs {langs[0]}", f"xsim_all_pairs {lang}"), first, arrays[lang])
    _check_xsim_options(k, margin, candidates, batch_size, len(first))
    normed = {lang: _normalise(arrays[lang]) for lang in langs}
    errors: dict[tuple[str, str], float] = {}
    for i, l1 in enumerate(langs):
        for l2 in langs[i + 1:]:
            forward, backward = _xsim_both(normed[l1], normed[l2], int(k), margin, candidates, int(batch_size))
            errors[(l1, l2)], errors[(l2, l1)] = _error_rate(forward), _error_rate(backward)
    return {(l1, l2): errors[(l1, l2)] for l1 in langs for l2 in langs if l1 != l2}


# --- representational similarity -------------------------------------------------------------

def rsim(embeddings: Mapping[str, np.ndarray]) -> tuple[float, dict[tuple[str, str], float]]:
    """Representational similarity of languages: for each unordered pair, the Pearson
    correlation of the two languages' within-language cosine similarities (the n(n-1)/2 pairs
    i < j of each cosine matrix) over multi-parallel sentences. Returns the mean over pairs and
    the value of each pair, keyed by the sorted pair of codes.

    A high value means the encoder arranges the same sentences alike in both languages,
    whatever rotation or scaling separates the two spaces. A language whose similarities are all
    equal gives NaN for its pairs. Computed in float64; memory: 8 n(n-1)/2 bytes per language
    plus one n x n cosine matrix at a time.
    """
    langs = list(embeddings)
    if len(langs) < 2:
        raise InputError(f"rsim: {len(langs)} language(s); at least 2 are needed")
    arrays = {lang: _matrix(f"rsim {lang}", embeddings[lang], min_rows=3) for lang in langs}
    n = len(arrays[langs[0]])
    for lang in langs[1:]:
        if len(arrays[lang]) != n:
            raise InputError(f"rsim: {langs[0]} has {n} sentences but {lang} {len(arrays[lang])}; "
                             "multi-parallel sentences are needed")
    upper = np.triu_indices(n, k=1)
    unit: dict[str, np.ndarray | None] = {}
    for lang in langs:
        xn = _normalise(arrays[lang], np.float64)
        tri = (xn @ xn.T)[upper]
        tri -= tri.mean()
        norm = np.linalg.norm(tri)
        unit[lang] = tri / norm if norm > 0 else None
    per_pair: dict[tuple[str, str], float] = {}
    for i, l1 in enumerate(langs):
        for l2 in langs[i + 1:]:
            u1, u2 = unit[l1], unit[l2]
            value = float("nan") if u1 is None or u2 is None else float(np.clip(u1 @ u2, -1.0, 1.0))
            per_pair[tuple(sorted((l1, l2)))] = value
    return float(np.mean(list(per_pair.values()))), per_pair


# --- STS language bias -----------------------------------------------------------------------

def language_bias(pairs: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    """Language bias on a multi-parallel STS set: ``(bias, bilingual, pooled)``.

    ``pairs`` maps a language pair to (cosine scores, gold scores) of its sentence pairs.
    ``bilingual`` is the mean over language pairs of each pair's Spearman correlation;
    ``pooled`` the Spearman correlation over all pairs' items together; ``bias = bilingual -
    pooled``. The bias is positive when the model ranks items of one language pair well but its
    scores are not comparable across language pairs (e.g. every de-fr score above every en-ar
    one): pooling then mixes offsets into the ranking. Zero for a language-agnostic model.
    """
    if len(pairs) < 1:
        raise InputError("language_bias: no language pairs")
    preds, golds, per_pair = [], [], []
    for pair, value in pairs.items():
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise InputError(f"language_bias {pair}: expected (cosine scores, gold scores)")
        pred = _vector(f"language_bias {pair} scores", value[0])
        gold = _vector(f"language_bias {pair} gold", value[1])
        per_pair.append(_spearman(pred, gold, f"language_bias {pair}"))
        preds.append(pred)
        golds.append(gold)
    bilingual = float(np.mean(per_pair))
    pooled = _spearman(np.concatenate(preds), np.concatenate(golds), "language_bias pooled")
    return bilingual - pooled, bilingual, pooled


def symmetric_average(scores: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Both directions of a language pair averaged into one entry keyed by the sorted pair
    (de-fr and fr-de -> ('de', 'fr')); a pair scored in one direction only keeps its value."""
    grouped: dict[tuple[str, str], list[float]] = {}
    for pair, value in scores.items():
        if len(pair) != 2:
            raise InputError(f"symmetric_average: expected (language, language) keys, got {pair!r}")
        grouped.setdefault(tuple(sorted(pair)), []).append(float(value))
    return {pair: float(np.mean(values)) for pair, values in grouped.items()}


# --- classification --------------------------------------------------------------------------

def _fit_predict(train_x, train_y, test_x, test_y, seed: int, max_iter: int) -> tuple[np.ndarray, np.ndarray]:
    """Test labels and the predictions of a logistic regression trained on frozen embeddings.

    scikit-learn's defaults: L2 penalty, C = 1.0, lbfgs (multinomial for more than two classes),
    no feature scaling; ``max_iter`` iterations at most, ``random_state=seed``.
    """
    from sklearn.linear_model import LogisticRegression

    train_x = _matrix("classification train_x", train_x)
    test_x = _matrix("classification test_x", test_x, min_rows=1)
    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    if train_y.ndim != 1 or len(train_y) != len(train_x):
        raise InputError(f"classification: train_y of shape {train_y.shape} for {len(train_x)} train rows")
    if test_y.ndim != 1 or len(test_y) != len(test_x):
        raise InputError(f"classification: test_y of shape {test_y.shape} for {len(test_x)} test rows")
    if train_x.shape[1] != test_x.shape[1]:
        raise InputError(f"classification: train dimension {train_x.shape[1]} but test {test_x.shape[1]}")
    if len(np.unique(train_y)) < 2:
        raise InputError("classification: the training labels hold a single class")
    model = LogisticRegression(max_iter=max_iter, random_state=seed)
    model.fit(train_x, train_y)
    return test_y, model.predict(test_x)


def classification_accuracy(train_x, train_y, test_x, test_y, *, seed: int = 0, max_iter: int = 1000) -> float:
    """Accuracy on the test set of a logistic regression trained on frozen train embeddings."""
    gold, pred = _fit_predict(train_x, train_y, test_x, test_y, seed, max_iter)
    return float(np.mean(gold == pred))


def classification_macro_f1(train_x, train_y, test_x, test_y, *, seed: int = 0, max_iter: int = 1000) -> float:
    """Macro-averaged F1 (over the labels of test and predictions) of the same classifier."""
    from sklearn.metrics import f1_score

    gold, pred = _fit_predict(train_x, train_y, test_x, test_y, seed, max_iter)
    return float(f1_score(gold, pred, average="macro"))
