"""Regenerate modsent/data/languages.tsv, the language registry's table.

Sources: the FLORES-200 language list (the 202 codes NLLB-200 was trained with, as listed by
transformers' NLLB tokenizer, plus the FLORES-200 codes NLLB does not cover) and ISO 639 names
and two-letter codes from pycountry. Run from the repository root:

    python tools/make_language_table.py > modsent/data/languages.tsv
"""

import sys

import pycountry
from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as NLLB_CODES

# FLORES-200 codes missing from NLLB-200's list. NLLB calls Santali "sat_Beng" although its
# FLORES text is in Ol Chiki; FLORES-200 renamed it sat_Olck.
FLORES_ONLY = ["arb_Latn", "min_Arab", "sat_Olck"]
NLLB_ALIASES = {"sat_Olck": "sat_Beng"}

# Individual languages FLORES uses for a macrolanguage that has an ISO 639-1 code.
MACRO_639_1 = {
    "arb": "ar", "zsm": "ms", "swh": "sw", "pes": "fa", "azj": "az", "uzn": "uz", "khk": "mn",
    "npi": "ne", "ory": "or", "pbt": "ps", "lvs": "lv", "als": "sq", "gaz": "om", "quy": "qu",
    "ayr": "ay", "plt": "mg", "ydd": "yi", "knc": "kr", "kmr": "ku", "fuv": "ff", "ekk": "et",
}
# Names pycountry lacks (ajp was merged into apc in ISO 639-3) or spells for historians.
NAME_OVERRIDES = {"ajp": "South Levantine Arabic", "ell": "Greek", "nep": "Nepali"}
# For a language FLORES has in two scripts, the one that gets the plain code.
PRIMARY_SCRIPT = {"ace": "Latn", "arb": "Arab", "bjn": "Latn", "kas": "Arab", "knc": "Latn",
                  "min": "Latn", "taq": "Latn", "zho": "Hans"}


def main() -> None:
    flores = sorted(set(c for c in NLLB_CODES if c != "sat_Beng") | set(FLORES_ONLY))
    scripts_of: dict[str, list[str]] = {}
    for code in flores:
        lang3, script = code.split("_")
        scripts_of.setdefault(lang3, []).append(script)
    rows = []
    for code in flores:
        lang3, script = code.split("_")
        record = pycountry.languages.get(alpha_3=lang3)
        alpha_2 = MACRO_639_1.get(lang3) or getattr(record, "alpha_2", None)
        base = alpha_2 or lang3
        if len(scripts_of[lang3]) > 1 and PRIMARY_SCRIPT[lang3] != script:
            base = f"{base}-{script}"
        name = NAME_OVERRIDES.get(lang3) or (record.name if record else lang3)
        if len(scripts_of[lang3]) > 1:
            name = f"{name} ({script})"
        nllb = NLLB_ALIASES.get(code, code) if (code in NLLB_CODES or code in NLLB_ALIASES) else ""
        rows.append((base, lang3, code, nllb, script, name))
    codes = [r[0] for r in rows]
    duplicates = {c for c in codes if codes.count(c) > 1}
    if duplicates:
        sys.exit(f"duplicate codes: {sorted(duplicates)}")
    print("code\tiso639_3\tflores\tnllb\tscript\tname")
    for row in sorted(rows):
        print("\t".join(row))


if __name__ == "__main__":
    main()
