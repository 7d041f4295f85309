import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from modsent.modular import alignment as al
from modsent.modular import parallel_adapter as pa
from modsent.modular import sentence_adapter as sa
from modsent.io import InputError
from modsent.encoders.modular import ModularEncoder, RoutedLoRALinear, fold_parallel_adapters, load_exported
from modsent.sources.builtin import builtin_corpus
from modsent.testing import make_tiny_xlmr, sample_texts
from modsent.training.seeding import private_cpu_stream
from tiny_modules import language_modules, pairs_in, tiny_base_and_data

SE_CFG = sa.SentenceAdapterConfig(batch_size=16, seq_len=32, learning_rate=5e-3, max_steps=8,
                                  lora_dropout=0.0, eval_pairs=20, log_every=4, seed=0)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny base; de (LA + SE + a CLA adapter), ky (LA + SE), zh (SE only, base tokenizer)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread on shared cores is 100x slower
    root = tmp_path_factory.mktemp("modular")
    base, english, units = tiny_base_and_data(root)
    out = {"base": base, "root": root}
    for lang in ("de", "ky", "zh"):
        out[lang] = language_modules(root, base, lang, pairs_in(lang, english, units), SE_CFG,
                                    with_la=lang != "zh")
    # a CLA adapter for de with non-zero weights (training it is alignment's test; here: any values)
    model = al.build_alignment_model(base, *out["de"], al.AlignmentConfig(seq_len=32), device="cpu")
    with torch.no_grad(), private_cpu_stream(1):
        for adapter in pa.parallel_adapters(model.encoder).values():
            adapter.up.weight.normal_(0, 0.3)
            adapter.up.bias.normal_(0, 0.1)
    out["de_cla"] = pa.save_parallel_adapters(model.encoder, root / "cla-de" / "adapter")
    yield out
    torch.set_num_threads(threads)


GERMAN = builtin_corpus("de")[100:106]
KYRGYZ = builtin_corpus("ky")[100:106]
CHINESE = builtin_corpus("zh")[100:106]


@pytest.fixture(scope="module")
def modular(inputs):
    encoder = ModularEncoder(inputs["base"], device="cpu")
    encoder.add_language("de", language_adapter=inputs["de"][0], sentence_adapter=inputs["de"][1],
                         alignment=inputs["root"] / "cla-de")
    encoder.add_language("ky", language_adapter=inputs["ky"][0], sentence_adapter=inputs["ky"][1])
    encoder.add_language("zh", sentence_adapter=inputs["zh"][1])
    return encoder


def _references(inputs):
    return {
        "de": al.load_aligned_encoder(inputs["base"], *inputs["de"], inputs["root"] / "cla-de", device="cpu"),
        "ky": sa.load_sentence_encoder(inputs["base"], *inputs["ky"], device="cpu"),
        "zh": sa.load_sentence_encoder(inputs["base"], None, inputs["zh"][1], device="cpu"),
    }


TEXTS = {"de": GERMAN, "ky": KYRGYZ, "zh": CHINESE}


def test_encode_equals_each_language_s_reference_encoder(inputs, modular):
    assert modular.languages == ["de", "ky", "zh"]
    references = _references(inputs)
    # interleaved calls: switching languages back and forth must not leave anything behind
    for lang in ("de", "ky", "zh", "de", "zh", "ky"):
        mine = modular.encode(TEXTS[lang], lang=lang, batch_size=4)
        expected = references[lang].encode(TEXTS[lang], batch_size=4)
        assert mine.shape == expected.shape
        assert np.abs(mine - expected).max() < 1e-4, lang
        raw = modular.encode(TEXTS[lang], lang=lang, normalize=False)
        assert np.abs(raw - references[lang].encode(TEXTS[lang], normalize=False)).max() < 1e-4
    # the CLA adapter matters: without it de's encoder differs
    plain = sa.load_sentence_encoder(inputs["base"], *inputs["de"], device="cpu").encode(GERMAN)
    assert np.abs(plain - modular.encode(GERMAN, lang="de")).max() > 1e-3


