"""Model cards: the ``README.md`` the Hugging Face Hub reads, for an exported encoder: one
language's modular system (:func:`export_card`) or a monolithic system — a full baseline or a
recipe's model — for all its languages (:func:`system_card`).

The card has the metadata block the Hub indexes (language, base_model as a Hub id, library_name
sentence-transformers, pipeline_tag sentence-similarity, tags, and the licence when it is
given), written with huggingface_hub's own ``ModelCardData``; then how to load it, how each of
its modules was trained (the settings and figures each training stage recorded in its
``metrics.json``), the system's scores from the run's ``summary.csv`` and per-language tables,
and the notices of the built-in data the run may have used.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from modsent.io import InputError

CARD = "README.md"
TAGS = ["sentence-transformers", "sentence-similarity", "feature-extraction", "modsent",
        "modular-sentence-encoder"]
# what each stage's metrics.json holds that a reader of the card wants (in this order)
STAGE_FIGURES = {
    "language adapter (MLM)": ["steps", "train_lines", "heldout_mlm_loss_before", "heldout_mlm_loss_after"],
    "sentence-encoding adapter": ["steps", "train_pairs", "heldout_retrieval_accuracy_before",
                                  "heldout_retrieval_accuracy_after"],
    "cross-lingual alignment adapter": ["kind", "steps", "train_pairs", "heldout_retrieval_accuracy_before",
                                        "heldout_retrieval_accuracy_after"],
}


def _value(value) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _stage_rows(modules: dict[str, Path | None]) -> list[tuple[str, Path, dict]]:
    """(stage, directory, metrics) of each module that recorded its training; a merged
    alignment adapter lists the pp and pl adapters it averages."""
    stages = {"language_adapter": "language adapter (MLM)", "sentence_adapter": "sentence-encoding adapter",
              "alignment": "cross-lingual alignment adapter"}
    rows = []
    for key, path in modules.items():
        if path is None:
            continue
        path = Path(path)
        sources = [path]
        if key == "alignment" and path.parent.name.startswith("merged-"):
            sources = [path.parent.parent / kind / path.name for kind in ("pp", "pl")]
        for source in sources:
            metrics = source / "metrics.json"
            if metrics.is_file():
                rows.append((stages[key], source, json.loads(metrics.read_text(encoding="utf-8"))))
    return rows


def _column_languages(column: str) -> list[str]:
    """The languages of a per-language table's column (``ky``, ``en-ky``, ``zh-Hant``), or none."""
    from modsent.evaluation.suite import subset_languages

    try:
        return subset_languages(column.replace("→", "-"))
    except InputError:
        return []


def _score_tables(results_dir: Path, names: list[str], lang: str | None) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """This system's row of ``summary.csv`` ({column: value}) and, per evaluation table under
    eval/per_language, its values in the columns that involve ``lang`` (every column when None)."""
    import pandas as pd

    summary, per_language = {}, {}
    path = results_dir / "summary.csv"
    if path.is_file():
        frame = pd.read_csv(path)
        rows = frame[frame["variant"].isin(names)]
        if len(rows):
            summary = {column: _value(rows.iloc[0][column]) for column in frame.columns if column != "variant"}
    for table in sorted((results_dir / "eval" / "per_language").glob("*.csv")):
        frame = pd.read_csv(table)
        rows = frame[frame["variant"].isin(names)]
        columns = [c for c in frame.columns if c != "variant" and (lang is None or lang in _column_languages(c))]
        if len(rows) and columns:
            per_language[table.stem] = {c: _value(rows.iloc[0][c]) for c in columns}
    return summary, per_language


def _notices(builtin_data: bool, results_dir: Path | None = None,
             languages: list[str] | None = None) -> list[str]:
    """The built-in data's notices (when the run used it), and those the run's provided
    translations of ``languages`` recorded (the Debian packages of ``builtin:debian``)."""
    from modsent.sources.builtin import PROVENANCE

    notices = [f"{entry['source']} ({entry['package']} {entry['version']}): {entry['content']}; "
               f"{entry['licence']}; {entry['copyright']}; {entry['url']}" for entry in PROVENANCE] \
        if builtin_data else []
    return notices + [n for n in data_notices(results_dir, languages) if n not in notices]


def data_notices(results_dir: Path | None, languages: list[str] | None = None) -> list[str]:
    """Notices stored in the metadata of ``resources/translations/{lang}.parquet`` of the run that
    ``results_dir`` (``results/{base}``) belongs to, for ``languages`` (None: every file), in
    file order, each once."""
    if results_dir is None:
        return []
    import pyarrow.parquet as pq

    folder = Path(results_dir).parent.parent / "resources" / "translations"
    paths = sorted(folder.glob("*.parquet")) if languages is None else \
        [folder / f"{lang}.parquet" for lang in languages if (folder / f"{lang}.parquet").is_file()]
    found: dict[str, None] = {}
    for path in paths:
        metadata = pq.read_schema(path).metadata or {}
        attrs = json.loads(metadata.get(b"PANDAS_ATTRS", b"{}"))
        found.update(dict.fromkeys(attrs.get("modsent_notices", [])))
    return list(found)


