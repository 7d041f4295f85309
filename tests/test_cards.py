"""Model cards: the Hub's parser reads the metadata, and the body holds what the run recorded."""

import json

import pandas as pd
import pytest
from huggingface_hub import ModelCard

from modsent import cards
from modsent.io import InputError


def _module(path, **metrics):
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(metrics))
    return path


def test_card_metadata_training_and_scores(tmp_path):
    results = tmp_path / "results" / "labse"
    la = _module(results / "language_adapters" / "ky", steps=200, train_lines=5000, heldout_mlm_loss_before=7.5,
                 heldout_mlm_loss_after=4.25, config={"learning_rate": 5e-4, "lora_r": 8})
    se = _module(results / "sentence_adapters" / "ky", steps=100, train_pairs=3000, config={"batch_size": 128})
    for kind, steps in (("pp", 40), ("pl", 60)):
        _module(results / "alignment" / kind / "ky", kind=kind, steps=steps, train_pairs=900)
    merged = results / "alignment" / "merged-0.5" / "ky"
    merged.mkdir(parents=True)
    pd.DataFrame({"variant": ["base", "Mod_mc-0.5"], "BM xsim err ↓": [22.18, 19.04], "RSIM": [0.6, 0.65]}).to_csv(
        results / "summary.csv", index=False)
    (results / "eval" / "per_language").mkdir(parents=True)
    pd.DataFrame({"variant": ["Mod_mc-0.5"], "de-en": [0.7], "en-ky": [0.61], "ky-zh": [0.52]}).to_csv(
        results / "eval" / "per_language" / "rsim.csv", index=False)
    text = cards.export_card(language="ky", base_model="sentence-transformers/LaBSE", system="Mod_mc",
                             modules={"language_adapter": la, "sentence_adapter": se, "alignment": merged},
                             results_dir=results, license="apache-2.0", builtin_data=True)
    data = cards.check_card(text)
    assert data == ModelCard(text).data.to_dict()
    assert (data["language"], data["base_model"], data["license"]) == (["ky"], "sentence-transformers/LaBSE", "apache-2.0")
    assert data["library_name"] == "sentence-transformers" and data["pipeline_tag"] == "sentence-similarity"
    body = ModelCard(text).text
    assert "| steps | 200 |" in body and "| heldout_mlm_loss_after | 4.25 |" in body
    assert '"lora_r": 8' in body and "| train_pairs | 3000 |" in body
    assert "`pp/ky`" in body and "| steps | 40 |" in body and "`pl/ky`" in body and "| steps | 60 |" in body
    assert "| BM xsim err ↓ | RSIM |\n|---|---|\n| 19.04 | 0.65 |" in body  # Mod_mc is the 0.5 merge's row
    assert "| en-ky | ky-zh |\n|---|---|\n| 0.61 | 0.52 |" in body and "de-en" not in body
    assert "## Data notices" in body and "django (Django" in body and "BSD-3-Clause" in body
    # codes with a script: zh is not zh-Hant, and en-zh-Hant is a pair with zh-Hant
    pd.DataFrame({"variant": ["Mod_mc"], "en-zh-Hant": [0.3], "zh-Hant": [0.4], "ky-zh": [0.5]}).to_csv(
        results / "eval" / "per_language" / "rsim.csv", index=False)
    assert cards._score_tables(results, ["Mod_mc"], "zh")[1] == {"rsim": {"ky-zh": "0.5"}}
    assert cards._score_tables(results, ["Mod_mc"], "zh-Hant")[1] == {"rsim": {"en-zh-Hant": "0.3", "zh-Hant": "0.4"}}
    assert "not float16" in body  # the folded alignment adapter's scaled activations
    bare = cards.export_card(language="ky", base_model=None, system="base", modules={"language_adapter": None})
    assert "base_model" not in cards.check_card(bare) and "## Evaluation" not in bare and "Data notices" not in bare
    assert "float16" not in bare
    with pytest.raises(InputError, match="lacks library_name, pipeline_tag"):
        cards.check_card("---\nlanguage: [ky]\ntags: [x]\n---\ntext")


