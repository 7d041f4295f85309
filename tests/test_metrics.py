"""modsent.evaluation.metrics against independent computations: scipy's correlations, a pure-Python xsim
with explicit nearest-neighbour loops, and cases whose answer is known by construction."""

import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from modsent.evaluation import metrics as m
from modsent.io import InputError


def brute_xsim(src, tgt, k, margin, candidates="knn", wrong_direction=False):
    """Error rate of :func:`brute_predictions`."""
    pred = brute_predictions(src, tgt, k, margin, candidates, wrong_direction)
    return sum(p != i for i, p in enumerate(pred)) / len(pred)


def brute_predictions(src, tgt, k, margin, candidates="knn", wrong_direction=False):
    """xsim's retrieved target rows, with loops over plain Python floats, from the definition.

    With ``wrong_direction`` the target's kNN average is taken over the other targets instead of
    over the sources (a plausible mistake the vectorised version must not make).
    """
    src = [[float(v) for v in row] for row in src]
    tgt = [[float(v) for v in row] for row in tgt]
    n = len(src)

    def cos(u, v):
        nu, nv = math.sqrt(sum(a * a for a in u)), math.sqrt(sum(b * b for b in v))
        return 0.0 if nu == 0 or nv == 0 else sum(a * b for a, b in zip(u, v)) / (nu * nv)

    def mean_top(values):
        return sum(sorted(values, reverse=True)[:k]) / k

    sim = [[cos(src[i], tgt[j]) for j in range(n)] for i in range(n)]
    avg_src = [mean_top(sim[i]) for i in range(n)]
    if wrong_direction:
        avg_tgt = [mean_top([cos(tgt[j], tgt[l]) for l in range(n) if l != j]) for j in range(n)]
    else:
        avg_tgt = [mean_top([sim[i][j] for i in range(n)]) for j in range(n)]
    pred = []
    for i in range(n):
        if candidates == "knn":  # LASER: rescore the k nearest targets (absolute: the nearest)
            by_cos = sorted(range(n), key=lambda j: (-sim[i][j], j))
            cands = by_cos[:1] if margin == "absolute" else by_cos[:k]
        else:
            cands = range(n)
        best, best_score = None, -math.inf
        for j in cands:
            a, b = sim[i][j], (avg_src[i] + avg_tgt[j]) / 2
            score = a if margin == "absolute" else a / b if margin == "ratio" else a - b
            if score > best_score:
                best, best_score = j, score
        pred.append(best)
    return pred


def noisy_pair(seed, n=30, d=8):
    """A source and a noisy translation with a hub direction shared by some targets."""
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((n, d))
    hub = rng.standard_normal(d)
    tgt = src + 0.9 * rng.standard_normal((n, d)) + 0.7 * hub * rng.random((n, 1))
    return src.astype(np.float32), tgt.astype(np.float32)


# --- cosine and STS --------------------------------------------------------------------------

def test_cosine_rows_matches_loop_and_zero_vectors():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    a[2] = 0.0
    expected = [0.0 if not np.any(x) else float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b)]
    assert m.cosine_rows(a, b) == pytest.approx(expected, abs=1e-12)
    assert m.cosine_rows(a, 3 * a)[[0, 1]] == pytest.approx([1.0, 1.0])


def test_sts_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(1)
    e1, e2 = rng.standard_normal((40, 6)), rng.standard_normal((40, 6))
    gold = rng.integers(0, 5, 40).astype(float)  # many ties
    cos = m.cosine_rows(e1, e2)
    assert m.sts_spearman(e1, e2, gold) == pytest.approx(spearmanr(cos, gold).statistic, abs=1e-12)
    e2[:5] = e1[:5]  # tied cosines (1.0) as well
    cos = m.cosine_rows(e1, e2)
    assert m.sts_spearman(e1, e2, gold) == pytest.approx(spearmanr(cos, gold).statistic, abs=1e-12)


def test_sts_spearman_perfect_and_reversed():
    rng = np.random.default_rng(2)
    e1 = rng.standard_normal((20, 4))
    e2 = e1 + rng.standard_normal((20, 4))
    cos = m.cosine_rows(e1, e2)
    assert m.sts_spearman(e1, e2, np.exp(cos)) == pytest.approx(1.0)
    assert m.sts_spearman(e1, e2, -cos) == pytest.approx(-1.0)


