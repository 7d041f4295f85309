"""A quality report for one language's translations: what a person checks before training on them.

Per language: empty outputs, untranslated outputs (identical to the English), outputs much
shorter than their source (likely truncated or dropped content), the character length ratio
distribution, the copy rate (share of output words found verbatim in the source), and the
agreement of an offline language identifier (py3langid, bundled model, 97 languages) with the
target language. JSON + a plot per language; a Markdown table over languages.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from modsent.io import atomic_open, atomic_path

# Output shorter than 30% of the language's typical length ratio: likely truncated or dropped
# content. Relative to the median because scripts differ (Chinese needs a third of the
# characters English does).
SHORT_RATIO = 0.3
# Language ID is unreliable on names and single words: agreement counts outputs this long only.
LID_MIN_CHARS = 20
# Scripts that write a word in one or two characters: a third of the length is enough.
DENSE_SCRIPTS = {"Hans", "Hant", "Jpan", "Hang", "Kore"}
# py3langid labels that name a variety of one of our languages
LID_ALIASES = {"wuu": "zh", "yue": "zh", "cmn": "zh", "nb": "no", "nn": "no"}
_WORD = re.compile(r"\w+", re.UNICODE)


def _identifier():
    from py3langid.langid import _get_identifier

    return _get_identifier()


def copy_rate(source: str, output: str) -> float:
    """Share of the output's words that occur in the source (numbers and names are copied
    legitimately, so this is a distribution to look at, not a failure)."""
    words = _WORD.findall(output.casefold())
    if not words:
        return 0.0
    source_words = set(_WORD.findall(source.casefold()))
    return sum(w in source_words for w in words) / len(words)


def quality_report(translations: pd.DataFrame, lang: str) -> dict:
    """Metrics over ``unit_id, text, translation`` rows translated into ``lang``."""
    source = translations["text"].astype(str)
    output = translations["translation"].fillna("").astype(str)
    n = len(translations)
    empty = output.str.strip() == ""
    untranslated = (output.str.strip().str.casefold() == source.str.strip().str.casefold()) & ~empty
    ratio = output.str.len() / source.str.len().clip(lower=1)
    typical = ratio[~empty].median() if (~empty).any() else 1.0
    short = (ratio < SHORT_RATIO * typical) & ~empty
    copies = np.array([copy_rate(s, o) for s, o in zip(source, output)])
    identifier = _identifier()
    lid_code = lang.split("-")[0]
    supported = lid_code in identifier.nb_classes
    from modsent import languages

    dense = languages.get(lang).script in DENSE_SCRIPTS if languages.is_registered(lang) else False
    min_chars = LID_MIN_CHARS // 3 if dense else LID_MIN_CHARS
    long_enough = [o for o in output if len(o.strip()) >= min_chars]
    if supported and long_enough:
        labels = (identifier.classify(o)[0] for o in long_enough)
        predicted = [LID_ALIASES.get(label, label) for label in labels]
        agreement = float(np.mean([p == lid_code for p in predicted]))
        confusions = pd.Series(predicted)[[p != lid_code for p in predicted]].value_counts().head(5)
    else:
        agreement, confusions = None, pd.Series(dtype=int)
    quantiles = ratio.quantile([0.05, 0.25, 0.5, 0.75, 0.95]) if n else pd.Series(dtype=float)
    return {
        "language": lang,
        "units": n,
        "empty": int(empty.sum()),
        "untranslated": int(untranslated.sum()),
        "short": int(short.sum()),
        "length_ratio_quantiles": {f"{q:.2f}": round(float(v), 3) for q, v in quantiles.items()},
        "copy_rate_mean": round(float(copies.mean()), 4) if n else None,
        "language_id_agreement": None if agreement is None else round(agreement, 4),
        "language_id_checked": len(long_enough) if supported else 0,
        "language_id_supported": supported,
        "language_id_confusions": {str(k): int(v) for k, v in confusions.items()},
        "examples_untranslated": source[untranslated].head(5).tolist(),
        "_ratio": ratio.tolist(),
        "_copies": copies.tolist(),
    }


def write_quality_report(translations_path: str | Path, lang: str, json_path: str | Path,
                         plot_path: str | Path, units_path: str | Path | None = None) -> dict:
    """The report as JSON and a plot; with ``units_path`` it also counts the units that have no
    translation at all (dropped by the provided engine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = quality_report(pd.read_parquet(translations_path), lang)
    if units_path is not None:
        report["missing"] = int(pd.read_parquet(units_path, columns=["unit_id"]).shape[0] - report["units"])
    ratio, copies = report.pop("_ratio"), report.pop("_copies")
    with atomic_open(json_path) as handle:
        handle.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), dpi=100)
    axes[0].hist(np.clip(ratio, 0, 3), bins=30)
    axes[0].axvline(SHORT_RATIO * float(np.median(ratio)) if ratio else SHORT_RATIO, color="red",
                    linestyle="--", label="likely truncated")
    axes[0].set_xlabel("length ratio (translation / English, chars)")
    axes[0].legend()
    axes[1].hist(copies, bins=20, range=(0, 1))
    axes[1].set_xlabel("copy rate (output words found in source)")
    agreement = report["language_id_agreement"]
    fig.suptitle(f"translations into {lang}: {report['units']} sentences; language ID agreement "
                 f"{'n/a' if agreement is None else f'{agreement:.1%}'}")
    fig.tight_layout()
    with atomic_path(plot_path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return report


def write_quality_summary(json_paths: list[str | Path], out_path: str | Path) -> None:
    rows = [json.loads(Path(p).read_text(encoding="utf-8")) for p in json_paths]
    lines = ["# Translation quality", "",
             "| language | sentences | missing | empty | untranslated | short | median length ratio | "
             "mean copy rate | language ID agreement (outputs of 20+ chars; CJK 6+) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        agreement = r["language_id_agreement"]
        checked = r.get("language_id_checked", 0)
        lines.append(
            f"| {r['language']} | {r['units']} | {r.get('missing', 0)} | {r['empty']} | {r['untranslated']} | {r['short']} | "
            f"{r['length_ratio_quantiles'].get('0.50', float('nan')):.2f} | {r['copy_rate_mean']:.2f} | "
            f"{'n/a' if agreement is None else f'{agreement:.1%} of {checked}'} |")
    with atomic_open(out_path) as handle:
        handle.write("\n".join(lines) + "\n")
