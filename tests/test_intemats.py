"""InteMATs (modsent.methods.intemats, modsent.modular.serial_adapter, modsent.encoders.intemats):
InfoNCE, the serial adapter and AdapterFusion against hand computations, a fresh adapter set is the
identity, saving and loading, the ST and DT data, training the three stages on a tiny random
XLM-R, the saved systems reloading to the same vectors (modsent's loader, plain
sentence-transformers, `modsent encode`), resumption bit for bit, the config rules."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import run_card_usage
from modsent import losses, methods
from modsent.encoders import intemats as ie
from modsent.encoders import transformer as tf
from modsent.io import InputError
from modsent.methods import intemats
from modsent.methods.intemats import training as it
from modsent.modular import serial_adapter as sad
from modsent.training import efficiency
from tiny_modules import (assert_close_model, assert_grouped_batches, assert_stored_in_half, counted_training_passes,
                          pairs_in, recorded_training_data, tiny_base_and_data)

LANGS = ["en", "de", "ky"]
# a tiny random model moves only with a large learning rate; few steps, short texts
SETTINGS = {"batch_size": 8, "gradient_accumulation": 1, "max_steps": 3, "eval_pairs": 20, "learning_rate": 5e-3,
            "warmup_steps": 1, "log_every": 1, "max_length": 48}
DT_SETTINGS = {**SETTINGS, "document_sentences": 4, "max_length": 96}
TEXTS = ["Hallo Welt", "Guten Morgen, wie geht es dir?", "Салам дүйнө", "A short English sentence."]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny random XLM-R base (sentence-transformers) and the built-in pairs in en, de, ky."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("intemats")
    base, english, units = tiny_base_and_data(root)
    paths = {}
    for lang in LANGS:
        frame = english if lang == "en" else pairs_in(lang, english, units)
        paths[lang] = root / f"pairs-{lang}.parquet"
        frame.to_parquet(paths[lang], index=False)
    return {"root": root, "base": base, "paths": paths, "inputs": {"base": base, "pairs": paths}}


@pytest.fixture(scope="module")
def trained(data):
    """The three systems trained once: {name: (output dir, metrics)}."""
    methods.load()
    root = data["root"] / "systems"
    out = {}
    for name, settings in ((intemats.ST, SETTINGS), (intemats.DT, DT_SETTINGS)):
        out[name] = (root / name, methods.get(name).train(data["inputs"], root / name, settings, device="cpu",
                                                          progress=False))
    inputs = {**data["inputs"], "st": root / intemats.ST, "dt": root / intemats.DT}
    out[intemats.FUSED] = (root / intemats.FUSED, methods.get(intemats.FUSED).train(
        inputs, root / intemats.FUSED, SETTINGS, device="cpu", progress=False))
    out["fusion_inputs"] = inputs
    return out


def backbone(data):
    body, _ = tf.load_encoder_body(data["base"])
    return body.eval()


# ---- the loss and the modules against hand computations -----------------------------------------


def test_infonce_is_its_formula_and_mnrl_with_scale_one_over_t():
    generator = torch.Generator().manual_seed(0)
    a, p = (torch.randn(5, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    t = 0.1

    def cos(u, v):
        return float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))

    a64, p64 = a.numpy(), p.numpy()
    terms = [-math.log(math.exp(cos(a64[i], p64[i]) / t) / sum(math.exp(cos(a64[i], p64[j]) / t) for j in range(5)))
             for i in range(5)]
    assert losses.InfoNCELoss(t)(a, p).item() == pytest.approx(np.mean(terms), rel=1e-6)
    assert torch.allclose(losses.InfoNCELoss(t)(a.float(), p.float()),
                          losses.MultipleNegativesRankingLoss(1 / t)(a.float(), p.float()), atol=1e-6)
    with pytest.raises(ValueError, match="one positive per anchor"):
        losses.InfoNCELoss(t)(a, p[:3])
    with pytest.raises(ValueError, match="temperature"):
        losses.InfoNCELoss(0)


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return module


def test_serial_adapter_is_the_bottleneck_plus_residual_by_hand():
    cfg = sad.SerialAdapterConfig()
    adapter = randomised(sad.SerialAdapter(32, cfg), 1).double()
    assert adapter.down.weight.shape == (2, 32) and adapter.up.weight.shape == (32, 2)  # r = 32 / 16
    z = np.random.default_rng(0).normal(size=(3, 32))
    wd, bd = adapter.down.weight.detach().numpy(), adapter.down.bias.detach().numpy()
    wu, bu = adapter.up.weight.detach().numpy(), adapter.up.bias.detach().numpy()
    expected = np.array([row + wu @ np.maximum(wd @ row + bd, 0) + bu for row in z])
    assert np.allclose(adapter(torch.from_numpy(z)).detach().numpy(), expected, atol=1e-12)
    assert np.allclose(adapter.delta(torch.from_numpy(z)).detach().numpy(), expected - z, atol=1e-12)
    fresh = sad.SerialAdapter(32, cfg)
    x = torch.randn(4, 32)
    assert torch.equal(fresh(x), x)  # W_up = 0: exactly the identity
    assert sad.SerialAdapterConfig(bottleneck_size=5).bottleneck(1024) == 5
    with pytest.raises(InputError, match="sites"):
        sad.SerialAdapterConfig(sites=("attention", "output"))


def test_fusion_is_attention_over_the_adapters_by_hand_and_its_weights_sum_to_one():
    d = 6
    fusion = sad.AdapterFusion(d).double()
    assert torch.equal(fusion.value.weight, torch.eye(d, dtype=torch.float64))  # W_v starts as the identity
    assert fusion.query.bias is None and 0 < fusion.query.weight.std() < 0.05
    randomised(fusion, 2)
    rng = np.random.default_rng(3)
    z, a1, a2 = (rng.normal(size=(2, 4, d)) for _ in range(3))
    out, weights = fusion(torch.from_numpy(z), [torch.from_numpy(a1), torch.from_numpy(a2)])
    assert weights.shape == (2, 4, 2) and torch.allclose(weights.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    wq, wk, wv = (m.weight.detach().numpy() for m in (fusion.query, fusion.key, fusion.value))
    for b in range(2):
        for t in range(4):  # one token at a time, the paper's Eq. 6-9 plus the residual
            q = z[b, t] @ wq.T
            scores = np.array([q @ (a[b, t] @ wk.T) / math.sqrt(d) for a in (a1, a2)])
            w = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            expected = z[b, t] + w[0] * (a1[b, t] @ wv.T) + w[1] * (a2[b, t] @ wv.T)
            assert np.allclose(weights[b, t].detach().numpy(), w, atol=1e-12)
            assert np.allclose(out[b, t].detach().numpy(), expected, atol=1e-12)
    # fresh adapters (zero outputs): the fusion adds nothing
    zeros = torch.zeros(2, 4, d, dtype=torch.float64)
    assert torch.equal(sad.AdapterFusion(d).double()(torch.from_numpy(z), [zeros, zeros])[0], torch.from_numpy(z))


def test_fresh_adapters_and_fusion_are_the_identity_and_sit_at_houlsby_s_sites(data):
    body = backbone(data)
    batch = {"input_ids": torch.randint(5, 300, (2, 9), generator=torch.Generator().manual_seed(0)),
             "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    reference = body(**batch, output_hidden_states=True).hidden_states
    adapters = {name: sad.new_adapter_set(body, sad.SerialAdapterConfig()) for name in ("st", "dt")}
    for stack in (sad.SerialAdapterStack({"st": adapters["st"]}),
                  sad.SerialAdapterStack(adapters, sad.new_fusion(body, adapters))):
        stack.attach(body)
        hidden = body(**batch, output_hidden_states=True).hidden_states
        assert all(torch.equal(h, r) for h, r in zip(hidden, reference))  # bit for bit
        stack.detach()
    # a trained adapter at each site: the sublayer computes LayerNorm(A(dense(h)) + x)
    single = sad.SerialAdapterStack({"st": randomised(adapters["st"], 4)}).attach(body)
    layer = body.encoder.layer[1]
    h, x = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    for site, module in (("attention", layer.attention.output), ("ffn", layer.output)):
        inner = torch.randn(2, 5, module.dense.in_features)
        adapter = adapters["st"].get(1, site)
        expected = module.LayerNorm(adapter(module.dense(inner)) + x)
        assert torch.allclose(module(inner, x), expected, atol=1e-6)
    assert h.shape == x.shape
    changed = body(**batch, output_hidden_states=True).hidden_states
    assert not torch.allclose(changed[-1], reference[-1])
    single.detach()
    assert all(torch.equal(h, r) for h, r in zip(body(**batch, output_hidden_states=True).hidden_states, reference))
    # sites and layers are settings
    ffn_only = sad.new_adapter_set(body, sad.SerialAdapterConfig(sites=["ffn"], layers=[1]))
    assert ffn_only.places() == [(1, "ffn")]
    with pytest.raises(InputError, match="layers \\[5\\] do not exist"):
        sad.new_adapter_set(body, sad.SerialAdapterConfig(layers=[5]))


def test_adapters_save_and_load_and_another_base_is_refused(data, tmp_path):
    from modsent.testing import make_tiny_xlmr, sample_texts

    body = backbone(data)
    adapters = {name: randomised(sad.new_adapter_set(body, sad.SerialAdapterConfig()), i) for i, name in
                enumerate(("st", "dt"))}
    stack = sad.SerialAdapterStack(adapters, randomised(sad.new_fusion(body, adapters), 9))
    sad.save_serial_adapters(stack, body, tmp_path / "saved", metadata={"method": "x"})
    record = json.loads((tmp_path / "saved" / sad.CONFIG_NAME).read_text())
    assert record["fusion"] == {"adapters": ["st", "dt"]} and record["adapters"]["st"]["reduction_factor"] == 16.0
    loaded, fusion = sad.load_serial_adapters(body, tmp_path / "saved")
    for name in ("st", "dt"):
        ours, theirs = adapters[name].state_dict(), loaded[name].state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert all(torch.equal(v, fusion.state_dict()[k]) for k, v in stack.fusion.state_dict().items())
    only_st, none = sad.load_serial_adapters(body, tmp_path / "saved", names=["st"], fusion=False)
    assert list(only_st) == ["st"] and none is None
    other, _ = tf.load_encoder_body(make_tiny_xlmr(tmp_path / "other", sample_texts(200), seed=1))
    with pytest.raises(InputError, match="trained on another base model"):
        sad.load_serial_adapters(other, tmp_path / "saved")
    with pytest.raises(ValueError, match="fused, not stacked"):
        sad.SerialAdapterStack(adapters)


# ---- data ----------------------------------------------------------------------------------------


def test_sentence_pairs_align_english_with_x_and_documents_keep_the_same_ids_on_both_sides(data):
    frames = it.read_frames(data["paths"], None, "methods.InteMATs-ST.datasets")
    rows, identical = it.sentence_pairs(frames, "en")
    indexed = {lang: frame.set_index("pair_id") for lang, frame in frames.items()}
    assert set(rows["lang"]) == {"de", "ky"} and identical > 0  # names spelt alike are dropped
    for row in rows.sample(50, random_state=0).itertuples(index=False):
        column = "anchor" if row.anchor == indexed["en"].at[row.group, "anchor"] else "positive"
        assert row.anchor == indexed["en"].at[row.group, column]
        assert row.positive == indexed[row.lang].at[row.group, column] != row.anchor
    batches = it.grouped_data(rows, 8, seed=0).epoch_batches(0)
    assert all(rows.iloc[batch]["group"].is_unique for batch in batches)  # no pair id twice in a batch

    _, tokenizer = tf.load_encoder_body(data["base"])
    groups = it.document_groups(frames, "en", tokenizer, k=4, max_length=40)
    assert max(len(g) for g in groups) == 4 and [i for g in groups for i in g] == list(frames["en"]["pair_id"])
    for group in groups:  # within the limit in every language, unless one sentence alone passes it
        for frame in indexed.values():
            text = " ".join(frame.loc[group, "anchor"])
            assert len(group) == 1 or len(tokenizer(text)["input_ids"]) <= 40 + 2 * len(group)
    documents = it.pseudo_documents(frames, "en", groups)
    first = documents[documents["lang"] == "de"].iloc[0]
    assert first["anchor"] == " ".join(indexed["en"].loc[groups[0], "anchor"])
    assert first["positive"] == " ".join(indexed["de"].loc[groups[0], "anchor"])
    assert len(documents) == 2 * len(groups)


def test_grouped_batches_keep_each_language_and_dataset_and_the_runs_train_on_them(data, monkeypatch):
    """``length_groups``: MATs-ST's pairs carry their pair's dataset and its run's batches are
    grouped by length within (dataset, X language), still no pair id twice and padding less
    than its random batches; the fusion's batches are the baselines' grouped ones. The metrics
    record the setting."""
    from modsent.methods import baselines as bl
    from modsent.training.pairs import no_duplicate_batches

    made = recorded_training_data(monkeypatch)
    cfg = it.InteMATsConfig.from_settings(intemats.ST, {**SETTINGS, "length_groups": 4, "max_steps": 1})
    result = it.run_training(intemats.ST, data["inputs"], cfg, device="cpu", progress=False)
    assert result.metrics["config"]["length_groups"] == 4
    (run,) = made
    rows = run.rows
    assert "dataset" in rows.columns and set(rows["lang"]) == {"de", "ky"}
    grouped = run.epoch_batches(0)
    assert_grouped_batches(rows, grouped, no_duplicate_batches(rows, 8, 0, group_column="group", length_groups=4,
                                                               strata_column=("dataset", "lang")),
                           it.grouped_data(rows, 8, 0).epoch_batches(0), ["anchor", "positive"], "group")

    frames = it.read_frames(data["paths"], None, "k")
    fusion = it.InteMATsConfig.from_settings(intemats.FUSED, {**SETTINGS, "length_groups": 4})
    assert it.fusion_data(frames, fusion).epoch_batches(0) == bl.crosslingual_data(frames, 8, 0, 4).epoch_batches(0)
    assert it.fusion_data(frames, fusion).epoch_batches(0) != bl.crosslingual_data(frames, 8, 0).epoch_batches(0)


# ---- training ------------------------------------------------------------------------------------


def test_the_three_stages_train_what_they_should_and_reload_to_the_same_vectors(data, trained):
    from sentence_transformers import SentenceTransformer

    from modsent.encoders.systems import SentenceTransformerEncoder

    st_dir, st = trained[intemats.ST]
    dt_dir, dt = trained[intemats.DT]
    fused_dir, fused = trained[intemats.FUSED]
    # ST and DT: only the adapters train (2 sites x 2 layers x (32*2 + 2 + 2*32 + 32)); before = the backbone
    assert st["trainable_parameters"] == dt["trainable_parameters"] == 4 * (32 * 2 + 2 + 2 * 32 + 32)
    assert st["steps"] == 3 and st["loss"] == "InfoNCE" and st["languages"] == sorted(LANGS)
    assert 0 < st["padding_fraction"] < 1  # every micro-batch counted
    for metrics in (st, dt, fused):  # the CPU: no peak, no memory
        assert metrics["model_flops"] > 0 and metrics["mfu"] is None and metrics["gpu_peak_memory_gib"] is None
    assert fused["trainable_parameters"] == 4 * 3 * 32 * 32 and fused["loss"] == "MNRL"
    by_system = fused["heldout_translation_retrieval_accuracy_by_system"]
    assert by_system["backbone"] == st["heldout_translation_retrieval_accuracy_before"]  # fresh = the backbone
    assert by_system["InteMATs-ST"] == st["heldout_translation_retrieval_accuracy_after"]
    assert by_system["InteMATs-DT"] == dt["heldout_translation_retrieval_accuracy_after"]
    assert fused["heldout_ids_trained_on_by_adapters"] == {"st": 0, "dt": 0}
    assert dt["train_documents"] > 10 and dt["sentences_per_document_mean"] <= 4
    assert set(dt["heldout_document_retrieval_accuracy_after"]) == {"en-de", "en-ky"}
    for weights in fused["fusion_weights"].values():
        assert set(weights) == {"st", "dt"} and sum(weights.values()) == pytest.approx(1.0, abs=2e-4)

    # the saved backbone is the base's, unchanged; ST's adapters moved; the fusion keeps ST's and DT's
    base_weights = backbone(data).state_dict()
    saved = load_file(str(st_dir / "model.safetensors"))
    assert all(torch.equal(v, base_weights[k]) for k, v in saved.items() if k in base_weights)
    st_adapters = load_file(str(st_dir / sad.WEIGHTS_NAME))
    assert any(k.endswith("up.weight") and v.abs().sum() > 0 for k, v in st_adapters.items())
    fused_adapters = load_file(str(fused_dir / sad.WEIGHTS_NAME))
    assert all(torch.equal(fused_adapters[k], v) for k, v in st_adapters.items())
    assert any(k.startswith("fusion.") for k in fused_adapters)
    assert json.loads((fused_dir / "modules.json").read_text())[0]["type"] == ie.class_path()

    # the same run in memory (a pure function of the settings) encodes as the saved directory,
    # through modsent's loader and through plain sentence-transformers (trust_remote_code)
    cfg = it.InteMATsConfig.from_settings(intemats.FUSED, {**SETTINGS})
    rerun = it.run_training(intemats.FUSED, trained["fusion_inputs"], cfg, device="cpu", progress=False)
    ours = rerun.model.encode(TEXTS)
    loaded = SentenceTransformerEncoder(fused_dir, device="cpu").encode(TEXTS)
    assert np.allclose(ours, loaded, atol=1e-5)
    plain = SentenceTransformer(str(fused_dir), device="cpu", trust_remote_code=True)
    assert np.allclose(plain.encode(TEXTS, normalize_embeddings=True, prompt=""), loaded, atol=1e-5)
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(fused_dir), device="cpu")
    # trained: not the backbone's vectors
    original = SentenceTransformerEncoder(data["base"], device="cpu").encode(TEXTS)
    assert not np.allclose(loaded, original, atol=1e-3)


def test_the_model_flops_count_the_adapters_and_the_fusion_as_the_flop_counter_sees_them(data, trained):
    """model_flops (metrics.json): the frozen backbone with its serial adapters (ST, DT) or both
    sets and the fusion, 6N per token for every weight up to the pooled layer, through the masks
    the loop counts; PyTorch's FLOP counter agrees once every weight trains (eager attention; a
    text per pass, no padding)."""
    from torch.utils.flop_counter import FlopCounterMode

    from modsent.training.loop import TrainingLog

    cfg = it.InteMATsConfig.from_settings(intemats.FUSED, SETTINGS)
    st_dir, dt_dir = trained[intemats.ST][0], trained[intemats.DT][0]
    adapters = trained[intemats.ST][1]["trainable_parameters"] + trained[intemats.DT][1]["trainable_parameters"]
    fused = it.build_fusion_model(st_dir, dt_dir, cfg, "k")
    single = it.build_adapter_model(intemats.ST, str(data["base"]), cfg, "k")
    bare = efficiency.body_shape(backbone(data))[0]
    assert efficiency.body_shape(single.encoder)[0] == bare + trained[intemats.ST][1]["trainable_parameters"]
    assert efficiency.body_shape(fused.encoder)[0] == bare + adapters + trained[intemats.FUSED][1]["trainable_parameters"]
    texts = ["Good morning", "The password was changed on Monday.", "Yes"]
    for model in (single, fused):
        model.encoder.body.set_attn_implementation("eager")
        model.requires_grad_(True)
        log = TrainingLog(len(texts), 0, "test", False, 10)
        with FlopCounterMode(display=False) as counter:
            for text in texts:
                features = model.features([text])
                model(features).sum().backward()
                log.count_padding(features)
        log.close()
        # the vector is the second-to-last hidden state: the last layer (with its adapters) is not
        # model FLOPs, though its forward runs, which the counter sees
        assert model.encoder.layers_used == 1 and efficiency.body_shape(model.encoder)[1] == 2
        shape = it.flop_shape(model.encoder, "cpu")
        ours = efficiency.encoder_flops(shape, log.tokens, log.token_squares)
        # the fusion's key and value run on both adapter sets' outputs: each layer's twice
        repeated = shape[0] - efficiency.body_shape(model.encoder, 1)[0]
        assert repeated == (0 if model.encoder.stack.fusion is None else 2 * 2 * 32 * 32)  # 2 sites
        top = efficiency.encoder_flops(efficiency.body_shape(model.encoder), log.tokens, log.token_squares) - \
            efficiency.encoder_flops(efficiency.body_shape(model.encoder, 1), log.tokens, log.token_squares) + \
            6 * repeated * log.tokens  # the last layer's, had it been used
        assert top > 0.3 * ours
        # N holds the biases and LayerNorms, which no product computes (13 of 12·d + 13 per d² at d = 32)
        assert 0.95 * (ours + top / 3) < counter.get_total_flops() <= ours + top / 3


def test_modsent_encode_reads_the_systems_from_a_results_tree_and_their_directories(trained, tmp_path):
    from modsent import cli
    from modsent.encoders.systems import SentenceTransformerEncoder

    fused_dir, _ = trained[intemats.FUSED]
    tree = tmp_path / "results" / "tiny"
    shutil.copytree(fused_dir, tree / "methods" / intemats.FUSED)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    expected = SentenceTransformerEncoder(fused_dir, device="cpu").encode(TEXTS)
    for args in (["--model", str(tree), "--variant", intemats.FUSED, "--lang", "de"],
                 ["--model", str(fused_dir)]):
        out = tmp_path / "out.npy"
        assert cli.main(["encode", *args, "--input", str(tmp_path / "in.txt"), "--output", str(out), "--quiet"]) == 0
        assert np.allclose(np.load(out), expected, atol=1e-5)


def test_a_killed_run_resumes_to_the_weights_of_an_unbroken_one(data, trained, tmp_path):
    class Killed(Exception):
        pass

    def kill(step):
        if step == 3:
            raise Killed

    # ST with gradient accumulation and dropout on; the fusion
    cases = [(intemats.ST, data["inputs"], {**SETTINGS, "max_steps": 5, "checkpoint_every": 2,
                                            "gradient_accumulation": 2}),
             (intemats.FUSED, trained["fusion_inputs"], {**SETTINGS, "max_steps": 4, "checkpoint_every": 2})]
    for name, inputs, settings in cases:
        straight = it.train_intemats(name, inputs, tmp_path / f"{name}-straight", settings, device="cpu",
                                     progress=False)
        with pytest.raises(Killed):
            it.train_intemats(name, inputs, tmp_path / f"{name}-resumed", settings, device="cpu", progress=False,
                              on_step=kill)
        assert (tmp_path / f"{name}-resumed.checkpoint").is_dir() and not (tmp_path / f"{name}-resumed").exists()
        resumed = it.train_intemats(name, inputs, tmp_path / f"{name}-resumed", settings, device="cpu", progress=False)
        assert resumed["resumed_from_step"] == 2 and straight["resumed_from_step"] == 0
        a = load_file(str(tmp_path / f"{name}-straight" / sad.WEIGHTS_NAME))
        b = load_file(str(tmp_path / f"{name}-resumed" / sad.WEIGHTS_NAME))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name  # bit for bit
        for key in ("loss_first", "loss_last", "steps", "heldout_translation_retrieval_accuracy_before",
                    "heldout_translation_retrieval_accuracy_after"):
            assert resumed[key] == straight[key], (name, key)
        assert ((tmp_path / f"{name}-resumed" / "loss.tsv").read_text()
                == (tmp_path / f"{name}-straight" / "loss.tsv").read_text())
    # a checkpoint of other settings is not resumed
    settings = {**SETTINGS, "max_steps": 5, "checkpoint_every": 2}
    with pytest.raises(Killed):
        it.train_intemats(intemats.ST, data["inputs"], tmp_path / "other", settings, device="cpu", progress=False,
                          on_step=kill)
    other = it.train_intemats(intemats.ST, data["inputs"], tmp_path / "other", {**settings, "temperature": 0.2},
                              device="cpu", progress=False)
    assert other["resumed_from_step"] == 0


def test_storage_dtype_float16_rounds_the_backbone_and_the_fusion_keeps_the_adapters(data, trained, tmp_path):
    """storage_dtype: float16 stores the (frozen) backbone rounded, the adapters float32 as
    trained; modsent's loader computes in float32 from both; the same training as the fixture's
    float32 run. The fusion built from half-stored ST and DT (the demo's) trains on ST's stored
    backbone with DT's adapters, is stored rounded too, and encodes as the float32 systems'
    fusion up to that rounding."""
    from modsent.encoders.systems import load_sentence_transformer

    for name, settings in ((intemats.ST, SETTINGS), (intemats.DT, DT_SETTINGS)):
        metrics = methods.get(name).train(data["inputs"], tmp_path / name, {**settings, "storage_dtype": "float16"},
                                          device="cpu", progress=False)
        full_dir, full = trained[name]
        assert metrics["loss_last"] == full["loss_last"]
        assert_stored_in_half(full_dir, tmp_path / name, TEXTS, kept_float32=(sad.WEIGHTS_NAME,))
    inputs = {**data["inputs"], "st": tmp_path / intemats.ST, "dt": tmp_path / intemats.DT}
    fused = methods.get(intemats.FUSED).train(inputs, tmp_path / intemats.FUSED,
                                              {**SETTINGS, "storage_dtype": "float16"}, device="cpu", progress=False)
    assert fused["loss_last"] == pytest.approx(trained[intemats.FUSED][1]["loss_last"], rel=1e-2)
    a, b = (load_sentence_transformer(d, device="cpu").encode(TEXTS, normalize_embeddings=True)
            for d in (trained[intemats.FUSED][0], tmp_path / intemats.FUSED))
    assert np.min(np.sum(a * b, axis=1)) > 0.999
    # the fusion is stored in float16 too (3 x hidden² per layer), the adapters it fuses float32
    saved, full = (load_file(str(d / sad.WEIGHTS_NAME)) for d in (tmp_path / intemats.FUSED,
                                                                   trained[intemats.FUSED][0]))
    fusion = {key for key in saved if key.startswith(sad.FUSION + ".")}
    assert fusion and sorted(saved) == sorted(full)
    assert {saved[key].dtype for key in fusion} == {torch.float16}
    assert {value.dtype for key, value in saved.items() if key not in fusion} == {torch.float32}
    # loaded into float32 parameters holding the stored values
    fusion_state = load_sentence_transformer(tmp_path / intemats.FUSED, device="cpu")[0].stack.fusion.state_dict()
    assert len(fusion_state) == len(fusion)
    for key, value in fusion_state.items():
        assert value.dtype == torch.float32 and torch.equal(value, saved[f"{sad.FUSION}.{key}"].float()), key
    # the model card's usage line loads it as the evaluation does: float32, modsent's module class
    from modsent import cards

    card = cards.system_card(system=intemats.FUSED, system_dir=tmp_path / intemats.FUSED, base_model=None)
    scope = run_card_usage(card, tmp_path / intemats.FUSED, TEXTS, normalize_embeddings=True)
    assert "trust_remote_code" not in scope["CODE"]
    assert f"load_sentence_transformer({str(tmp_path / intemats.FUSED)!r})" in scope["CODE"]
    assert {p.dtype for p in scope["model"].parameters()} == {torch.float32}
    assert np.array_equal(scope["embeddings"], b)


def test_compile_routes_the_encoder_through_dynamo_and_trains_what_eager_trains(data, trained, tmp_path,
                                                                                traced_compile):
    """methods.InteMATs*.compile: the adapter-carrying encoder is compiled in place, Dynamo's
    graphs run eagerly (the traced_compile fixture), and the written system is the eager one's
    (the fixture's): its adapters, weights and losses. InteMATs-ST here; the fusion compiles the
    same module with the fusion's hooks, at twice this test's cost (transformers records the
    hidden states with hooks, each a graph break)."""
    modules, graphs = traced_compile
    name = intemats.ST
    compiled = methods.get(name).train(data["inputs"], tmp_path / name, {**SETTINGS, "compile": True}, device="cpu",
                                       progress=False)
    assert len(modules) == 1 and isinstance(modules[0], ie.InteMATsBody) and graphs() >= 1
    eager_dir, eager = trained[name]
    assert_close_model(eager_dir, tmp_path / name, eager, compiled)
    a, b = (load_file(str(run / sad.WEIGHTS_NAME)) for run in (eager_dir, tmp_path / name))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_micro_batches_tokenised_ahead_train_what_tokenising_in_the_step_trains(data, monkeypatch):
    """Each micro-batch is tokenised on a thread during the one before (loop.ahead), across the
    steps of gradient accumulation: the same adapters and logged losses as the plain loop."""
    from modsent.training import loop

    cfg = it.InteMATsConfig.from_settings(intemats.ST, {**SETTINGS, "gradient_accumulation": 2})
    threaded = it.run_training(intemats.ST, data["inputs"], cfg, device="cpu", progress=False)
    monkeypatch.setattr(it, "ahead", lambda items, prepare: loop.ahead(items, prepare, enabled=False))
    passes = counted_training_passes(monkeypatch)
    serial = it.run_training(intemats.ST, data["inputs"], cfg, device="cpu", progress=False)
    a, b = threaded.model.state_dict(), serial.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert threaded.history == serial.history and len(threaded.history) == SETTINGS["max_steps"]
    # the model FLOPs: every micro-batch's pass, through the backbone and adapters up to the pooled layer
    shape = it.flop_shape(serial.model.encoder, "cpu")
    assert shape[1] == 1 and passes.tokens > 0
    assert serial.metrics["model_flops"] == threaded.metrics["model_flops"] == efficiency.encoder_flops(
        shape, passes.tokens, passes.token_squares)


# ---- registration and configuration --------------------------------------------------------------


def test_the_three_systems_are_registered_with_the_paper_s_defaults_and_the_fusion_needs_the_others(data):
    import yaml

    from conftest import REPO
    from modsent.config import ConfigError, check_config

    registry = methods.load()
    defaults = {key: value["default"] for key, value in registry[intemats.ST].schema()["properties"].items()}
    assert (defaults["reduction_factor"], defaults["sites"], defaults["temperature"], defaults["max_length"],
            defaults["batch_size"], defaults["gradient_accumulation"], defaults["learning_rate"],
            defaults["warmup_steps"], defaults["epochs"], defaults["pooling_layers"]) == (
        16, ["attention", "ffn"], 0.1, 384, 8, 2, 5e-5, 10000, 5, [-2])
    assert "document_sentences" in registry[intemats.DT].schema()["properties"]
    assert "model" not in registry[intemats.FUSED].schema()["properties"]
    assert registry[intemats.FUSED].requires == (intemats.ST, intemats.DT)
    assert registry[intemats.FUSED].extra_inputs("b", {}, LANGS) == {
        "st": "results/b/methods/InteMATs-ST", "dt": "results/b/methods/InteMATs-DT"}
    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    config["methods"] = {intemats.FUSED: {}, intemats.DT: {}}
    with pytest.raises(ConfigError, match="methods.InteMATs: needs methods.InteMATs-ST in the config"):
        check_config(config)
    config["methods"] = {intemats.FUSED: {"model": "x"}, intemats.ST: {}, intemats.DT: {"temperature": 0}}
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert "methods.InteMATs: unknown key(s) 'model'" in str(err.value)
    assert "methods.InteMATs-DT.temperature" in str(err.value)
    with pytest.raises(InputError, match="unknown key\\(s\\) document_sentences"):
        it.InteMATsConfig.from_settings(intemats.ST, {"document_sentences": 3})
    with pytest.raises(InputError, match="pooling_layers"):
        it.build_adapter_model(intemats.ST, str(data["base"]),
                               it.InteMATsConfig.from_settings(intemats.ST, {"pooling_layers": [7]}), "methods.X")