def test_sts_spearman_degenerate():
    e = np.ones((5, 3))
    assert math.isnan(m.sts_spearman(e, e, [1, 2, 3, 4, 5]))  # a collapsed model: undefined
    with pytest.raises(InputError, match="gold scores are equal"):
        m.sts_spearman(np.eye(3), np.eye(3)[::-1], [2, 2, 2])


# --- xsim ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("margin", m.MARGINS)
@pytest.mark.parametrize("candidates", m.CANDIDATES)
def test_xsim_matches_brute_force(seed, k, margin, candidates):
    src, tgt = noisy_pair(seed)
    for x, y in ((src, tgt), (tgt, src)):
        expected = brute_predictions(x, y, k, margin, candidates)
        for batch_size in (1024, 7):  # 7: chunked over sources
            opts = dict(k=k, margin=margin, candidates=candidates, batch_size=batch_size)
            assert m.xsim_predictions(x, y, **opts).tolist() == expected
            assert m.xsim_error_rate(x, y, **opts) == brute_xsim(x, y, k, margin, candidates)
            # the reverse direction from the same similarity matrix (its column top-k, merged
            # across chunks): what xsim_all_pairs reports for (tgt, src)
            backward = m._xsim_both(m._normalise(y), m._normalise(x), k, margin, candidates, batch_size)[1]
            assert backward.tolist() == expected


def test_brute_force_data_tells_the_variants_apart():
    """The brute-force comparison is discriminating: on its data the margins, the candidate sets
    and the direction of the target's kNN average change the result."""
    pairs = [noisy_pair(seed) for seed in range(6)]
    def brute(*args, **kwargs):
        return [brute_xsim(src, tgt, *args, **kwargs) for src, tgt in pairs]
    assert brute(4, "ratio") != brute(4, "absolute")
    assert brute(4, "ratio") != brute(4, "distance")
    assert brute(1, "ratio", "knn") != brute(1, "ratio", "all")
    assert brute(4, "ratio") != brute(4, "ratio", wrong_direction=True)
    vectorised = [m.xsim_error_rate(src, tgt, k=4, margin="ratio") for src, tgt in pairs]
    assert vectorised == brute(4, "ratio")


@pytest.mark.parametrize("margin", m.MARGINS)
def test_xsim_known_cases(margin):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 16))
    assert m.xsim_error_rate(x, x, margin=margin) == 0.0
    assert m.xsim_error_rate(x, 2.5 * x + 0, margin=margin) == 0.0  # cosine ignores scale
    derangement = np.roll(np.arange(40), 1)  # every row moved: each own match is at another row
    assert m.xsim_error_rate(x, x[derangement], margin=margin) == 1.0
    assert m.xsim_error_rate(x, x[derangement], margin=margin, candidates="all") == 1.0


def test_xsim_ties_go_to_the_lower_row():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 6))
    x[7] = x[3]  # a duplicate sentence: source 7 finds target 3 first
    expected = [0, 1, 2, 3, 4, 5, 6, 3, 8, 9]
    xn = m._normalise(x)
    for margin in m.MARGINS:
        for candidates in m.CANDIDATES:
            for batch_size in (1024, 4):  # 4: rows 3 and 7 in different chunks
                opts = dict(margin=margin, candidates=candidates, batch_size=batch_size)
                assert m.xsim_predictions(x, x, **opts).tolist() == expected
                assert m.xsim_error_rate(x, x, **opts) == 0.1
                assert m._xsim_both(xn, xn, 4, margin, candidates, batch_size)[1].tolist() == expected


def test_xsim_margin_undoes_a_hub():
    """A target close to every source (the sources' shared component) wins plain cosine
    retrieval for many sources; the margin discounts it."""
    rng = np.random.default_rng(5)
    shared = 1.5 * rng.standard_normal(32)
    src = shared + rng.standard_normal((50, 32))
    tgt = src + rng.standard_normal((50, 32))
    tgt[0] = shared  # a hub
    absolute = m.xsim_error_rate(src, tgt, margin="absolute")
    assert absolute > 0.15
    assert m.xsim_error_rate(src, tgt, margin="ratio") < absolute / 2
    assert m.xsim_error_rate(src, tgt, margin="distance") < absolute / 2