def test_a_monolithic_system_card_lists_its_languages_figures_and_every_score(tmp_path):
    results = tmp_path / "results" / "labse"
    system = _module(results / "baselines" / "Full_m", baseline="Full_m", description="all weights, monolingual batches",
                     objective="monolingual", languages=["en", "de", "ky"], steps=400, loss_first=1.9, loss_last=0.75,
                     trainable_parameters=117505920, config={"learning_rate": 2e-5})
    pd.DataFrame({"variant": ["Full_m", "Mod_m"], "BM xsim err ↓": [30.5, 20.25]}).to_csv(results / "summary.csv", index=False)
    (results / "eval" / "per_language").mkdir(parents=True)
    pd.DataFrame({"variant": ["Full_m"], "de-en": [0.7], "en-ky": [0.61]}).to_csv(
        results / "eval" / "per_language" / "rsim.csv", index=False)
    text = cards.system_card(system="Full_m", system_dir=system, base_model="sentence-transformers/LaBSE",
                             results_dir=results, license="apache-2.0")
    data = cards.check_card(text)
    assert data["language"] == ["en", "de", "ky"] and data["base_model"] == "sentence-transformers/LaBSE"
    assert "modsent-Full_m" in data["tags"] and "monolithic-sentence-encoder" in data["tags"]
    body = ModelCard(text).text
    assert "| languages | en, de, ky |" in body and "| steps | 400 |" in body and "| loss_last | 0.75 |" in body
    assert '"learning_rate": 2e-05' in body
    assert "| BM xsim err ↓ |\n|---|\n| 30.5 |" in body  # its own row, not Mod_m's
    assert "| de-en | en-ky |\n|---|---|\n| 0.7 | 0.61 |" in body  # every column: one model for all languages
    # a recipe that trained on the other languages' pairs with English lists English too
    mexma = _module(results / "methods" / "MEXMA", method="MEXMA", languages=["de", "ky"], steps=8)
    assert cards.check_card(cards.system_card(system="MEXMA", system_dir=mexma, base_model=None))["language"] == [
        "en", "de", "ky"]
    assert 'model = SentenceTransformer("PATH_OR_HUB_ID")\n' in body and "import torch" not in body
    # weights stored in half precision (storage_dtype) load in float32, as evaluated; modsent's own
    # module class (InteMATs) loads through modsent's loader, never with trust_remote_code, which would
    # also run code the directory's config names (tests/test_workflow.py runs the card's line)
    (mexma / "config.json").write_text(json.dumps({"dtype": "float16"}))
    (mexma / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "modsent.encoders.intemats.InteMATsTransformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.sentence_transformer.modules.Pooling"}]))
    body = ModelCard(cards.system_card(system="MEXMA", system_dir=mexma, base_model=None)).text
    assert 'from modsent.encoders.systems import load_sentence_transformer\n' in body
    assert 'model = load_sentence_transformer("PATH")\n' in body and "SentenceTransformer(\"" not in body
    assert "import torch" not in body and "trust_remote_code=True)` computes the same, but" in body
    assert "stored in float16" in body and "`modsent.encoders.intemats.InteMATsTransformer`" in body


def test_card_keeps_the_notices_the_run_s_translations_recorded(tmp_path, monkeypatch):
    """translation.provided: builtin:debian stores each Debian package's notice in the prepared
    translations' parquet metadata; the exported card lists them under the data notices."""
    from babel.messages.catalog import Catalog
    from babel.messages.mofile import write_mo

    from modsent.sources import builtin_catalogs
    from modsent.sources.prepare import prepare_translations

    root = tmp_path / "locale"
    catalog = Catalog(locale="de")
    catalog.add("Cannot open archive", "Archiv kann nicht geöffnet werden")
    (root / "de/LC_MESSAGES").mkdir(parents=True)
    with open(root / "de/LC_MESSAGES/tar.mo", "wb") as handle:
        write_mo(handle, catalog)
    monkeypatch.setattr(builtin_catalogs, "DEBIAN_LOCALE_ROOT", root)
    run = tmp_path / "run"
    prepare_translations("builtin:debian", "de", run / "resources/translations/de.parquet")
    results = run / "results" / "me5-small"
    results.mkdir(parents=True)
    notices = cards.data_notices(results)
    assert len(notices) == 1 and notices[0].startswith("debian (tar ") and "GPL-3+" in notices[0]
    text = cards.export_card(language="de", base_model=None, system="base", modules={"language_adapter": None},
                             results_dir=results, builtin_data=True)
    body = ModelCard(text).text
    assert "django (Django" in body and "- debian (tar " in body and "/usr/share/doc/tar/copyright" in body
    # the notices are those of the card's own languages: Kyrgyz's translations came from the
    # built-in catalogs alone, so its card lists no Debian package
    prepare_translations("builtin", "ky", run / "resources/translations/ky.parquet")
    assert cards.data_notices(results, ["ky"]) == [] and cards.data_notices(results, ["de", "ky"]) == notices
    ky = ModelCard(cards.export_card(language="ky", base_model=None, system="base",
                                     modules={"language_adapter": None}, results_dir=results, builtin_data=True)).text
    assert "django (Django" in ky and "debian (" not in ky
    # Debian's notices are kept even when the run's paraphrases were not the built-in ones
    no_builtin = ModelCard(cards.export_card(language="de", base_model=None, system="base",
                                             modules={"language_adapter": None}, results_dir=results)).text
    assert "## Data notices" in no_builtin and "- debian (tar " in no_builtin and "django (Django" not in no_builtin
    # a run on the built-in data alone records none
    prepare_translations("builtin", "de", run / "resources/translations/de.parquet")
    assert cards.data_notices(results) == []
