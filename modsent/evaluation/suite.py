"""Evaluation: embeddings per (variant, language), scores per (variant, dataset), the tables.

Three steps, one Snakemake rule each (rules/evaluation.smk):

1. :func:`embed_language` — for one language, every evaluated system encodes every sentence of
   that language in every configured evaluation dataset, once (tasks that share sentences, such
   as bitext mining and RSIM on FLORES, share the embeddings; systems with the same modules for
   the language, such as English in every Mod_* variant, share the encoding):
   ``results/{base}/eval/embeddings/{group}/{lang}/{variant}/{dataset}.parquet`` (``text``,
   ``embedding``). One job per (group, language): ``modular`` (the base model, the modular
   variants and ablations on one shared body, loaded once) and ``full`` (the monolithic
   baselines, whose retraining then leaves the modular embeddings alone).
2. :func:`score_dataset` — the paper's protocol for one (variant, dataset), from those files and
   the normalised dataset subsets (:mod:`modsent.sources.evaluation`), into one JSON, scored by
   the dataset's task kind (:mod:`modsent.evaluation.tasks`):

   ============== =====================================================================
   kind           scores
   ============== =====================================================================
   pairs          STS/STR: Spearman ×100 of cosine vs gold, per language (``mono``) and
                  per language pair (``cross``, symmetric pairs averaged); for
                  multi-parallel sets also every configured language pair built from
                  ``pair_id`` and the language bias (:func:`modsent.evaluation.metrics.language_bias`)
   parallel       bitext mining: xsim error rate ×100 (ratio margin, k = 4) for every
                  ordered language pair; RSIM over language pairs
   bitext_pairs   bitext mining en↔X: xsim error ×100, the mean of both directions
   classification logistic regression on frozen embeddings: accuracy ×100 in-language
                  (``mono``) and zero-shot from English (``zero_shot``)
   paraphrase     monolingual paraphrase mining: xsim error ×100 between each language's
                  anchors and positives, the mean of both directions (``error``)
   ============== =====================================================================

   A configured language the dataset lacks is skipped and listed under ``missing_languages``.
3. :func:`aggregate` — ``summary.csv``/``summary.md`` shaped like the paper's Table 1 (rows:
   variants; columns: task and dataset, averaged over languages), per-language tables, a bar
   plot of the variants per task and heatmaps of xsim per language pair.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from modsent.sources import evaluation as ed
from modsent.evaluation import tasks
from modsent.evaluation.tasks import Scoring
from modsent.io import InputError, atomic_path, write_parquet

log = logging.getLogger(__name__)

LOWER_IS_BETTER = {"xsim", "error"}


# ---- which sentences a language needs ----------------------------------------------------------


def subset_languages(subset: str, dataset: str | None = None) -> list[str]:
    """The languages of a subset name: ``de`` → [de]; ``en-de`` → [en, de]; codes with a script
    (``zh-Hant``) are recognised by the registry. With ``dataset``, the languages its subset
    holds, which the name may not say: Tatoeba's ``de`` is German–English pairs → [de, en]."""
    from modsent import languages as registry

    table = ed._table(ed.get(dataset)) if dataset is not None else {}
    if subset in table:
        return list(table[subset].languages)
    if registry.is_registered(subset):
        return [subset]
    for i, char in enumerate(subset):
        if char == "-" and registry.is_registered(subset[:i]) and registry.is_registered(subset[i + 1:]):
            return [subset[:i], subset[i + 1:]]
    raise InputError(f"evaluation subset {subset!r}: not a registered language or language pair")


# ---- step 1: embeddings ------------------------------------------------------------------------


def write_embeddings(path: str | Path, texts: Sequence[str], embeddings: np.ndarray) -> None:
    """A parquet of ``text`` and ``embedding`` (fixed-size float32 lists), atomically."""
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if embeddings.shape[0] != len(texts):
        raise InputError(f"{path}: {len(texts)} texts but {embeddings.shape[0]} embeddings")
    dim = embeddings.shape[1] if embeddings.ndim == 2 else 0
    column = pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), dim)
    table = pa.table({"text": pa.array(list(texts), pa.string()), "embedding": column})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