def test_xsim_all_pairs_equals_pairwise_calls():
    rng = np.random.default_rng(6)
    base = rng.standard_normal((30, 8))
    langs = {lang: base + s * rng.standard_normal((30, 8)) for lang, s in zip("abcd", (0.5, 0.8, 1.0, 1.3))}
    for margin in m.MARGINS:
        for candidates in m.CANDIDATES:
            for batch_size in (1024, 7):
                got = m.xsim_all_pairs(langs, k=3, margin=margin, batch_size=batch_size, candidates=candidates)
                assert list(got) == [(l1, l2) for l1 in langs for l2 in langs if l1 != l2]
                for (l1, l2), value in got.items():
                    assert value == m.xsim_error_rate(langs[l1], langs[l2], k=3, margin=margin,
                                                      candidates=candidates)
                    assert value == brute_xsim(langs[l1], langs[l2], 3, margin, candidates)


def test_xsim_input_errors():
    x = np.zeros((5, 4))
    with pytest.raises(InputError, match="shapes differ"):
        m.xsim_error_rate(x, np.zeros((6, 4)))
    with pytest.raises(InputError, match="shapes differ"):
        m.xsim_all_pairs({"a": x, "b": np.zeros((5, 3))})
    with pytest.raises(InputError, match="at least 2"):
        m.xsim_error_rate(x[:1], x[:1])
    with pytest.raises(InputError, match="NaN"):
        m.xsim_error_rate(x, np.full((5, 4), np.nan))
    with pytest.raises(InputError, match="margin"):
        m.xsim_error_rate(x, x, margin="cosine")
    with pytest.raises(InputError, match="k must"):
        m.xsim_error_rate(x, x, k=6)
    with pytest.raises(InputError, match="k must"):
        m.xsim_error_rate(x, x, k=0)
    with pytest.raises(InputError, match="2-D"):
        m.xsim_error_rate(x[0], x[0])
    with pytest.raises(InputError, match="at least 2"):
        m.xsim_all_pairs({"a": x})


# --- rsim ------------------------------------------------------------------------------------

def test_rsim_matches_pearsonr():
    rng = np.random.default_rng(7)
    base = rng.standard_normal((25, 6))
    langs = {"de": base + 0.3 * rng.standard_normal((25, 6)), "en": base,
             "fr": base + rng.standard_normal((25, 6))}
    mean, per_pair = m.rsim(langs)
    iu = np.triu_indices(25, k=1)
    def triangle(x):
        xn = x / np.linalg.norm(x, axis=1, keepdims=True)
        return (xn @ xn.T)[iu]
    expected = {("de", "en"): pearsonr(triangle(langs["de"]), triangle(langs["en"])).statistic,
                ("de", "fr"): pearsonr(triangle(langs["de"]), triangle(langs["fr"])).statistic,
                ("en", "fr"): pearsonr(triangle(langs["en"]), triangle(langs["fr"])).statistic}
    assert per_pair == pytest.approx(expected, abs=1e-10)
    assert mean == pytest.approx(np.mean(list(expected.values())), abs=1e-10)
    assert m.rsim({"fr": langs["fr"], "en": langs["en"]})[1].keys() == {("en", "fr")}


def test_rsim_invariant_to_rotation_and_scale():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((30, 10))
    q, _ = np.linalg.qr(rng.standard_normal((10, 10)))
    scale = rng.uniform(0.5, 3.0, (30, 1))
    mean, per_pair = m.rsim({"a": x, "b": (x @ q) * scale})
    assert mean == pytest.approx(1.0, abs=1e-12)
    mean, _ = m.rsim({"a": x, "b": rng.standard_normal((30, 10))})
    assert abs(mean) < 0.2  # unrelated spaces


def test_rsim_input_errors():
    with pytest.raises(InputError, match="multi-parallel"):
        m.rsim({"a": np.ones((4, 3)), "b": np.ones((5, 3))})
    with pytest.raises(InputError, match="at least 3"):
        m.rsim({"a": np.eye(2), "b": np.eye(2)})
    with pytest.raises(InputError, match="at least 2"):
        m.rsim({"a": np.eye(3)})


# --- language bias and symmetric averages ----------------------------------------------------

