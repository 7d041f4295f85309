"""Tiny per-language modules (LA + SE) for the tests of later stages: seconds, not quality."""

import importlib.util
import os

import pytest
import torch
from safetensors.torch import load_file

from modsent.modular import language_adapter as la
from modsent.modular import sentence_adapter as sa
from modsent.modular.fasttext_embeddings import train_token_fasttext
from modsent.modular.focus import initialize_embeddings
from modsent.sources.builtin import builtin_corpus
from modsent.modular.tokenizer_training import train_tokenizer

LA_CFG = la.LanguageAdapterConfig(steps=3, batch_size=4, seq_len=32, learning_rate=2e-3,
                                  warmup_steps=1, eval_sentences=20, checkpoint_every=100, log_every=1,
                                  head_warmup_steps=0)


def language_modules(root, base, lang, pairs, se_cfg, *, with_la=True):
    """A tiny LA (unless ``with_la`` is False) and SE of ``lang`` on ``base``: (la_dir, se_dir)."""
    corpus = root / f"{lang}.txt"
    corpus.write_text("\n".join(builtin_corpus(lang)[:400]) + "\n", encoding="utf-8")
    la_dir = None
    if with_la:
        train_tokenizer(corpus, base, root / f"tok-{lang}", vocab_size=400)
        train_token_fasttext(corpus, root / f"tok-{lang}", root / f"ft-{lang}", dim=16, epochs=1, min_count=2)
        initialize_embeddings(base, root / f"tok-{lang}", root / f"ft-{lang}", root / f"emb-{lang}")
        la.train_language_adapter(base, root / f"tok-{lang}", root / f"emb-{lang}", corpus, root / f"la-{lang}",
                                  LA_CFG, progress=False)
        la_dir = root / f"la-{lang}"
    pairs_path = root / f"pairs-{lang}.parquet"
    pairs.to_parquet(pairs_path, index=False)
    sa.train_sentence_adapter(base, la_dir, pairs_path, root / f"se-{lang}", se_cfg, device="cpu", progress=False)
    return la_dir, root / f"se-{lang}"


def tiny_base_and_data(root):
    """(base dir, English pairs, translation units): a tiny random XLM-R and the built-in pairs."""
    from modsent.data.paraphrase import translation_units
    from modsent.sources.builtin import builtin_paraphrases
    from modsent.testing import make_tiny_xlmr, sample_texts

    english = builtin_paraphrases()
    return make_tiny_xlmr(root / "base", sample_texts(600)), english, translation_units(english)


def pairs_in(lang, english, units):
    """The English pairs translated into ``lang`` with the built-in human translations."""
    from modsent.data.paraphrase import align_provided, translate_pairs
    from modsent.sources.builtin import builtin_translations

    lang_units, _ = align_provided(units, builtin_translations(lang), lang)
    return translate_pairs(english, lang_units)


def logged_losses(run_dir) -> list[float]:
    """The losses a training run logged (``run_dir/loss.tsv``: a header, then step and loss)."""
    return [float(line.split("\t")[1]) for line in (run_dir / "loss.tsv").read_text().splitlines()[1:]]