class EmbeddingTable:
    """The embeddings of one language in one dataset, looked up by text."""

    def __init__(self, texts: list[str], embeddings: np.ndarray, source: str = "embeddings"):
        self.texts, self.embeddings, self.source = texts, embeddings, source
        self.row = {text: i for i, text in enumerate(texts)}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        try:
            return self.embeddings[[self.row[t] for t in texts]]
        except KeyError as error:
            raise InputError(f"{self.source}: no embedding for {error.args[0]!r}: the embeddings are "
                             "older than the dataset (rerun the embedding rule)") from None


def read_embeddings(path: str | Path) -> EmbeddingTable:
    table = pq.read_table(path)
    if table.column_names != ["text", "embedding"]:
        raise InputError(f"{path}: expected columns text, embedding; found {table.column_names}")
    column = table.column("embedding").combine_chunks()
    dim = column.type.list_size
    values = np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    return EmbeddingTable(table.column("text").to_pylist(), values.reshape(len(table), dim), str(path))


def encoding_batch_size(setting: int | None, device: str | None = None) -> int:
    """``evaluation.batch_size``, or with ``None`` the device's: 512 sentences on a GPU, where
    smaller batches leave it waiting for the CPU to launch kernels (an H100 encodes 6.2x the
    sentences/s at 512 than at 64, benchmarks/results/encode_throughput*_h100.txt, measured
    with a loop that waited for every batch, which costs small batches most: the loop that
    encodes now does not wait, and gpu.sh's encode_throughput re-measures the ratio), 32 on the
    CPU, where the longer padding of a large batch costs more than it saves (3x slower at 512;
    sorted by tokens, batches of 32 encoded the demo's languages 1.33-1.73x as fast as the 64
    sorted by characters of before, 64 sorted by tokens 0.98-1.51x:
    benchmarks/results/encode_order_cpu.txt)."""
    if setting is not None:
        return int(setting)
    import torch

    on_gpu = str(device).startswith("cuda") if device is not None else torch.cuda.is_available()
    return GPU_ENCODING_BATCH if on_gpu else CPU_ENCODING_BATCH


GPU_ENCODING_BATCH, CPU_ENCODING_BATCH = 512, 32


def embed_language(encoders: dict, lang: str, datasets: dict[str, list[str | Path]], out_dir: str | Path, *,
                   batch_size: int = 64) -> dict[str, dict[str, int]]:
    """Encode ``lang``'s sentences of each dataset (``{name: [subset parquet paths]}``) with each
    system's encoder (``{system: encoder}``, anything with ``encode(sentences, lang=,
    batch_size=)``) into ``out_dir/{system}/{name}.parquet``; the directory is written
    atomically. A sentence in several datasets is encoded once per system (SIB-200 is built on
    FLORES' sentences; the built-in topics on the built-in parallel set's). Encoders that compute
    the same function (equal ``encoder`` and ``key`` attributes, see
    :func:`modsent.encoders.systems.build_language_encoders`) encode once. Returns sentence
    counts per system and dataset."""
    texts = {}
    for name, paths in datasets.items():
        kind = tasks.get(ed.DATASETS[name].kind)
        texts[name] = kind.sentences([ed.read_subset(path) for path in paths], lang)
        log.info("%s %s: %d sentences", name, lang, len(texts[name]))
    unique = list(dict.fromkeys(text for sentences in texts.values() for text in sentences))
    row = {text: i for i, text in enumerate(unique)}
    log.info("%s: %d distinct sentences in %d datasets", lang, len(unique), len(texts))
    done: dict[tuple, Path] = {}
    counts = {}
    with atomic_path(out_dir, directory=True) as tmp:
        for system, encoder in encoders.items():
            identity = (id(getattr(encoder, "encoder", encoder)), getattr(encoder, "key", system))
            (tmp / system).mkdir()
            counts[system] = {}
            if identity in done:  # the same modules as another system: same vectors
                for name, sentences in texts.items():
                    shutil.copyfile(done[identity] / f"{name}.parquet", tmp / system / f"{name}.parquet")
                    counts[system][name] = len(sentences)
                log.info("%s %s: the vectors of %s", system, lang, done[identity].name)
                continue
            vectors = (encoder.encode(unique, lang=lang, batch_size=batch_size) if unique
                       else np.zeros((0, 0)))
            for name, sentences in texts.items():
                rows = vectors[[row[text] for text in sentences]] if sentences else np.zeros((0, 0))
                bad = int((~np.isfinite(rows)).any(axis=-1).sum()) if rows.size else 0
                if bad:
                    raise InputError(f"{system} {lang} ({name}): {bad} of {len(sentences)} embeddings are not "
                                     "finite (NaN or inf): a module of this system holds non-finite weights; "
                                     "retrain it (its directory is listed by `modsent outputs`)")
                write_embeddings(tmp / system / f"{name}.parquet", sentences, rows)
                counts[system][name] = len(sentences)
            done[identity] = tmp / system
            getattr(encoder, "close", lambda: None)()  # a monolithic model loaded for this system
            log.info("%s %s: encoded", system, lang)
        (tmp / "counts.json").write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    return counts


