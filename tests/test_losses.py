"""The objectives of modsent.losses against their reference definitions, and the training
toolkit's schedules and seeds."""

import pytest
import torch

from modsent import losses
from modsent.io import InputError
from modsent.training import schedules, seeding


def test_mnrl_equals_sentence_transformers():
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    generator = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(8, 16, generator=generator) for _ in range(3))
    reference = MultipleNegativesRankingLoss(model=None, scale=20.0)
    ours = losses.MultipleNegativesRankingLoss(20.0)
    labels = torch.zeros(8)
    assert torch.allclose(ours(a, p), reference.compute_loss_from_embeddings([a, p], labels), atol=1e-6)
    assert torch.allclose(ours(a, p, n), reference.compute_loss_from_embeddings([a, p, n], labels), atol=1e-6)
    # some pairs without a hard negative: those add no candidate
    some = n[:3]
    scores = 20.0 * torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(
        torch.cat([p, some]), dim=-1).T
    expected = torch.nn.functional.cross_entropy(scores, torch.arange(8))
    assert torch.allclose(ours(a, p, some), expected, atol=1e-6)


def test_similarity_losses_compute_in_float32_under_autocast():
    """Autocast runs a matrix product in bf16 even on float32 inputs; the similarity losses
    compute their cosines (and KoLeo its nearest neighbours) outside it, so under bf16 autocast
    (CPU autocast here; CUDA's treats the product the same) each equals its float32 value, where
    bf16 similarities moved these by 0.1-0.6%. KoLeo's case is a near tie: the first vector's
    two neighbours (at cosines 0.9982 and 0.9988) are both 1.0 in bf16, where the farther one
    would win and move the loss by 2%."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(48, 64, generator=g)
    a = base + torch.randn(48, 64, generator=g)  # related pairs: losses of 0.2-0.7, moved 0.1-0.6% by bf16
    b = base + torch.randn(48, 64, generator=g)
    negatives = torch.randn(48, 64, generator=g)
    e = torch.eye(4)
    near_tie = torch.stack([e[0], e[0] + 0.06 * e[1], e[0] + 0.05 * e[2], e[3]])
    cases = {
        "MNRL": lambda: losses.MultipleNegativesRankingLoss()(a, b, negatives[:20]),
        "TripletInfoNCE": lambda: losses.TripletInfoNCELoss()(a, b, negatives),
        "SymmetricInfoNCE": lambda: losses.SymmetricInfoNCELoss()(a, b),
        "InfoNCE": lambda: losses.InfoNCELoss()(a, b),
        "KoLeo": lambda: losses.KoLeoLoss()(near_tie),
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert losses.cos_sim(a, b).dtype == torch.float32
        assert (a @ b.T).dtype == torch.bfloat16  # what the losses would otherwise have computed with
        mixed = {name: float(loss()) for name, loss in cases.items()}
    for name, loss in cases.items():
        assert mixed[name] == pytest.approx(float(loss()), rel=1e-5), name


def test_cosine_similarity_loss_equals_sentence_transformers():
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss

    generator = torch.Generator().manual_seed(0)
    u, v = torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator)
    reference = CosineSimilarityLoss(model=None).compute_loss_from_embeddings([u, v], torch.ones(8))
    ours = losses.CosineSimilarityLoss()
    assert torch.allclose(ours(u, v), reference, atol=1e-6)
    assert ours(u, u).item() == pytest.approx(0.0, abs=1e-6)
    labels = torch.rand(8, generator=generator)
    assert torch.allclose(ours(u, v, labels),
                          CosineSimilarityLoss(model=None).compute_loss_from_embeddings([u, v], labels), atol=1e-6)


def test_masked_language_modeling_loss_equals_the_full_head_loss(tmp_path):
    """Masked positions only through the head equals transformers' *ForMaskedLM loss over the
    same labels; the sum is the mean times the masked positions."""
    from transformers import AutoModelForMaskedLM

    from modsent.testing import make_tiny_xlmr, sample_texts

    model = AutoModelForMaskedLM.from_pretrained(str(make_tiny_xlmr(tmp_path / "base", sample_texts(200)))).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (3, 12), generator=generator)
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape, generator=generator) < 0.3
    labels[chosen] = ids[chosen]
    with torch.no_grad():
        ours = losses.MaskedLanguageModelingLoss()(model, ids, labels)
        reference = model(input_ids=ids, labels=labels).loss
        summed = losses.MaskedLanguageModelingLoss("sum")(model, ids, labels)
    assert torch.allclose(ours, reference, atol=1e-5)
    assert torch.allclose(summed, reference * chosen.sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        losses.MaskedLanguageModelingLoss("none")


def test_masked_positions_are_found_where_the_labels_are(tmp_path):
    """With labels on the CPU the loss asks nothing of the model's device that depends on its
    values: on the meta device (shapes only, as a GPU the host need not wait for) it runs, where
    a boolean index of the hidden states fails. Its gradient equals the boolean index's."""
    from transformers import AutoModelForMaskedLM

    from modsent.testing import make_tiny_xlmr, sample_texts

    path = make_tiny_xlmr(tmp_path / "base", sample_texts(200))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (3, 12), generator=generator)
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.3, ids, torch.full_like(ids, -100))
    config = AutoModelForMaskedLM.from_pretrained(str(path)).config
    with torch.device("meta"):
        model = AutoModelForMaskedLM.from_config(config)
    loss = losses.MaskedLanguageModelingLoss()(model, ids.to("meta"), labels)
    assert loss.device.type == "meta" and loss.shape == ()
    hidden = losses.mlm_parts(model)[0](input_ids=ids.to("meta")).last_hidden_state
    with pytest.raises(NotImplementedError):
        hidden[labels.to("meta") != -100]

    model = AutoModelForMaskedLM.from_pretrained(str(path))
    model.train(False)
    losses.MaskedLanguageModelingLoss()(model, ids, labels).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    encoder, head = losses.mlm_parts(model)
    selected = labels != -100
    torch.nn.functional.cross_entropy(head(encoder(input_ids=ids).last_hidden_state[selected]),
                                      labels[selected]).backward()
    assert ours.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.equal(ours[n], p.grad) for n, p in model.named_parameters() if n in ours)