def export_card(*, language: str, base_model: str | None, system: str, modules: dict[str, Path | None],
                results_dir: Path | None = None, license: str | None = None,
                builtin_data: bool = False) -> str:
    """The card's text (metadata block and body) for ``language``'s export of ``system``."""
    from huggingface_hub import ModelCardData

    names = [system] + (["Mod_mc-0.5"] if system == "Mod_mc" else [])
    data = ModelCardData(language=[language], license=license, library_name="sentence-transformers",
                         pipeline_tag="sentence-similarity", base_model=base_model,
                         tags=TAGS + [f"modsent-{system}"])
    lines = ["---", data.to_yaml(), "---", "",
             f"# {system} sentence encoder for `{language}` (modsent)", "",
             f"The `{language}` encoder of the modular system **{system}**, trained with modsent on "
             f"{'`' + base_model + '`' if base_model else 'a base model without a Hub id'}: its "
             "language adapter, sentence-encoding adapter and cross-lingual alignment adapter, as "
             "present, are merged into the weights, so it is a plain sentence-transformers model "
             "with no custom code. It encodes without a prompt, as it was trained and evaluated.", "",
             "## Usage", "", "```python", "from sentence_transformers import SentenceTransformer", "",
             'model = SentenceTransformer("PATH_OR_HUB_ID")',
             "embeddings = model.encode([...])  # L2-normalised when the base model normalises", "```", ""]
    if modules.get("alignment") is not None:
        lines += ["Run it in float32 or bfloat16, not float16: its feed-forward layers carry the alignment "
                  "adapter folded in, its ReLU written as GELU(1000·x)/1000, and those scaled activations "
                  "can exceed float16's range.", ""]
    lines += ["## Training", ""]
    stages = _stage_rows(modules)
    if not stages:
        lines += ["No module recorded its training (the base model's weights only).", ""]
    for stage, path, metrics in stages:
        lines += [f"### {stage}: `{path.parent.name}/{path.name}`", "", "| figure | value |", "|---|---|"]
        lines += [f"| {key} | {_value(metrics[key])} |" for key in STAGE_FIGURES[stage] if key in metrics]
        if metrics.get("config"):
            lines += ["", "<details><summary>settings</summary>", "", "```json",
                      json.dumps(metrics["config"], indent=2, sort_keys=True), "```", "", "</details>"]
        lines.append("")
    lines += _closing_sections(system, names, language, results_dir, base_model, license, builtin_data,
                               [language])
    return "\n".join(lines)


def _closing_sections(system: str, names: list[str], language: str | None, results_dir: Path | None,
                      base_model: str | None, license: str | None, builtin_data: bool,
                      languages: list[str] | None = None) -> list[str]:
    """The card's evaluation (the system's summary row and per-language values: those involving
    ``language``, or all when None), data notices and licence sections."""
    lines = []
    if results_dir is not None:
        summary, per_language = _score_tables(Path(results_dir), names, language)
        if summary or per_language:
            lines += ["## Evaluation", "",
                      f"Scores of {system} in the run that trained it (modsent's evaluation suite; "
                      "↓ marks an error, lower is better):", ""]
        if summary:
            lines += ["| " + " | ".join(summary) + " |", "|" + "---|" * len(summary),
                      "| " + " | ".join(summary.values()) + " |", ""]
        for table, values in per_language.items():
            lines += [f"`{table}`" + (f", the pairs or languages with `{language}`:" if language else ":"), "",
                      "| " + " | ".join(values) + " |", "|" + "---|" * len(values),
                      "| " + " | ".join(values.values()) + " |", ""]
    notices = _notices(builtin_data, results_dir, languages)
    if notices:
        lines += ["## Data notices", "",
                  "The run's training data come from these packages, under these licences:", ""]
        lines += [f"- {notice}" for notice in notices] + [""]
    lines += ["## Licence", "",
              f"{'`' + license + '`' if license else 'Not set: the licence of the base model and of the training data apply'}"
              f"{'' if not base_model else f' (base model: `{base_model}`)'}.", ""]
    return lines


# what a monolithic system's metrics.json holds that a reader of the card wants (in this order)
SYSTEM_FIGURES = ["objective", "languages", "steps", "train_rows", "batches_per_epoch", "loss_first", "loss_last",
                  "heldout_retrieval_accuracy_mean_before", "heldout_retrieval_accuracy_mean_after",
                  "trainable_parameters", "total_parameters"]