# ---- step 2: scores ----------------------------------------------------------------------------


def read_dataset(subset_paths: dict[str, str | Path], embedding_paths: dict[str, str | Path]) -> tuple[dict, dict]:
    """(subset → its non-empty normalised rows, language → its embedding lookup): what scoring
    one system on one dataset reads (the paper's scores and the mteb result files)."""
    frames = {subset: ed.read_subset(path) for subset, path in subset_paths.items()}
    frames = {subset: frame for subset, frame in frames.items() if len(frame)}
    return frames, {lang: read_embeddings(path) for lang, path in embedding_paths.items()}


def score_dataset(name: str, subset_paths: dict[str, str | Path], embedding_paths: dict[str, str | Path],
                  languages: list[str], *, variant: str = "", missing: Sequence[str] = (), k: int = 4,
                  margin: str = "ratio", seed: int = 0) -> dict:
    """The scores of one variant on one dataset (see the module docstring).

    ``subset_paths``: subset name → normalised parquet; ``embedding_paths``: language → that
    language's embeddings of this dataset; ``languages``: the configured languages, in order."""
    dataset = ed.DATASETS[name]
    frames, emb = read_dataset(subset_paths, embedding_paths)
    scores = tasks.get(dataset.kind).score(Scoring(dataset, frames, emb, languages, k, margin, seed))
    return {"variant": variant, "dataset": name, "task": dataset.task, "kind": dataset.kind,
            "languages": [lang for lang in languages if lang in emb], "missing_languages": list(missing),
            "scores": scores}


# ---- step 3: tables and plots ------------------------------------------------------------------

TASK_LABELS = {"sts": "STS", "str": "STR", "bitext": "BM", "classification": "TC", "paraphrase": "PM"}
METRIC_LABELS = {"mono": "mono", "cross": "cross", "zero_shot": "zero-shot", "xsim": "xsim err ↓",
                 "rsim": "RSIM", "language_bias": "bias ↓", "error": "err ↓"}


def _column(result: dict, metric: str) -> str:
    task = "BM" if metric == "xsim" else TASK_LABELS.get(result["task"], result["task"])
    if metric == "rsim":
        task = "RSIM"
    return f"{task} {result['dataset']} {METRIC_LABELS.get(metric, metric)}" if metric != "rsim" \
        else f"RSIM {result['dataset']}"


def summary_frame(results: Sequence[dict], variants: Sequence[str]) -> pd.DataFrame:
    """Rows: variants (in the given order); columns: task, dataset and metric, averaged over
    languages (or language pairs)."""
    rows: dict[str, dict[str, float]] = {variant: {} for variant in variants}
    for result in results:
        for metric, entry in result["scores"].items():
            if entry.get("average") is not None:
                rows.setdefault(result["variant"], {})[_column(result, metric)] = entry["average"]
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "variant"
    return frame


def per_language_frames(results: Sequence[dict], variants: Sequence[str]) -> dict[str, pd.DataFrame]:
    """One table per (dataset, metric): rows variants, columns languages or language pairs."""
    tables: dict[str, dict[str, dict]] = {}
    metrics: dict[str, str] = {}
    for result in results:
        for metric, entry in result["scores"].items():
            if isinstance(entry.get("values"), dict):
                key = f"{result['dataset']}_{metric}"
                tables.setdefault(key, {})[result["variant"]] = entry["values"]
                metrics[key] = metric
    out = {}
    for key, rows in tables.items():
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.attrs["metric"] = metrics[key]
        if key.endswith("_rsim"):
            frame.attrs["unit"] = "pearson"
        frame = frame.reindex([v for v in variants if v in frame.index])
        frame.index.name = "variant"
        if metrics[key] in ("xsim", "error"):
            frame.attrs["xsim"] = xsim_setting([r["scores"][metrics[key]] for r in results
                                                if f"{r['dataset']}_{metrics[key]}" == key])
        out[key] = frame
    return out