def test_one_body_is_shared(inputs, modular):
    query = modular.body.encoder.layer[0].attention.self.query
    assert isinstance(query, RoutedLoRALinear)
    pointer = query.base.weight.data_ptr()
    body_numel = sum(p.numel() for p in modular.body.parameters()
                     if p is not modular.body.embeddings.word_embeddings.weight)
    for lang in modular.languages:
        modular.encode(TEXTS[lang][:2], lang=lang)
        assert modular.body.encoder.layer[0].attention.self.query.base.weight.data_ptr() == pointer
        # per language: embeddings, LoRA and parallel adapters only, far less than a body
        state = modular._languages[lang].tensors()
        own = sum(t.numel() for t in state if t is not modular.base_embeddings.weight)
        assert own < body_numel
    assert not any(p.requires_grad for p in modular.body.parameters())


def test_keys_on_one_language_adapter_share_it(inputs):
    """Systems registered on one LA (Mod_m and Mod_mc-* of a language) read its tokenizer,
    embeddings and LoRA once; each key still computes its own modules: the LA with its SE and
    CLA, the LA with its SE alone, the LA alone."""
    la_dir, se_dir = inputs["de"]
    encoder = ModularEncoder(inputs["base"], device="cpu")
    encoder.add_language("cla", language_adapter=la_dir, sentence_adapter=se_dir,
                         alignment=inputs["root"] / "cla-de")
    encoder.add_language("se", language_adapter=la_dir, sentence_adapter=se_dir)
    encoder.add_language("la", language_adapter=str(la_dir))  # another spelling of the same directory
    parts = [encoder._languages[key] for key in ("cla", "se", "la")]
    assert len(encoder._language_adapters) == 1
    assert all(p.tokenizer is parts[0].tokenizer and p.embeddings is parts[0].embeddings for p in parts)
    # the LA's LoRA terms are the same tensors; the SE's come after them and stay in their keys
    name = next(iter(parts[2].lora))
    assert len(parts[0].lora[name]) == len(parts[1].lora[name]) == 2 and len(parts[2].lora[name]) == 1
    assert parts[0].lora[name][0][0] is parts[2].lora[name][0][0]
    expected = {
        "cla": al.load_aligned_encoder(inputs["base"], la_dir, se_dir, inputs["root"] / "cla-de", device="cpu"),
        "se": sa.load_sentence_encoder(inputs["base"], la_dir, se_dir, device="cpu"),
        "la": sa.load_sentence_encoder(inputs["base"], la_dir, None, device="cpu"),
    }
    vectors = {}
    for key in ("cla", "se", "la", "cla"):
        vectors[key] = encoder.encode(GERMAN, lang=key, batch_size=4)
        assert np.abs(vectors[key] - expected[key].encode(GERMAN, batch_size=4)).max() < 1e-4, key
    assert min(np.abs(vectors[a] - vectors[b]).max() for a, b in [("cla", "se"), ("se", "la")]) > 1e-3
    # the embeddings hold the LA's saved rows as they are
    saved = load_file(str(la_dir / "embeddings.safetensors"))["input_embeddings"]
    assert torch.equal(parts[0].embeddings.weight, saved.float()) and not parts[0].embeddings.weight.requires_grad


