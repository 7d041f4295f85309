"""A quality report for one language's translations: what a person checks before training on them.

Per language: empty outputs, untranslated outputs (identical to the English), outputs much
shorter than their source (likely truncated or dropped content), the character length ratio
distribution, the copy rate (share of output words found verbatim in the source), and the
agreement of an offline language identifier (modsent.data.language_id: py3langid's bundled model, 97
languages) with the target language. JSON + a plot per language; a Markdown table over languages.

The identifier misreads even good human translations of short UI strings and names (a third or
more of the built-in Kyrgyz as Russian or Kazakh), so its agreement alone would flag good
translations. It is calibrated: the same identifier's agreement on built-in human translations
is the reference (of the same English sources where the built-in data has them, else of the
language), and only a shortfall beyond sampling noise (:func:`off_target`) is flagged as likely
off-target output.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from modsent.data import language_id
from modsent.io import atomic_open, atomic_path

# Output shorter than 30% of the language's typical length ratio: likely truncated or dropped
# content. Relative to the median because scripts differ (Chinese needs a third of the
# characters English does).
SHORT_RATIO = 0.3
# A shortfall of language-ID agreement below the human reference is flagged when it exceeds
# this many standard errors of the difference of the two shares, and at least MIN_SHORTFALL.
SHORTFALL_SE = 3.0
MIN_SHORTFALL = 0.05
_WORD = re.compile(r"\w+", re.UNICODE)


def off_target(agreement: float, checked: int, reference: float, reference_n: int) -> tuple[float, bool]:
    """(estimated share of off-target outputs, flagged): the shortfall of ``agreement`` (over
    ``checked`` outputs) below the identifier's agreement on human translations (``reference``
    over ``reference_n``), and whether it exceeds sampling noise (two binomial shares)."""
    shortfall = max(0.0, reference - agreement)
    se = math.sqrt(reference * (1 - reference) / max(reference_n, 1) + agreement * (1 - agreement) / max(checked, 1))
    return shortfall, shortfall > max(MIN_SHORTFALL, SHORTFALL_SE * se)


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
    supported = language_id.supported(lang)
    checked = output.str.strip().str.len() >= language_id.min_chars(lang)
    long_enough = output[checked].tolist()
    reference = language_id.human_agreement(lang, source[checked]) if supported else None
    shortfall, flagged = None, None
    if supported and long_enough:
        target = language_id.code_of(language_id.label_of(lang))
        predicted = language_id.LanguageIdentifier().identify(long_enough)
        agreement = float(np.mean([p == target for p in predicted]))
        confusions = pd.Series(predicted)[[p != target for p in predicted]].value_counts().head(5)
        if reference is not None:
            shortfall, flagged = off_target(agreement, len(long_enough), *reference[:2])
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
        # the identifier's agreement on the built-in human translations into lang (None: no reference)
        "language_id_human_agreement": None if reference is None else round(reference[0], 4),
        "language_id_human_reference": None if reference is None else f"{reference[2]}: {reference[1]} sentences",
        "language_id_off_target": None if shortfall is None else round(shortfall, 4),
        "language_id_flagged": flagged,
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
             "mean copy rate | language ID agreement (outputs of 20+ chars; CJK 6+) | on human translations | "
             "likely off-target |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        agreement = r["language_id_agreement"]
        checked = r.get("language_id_checked", 0)
        lines.append(
            f"| {r['language']} | {r['units']} | {r.get('missing', 0)} | {r['empty']} | {r['untranslated']} | {r['short']} | "
            f"{r['length_ratio_quantiles'].get('0.50', float('nan')):.2f} | {r['copy_rate_mean']:.2f} | "
            f"{'n/a' if agreement is None else f'{agreement:.1%} of {checked}'} | "
            f"{_share(r.get('language_id_human_agreement'))} {_scope(r)}| {_off_target_cell(r)} |")
    with atomic_open(out_path) as handle:
        handle.write("\n".join(lines) + "\n")


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _scope(report: dict) -> str:
    scope = report.get("language_id_human_reference")
    return f"({scope}) " if scope else ""


def _off_target_cell(report: dict) -> str:
    """The estimated off-target share beyond the human reference, and whether it is flagged."""
    shortfall = report.get("language_id_off_target")
    if shortfall is None:
        return "n/a (no human reference)"
    return f"**{shortfall:.1%} (flagged)**" if report.get("language_id_flagged") else f"{shortfall:.1%} (within noise)"
