"""Everything a run reads from the Hugging Face Hub, fetched ahead on a machine with internet
access (``modsent fetch``), for clusters whose compute nodes have none.

A run reads the Hub in two kinds of job:

- the input rules (:data:`INPUT_RULES`: the base model, corpora, paraphrase and evaluation
  datasets, human translations, the CTranslate2 conversion of the translation model), whose
  outputs in ``resources/`` are what every later job reads. Corpora are streamed from the Hub
  (only the capped lines are read), so they cannot be cached: fetch runs these rules here, with
  Snakemake (``--until``), and the cluster run finds them done;
- the jobs that load a Hub model by its id themselves: a training method's encoder (by the
  methods' convention, a setting ``model`` or ``*_model``, with its revision in ``revision`` or
  ``*_revision``) and the translation model with the ``transformers`` engine. Fetch downloads
  those into the Hub cache (``$HF_HOME``, or ``~/.cache/huggingface``), the files their loaders
  read only (no pickles); the compute nodes must see the same cache, and the run should set
  ``HF_HUB_OFFLINE=1`` so that they do not wait for the network before they read it. A T5 or
  mT5 model without safetensors at any revision (google/mt5-xxl) is converted here from its
  TensorFlow weights into ``$HF_HOME/modsent/converted`` (:mod:`modsent.encoders.tf_checkpoint`),
  where its loader finds it by the same id.
"""
from __future__ import annotations

import dataclasses
import logging
import subprocess
from collections.abc import Mapping
from pathlib import Path

from modsent.io import InputError

log = logging.getLogger(__name__)

# the rules that read the user's inputs (the Hub, local files, built-in data) into resources/;
# every other rule reads what these wrote (tests/test_workflow.py checks the list against the
# rules that run first, `priority: 5`, and the conversion)
INPUT_RULES = ("base_model", "corpus", "paraphrase_source", "provided_translations", "evaluation_subset",
               "convert_translation_model")
# the files of a Hub model the loaders read (transformers with safetensors, the tokenizers):
# weights as safetensors only, never pickles
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt"]


@dataclasses.dataclass(frozen=True)
class HubModel:
    """A Hub model a job loads by its id: ``repo_id`` at ``revision`` (None: the default
    branch), named in the config at ``key``."""

    repo_id: str
    revision: str | None
    key: str


def _hub_id(value: object, directory: Path) -> str | None:
    """The Hub id ``value`` names, or None for no value, a local directory (relative to the
    run's ``directory``), ``local:PATH`` or built-in data."""
    if not isinstance(value, str) or not value:
        return None
    if value.startswith(("local:", "builtin:")):
        return None
    if Path(value).is_absolute() or (directory / value).is_dir() or value.startswith((".", "/", "~")):
        return None
    return value


def hub_models(config: Mapping, directory: str | Path = ".") -> list[HubModel]:
    """The Hub models the jobs of ``config`` (schema-filled) load by id themselves, in the
    config's order, each once: each method's ``model``/``*_model`` settings (with
    ``revision``/``*_revision``), and ``translation.model`` when
    the engine is ``transformers`` (which reads ``hf:ID`` too). The base model and the
    CTranslate2 conversion are input rules' (:data:`INPUT_RULES`), not listed."""
    directory = Path(directory)
    found: dict[tuple[str, str | None], HubModel] = {}

    def add(value, revision, key):
        repo_id = _hub_id(value, directory)
        if repo_id is not None and key == "translation.model":
            repo_id = repo_id.removeprefix("hf:")
        if repo_id is not None:
            found.setdefault((repo_id, revision), HubModel(repo_id, revision, key))

    translation = config.get("translation") or {}
    if translation.get("engine") == "transformers":
        add(translation.get("model"), translation.get("revision"), "translation.model")
    for name, settings in (config.get("methods") or {}).items():
        for key, value in (settings or {}).items():
            if key == "model" or key.endswith("_model"):
                revision = settings.get(key[:-len("model")] + "revision")
                add(value, revision, f"methods.{name}.{key}")
    return list(found.values())