def test_warmup_linear_schedule():
    """Warm-up to the peak, then linear decay to zero; step s's rate is set before its update,
    so the warm-up starts at peak / warmup (transformers' get_linear_schedule_with_warmup one
    step ahead during the warm-up, equal after it)."""
    from transformers import get_linear_schedule_with_warmup

    peak, total, warmup = 0.5, 20, 4
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    reference = get_linear_schedule_with_warmup(optimizer, warmup, total)
    factors = [reference.lr_lambdas[0](step) for step in range(total + 1)]
    ours = [schedules.warmup_linear(step, total, warmup, peak) for step in range(total)]
    assert ours[:warmup] == pytest.approx([peak * f for f in factors[1:warmup + 1]])
    assert ours[warmup:] == pytest.approx([peak * f for f in factors[warmup:total]])
    assert schedules.warmup_linear(total, total, warmup, peak) == 0.0
    assert schedules.warmup_steps_of(0.1, 47) == 5


def test_step_seeds_are_pure_functions_of_the_step():
    assert seeding.dropout_seed(7, 0) == seeding.dropout_seed(7, 0, rank=0)
    assert len({seeding.dropout_seed(7, 0, rank) for rank in range(4)}) == 4
    assert seeding.dropout_seed(7, 0) != seeding.dropout_seed(8, 0) != seeding.dropout_seed(7, 1)
    a = torch.rand(3, generator=seeding.step_generator(5, 2))
    assert torch.equal(a, torch.rand(3, generator=seeding.step_generator(5, 2)))


def test_fresh_weights_draw_from_a_private_cpu_stream(monkeypatch):
    """The recipes' fresh weights (built on the CPU) come from their seed, wherever the run
    trains: the caller's CPU stream goes on as if nothing was drawn, and no GPU generator is
    reseeded (``torch.manual_seed`` would reseed every GPU's and leave it so)."""
    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseeded.append)
    monkeypatch.setattr(torch.cuda, "manual_seed", reseeded.append)
    cpu = torch.random.default_generator
    cpu.manual_seed(11)
    expected_after = torch.rand(4)
    cpu.manual_seed(11)
    with seeding.private_cpu_stream(3):
        first = torch.nn.Linear(4, 2).weight.detach().clone()
    assert torch.equal(torch.rand(4), expected_after)  # the caller's stream, untouched
    with seeding.private_cpu_stream(3):
        assert torch.equal(torch.nn.Linear(4, 2).weight, first)  # the seed's weights, again
    with seeding.private_cpu_stream():  # no seed: private draws from where the stream was
        unseeded = torch.rand(4)
    assert torch.equal(unseeded, torch.rand(4))
    assert reseeded == []


def test_batches_can_keep_the_rows_of_one_group_apart():
    """Multi-parallel rows (one pair_id in three languages) with group_column="pair_id": no batch
    holds two rows of one pair (they would be each other's false negatives); every row is used
    once an epoch; without the grouping the same data does put copies of a pair together."""
    import pandas as pd

    from modsent.training.pairs import no_duplicate_batches

    rows = pd.DataFrame([{"pair_id": f"p{i}", "anchor": f"anchor {i} in {lang}", "positive": f"positive {i} in {lang}",
                          "negative": None} for i in range(40) for lang in ("en", "de", "ky")])
    grouped = no_duplicate_batches(rows, 16, seed=0, group_column="pair_id")
    for batch in grouped:
        assert rows.loc[batch, "pair_id"].is_unique
    used = sorted(i for batch in grouped for i in batch)
    assert used == sorted(set(used)) and len(used) >= len(rows) - 1  # at most a last lone row dropped
    plain = no_duplicate_batches(rows, 16, seed=0)
    assert any(not rows.loc[batch, "pair_id"].is_unique for batch in plain)
    assert no_duplicate_batches(rows, 16, seed=0, group_column="pair_id") == grouped  # seeded
    with pytest.raises(InputError, match="no column 'lang'"):
        no_duplicate_batches(rows, 16, seed=0, group_column="lang")