def test_a_language_adapter_changed_in_place_is_read_again(inputs, tmp_path):
    """A key added after its LA directory was rewritten (retrained in place) gets the new files,
    not the parts read before; keys added earlier keep what they were given."""
    import shutil

    from safetensors.torch import save_file

    la_dir = tmp_path / "la"
    shutil.copytree(inputs["de"][0], la_dir)
    encoder = ModularEncoder(inputs["base"], device="cpu")
    encoder.add_language("old", language_adapter=la_dir)
    before = encoder.encode(GERMAN, lang="old")
    path = la_dir / "embeddings.safetensors"
    saved = load_file(str(path))
    save_file({"input_embeddings": saved["input_embeddings"] * 2.0}, str(path))
    encoder.add_language("new", language_adapter=la_dir)
    assert len(encoder._language_adapters) == 2
    assert torch.equal(encoder._languages["new"].embeddings.weight, saved["input_embeddings"].float() * 2.0)
    assert np.abs(encoder.encode(GERMAN, lang="new") - before).max() > 1e-3
    assert np.array_equal(encoder.encode(GERMAN, lang="old"), before)


def long_lines(lang, start, stop):
    """Built-in lines long enough to identify (single words and names cannot be; the first two
    long Kyrgyz lines use only letters Russian has, and read as Russian)."""
    return [s for s in builtin_corpus(lang) if len(s) >= (15 if lang == "zh" else 45)][start:stop]


def test_language_detection_routes_by_script(inputs, modular):
    ky, de, zh = long_lines("ky", 2, 4), long_lines("de", 0, 2), long_lines("zh", 0, 2)
    mixed = [ky[0], de[0], zh[0], de[1], ky[1], zh[1]]
    assert modular.detect(mixed) == ["ky", "de", "zh", "de", "ky", "zh"]
    auto = modular.encode(mixed)
    expected = np.stack([modular.encode([text], lang=lang)[0]
                         for text, lang in zip(mixed, ["ky", "de", "zh", "de", "ky", "zh"])])
    assert np.abs(auto - expected).max() < 1e-5


def test_unknown_language_lists_the_available_ones(modular):
    with pytest.raises(InputError, match="'fr'.*available: de, ky, zh"):
        modular.encode(["Bonjour"], lang="fr")


def test_adapters_of_another_base_are_refused(inputs, tmp_path):
    other = make_tiny_xlmr(tmp_path / "other", sample_texts(600), hidden=48, seed=1)
    encoder = ModularEncoder(other, device="cpu")
    with pytest.raises(InputError, match="another base model"):
        encoder.add_language("de", language_adapter=inputs["de"][0])
    with pytest.raises(InputError, match="another base model"):
        encoder.add_language("zh", sentence_adapter=inputs["zh"][1])
    same_shape = make_tiny_xlmr(tmp_path / "same-shape", sample_texts(600), seed=3)
    encoder = ModularEncoder(same_shape, device="cpu")
    with pytest.raises(InputError, match="another base model"):
        encoder.add_language("de", alignment=inputs["root"] / "cla-de")
    # a LoRA adapter that fits by shape but records another base is refused too
    import shutil
    for kind, (directory, kwarg) in {"la": (inputs["de"][0], "language_adapter"),
                                     "se": (inputs["zh"][1] / "adapter", "sentence_adapter")}.items():
        copy = tmp_path / f"copy-{kind}"
        shutil.copytree(directory, copy)
        config_path = copy / "adapter" / "adapter_config.json" if kind == "la" else copy / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = str(same_shape)
        config_path.write_text(json.dumps(config))
        with pytest.raises(InputError, match="another base model"):
            ModularEncoder(inputs["base"], device="cpu").add_language("x", **{kwarg: copy})
    assert encoder.languages == []


@pytest.mark.parametrize("lang", ["ky", "zh"])
def test_export_reloads_with_sentence_transformers(inputs, modular, tmp_path, lang):
    from sentence_transformers import SentenceTransformer

    out = modular.export(lang, tmp_path / f"export-{lang}")
    assert not list(out.rglob("*.bin")) and not list(out.rglob("*.pt")) and list(out.rglob("*.safetensors"))
    assert json.loads((out / "export_info.json").read_text())["parallel_adapter"] is None
    assert all(m["type"].startswith("sentence_transformers.") for m in json.loads((out / "modules.json").read_text()))
    loaded = SentenceTransformer(str(out), device="cpu")
    mine = modular.encode(TEXTS[lang], lang=lang)
    theirs = loaded.encode(TEXTS[lang], normalize_embeddings=True)
    assert (np.sum(mine * theirs, axis=1) >= 0.9999).all()
    assert np.abs(modular.encode(TEXTS[lang], lang=lang) - mine).max() == 0  # exporting changed nothing
    # AutoModel builds a pooler (never used for sentence pooling): the export carries the base's,
    # so loading reports no weights missing
    from transformers import AutoModel

    _, info = AutoModel.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and any("pooler" in k for k in load_file(str(out / "model.safetensors")))