METRIC_NOTES = {
    "xsim": "xsim error rate in % per source-target pair ({xsim}); lower is better.",
    "language_bias": "bilingual minus pooled multilingual Spearman ×100 per language pair; lower is better.",
    "rsim": "Pearson correlation of within-language similarity sets per language pair; higher is better.",
    "mono": "Spearman ×100 (STS/STR) or accuracy ×100 (TC) per language; higher is better.",
    "cross": "Spearman ×100 per language pair; higher is better.",
    "zero_shot": "accuracy ×100, trained on English, per language; higher is better.",
    "error": "paraphrase mining error rate in % per language (xsim inside the language, {xsim}, "
             "mean of both directions); lower is better.",
}


def xsim_setting(entries: Sequence[dict]) -> str | None:
    """How the xsim scores in ``entries`` (score entries with ``k`` and ``margin``) were scored,
    e.g. "ratio margin, k = 4"; "plain cosine" for the absolute margin (k plays no part there);
    several settings joined with "; "; None when no entry says."""
    settings = sorted({(entry["margin"], entry["k"]) for entry in entries if "margin" in entry and "k" in entry})
    if not settings:
        return None
    return "; ".join("plain cosine" if margin == "absolute" else f"{margin} margin, k = {k}"
                     for margin, k in settings)


def _xsim_entries(results: Sequence[dict], metrics: Sequence[str] = ("xsim", "error")) -> list[dict]:
    return [entry for result in results for metric, entry in result["scores"].items() if metric in metrics]


def _per_language_note(frame: pd.DataFrame) -> str:
    """What a per-language table's cells are and which way is better."""
    metric = frame.attrs.get("metric", "")
    note = METRIC_NOTES.get(metric, f"{metric}; see the summary's legend.")
    return "Rows: variants; columns: languages or language pairs. " + note.format(
        xsim=frame.attrs.get("xsim") or "the margin and k of the evaluation settings")


def left_out(results: Sequence[dict]) -> list[str]:
    """Scores an average leaves out, one line each: a language (pair) whose value is not a finite
    number (e.g. a constant similarity), and a language a task skipped for its size."""
    lines = []
    for result in results:
        for metric, entry in result["scores"].items():
            where = f"{result['variant']}: {_column(result, metric)}"
            values = entry.get("values") if isinstance(entry.get("values"), dict) else {}
            undefined = [key for key, value in values.items() if value is None or not math.isfinite(value)]
            if undefined:
                lines.append(f"{where}: no finite score for {', '.join(undefined)}")
            for lang, why in (entry.get("skipped_languages") or {}).items():
                lines.append(f"{where}: {lang} skipped ({why})")
    return lines


def _markdown(frame: pd.DataFrame, digits: int = 1) -> str:
    columns = [frame.index.name or ""] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(["---"] + ["---:"] * len(frame.columns)) + "|"]
    for index, row in frame.iterrows():
        cells = ["" if pd.isna(v) else f"{v:.{3 if str(c).startswith('RSIM') or frame.attrs.get('unit') == 'pearson' else digits}f}"
                 for c, v in zip(frame.columns, row)]
        lines.append("| " + " | ".join([str(index)] + cells) + " |")
    return "\n".join(lines) + "\n"


FAMILY_COLOURS = {"base model": "#7f7f7f", "full baselines": "#ff7f0e", "modular (ours)": "#1f77b4",
                  "recipes": "#2ca02c"}


def variant_family(name: str) -> str:
    """The summary plot's group of a variant: the base model, the monolithic full baselines,
    modsent's modular variants and ablations, or another method's recipe."""
    if name == "base":
        return "base model"
    if name.startswith("Full_"):
        return "full baselines"
    if name.startswith("Mod_"):
        return "modular (ours)"
    return "recipes"


