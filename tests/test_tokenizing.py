"""modsent.tokenizing: padded batches read straight from the Rust tokenizer equal the tokenizer's
own call (``padding=True, truncation=True, max_length=n, return_tensors="pt"``) for the kinds of
tokenizer modsent's encoders use, and anything else goes through the call."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import transformers

from modsent import tokenizing
from modsent.testing import make_random_nllb, make_tiny_bert, make_tiny_xlmr, sample_texts

TEXTS = sample_texts(300)
ODD = ["", " ", "x", "ünïcödé — ☃ and 中文 text", "[CLS] a text with [SEP] and <mask> in it",
       " ".join(TEXTS[:6]),  # longer than every max_length below: truncated
       "tab\tand\nnewline"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    from test_mst5 import make_tiny_mt5

    bert = make_tiny_bert(root / "bert", TEXTS, vocab_size=500)
    left = transformers.AutoTokenizer.from_pretrained(bert)
    left.padding_side = left.truncation_side = "left"
    return {
        "bert": transformers.AutoTokenizer.from_pretrained(bert), "bert-left": left,
        "xlmr": transformers.AutoTokenizer.from_pretrained(make_tiny_xlmr(root / "xlmr", TEXTS, vocab_size=500)),
        "mt5": transformers.AutoTokenizer.from_pretrained(make_tiny_mt5(root / "mt5", TEXTS, vocab_size=300)),
        "nllb": transformers.AutoTokenizer.from_pretrained(make_random_nllb(root / "nllb", TEXTS, vocab_size=300)),
    }


@pytest.mark.parametrize("kind", ["bert", "bert-left", "xlmr", "mt5", "nllb"])
def test_padded_batches_equal_the_tokenizers_call(tokenizers, kind):
    tokenizer = tokenizers[kind]
    for max_length in (8, 32, 512):
        for batch in (TEXTS[:64], ODD, TEXTS[100:101], ODD[:1]):
            lean = tokenizing.padded_batch(tokenizer, batch, max_length)
            assert lean is not None  # all are plain fast tokenizers
            reference = tokenizer(batch, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            assert list(lean) == [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in reference]
            for key, value in lean.items():
                assert value.dtype == torch.int64 and torch.equal(value, reference[key]), (kind, max_length, key)
            assert lean["input_ids"].shape[1] <= max_length
    # the lean path leaves the Rust tokenizer's settings as the call leaves them
    tokenizing.padded_batch(tokenizer, ODD, 16)
    after_lean = (tokenizer._tokenizer.truncation, tokenizer._tokenizer.padding)
    tokenizer(ODD, padding=True, truncation=True, max_length=16, return_tensors="pt")
    assert after_lean == (tokenizer._tokenizer.truncation, tokenizer._tokenizer.padding)
    assert after_lean[0]["max_length"] == 16


def test_a_tokenizer_with_a_path_of_its_own_goes_through_its_call(tokenizers):
    bert = tokenizers["bert"]

    class Custom(type(bert)):
        def _encode_plus(self, *args, **kwargs):
            return super()._encode_plus(*args, **kwargs)

    custom = Custom.from_pretrained(bert.name_or_path)
    assert tokenizing.padded_batch(custom, ["a text"], 16) is None
    batcher = tokenizing.BatchTokenizer(custom, 16)
    reference = bert(TEXTS[:4], padding=True, truncation=True, max_length=16, return_tensors="pt")
    assert torch.equal(batcher(TEXTS[:4])["input_ids"], reference["input_ids"])
    assert batcher.lean is False


def test_the_batcher_checks_its_first_batch_and_keeps_the_call_if_they_differ(tokenizers, monkeypatch, caplog):
    bert = tokenizers["bert"]
    batcher = tokenizing.BatchTokenizer(bert, 32)
    first = batcher(TEXTS[:8])
    assert batcher.lean is True
    assert torch.equal(first["input_ids"], batcher.call(TEXTS[:8])["input_ids"])

    real = tokenizing.padded_batch

    def off_by_one(tokenizer, texts, max_length):
        batch = real(tokenizer, texts, max_length)
        batch["input_ids"] = batch["input_ids"] + 1
        return batch

    assert tokenizing.BatchTokenizer(bert, 32).lean is True  # decided once for this tokenizer
    monkeypatch.setattr(tokenizing, "padded_batch", off_by_one)
    other = transformers.AutoTokenizer.from_pretrained(bert.name_or_path)  # not decided yet
    broken = tokenizing.BatchTokenizer(other, 32)
    with caplog.at_level(logging.WARNING, logger="modsent.tokenizing"):
        out = broken(TEXTS[:8])
    assert broken.lean is False and "differs from the tokenizer's call" in caplog.text
    assert torch.equal(out["input_ids"], first["input_ids"])
    assert torch.equal(broken(TEXTS[8:12])["input_ids"], batcher.call(TEXTS[8:12])["input_ids"])


# ---- the padding mask decided on the host ------------------------------------------------------


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("encoders")
    from test_mst5 import make_tiny_mt5

    out = {}
    for kind, make in (("bert", make_tiny_bert), ("xlmr", make_tiny_xlmr)):
        directory = make(root / kind, TEXTS, vocab_size=500)
        model = transformers.AutoModel.from_pretrained(directory, attn_implementation="sdpa").eval()
        out[kind] = (model, transformers.AutoTokenizer.from_pretrained(directory))
    directory = make_tiny_mt5(root / "mt5", TEXTS, vocab_size=300)  # m-ST5's body: the encoder alone
    model = transformers.MT5EncoderModel.from_pretrained(directory, attn_implementation="sdpa").eval()
    out["mt5"] = (model, transformers.AutoTokenizer.from_pretrained(directory))
    return out


@pytest.mark.parametrize("kind", ["bert", "xlmr", "mt5"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_the_mask_decided_on_the_host_gives_transformers_outputs_without_asking_the_device(
        encoders, kind, side, monkeypatch):
    from transformers import masking_utils

    model, tokenizer = encoders[kind]
    tokenizer.padding_side = side
    asked = []  # the padding masks transformers inspects (on a GPU: a wait for the device)
    original = masking_utils._ignore_bidirectional_mask_sdpa

    def spy(padding_mask, *args, **kwargs):
        asked.append(padding_mask)
        return original(padding_mask, *args, **kwargs)

    monkeypatch.setattr(masking_utils, "_ignore_bidirectional_mask_sdpa", spy)
    try:
        padded = tokenizer(TEXTS[:12] + ["a"], padding=True, truncation=True, max_length=40, return_tensors="pt")
        equal = tokenizer([TEXTS[0], TEXTS[0]], padding=True, return_tensors="pt")
        assert not padded["attention_mask"].all() and equal["attention_mask"].all()
        for batch in (padded, equal):
            host = batch["attention_mask"]
            with torch.no_grad():
                expected = model(**batch).last_hidden_state
                asked.clear()
                mask = tokenizing.encoder_attention_mask(model.config, host, host.clone())
                got = model(**{**batch, "attention_mask": mask}).last_hidden_state
            assert all(m is None for m in asked)  # nothing of the batch's mask was inspected
            if host.all():
                assert mask is None
            else:
                assert mask.shape == (len(host), 1, 1, host.shape[1]) and mask.dtype == torch.bool
            real = host.bool()
            torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-6)
    finally:
        tokenizer.padding_side = "right"


def test_other_models_and_attention_keep_the_mask_for_transformers(encoders):
    model, _ = encoders["bert"]
    host = torch.tensor([[1, 1, 0], [1, 1, 1]])
    device_mask = host.clone()
    eager = model.config.__class__.from_dict({**model.config.to_dict(), "model_type": "bert"})
    eager._attn_implementation = "eager"
    decoder = transformers.T5Config(d_model=8, num_layers=1, num_heads=1, d_kv=8, d_ff=8, is_decoder=True)
    decoder._attn_implementation = "sdpa"
    gpt2 = transformers.GPT2Config(n_layer=1, n_head=1, n_embd=8)
    gpt2._attn_implementation = "sdpa"
    for config in (eager, decoder, gpt2, None):
        assert tokenizing.encoder_attention_mask(config, host, device_mask) is device_mask
    meta = host.to("meta")
    assert tokenizing.encoder_attention_mask(model.config, meta, device_mask) is device_mask


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/gpu.sh runs it)")
@pytest.mark.parametrize("precision", ["auto", "fp16"])
def test_an_se_step_on_a_gpu_never_waits_for_it(tmp_path, precision):
    """The SE stage's step as its loop runs it (MNRL, clipping, fused AdamW, the loss recorded as a
    tensor), on batches pinned beforehand: CUDA's sync check set to fail. ``fp16``: the loss
    scaler hands its overflow flag to the fused optimizer's kernel instead of reading it."""
    import pandas as pd

    from modsent.losses import MultipleNegativesRankingLoss
    from modsent.modular import sentence_adapter as sa
    from modsent.training import fastpath
    from modsent.training.loop import TrainingLog, optimizer_step
    from modsent.training.optim import adamw
    from modsent.training.precision import autocast, grad_scaler

    base = make_tiny_bert(tmp_path / "base", TEXTS, vocab_size=500)
    model = sa.build_model(base, None, sa.SentenceAdapterConfig()).to("cuda")
    fastpath.speed_up(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer, scaler = adamw(trainable, 1e-4, 0.01), grad_scaler("cuda", precision)
    loss_fn = MultipleNegativesRankingLoss(20.0)
    log = TrainingLog(10, 0, "SE test", progress=False, log_every=10)  # steps 1-2 are not logged: no read
    batches = [pd.DataFrame({"anchor": TEXTS[k:k + 16], "positive": TEXTS[k + 100:k + 116], "negative": [None] * 16})
               for k in (0, 16, 32)]
    prepared = [model.features(sa.batch_texts(rows)) for rows in batches]  # pinned outside the check
    assert not prepared[1]["attention_mask"].all()
    try:
        for step, (rows, features) in enumerate(zip(batches, prepared)):
            if step == 1:  # the first step may wait once: lazy initialisations
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            with autocast("cuda", precision):  # auto: bf16 where the GPU has it, else fp16 with the scaler
                loss = sa.batch_loss(model, loss_fn, rows, features)
            scaler.scale(loss).backward()
            optimizer_step(optimizer, trainable, 1.0, scaler)
            log.record(step, loss, 1e-4, len(rows))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(math.isfinite(value) for value in log.close()[0])


def test_recording_added_tokens_lists_what_tokenizer_json_holds_once_and_leaves_other_directories(tmp_path):
    """io.record_added_tokens: the config of a saved fast tokenizer gains tokenizer.json's added
    tokens (found in subfolders by record_added_tokens_under), once; a directory whose loader
    reads a special_tokens_map.json, or whose files are not what a save writes, is left as it is."""
    import json

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    from modsent.io import record_added_tokens, record_added_tokens_under

    def write(directory, extra=None):
        directory.mkdir(parents=True)
        tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.add_special_tokens([AddedToken("[PAD]", special=True), AddedToken("[MASK]", special=True, lstrip=True)])
        tok.add_tokens([AddedToken("new-word", normalized=True)])
        tok.save(str(directory / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
                  "mask_token": "[MASK]"}
        (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        for name, text in (extra or {}).items():
            (directory / name).write_text(text, encoding="utf-8")
        return config

    plain = write(tmp_path / "model" / "0_Transformer")
    mapped = write(tmp_path / "model" / "mapped", {"special_tokens_map.json": "{}"})
    broken = tmp_path / "model" / "broken"
    write(broken)
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")

    assert record_added_tokens_under(tmp_path / "model") == 1
    config = json.loads((tmp_path / "model/0_Transformer/tokenizer_config.json").read_text(encoding="utf-8"))
    assert {key: config[key] for key in plain} == plain
    assert config["added_tokens_decoder"] == {
        "3": {"content": "[PAD]", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True},
        "4": {"content": "[MASK]", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False,
              "special": True},
        "5": {"content": "new-word", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
              "special": False},
    }
    assert json.loads((tmp_path / "model/mapped/tokenizer_config.json").read_text(encoding="utf-8")) == mapped
    assert "added_tokens_decoder" not in json.loads((broken / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert not record_added_tokens(tmp_path / "model" / "0_Transformer")  # listed already: nothing to write
    assert not record_added_tokens(tmp_path / "nowhere")
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "model" / "0_Transformer"))
    assert loaded("hello new-word [MASK]")["input_ids"] == [1, 5, 4]
    assert loaded.added_tokens_decoder[4].lstrip and loaded.added_tokens_decoder[5].normalized