def test_language_bias_zero_for_identical_pairs():
    rng = np.random.default_rng(9)
    cos, gold = rng.random(30), rng.integers(0, 6, 30).astype(float)
    bias, bilingual, pooled = m.language_bias({("de", "en"): (cos, gold), ("de", "fr"): (cos, gold),
                                               ("en", "fr"): (cos.copy(), gold.copy())})
    assert bilingual == pytest.approx(spearmanr(cos, gold).statistic, abs=1e-12)
    assert pooled == pytest.approx(bilingual, abs=1e-12)
    assert bias == pytest.approx(0.0, abs=1e-12)


def test_language_bias_from_offsets():
    """Each pair ranks perfectly, but one pair's scores are shifted: pooling loses."""
    rng = np.random.default_rng(10)
    gold_a, gold_b = rng.random(20) * 5, rng.random(20) * 5
    cos_a, cos_b = gold_a / 10, gold_b / 10 + 0.4
    bias, bilingual, pooled = m.language_bias({("de", "en"): (cos_a, gold_a), ("ar", "en"): (cos_b, gold_b)})
    expected_pooled = spearmanr(np.concatenate([cos_a, cos_b]), np.concatenate([gold_a, gold_b])).statistic
    assert bilingual == pytest.approx(1.0)
    assert pooled == pytest.approx(expected_pooled, abs=1e-12)
    assert bias == pytest.approx(1.0 - expected_pooled, abs=1e-12)
    assert bias > 0.05


def test_language_bias_matches_scipy_on_random_data():
    rng = np.random.default_rng(11)
    pairs = {(a, b): (rng.random(15), rng.random(15)) for a, b in [("de", "en"), ("en", "fr"), ("de", "fr")]}
    bias, bilingual, pooled = m.language_bias(pairs)
    expected_bi = np.mean([spearmanr(c, g).statistic for c, g in pairs.values()])
    expected_pooled = spearmanr(np.concatenate([c for c, _ in pairs.values()]),
                                np.concatenate([g for _, g in pairs.values()])).statistic
    assert (bias, bilingual, pooled) == pytest.approx((expected_bi - expected_pooled, expected_bi, expected_pooled))


def test_language_bias_input_errors():
    with pytest.raises(InputError, match="no language pairs"):
        m.language_bias({})
    with pytest.raises(InputError, match="predicted scores"):
        m.language_bias({("de", "en"): (np.ones(3), np.arange(4.0))})
    with pytest.raises(InputError, match="NaN"):
        m.language_bias({("de", "en"): (np.array([0.1, np.nan, 0.3]), np.arange(3.0))})


def test_symmetric_average():
    got = m.symmetric_average({("de", "fr"): 0.2, ("fr", "de"): 0.4, ("en", "de"): 0.1, ("ar", "en"): 0.7})
    assert got == pytest.approx({("de", "fr"): 0.3, ("de", "en"): 0.1, ("ar", "en"): 0.7})
    with pytest.raises(InputError, match=r"expected \(language, language\) keys"):
        m.symmetric_average({("de",): 0.1})


# --- classification --------------------------------------------------------------------------

def test_classification_separable_and_random():
    rng = np.random.default_rng(12)
    centers = rng.standard_normal((3, 8)) * 6
    train_y, test_y = rng.integers(0, 3, 150), rng.integers(0, 3, 60)
    train_x = centers[train_y] + rng.standard_normal((150, 8))
    test_x = centers[test_y] + rng.standard_normal((60, 8))
    assert m.classification_accuracy(train_x, train_y, test_x, test_y) == 1.0
    assert m.classification_macro_f1(train_x, train_y, test_x, test_y) == 1.0
    # random labels: nothing to learn, accuracy near chance (0.5; 2000 test items: sd 0.011)
    rx, ry = rng.standard_normal((400, 5)), rng.integers(0, 2, 400)
    tx, ty = rng.standard_normal((2000, 5)), rng.integers(0, 2, 2000)
    assert abs(m.classification_accuracy(rx, ry, tx, ty) - 0.5) < 0.05


def test_classification_input_errors():
    x = np.zeros((4, 3))
    with pytest.raises(InputError, match="train_y"):
        m.classification_accuracy(x, [0, 1, 0], x, [0, 1, 0, 1])
    with pytest.raises(InputError, match="dimension"):
        m.classification_accuracy(x, [0, 1, 0, 1], np.zeros((4, 2)), [0, 1, 0, 1])
    with pytest.raises(InputError, match="single class"):
        m.classification_accuracy(x, [1, 1, 1, 1], x, [0, 1, 0, 1])
