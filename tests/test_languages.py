import re

import pycountry
import pytest

from modsent import languages as registry

PAPER_LANGUAGES = "am ar az cs de en es fr ha it kk ko ky mr nl pl ru rw te tr ug uz zh".split()


def test_covers_every_flores200_language():
    flores = {registry.get(code).flores for code in registry.codes()}
    # FLORES-200 has 204 language-script pairs: NLLB-200's 202 codes, with sat_Beng renamed
    # sat_Olck, plus arb_Latn and min_Arab.
    assert len(flores) == 204
    for code in ["eng_Latn", "zho_Hans", "zho_Hant", "arb_Latn", "min_Arab", "sat_Olck", "kin_Latn"]:
        assert code in flores


def test_nllb_codes_match_transformers_list():
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    nllb = {registry.get(code).nllb for code in registry.codes()} - {None}
    assert nllb == set(FAIRSEQ_LANGUAGE_CODES)


@pytest.mark.parametrize("code", PAPER_LANGUAGES)
def test_paper_languages_registered(code):
    lang = registry.get(code)
    assert lang.code == code
    assert re.fullmatch(r"[a-z]{3}_[A-Z][a-z]{3}", lang.flores)
    assert lang.nllb is not None  # every paper language can be machine-translated


@pytest.mark.parametrize(
    "code,flores",
    [("de", "deu_Latn"), ("ar", "arb_Arab"), ("zh", "zho_Hans"), ("zh-Hant", "zho_Hant"),
     ("az", "azj_Latn"), ("uz", "uzn_Latn"), ("rw", "kin_Latn"), ("ug", "uig_Arab"),
     ("am", "amh_Ethi"), ("ko", "kor_Hang"), ("fa", "pes_Arab"), ("ckb", "ckb_Arab")],
)
def test_known_mappings(code, flores):
    assert registry.get(code).flores == flores


def test_round_trip_code_flores_code():
    for code in registry.codes():
        lang = registry.get(code)
        assert registry.by_flores(lang.flores).code == code
        assert registry.resolve(lang.flores).code == code
        assert lang.script == lang.flores.split("_")[1]


def test_iso639_1_and_639_3_agree_with_pycountry():
    for code in registry.codes():
        lang = registry.get(code)
        base = code.split("-")[0]
        if len(base) == 2:
            # the two-letter code is the ISO 639-1 code of the language or of its macrolanguage
            assert pycountry.languages.get(alpha_2=base) is not None, code
        else:
            assert base == lang.iso639_3


@pytest.mark.parametrize("alias,code", [("deu", "de"), ("ger", "de"), ("ara", "ar"), ("arb", "ar"),
                                        ("zho", "zh"), ("deu_Latn", "de"), ("zho_Hant", "zh-Hant"),
                                        ("kin", "rw"), ("fas", "fa")])
def test_aliases_resolve(alias, code):
    assert registry.resolve(alias).code == code
    assert not registry.is_registered(alias)
    assert repr(code) in registry.unknown_message(alias)


@pytest.mark.parametrize("written,code", [("DE", "de"), ("Deu", "de"), ("de ", "de"), ("zh-hant", "zh-Hant"),
                                          ("zh_Hant", "zh-Hant"), ("zh-Hans", "zh"), ("zh-TW", "zh-Hant"),
                                          ("pt-BR", "pt"), ("en-US", "en"), ("sr-Cyrl", "sr"), ("no", "nb"),
                                          ("iw", "he"), ("fil", "tl")])
def test_other_spellings_of_a_registered_language_suggest_its_code(written, code):
    assert not registry.is_registered(written) and registry.is_registered(code)
    assert f"{written!r} is not a modsent language code; write {code!r}" in registry.unknown_message(written)


@pytest.mark.parametrize("bad", ["sr-Latn", "xx-YY", "de/x", "../de", "qq", "de-DE-1996", ""])
def test_no_code_is_suggested_where_the_registry_has_none(bad):
    assert "write '" not in registry.unknown_message(bad)


@pytest.mark.parametrize("bad", ["../x", "de/../../etc", "", "DE", "xx", "de-latn", "de_Latn "])
def test_bad_codes_rejected_with_message(bad):
    with pytest.raises(registry.UnknownLanguageError) as err:
        registry.get(bad)
    assert repr(bad) in str(err.value)


def test_wildcard_regex_accepts_only_registered_codes():
    pattern = re.compile(f"(?:{registry.wildcard_regex()})")
    for code in registry.codes():
        assert pattern.fullmatch(code)
    for bad in ["../x", "xx", "de/..", "de-fr", "en.txt", ""]:
        assert not pattern.fullmatch(bad)


def test_cli_lists_registry(capsys):
    from modsent.cli import main

    assert main(["languages", "--paper"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + len(PAPER_LANGUAGES)
    assert "rw\tkin_Latn\tkin_Latn\tLatn\tKinyarwanda" in lines