def assert_same_model(first, second, first_metrics: dict, second_metrics: dict,
                      keys=("loss_first", "loss_last", "steps", "loss_components")) -> None:
    """Two trainings of a whole model wrote the same thing: ``model.safetensors`` bit for bit,
    the metrics of ``keys`` and the loss curve."""
    a = load_file(str(first / "model.safetensors"))
    b = load_file(str(second / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for key in keys:
        assert first_metrics[key] == second_metrics[key], key
    assert (first / "loss.tsv").read_text() == (second / "loss.tsv").read_text()


def assert_close_model(first, second, first_metrics: dict, second_metrics: dict,
                       keys=("loss_first", "loss_last", "steps")) -> None:
    """Two trainings of a whole model wrote the same thing up to float rounding (one compiled):
    the tensors of ``model.safetensors`` (the same names), the metrics of ``keys`` and the losses."""
    a = load_file(str(first / "model.safetensors"))
    b = load_file(str(second / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    for key in keys:
        assert first_metrics[key] == pytest.approx(second_metrics[key], rel=1e-5), key
    curves = [logged_losses(run) for run in (first, second)]
    assert curves[0] and curves[0] == pytest.approx(curves[1], rel=1e-5)


def assert_same_adamw_training(first: dict, second: dict, learning_rate: float, name: str = "weights") -> None:
    """Two AdamW trainings of the same tensors that differ only in their kernels' rounding (an
    Inductor-compiled run against the eager one) wrote the same ``first``/``second`` tensors.
    AdamW divides each gradient by its own running RMS: an element whose gradient sits near zero
    moves by up to the learning rate either way on rounding alone, and how many such elements a
    run meets depends on the CPU's kernels (runs of the SE test here met 0-1 of its 9,216
    elements beyond 1e-5, the worst off by 3e-4; on CI's CPU one run met at least one). So the
    bulk is held to rounding (at most 1% of all elements off by more than 1e-5) and every element
    to one step's largest move (``learning_rate``); a missed step or a changed gradient moves most
    elements by far more than 1e-5 (a learning rate 1% higher: 8,045 of the 9,216)."""
    assert first.keys() == second.keys(), name
    diffs = torch.cat([(first[k].float() - second[k].float()).abs().flatten() for k in first])
    off = int((diffs > 1e-5).sum())
    assert off <= 0.01 * diffs.numel(), f"{name}: {off} of {diffs.numel()} elements differ by more than 1e-5"
    assert float(diffs.max()) <= learning_rate, f"{name}: an element differs by {float(diffs.max()):.3g} > {learning_rate}"


def assert_resumed_equals_straight(straight, resumed, expected: dict, metrics: dict, weights_name: str) -> None:
    """An adapter trained after a kill and resume equals the one trained without a break: its
    weights bit for bit, its metrics and its loss curve (``expected``/``metrics``: their metrics)."""
    a = load_file(str(straight / "adapter" / weights_name))
    b = load_file(str(resumed / "adapter" / weights_name))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    for key in ("loss_first", "loss_last", "steps", "heldout_retrieval_accuracy_before",
                "heldout_retrieval_accuracy_after"):
        assert metrics[key] == expected[key], key
    assert (resumed / "loss.tsv").read_text() == (straight / "loss.tsv").read_text()


def _cpu_compiles() -> bool:
    from modsent.io import InputError
    from modsent.training import fastpath

    try:
        fastpath.check_compilable("cpu", "compile")
    except InputError:
        return False
    return True


# the compile tests need torch.compile's CPU code generation: a C++ compiler (.ci/run installs g++)
needs_cpu_compiler = pytest.mark.skipif(not _cpu_compiles(), reason="torch.compile on the CPU needs a C++ compiler")
# modsent's Triton kernels on the CPU: conftest sets TRITON_INTERPRET=1 off a GPU where Triton is installed
needs_triton_interpreter = pytest.mark.skipif(
    not (os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton")),
    reason="Triton's interpreter not chosen (conftest chooses it off a GPU where Triton is installed)")


def inductor_draws_as_eager():
    """A decorator (or context) under which Inductor's compiled code draws random numbers (dropout)
    as eager PyTorch does, so a compiled run can be compared with an eager one. torch's own
    config patch: setting the option by monkeypatch would not be restored right."""
    import torch._inductor.config

    return torch._inductor.config.patch(fallback_random=True)


def compiled_against_eager(train) -> tuple[dict, dict]:
    """``train(compile)`` run eagerly, then compiled (Dynamo's caches cleared around each): their
    metrics, once each run is checked to have compiled a graph, or none."""
    import torch._dynamo

    runs = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        try:
            runs[name] = train(compiled)
            assert (torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1) == compiled, name
        finally:
            torch._dynamo.reset()
    return runs["eager"], runs["compiled"]


def assert_trained_alike(tmp_path, weights: str, zero_started: tuple[str, ...], *, rel: float,
                         cosine: float) -> None:
    """The eager and compiled runs under ``tmp_path`` logged the same losses (within ``rel``) and
    trained alike the tensors of ``weights`` whose names hold one of ``zero_started`` (LoRA's B,
    an adapter's up-projection: they start at zero, so their values are the training): the
    cosine of the two runs' values at least ``cosine`` and their norms within ``1 - cosine`` of
    each other (a changed gradient or a missed step moves either far; bf16's rounding keeps
    both near 1)."""
    losses = [logged_losses(tmp_path / name) for name in ("eager", "compiled")]
    assert len(losses[0]) >= 3 and losses[0] == pytest.approx(losses[1], rel=rel)
    x, y = (load_file(str(tmp_path / run / weights)) for run in ("eager", "compiled"))
    assert x.keys() == y.keys()
    trained = [k for k in x if any(part in k for part in zero_started)]
    assert trained, f"{weights}: no tensor named with {zero_started}"
    a, b = (torch.cat([t[k].float().flatten() for k in trained]) for t in (x, y))
    assert float(a.norm()) > 0 and float(torch.nn.functional.cosine_similarity(a, b, dim=0)) >= cosine
    assert float(b.norm() / a.norm()) == pytest.approx(1, abs=1 - cosine)  # and as far


def assert_stored_in_half(full_dir, half_dir, texts, *, kept_float32=()) -> None:
    """``half_dir``: the same training as ``full_dir`` saved with ``storage_dtype: float16`` (a
    method's setting): each weights file of the model holds the float32 run's tensors rounded to
    float16 (``kept_float32``: files that stay float32, equal to the float32 run's), the config
    names float16, and modsent's loader computes in float32 from them, the vectors those of the
    float32 model up to that rounding."""
    import json
    from pathlib import Path

    import numpy as np

    from modsent.encoders.systems import load_sentence_transformer

    full_dir, half_dir = Path(full_dir), Path(half_dir)
    files = sorted(p.relative_to(full_dir) for p in full_dir.rglob("*.safetensors"))
    assert files == sorted(p.relative_to(half_dir) for p in half_dir.rglob("*.safetensors"))
    assert json.loads((half_dir / "config.json").read_text())["dtype"] == "float16"
    for name in files:
        full, half = load_file(str(full_dir / name)), load_file(str(half_dir / name))
        assert sorted(full) == sorted(half)
        for key, tensor in full.items():
            if str(name) in kept_float32 or not tensor.is_floating_point():
                assert torch.equal(half[key], tensor), (name, key)
            else:
                assert half[key].dtype == torch.float16 and torch.equal(half[key], tensor.half()), (name, key)
    weights = full_dir / "model.safetensors"
    assert (half_dir / "model.safetensors").stat().st_size < 0.55 * weights.stat().st_size
    models = [load_sentence_transformer(d, device="cpu") for d in (full_dir, half_dir)]
    assert all(p.dtype == torch.float32 for p in models[1].parameters())
    a, b = (m.encode(texts, prompt="", normalize_embeddings=True) for m in models)
    assert np.min(np.sum(a * b, axis=1)) > 0.999 and not np.array_equal(a, b)


def recorded_training_data(monkeypatch) -> list:
    """Every ``TrainingData`` made while the test runs (the rows and batches every recipe's and
    baseline's steps are taken from), in order."""
    from modsent.methods import baselines as bl

    made = []

    class Recorded(bl.TrainingData):
        def __post_init__(self):
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(bl, "TrainingData", Recorded)
    return made


def counted_training_passes(monkeypatch):
    """A TrainingLog that counts the real tokens of every tokenised pass a SentenceEncoderModel
    runs in training mode while the test runs (each sub-pass of a step's length chunks): the
    model FLOPs a run should record, counted apart from its own loop."""
    from collections.abc import Mapping

    from modsent.training.loop import TrainingLog

    counted = TrainingLog(1, 0, "counted", False, 1)
    forward = sa.SentenceEncoderModel.forward

    def counting(self, texts):
        if self.training and isinstance(texts, Mapping):
            counted.count_padding(texts)
        return forward(self, texts)

    monkeypatch.setattr(sa.SentenceEncoderModel, "forward", counting)
    return counted


def assert_grouped_batches(rows, grouped, expected, random_, columns, group_column) -> None:
    """A recipe's grouped epoch: the batches ``expected`` (modsent.training.pairs'
    no_duplicate_batches with the recipe's strata), no ``group_column`` value twice in a batch,
    not its random batches ``random_``, and less padding than them in ``columns``."""
    assert grouped == expected
    assert grouped and all(rows.iloc[batch][group_column].is_unique for batch in grouped)
    assert grouped != random_
    assert padding_of(rows, grouped, columns) < padding_of(rows, random_, columns)


def padding_of(rows, batches, columns) -> float:
    """The share of padding when each batch is one pass padded to its longest text (characters)."""
    real = padded = 0
    for batch in batches:
        lengths = [len(t) for c in columns for t in rows.iloc[batch][c] if isinstance(t, str)]
        real += sum(lengths)
        padded += max(lengths) * len(lengths)
    return 1 - real / padded