def system_card(*, system: str, system_dir: Path, base_model: str | None, results_dir: Path | None = None,
                license: str | None = None, builtin_data: bool = False) -> str:
    """The card's text for a monolithic system (a full baseline or a recipe's model): one
    sentence-transformers model for every language it was trained on (its ``metrics.json``'s
    ``languages``), with its training figures and settings and all its scores."""
    from huggingface_hub import ModelCardData

    path = Path(system_dir) / "metrics.json"
    metrics = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    languages = list(metrics.get("languages") or [])
    if languages and "en" not in languages:  # the pivot: every system trains on English pairs or targets
        languages = ["en"] + languages
    data = ModelCardData(language=languages or None, license=license, library_name="sentence-transformers",
                         pipeline_tag="sentence-similarity", base_model=base_model,
                         tags=TAGS[:-1] + ["monolithic-sentence-encoder", f"modsent-{system}"])
    what = metrics.get("description") or f"trained by the {system} recipe"
    lines = ["---", data.to_yaml(), "---", "",
             f"# {system} multilingual sentence encoder (modsent)", "",
             f"The system **{system}** of a modsent run ({what}), trained on "
             f"{'`' + base_model + '`' if base_model else 'a base model without a Hub id'}"
             f"{' for ' + ', '.join(f'`{code}`' for code in languages) if languages else ''}. One model encodes "
             "every language; it is a plain sentence-transformers model and encodes without a prompt, as it "
             "was trained and evaluated.", "",
             *_system_usage(Path(system_dir)),
             "## Training", ""]
    if metrics:
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {key} | {', '.join(metrics[key]) if isinstance(metrics[key], list) else _value(metrics[key])} |"
                  for key in SYSTEM_FIGURES if key in metrics]
        if metrics.get("config"):
            lines += ["", "<details><summary>settings</summary>", "", "```json",
                      json.dumps(metrics["config"], indent=2, sort_keys=True), "```", "", "</details>"]
        lines.append("")
    else:
        lines += [f"{path} is missing: the training figures are unknown.", ""]
    lines += _closing_sections(system, [system], None, results_dir, base_model, license, builtin_data,
                               languages or None)
    return "\n".join(lines)


def _system_usage(system_dir: Path) -> list[str]:
    """The card's usage section for a monolithic system: loaded as modsent evaluated it, in
    float32 from weights stored in half precision (a ``storage_dtype``: sentence-transformers
    would compute in the stored dtype), and through modsent's loader for a system whose first
    module is modsent's own class (InteMATs): ``trust_remote_code=True`` would also let
    transformers run code that the directory's config names."""
    config_path, modules_path = system_dir / "config.json", system_dir / "modules.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    stored = config.get("dtype") or config.get("torch_dtype")
    modules = json.loads(modules_path.read_text(encoding="utf-8")) if modules_path.is_file() else []
    types = [str(m.get("type", "")) for m in modules]
    custom = [t for t in types if not t.startswith("sentence_transformers.")]
    half = stored in ("float16", "bfloat16")
    if custom:
        lines = ["## Usage", "", "```python", "from modsent.encoders.systems import load_sentence_transformer", "",
                 "# a local directory; from the Hub: huggingface_hub.snapshot_download(\"HUB_ID\") gives it",
                 'model = load_sentence_transformer("PATH")', "embeddings = model.encode([...])", "```", "",
                 f"It has a module of modsent's own (`{custom[0]}`: InteMATs' adapters, which cannot be folded "
                 "into the weights), so loading needs the modsent package installed. modsent's loader builds the "
                 "module classes of `modules.json` from an allow-list (modsent's and sentence-transformers') and "
                 "runs no code from the directory"
                 + (f"; it computes in float32 from the weights stored in {stored}, as modsent's evaluation did"
                    if half else "")
                 + ". `SentenceTransformer(path, trust_remote_code=True)` computes the same, but it also lets "
                 "transformers run code that the directory's `config.json` names (`auto_map`): use it only on a "
                 "directory you made.", ""]
        return lines
    options = ['model_kwargs={"dtype": torch.float32}'] if half else []
    lines = ["## Usage", "", "```python"] + (["import torch"] if half else []) + [
        "from sentence_transformers import SentenceTransformer", "",
        f'model = SentenceTransformer("PATH_OR_HUB_ID"{"".join(", " + o for o in options)})',
        "embeddings = model.encode([...])", "```", ""]
    if half:
        lines += [f"Its weights are stored in {stored} (half the disk of float32). modsent's evaluation loaded them "
                  "in float32, as `model_kwargs` asks above (and autocast to bfloat16 on GPUs that have it); "
                  f"without it sentence-transformers computes in {stored}.", ""]
    return lines


def check_card(text: str) -> dict:
    """The metadata of card ``text`` as huggingface_hub's card parser reads it; an InputError
    when it has none or lacks the fields the Hub indexes."""
    from huggingface_hub import ModelCard

    data = ModelCard(text).data.to_dict()
    missing = [key for key in ("language", "library_name", "pipeline_tag", "tags") if not data.get(key)]
    if missing:
        raise InputError(f"the model card's metadata lacks {', '.join(missing)}")
    return data
