"""benchmarks/recipe_throughput.py: what it counts is what the recipes trained on, its stand-in
for WMD where POT is missing is WMD's lower bound, and the random mT5 it builds at a real size's
shape loads as m-ST5 loads its encoder."""

import numpy as np
import pytest
import torch

from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("recipe_throughput")


def test_the_timed_figures_are_those_of_the_steps_the_recipe_trained_after_its_warm_up(bench, tmp_path):
    """Grouped by length, m-ST5's batches are not all full (a group's leftovers make a small
    batch): the benchmark must count the pairs each timed step trained on, and the FLOPs of
    those steps' own tokens, here checked against the recipe's own batches of the same data,
    tokenised and counted as the efficiency module counts them."""
    from modsent.methods import baselines as bl
    from modsent.methods.mst5 import training as mt
    from modsent.training import efficiency

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pairs = bench.pair_files(tmp_path)
        source = bench.random_mt5(tmp_path / "mt5", "small", "large", "cpu")
        args = bench.argparse.Namespace(steps=7, warmup=1, size="small", checkpointing=False, batch_size=64)
        settings = bench.settings_of("mST5-xnli", source, args, "fp32", 8)
        metrics, cfg, timed = bench.train("mST5-xnli", source, pairs, settings, 1, "cpu")
    finally:
        torch.set_num_threads(threads)

    frames = mt.read_frames(pairs, None, "datasets")
    train, _ = bl.split_heldout_by_pivot(frames, cfg.eval_pairs)
    rows = mt.crosslingual_triplets(train, cfg.seed)
    batches = mt.triplet_data(rows, 64, cfg.seed, 8).epoch_batches(0)[:8]
    assert metrics["steps"] == 8 and timed["seconds"] > 0
    assert timed["pairs"] == sum(len(batch) for batch in batches[1:])
    assert min(len(batch) for batch in batches[1:]) < 64  # the case the count is for: a timed batch not full

    model = mt.build_model(source, cfg).model  # the LoRA body whose shape the recipe counts, and its tokenizer
    tokenizer = model.tokenizer  # each text's tokens, as the recipe cuts them (<= seq_len)
    lengths = [[min(len(tokenizer(text)["input_ids"]), cfg.seq_len) for column in mt.TRIPLET
                for text in rows.iloc[batch][column]] for batch in batches]
    shape = efficiency.body_shape(model.encoder)
    step_flops = [efficiency.encoder_flops(shape, sum(n), sum(x * x for x in n)) for n in lengths]
    assert metrics["model_flops"] == pytest.approx(sum(step_flops), rel=1e-9)
    assert timed["flops"] == pytest.approx(sum(step_flops[1:]), rel=1e-9)
    assert timed["tokens_per_text"] == pytest.approx(np.mean([x for n in lengths[1:] for x in n]))
    row = bench.row("mST5-xnli", "fp32", metrics, timed, 7, None)
    assert row["pairs_s"] == pytest.approx(timed["pairs"] / timed["seconds"]) and row["mfu"] is None


def test_the_wmd_stand_in_is_its_centroid_lower_bound(bench):
    from modsent.methods.dueam.wmd import word_movers_distance

    rng = np.random.default_rng(0)
    for n, m in ((5, 3), (12, 9), (1, 1)):
        x, y = rng.normal(size=(n, 8)), rng.normal(size=(m, 8))
        wx, wy = rng.uniform(0.1, 1, n), rng.uniform(0.1, 1, m)
        wx, wy = wx / wx.sum(), wy / wy.sum()
        stand_in, exact = bench.centroid_distance(x, y, wx, wy), word_movers_distance(x, y, wx, wy)
        assert stand_in <= exact + 1e-9
        if n == m == 1:  # one token each: both are the distance of the two vectors
            assert stand_in == pytest.approx(exact) == pytest.approx(np.linalg.norm(x[0] - y[0]))


def test_a_random_mt5_encoder_of_a_real_shape_loads_as_m_st5_loads_it(tmp_path):
    """make_random_mt5(encoder_only, model_vocab_size): the encoder alone, its embedding padded to
    the real vocabulary, a real size's layer shapes (two layers of mt5-large's here), in bf16."""
    from modsent.encoders import transformer as tf
    from modsent.testing import MT5_SIZES, MT5_VOCAB, make_random_mt5, sample_texts

    shape = {**MT5_SIZES["large"], "layers": 2}
    out = make_random_mt5(tmp_path / "mt5", sample_texts(300), vocab_size=300, model_vocab_size=MT5_VOCAB,
                          encoder_only=True, dtype="bfloat16", **shape)
    body, tokenizer = tf.load_encoder_body(out, dtype=torch.bfloat16)
    assert type(body).__name__ == "MT5EncoderModel" and body.dtype == torch.bfloat16
    assert body.get_input_embeddings().weight.shape == (MT5_VOCAB, 1024)
    assert body.encoder.block[0].layer[1].DenseReluDense.wi_0.weight.shape == (2816, 1024)
    assert body.config.num_heads == 16 and body.config.relative_attention_num_buckets == 32
    ids = tokenizer(["A short English sentence."])["input_ids"][0]
    assert ids[-1] == 1 and max(ids) < 300  # "$A </s>", the learnt pieces
    with torch.no_grad():
        states = body(input_ids=torch.tensor([ids])).last_hidden_state
    assert states.shape == (1, len(ids), 1024) and torch.isfinite(states.float()).all()