def download(models: list[HubModel], directory: str | Path = ".") -> list[Path]:
    """Download ``models`` into the Hub cache (huggingface_hub's ``snapshot_download``, the
    :data:`HUB_PATTERNS` files): the local folder of each. A T5/mT5 model without safetensors
    weights at that revision is converted from its TensorFlow weights (its folder is then the
    conversion's); any other is an InputError naming its key (the loaders read no pickles)."""
    from huggingface_hub import snapshot_download

    folders = []
    for model in models:
        log.info("downloading %s (revision %s) for %s", model.repo_id, model.revision or "main", model.key)
        try:
            folder = Path(snapshot_download(repo_id=model.repo_id, revision=model.revision,
                                            allow_patterns=HUB_PATTERNS))
        except Exception as err:  # noqa: BLE001 - every failure of the Hub's, named with the config's key
            raise InputError(f"{model.key}: {model.repo_id} (revision {model.revision or 'main'}) is no local "
                             f"directory (in {Path(directory).resolve()}) and could not be downloaded from the "
                             f"Hub: {type(err).__name__}: {err}") from None
        if not any(folder.rglob("*.safetensors")):
            folder = _converted(model, folder)
        folders.append(folder)
    return folders


def _converted(model: HubModel, folder: Path) -> Path:
    """The encoder of a T5/mT5 model without safetensors converted from its TensorFlow weights
    (modsent.encoders.tf_checkpoint: google/mt5-xxl), where the loaders find it; an InputError
    naming the key for any other model without safetensors."""
    import json

    from modsent.encoders import tf_checkpoint

    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type not in tf_checkpoint.MODEL_TYPES:
        raise InputError(f"{model.key}: {model.repo_id} (revision {model.revision or 'main'}) has no "
                         f"safetensors weights, which modsent's loaders need; name a revision that has "
                         f"them (its key's revision setting)")
    try:
        return tf_checkpoint.hub_encoder(model.repo_id, model.revision)
    except InputError as err:
        raise InputError(f"{model.key}: {model.repo_id} (revision {model.revision or 'main'}) has no safetensors "
                         f"weights, and its TensorFlow weights could not be converted: {err}") from None


def input_rules(configfile: str | Path, directory: str | Path) -> list[str]:
    """The rules of :data:`INPUT_RULES` that the workflow defines for ``configfile`` (the
    conversion exists for the ctranslate2 engine only): Snakemake's ``--list-rules``."""
    from modsent.planning import snakemake_command

    cmd = snakemake_command(configfile, directory) + ["--list-rules"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=local_environment())
    if proc.returncode != 0:
        from modsent.planning import _dry_run_error

        raise InputError(f"snakemake --list-rules of {configfile} failed:\n{_dry_run_error(proc.stdout, proc.stderr)}")
    defined = {line.split()[0] for line in proc.stdout.splitlines() if line.strip() and not line[0].isspace()}
    return [rule for rule in INPUT_RULES if rule in defined]


def input_command(configfile: str | Path, directory: str | Path, cores: int, rules: list[str],
                  extra: list[str] = (), profile: str | None = None) -> list[str]:
    """The Snakemake command that runs the input rules ``rules`` of ``configfile`` here, in
    ``directory``, and nothing after them: on this machine (the local executor), under
    ``profile`` when given (the cluster run's, for its software deployment: a run whose
    software environment differs reruns the rules)."""
    from modsent.planning import snakemake_command

    return snakemake_command(configfile, directory) + [
        *(["--profile", str(profile)] if profile else []), "--executor", "local", "--cores", str(cores),
        "--until", *rules, *extra]


def local_environment() -> dict[str, str]:
    """This process's environment without $SNAKEMAKE_PROFILE (a cluster profile there would
    send the input rules to the compute nodes)."""
    import os

    return {key: value for key, value in os.environ.items() if key != "SNAKEMAKE_PROFILE"}