def _plot_summary(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.patches import Patch

    columns = list(frame.columns)
    n = max(1, len(columns))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 0.32 * len(frame) * rows + 1.2 * rows + 0.6),
                             dpi=100, squeeze=False)
    names = list(frame.index)[::-1]
    colours = [FAMILY_COLOURS[variant_family(name)] for name in names]
    for ax, column in zip(axes.flat, columns):
        values = list(frame[column])[::-1]
        bars = ax.barh(names, [0 if pd.isna(v) else v for v in values], color=colours)
        digits = 3 if str(column).startswith("RSIM") else 1
        ax.bar_label(bars, labels=["n/a" if pd.isna(v) else f"{v:.{digits}f}" for v in values],
                     fontsize=7, padding=2)
        lower = "↓" in str(column)
        ax.set_title(f"{str(column).replace(' ↓', '')}\n({'lower' if lower else 'higher'} is better)", fontsize=9)
        ax.margins(x=0.18)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(columns):]:
        ax.axis("off")
    present = [f for f in FAMILY_COLOURS if any(variant_family(name) == f for name in names)]
    if present:  # no rows, no legend
        fig.legend(handles=[Patch(color=FAMILY_COLOURS[f], label=f) for f in present], loc="upper center",
                   ncol=len(present), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def _plot_xsim_heatmaps(results: Sequence[dict], variants: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for variant in variants:
        for result in results:
            entry = result["scores"].get("xsim")
            if result["variant"] == variant and result["kind"] == "parallel" and entry:
                panels.append((f"{variant} · {result['dataset']}", entry["values"], result["languages"]))
    fig_cols = min(4, max(1, len(panels)))
    fig_rows = max(1, math.ceil(len(panels) / fig_cols))
    fig, axes = plt.subplots(fig_rows, fig_cols, figsize=(3.6 * fig_cols, 3.2 * fig_rows), dpi=100, squeeze=False)
    for ax, (title, values, langs) in zip(axes.flat, panels):
        grid = np.full((len(langs), len(langs)), np.nan)
        for i, a in enumerate(langs):
            for j, b in enumerate(langs):
                if f"{a}-{b}" in values:
                    grid[i, j] = values[f"{a}-{b}"]
        image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis_r")
        ax.set_xticks(range(len(langs)), langs, fontsize=7, rotation=90)
        ax.set_yticks(range(len(langs)), langs, fontsize=7)
        ax.set_xlabel("target", fontsize=8)
        ax.set_ylabel("source", fontsize=8)
        ax.set_title(title, fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, label="xsim error %")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if not panels:
        axes.flat[0].text(0.5, 0.5, "no bitext mining on a parallel dataset", ha="center", va="center")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def aggregate(score_paths: Sequence[str | Path], variants: Sequence[str], *, csv_path, md_path, plot_path,
              heatmap_path, per_language_dir, missing: dict[str, Sequence[str]] | None = None,
              base: str = "", html_path=None) -> pd.DataFrame:
    """Write the summary table (CSV, Markdown and, with ``html_path``, its HTML page for the
    report), per-language tables (CSV, Markdown, HTML) and the plots. ``missing``: dataset → the
    configured languages it lacks, listed under the table."""
    from modsent.reporting import markdown_to_html, write_html

    results = [json.loads(Path(p).read_text(encoding="utf-8")) for p in score_paths]
    frame = summary_frame(results, variants)
    with atomic_path(csv_path) as tmp:
        frame.to_csv(tmp, float_format="%.4f")
    missing = sorted({(dataset, lang) for dataset, langs in (missing or {}).items() for lang in langs}
                     | {(r["dataset"], lang) for r in results for lang in r.get("missing_languages", [])})
    xsim = xsim_setting(_xsim_entries(results))
    lines = [f"# Evaluation summary{f' · {base}' if base else ''}", "",
             "Rows: variants. Columns: task, dataset and score, averaged over languages (or language pairs). "
             f"STS/STR: Spearman ×100; BM: xsim error rate % ({xsim + '; ' if xsim else ''}lower is better); "
             "TC: accuracy ×100; PM: monolingual paraphrase mining error % (lower is better); "
             "bias: bilingual minus pooled Spearman ×100; RSIM: Pearson. Higher is better where not said.", "",
             _markdown(frame)]
    if missing:
        by_dataset: dict[str, list[str]] = {}
        for dataset, lang in missing:
            by_dataset.setdefault(dataset, []).append(lang)
        lines += ["", "Languages skipped (not in the dataset): "
                  + "; ".join(f"{d}: {', '.join(langs)}" for d, langs in by_dataset.items()), ""]
    outside = left_out(results)
    if outside:
        lines += ["", "Left out of the averages:", ""] + [f"- {line}" for line in outside] + [""]
    per_language_dir = Path(per_language_dir)
    tables = per_language_frames(results, variants)
    with atomic_path(per_language_dir, directory=True) as tmp:
        for key, table in sorted(tables.items()):
            table.to_csv(tmp / f"{key}.csv", float_format="%.4f")
            text = f"# {key}\n\n{_per_language_note(table)}\n\n" + _markdown(table)
            (tmp / f"{key}.md").write_text(text, encoding="utf-8")
            (tmp / f"{key}.html").write_text(markdown_to_html(text), encoding="utf-8")
    where = Path(os.path.relpath(per_language_dir, Path(md_path).parent)).as_posix()
    lines += ["", "Per-language tables: " + ", ".join(f"`{where}/{k}.md`" for k in sorted(tables)), ""]
    with atomic_path(md_path) as tmp:
        Path(tmp).write_text("\n".join(lines), encoding="utf-8")
    if html_path is not None:
        write_html(md_path, html_path)
    _plot_summary(frame, Path(plot_path))
    _plot_xsim_heatmaps(results, variants, Path(heatmap_path))
    return frame


def seeds_summary(csv_paths: Sequence[str | Path], *, csv_path, md_path, html_path=None,
                  base: str = "") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each score's mean and sample standard deviation (ddof 1) over seed replicates: one
    summary CSV per replicate (rows: systems, columns: scores, as :func:`aggregate` writes
    them) → ``csv_path`` (a ``<score> mean`` and a ``<score> std`` column per score, and
    ``replicates``: the runs with a value) and ``md_path`` (``mean ± std`` cells). Returns
    (mean, std)."""
    from modsent.reporting import write_html

    frames = [pd.read_csv(path, index_col=0) for path in csv_paths]
    if len(frames) < 2:
        raise InputError(f"a seeds summary needs at least two replicates' summaries, got {len(frames)}")
    rows = list(dict.fromkeys(name for frame in frames for name in frame.index))
    columns = list(dict.fromkeys(column for frame in frames for column in frame.columns))
    stacked = np.stack([frame.reindex(index=rows, columns=columns).to_numpy(dtype=float) for frame in frames])
    count = np.sum(~np.isnan(stacked), axis=0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a cell no replicate has: NaN, shown empty
        mean = np.nanmean(stacked, axis=0)
        std = np.where(count >= 2, np.nanstd(stacked, axis=0, ddof=1), np.nan)
    mean = pd.DataFrame(mean, index=rows, columns=columns)
    std = pd.DataFrame(std, index=rows, columns=columns)
    table = pd.concat({"mean": mean, "std": std}, axis=1).swaplevel(axis=1)
    table = table[[(column, stat) for column in columns for stat in ("mean", "std")]]
    table.columns = [f"{column} {stat}" for column, stat in table.columns]
    table["replicates"] = [min((n for n in row if n), default=0) for row in count]  # over measured cells
    table.index.name = frames[0].index.name
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, float_format="%.4f")
    header = "| system | " + " | ".join(columns) + " |"
    lines = [f"# Evaluation summary over {len(frames)} seeds{f' · {base}' if base else ''}", "",
             f"Each cell: the mean ± sample standard deviation of the score over {len(frames)} runs of "
             "the whole pipeline, each with every stage's seed plus r (replicate r; r = 0 is the main "
             "summary). Scores and units as in `summary.md` (BM: xsim error, lower is better).", "",
             header, "|" + "|".join(["---"] + ["---:"] * len(columns)) + "|"]
    for name in rows:
        cells = []
        for column in columns:
            m, d = mean.loc[name, column], std.loc[name, column]
            digits = 3 if column.startswith("RSIM") else 1
            cells.append("" if pd.isna(m) else f"{m:.{digits}f}" + ("" if pd.isna(d) else f" ± {d:.{digits}f}"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    with atomic_path(md_path) as tmp:
        Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if html_path is not None:
        write_html(md_path, html_path)
    return mean, std


def write_scores(path: str | Path, result: dict) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


__all__ = ["aggregate", "embed_language", "read_dataset", "read_embeddings", "score_dataset", "subset_languages",
           "summary_frame", "write_embeddings", "write_parquet", "write_scores"]