def test_export_with_alignment_adapter(inputs, modular, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer

    from modsent.encoders.modular import folded_adapter
    from modsent.encoders.systems import SentenceTransformerEncoder
    from modsent.training import precision

    out = modular.export("de", tmp_path / "export-de")
    assert not list(out.rglob("*.bin")) and not list(out.rglob("parallel_adapter*"))
    modules = json.loads((out / "modules.json").read_text())
    assert all(m["type"].startswith("sentence_transformers.") for m in modules)  # no custom code
    info = json.loads((out / "export_info.json").read_text())["parallel_adapter"]
    ffn, width = info["intermediate_size"]
    config = json.loads((out / modules[0].get("path", "") / "config.json").read_text())
    assert config["intermediate_size"] == width > ffn
    mine = modular.encode(GERMAN, lang="de")
    for loaded in (SentenceTransformer(str(out), device="cpu"), load_exported(out)):
        theirs = loaded.encode(GERMAN, normalize_embeddings=True)
        assert (np.sum(mine * theirs, axis=1) >= 0.9999).all()
    # without the adapter the export would be another model
    plain = sa.load_sentence_encoder(inputs["base"], *inputs["de"], device="cpu").encode(GERMAN)
    assert np.abs(plain - mine).max() > 1e-3
    # its folded ReLU, GELU(1000·x)/1000, can exceed fp16's range: where auto would encode in fp16
    # (a GPU without bf16 units), modsent's encoder takes fp32 for it, not for other directories
    assert folded_adapter(out) and not folded_adapter(inputs["base"])
    monkeypatch.setattr(precision, "resolve", lambda device, name="auto": "fp32" if name == "fp32" else "fp16")
    assert SentenceTransformerEncoder(out, device="cpu").precision == "fp32"
    assert SentenceTransformerEncoder(inputs["base"], device="cpu").precision == "auto"


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_fold_parallel_adapters_matches_the_hooked_adapter(act):
    """Folding the adapter into the FFN computes the hooked adapter's function: exactly for a
    ReLU FFN, within the GELU(c·x)/c ≈ ReLU(x) bound for GELU; layers without one are unchanged."""
    import copy

    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=24, hidden_act=act, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    body = BertModel(config).eval()
    pa.add_parallel_adapters(body, pa.ParallelAdapterConfig(bottleneck_size=4, layers=(0, 2)))
    adapters = pa.parallel_adapters(body)
    with torch.no_grad():
        for adapter in adapters.values():
            adapter.up.weight.normal_(0, 0.5)
            adapter.up.bias.normal_(0, 0.1)
            adapter.down.bias.normal_(0, 0.1)
    ids = torch.randint(0, 50, (3, 7))
    hooked = body(input_ids=ids).last_hidden_state
    folded = copy.deepcopy(body)
    kept = {i: copy.deepcopy(a) for i, a in pa.parallel_adapters(folded).items()}
    pa.remove_parallel_adapters(folded)
    unadapted = folded(input_ids=ids).last_hidden_state
    assert fold_parallel_adapters(folded, kept) == 28
    assert folded.config.intermediate_size == 28
    out = folded(input_ids=ids).last_hidden_state
    error = (out - hooked).abs().max().item()
    assert error < (1e-5 if act == "relu" else 1e-3), error
    assert (unadapted - hooked).abs().max().item() > 50 * max(error, 1e-6)  # the adapter mattered


def test_base_word_embeddings_are_held_only_for_languages_without_an_la(inputs):
    """The base's vocabulary matrix (most of a multilingual body) is not kept while every
    language brings its own embeddings; a language without an LA reads it back, exactly."""
    from safetensors.torch import load_file

    encoder = ModularEncoder(inputs["base"], device="cpu")
    encoder.add_language("de", language_adapter=inputs["de"][0], sentence_adapter=inputs["de"][1])
    assert encoder._base_embeddings is None
    assert encoder.body.embeddings.word_embeddings.num_embeddings == 1
    encoder.encode(GERMAN[:2], lang="de")
    encoder.add_language("zh", sentence_adapter=inputs["zh"][1])
    stored = load_file(str(inputs["base"] / "model.safetensors"))
    key = next(k for k in stored if k.endswith("embeddings.word_embeddings.weight"))
    assert torch.equal(encoder.base_embeddings.weight, stored[key].float())
    reference = sa.load_sentence_encoder(inputs["base"], None, inputs["zh"][1], device="cpu").encode(CHINESE)
    assert (np.sum(encoder.encode(CHINESE, lang="zh") * reference, axis=1) >= 0.9999).all()


RUSSIAN = long_lines("ru", 0, 4)


def test_a_language_without_modules_is_never_routed_silently(modular):
    """Russian text, which the identifier knows but this encoder has no modules for, is an error
    naming it; an explicit fallback encodes it with that language's modules and says so."""
    assert modular.detect(RUSSIAN) == ["ru"] * 4
    with pytest.raises(InputError, match=r"without modules: ru \(\d\).*modules: de, ky, zh.*fallback"):
        modular.encode(RUSSIAN + long_lines("de", 0, 1))
    used, detected = modular.route(RUSSIAN + long_lines("de", 0, 1), fallback="ky")
    assert used == [lang if lang in ("de", "ky", "zh") else "ky" for lang in detected] and used[-1] == "de"
    vectors = modular.encode(RUSSIAN + long_lines("de", 0, 1), fallback="ky")
    expected = modular.encode_by_language(RUSSIAN + long_lines("de", 0, 1), used)
    assert np.abs(vectors - expected).max() < 1e-6
    with pytest.raises(InputError, match="fallback language 'fr' has no modules"):
        modular.route(RUSSIAN, fallback="fr")


def test_no_sentences_give_an_empty_matrix_of_the_embedding_width(modular):
    dim = modular.encode(GERMAN[:1], lang="de").shape[1]
    assert modular.embedding_dimension == dim
    assert modular.encode([]).shape == (0, dim) and modular.encode([], lang="de").shape == (0, dim)


def test_export_encodes_as_evaluated_when_the_base_has_a_default_prompt(inputs, tmp_path):
    """A base with E5's default prompt ("query: "): the modules were trained and are evaluated
    without it, and so does plain SentenceTransformer(export).encode(texts), with no argument.
    export_info.json records the Hub id of the base, not a local path; `modsent encode` on the
    export gives the same vectors and refuses another language."""
    import shutil

    from sentence_transformers import SentenceTransformer

    from modsent.encoders.base_models import BASE_INFO, E5_PROMPTS, set_prompts
    from modsent.cli import main
    from modsent.encoders.modular import export_info

    base = tmp_path / "base-with-prompt"
    shutil.copytree(inputs["base"], base)
    set_prompts(base, E5_PROMPTS, "query")
    (base / BASE_INFO).write_text(json.dumps({"source": "builtin:multilingual-e5-small"}))
    assert SentenceTransformer(str(base), device="cpu").default_prompt_name == "query"
    encoder = ModularEncoder(base, device="cpu")
    encoder.add_language("ky", language_adapter=inputs["ky"][0], sentence_adapter=inputs["ky"][1])
    out = encoder.export("ky", tmp_path / "export")
    mine = encoder.encode(KYRGYZ, lang="ky")

    def cosine(a, b):
        return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    exported = SentenceTransformer(str(out), device="cpu")
    assert (cosine(mine, exported.encode(KYRGYZ)) >= 0.9999).all()
    assert cosine(mine, exported.encode(KYRGYZ, prompt="query: ")).min() < 0.999  # a prompt would matter
    info = export_info(out)
    assert info["language"] == "ky" and info["base_model"] == "intfloat/multilingual-e5-small"
    assert str(tmp_path) not in json.dumps(info["base_model"])
    texts = tmp_path / "ky.txt"
    texts.write_text("\n".join(KYRGYZ) + "\n", encoding="utf-8")
    assert main(["encode", "--model", str(out), "--input", str(texts), "--output", str(tmp_path / "e.npy"),
                 "--quiet"]) == 0
    assert (cosine(mine, np.load(tmp_path / "e.npy")) >= 0.9999).all()
    assert main(["encode", "--model", str(out), "--input", str(texts), "--output", str(tmp_path / "cpu.npy"),
                 "--device", "cpu", "--quiet"]) == 0
    assert np.array_equal(np.load(tmp_path / "cpu.npy"), np.load(tmp_path / "e.npy"))
    for device in ("cuda:7", "tpu", "nonsense"):  # refused before anything loads
        assert main(["encode", "--model", str(out), "--input", str(texts), "--output", str(tmp_path / "x.npy"),
                     "--device", device, "--quiet"]) == 2
    assert not (tmp_path / "x.npy").exists()
    assert main(["encode", "--model", str(out), "--lang", "de", "--input", str(texts), "--quiet",
                 "--output", str(tmp_path / "de.npy")]) == 2
    assert not (tmp_path / "de.npy").exists()
    texts.write_text("", encoding="utf-8")
    assert main(["encode", "--model", str(out), "--input", str(texts), "--output", str(tmp_path / "none.npy"),
                 "--quiet"]) == 0
    assert np.load(tmp_path / "none.npy").shape == (0, mine.shape[1])


def terms_added_encoder(inputs) -> ModularEncoder:
    """A default ModularEncoder with Kyrgyz's LA and SE that never merges: every layer adds the
    LoRA terms to its output at every call (the reference the merged forms are held to)."""
    encoder = ModularEncoder(inputs["base"], device="cpu")
    encoder.add_language("ky", language_adapter=inputs["ky"][0], sentence_adapter=inputs["ky"][1])
    for module in encoder._routed.values():
        module.merges_per_call = lambda x: False
    return encoder


def test_merged_lora_encodes_as_unmerged_and_as_the_export(inputs, modular, tmp_path):
    """``merge_lora`` (the evaluation's mode): each layer's active LoRA terms are merged into its
    weight once per activation, so the forward pass is the export's; the vectors equal those of
    the terms added unmerged (and the default encoder's) to float rounding and the export's more
    closely, and switching languages re-merges (no language's weights leak into another's)."""
    from sentence_transformers import SentenceTransformer

    merged = ModularEncoder(inputs["base"], device="cpu", merge_lora=True)
    merged.add_language("ky", language_adapter=inputs["ky"][0], sentence_adapter=inputs["ky"][1])
    merged.add_language("zh", sentence_adapter=inputs["zh"][1])
    terms = terms_added_encoder(inputs)
    terms.add_language("zh", sentence_adapter=inputs["zh"][1])
    for lang in ("ky", "zh", "ky"):
        mine = merged.encode(TEXTS[lang], lang=lang, normalize=False)
        added = terms.encode(TEXTS[lang], lang=lang, normalize=False)
        assert np.abs(mine - added).max() < 1e-4 and np.abs(mine - added).max() > 0, lang
        assert np.abs(mine - modular.encode(TEXTS[lang], lang=lang, normalize=False)).max() < 1e-4, lang
    query = merged.body.encoder.layer[0].attention.self.query
    assert query.merge and query._merged is not None  # the active language's merged weight is held
    expected = query.base.weight + sum((b @ a) * s for a, b, s in query.active)
    assert torch.allclose(query._merged, expected, atol=1e-6)
    exported = SentenceTransformer(str(modular.export("ky", tmp_path / "ky")), device="cpu")
    theirs = exported.encode(KYRGYZ, normalize_embeddings=True)
    from_merged = merged.encode(KYRGYZ, lang="ky")
    from_unmerged = terms.encode(KYRGYZ, lang="ky")
    assert np.abs(from_merged - theirs).max() <= np.abs(from_unmerged - theirs).max()


def test_the_default_encoder_merges_for_one_large_call_and_holds_nothing_after(inputs):
    """By default a call's LoRA terms are merged once, at its first batch where the merge costs
    fewer products than the terms (RoutedLoRALinear.merges_per_call), and the copy is dropped
    when the call ends: a large call encodes exactly as merge_lora=True, a call of one short
    sentence adds the terms, and nothing merged is held between calls."""
    default = ModularEncoder(inputs["base"], device="cpu")
    cached = ModularEncoder(inputs["base"], device="cpu", merge_lora=True)
    for encoder in (default, cached):
        encoder.add_language("ky", language_adapter=inputs["ky"][0], sentence_adapter=inputs["ky"][1])
    query = default.body.encoder.layer[0].attention.self.query
    n_in, n_out = query.base.in_features, query.base.out_features
    threshold = n_in * n_out / (n_in + n_out)
    assert not query.merges_per_call(torch.zeros(1, int(threshold) - 1, n_in))
    assert query.merges_per_call(torch.zeros(2, int(threshold // 2) + 1, n_in))
    merges = []
    merged_weight = query.merged_weight
    query.merged_weight = lambda: merges.append(1) or merged_weight()
    many = KYRGYZ * 8
    out = default.encode(many, lang="ky", batch_size=4)
    assert len(merges) == 1  # once for the call, not once per batch
    assert query._merged is None and not query.hold
    assert np.array_equal(out, cached.encode(many, lang="ky", batch_size=4))
    merges.clear()
    one = default.encode(["Саламатсызбы"], lang="ky")
    assert merges == [] and query._merged is None
    unmerged = terms_added_encoder(inputs)  # the same vectors to rounding
    assert np.abs(unmerged.encode(many, lang="ky", batch_size=4) - out).max() < 1e-4
    assert np.abs(unmerged.encode(["Саламатсызбы"], lang="ky") - one).max() == 0


def test_the_evaluation_batch_size_follows_the_device():
    from modsent.evaluation.suite import encoding_batch_size

    assert encoding_batch_size(None, "cpu") == 32 and encoding_batch_size(None, "cuda:0") == 512
    assert encoding_batch_size(16, "cuda") == 16
    assert encoding_batch_size(None) == (512 if torch.cuda.is_available() else 32)


def test_the_merged_weight_is_fp32_under_autocast_and_frees_with_the_language(inputs):
    """The merge runs outside autocast (as the export's): under bf16 autocast the cached weight is
    the fp32 sum; with gradients enabled the terms are added unmerged (no cache)."""
    merged = ModularEncoder(inputs["base"], device="cpu", merge_lora=True)
    merged.add_language("ky", language_adapter=inputs["ky"][0], sentence_adapter=inputs["ky"][1])
    merged._activate("ky")
    query = merged.body.encoder.layer[0].attention.self.query
    x = torch.randn(2, 3, query.base.in_features)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        query(x)
    assert query._merged.dtype == torch.float32
    assert torch.equal(query._merged, query.merged_weight())
    merged._deactivate()
    assert query._merged is None and query.active == []
    merged._activate("ky")
    with torch.enable_grad():
        y = query(x)
    assert query._merged is None and torch.allclose(y, torch.nn.functional.linear(x, query.merged_weight(), query.bias),
                                                    atol=1e-5)


def test_monolithic_systems_of_a_group_are_loaded_one_at_a_time():
    from modsent.encoders.systems import KeyedEncoder, LazyEncoder

    built = []

    class Model:
        def encode(self, sentences, lang=None, batch_size=32):
            return np.ones((len(sentences), 2), dtype=np.float32)

    lazy = KeyedEncoder(LazyEncoder(lambda: built.append(1) or Model()), "de", "de")
    assert built == []  # nothing loaded before encoding reaches it
    assert lazy.encode(["a", "b"]).shape == (2, 2) and lazy.encode(["c"]).shape == (1, 2) and built == [1]
    lazy.close()
    assert lazy.encoder._encoder is None


def test_modular_and_monolithic_systems_encode_under_the_same_precision(inputs, modular, tmp_path, monkeypatch):
    """The evaluation encodes a modular system (ModularEncoder) and a monolithic one (a Full_*
    baseline, a method's output, an export: SentenceTransformerEncoder) alike: under bf16
    autocast where ``auto`` runs it (a GPU), in float32 on the CPU. Here bf16 is forced on the
    CPU: both move off their float32 vectors by bf16 rounding, and an export still encodes as
    its modules in the ModularEncoder do."""
    from modsent.encoders.systems import SentenceTransformerEncoder
    from modsent.training import precision

    texts = builtin_corpus("de")[300:316]
    export = SentenceTransformerEncoder(modular.export("de", tmp_path / "export-de"), device="cpu")
    full = {"modular": modular.encode(texts, lang="de"), "export": export.encode(texts)}
    monkeypatch.setattr(precision, "resolve", lambda device, name="auto": "bf16")
    mixed = {"modular": modular.encode(texts, lang="de"), "export": export.encode(texts)}
    for name in full:
        moved = np.abs(mixed[name] - full[name]).max()
        assert 1e-4 < moved < 0.05, (name, moved)  # bf16 ran, and changed only the rounding
        assert np.min(np.sum(mixed[name] * full[name], axis=1)) > 0.999
    assert np.min(np.sum(mixed["modular"] * mixed["export"], axis=1)) > 0.999


def test_monolithic_systems_encode_as_sentence_transformers_does(inputs, modular, tmp_path, monkeypatch):
    """SentenceTransformerEncoder (Full_*, m-ST5, InteMATs, exports in evaluation) prepares batches
    on a thread, gives the encoder the mask decided on the host and copies results back without
    waiting: the vectors are sentence-transformers', and transformers never inspects a mask."""
    from sentence_transformers import SentenceTransformer
    from transformers import masking_utils

    from modsent.encoders.systems import SentenceTransformerEncoder

    asked = []
    original = masking_utils._ignore_bidirectional_mask_sdpa
    monkeypatch.setattr(masking_utils, "_ignore_bidirectional_mask_sdpa",
                        lambda mask, *args, **kwargs: asked.append(mask) or original(mask, *args, **kwargs))

    lines = builtin_corpus("de")[200:220]
    texts = lines[:13] + ["kurz", "kurz", "zwei", ""] + lines[13:]  # ties, an empty text
    for directory in (inputs["base"], modular.export("de", tmp_path / "export-de")):
        ours = SentenceTransformerEncoder(directory, device="cpu")
        mode = ours.model.training
        reference = SentenceTransformer(str(directory), device="cpu")
        for batch_size, normalize in ((5, True), (64, False)):
            asked.clear()
            got = ours.encode(texts, batch_size=batch_size, normalize=normalize)
            assert all(mask is None for mask in asked)
            expected = reference.encode(texts, batch_size=batch_size, prompt="",
                                        normalize_embeddings=normalize)
            assert got.dtype == np.float32 and got.shape == expected.shape == (len(texts), ours.embedding_dimension)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert ours.encode([]).shape == (0, ours.embedding_dimension)
        assert ours.model.training == mode  # left in the mode it was in
