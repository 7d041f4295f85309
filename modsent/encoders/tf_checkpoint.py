"""The encoder of a T5 or mT5 checkpoint that the Hub holds only as pickles and TensorFlow
weights, as a safetensors directory, with nothing unpickled (``modsent convert-tf``).

google/mt5-xxl, the m-ST5 paper's model, has ``pytorch_model.bin`` and ``tf_model.h5`` at every
revision and no safetensors conversion, and modsent's loaders read safetensors only. Its
TensorFlow file is Keras's HDF5 weight format, plain arrays read here with h5py: every top-level
layer's weights lie under ``<layer>/<variable name>``, the variable names being the scopes of
transformers' TF T5 classes, which name each sub-layer after the PyTorch attribute and a list
index ``_._N``::

    .../encoder/block_._0/layer_._0/SelfAttention/q/kernel:0      encoder.block.0.layer.0.SelfAttention.q.weight (transposed)
    .../encoder/block_._0/layer_._0/SelfAttention/relative_attention_bias/embeddings:0
                                                                  encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight
    .../encoder/block_._3/layer_._1/layer_norm/weight:0           encoder.block.3.layer.1.layer_norm.weight
    .../encoder/final_layer_norm/weight:0                         encoder.final_layer_norm.weight
    shared/.../weight:0 (or embeddings:0)                         shared.weight

A ``kernel`` is a Dense layer's [in, out] matrix, a Linear's weight transposed; an
``embeddings`` variable is an Embedding's table, as is the shared vocabulary's ``weight``;
the rest keep their names (transformers' TF-to-PyTorch renaming). The decoder's and the LM
head's weights are skipped. Every parameter of the encoder class (``T5EncoderModel`` or
``MT5EncoderModel``, built on the meta device from the checkpoint's ``config.json``) must be
found exactly once with its shape, or nothing is written; the directory then holds the encoder
in float32 safetensors (sharded above ``shard_bytes``), its config and the tokenizer's files,
written atomically, and :func:`modsent.encoders.transformer.load_encoder_body` reads it as any
local model.

A Hub id is converted once per commit into ``$HF_HOME/modsent/converted`` (laid out as the Hub
cache: ``models--ORG--NAME/snapshots/COMMIT``, ``refs/REVISION``), by ``modsent fetch`` on a
machine with internet access or by the first job that loads it (:func:`hub_encoder`); the
loaders find it there by the id and revision the config names (:func:`converted_folder`), so a
config keeps naming ``google/mt5-xxl``. A branch's conversion is kept until it is removed: pin a
commit (``revision:``) to follow upstream changes deliberately.
"""
from __future__ import annotations

import json
import logging
import math
import re
import shutil
from pathlib import Path

from modsent.io import InputError, atomic_path, record_added_tokens

log = logging.getLogger(__name__)

# what the conversion reads of a Hub repository: the TensorFlow weights (one file, or shards),
# the config and the tokenizer's files; never a pickle
HUB_FILES = ["tf_model*.h5", "tf_model.h5.index.json", "config.json", "spiece.model", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json"]
TOKENIZER_FILES = ("spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SHARD_BYTES = 5 * 2**30  # transformers' default max_shard_size
MODEL_TYPES = ("t5", "mt5")  # the configs whose encoders the conversion knows
_INDEX = re.compile(r"^(.+)_\._(\d+)$")  # "block_._3" -> block, 3
_COMMIT = re.compile(r"[0-9a-f]{40}")


def parameter_key(name: str) -> tuple[str | None, bool]:
    """(the PyTorch key of a Keras weight name in an encoder, whether its array is transposed);
    (None, False) for the decoder's, the LM head's and any weight outside the encoder and the
    shared vocabulary. ``name`` is the dataset's path in the HDF5 file."""
    parts = [p for p in name.replace(":0", "").split("/") if p]
    if "decoder" in parts or "lm_head" in parts:
        return None, False
    if "shared" in parts and parts[-1] in ("weight", "embeddings"):
        # the vocabulary: in its own scope (shared/shared/weight:0), and where a Keras layer that
        # uses it lists it again (encoder/shared/shared/embeddings:0, newer TF T5 classes)
        return "shared.weight", False
    if "encoder" in parts:
        parts = parts[len(parts) - 1 - parts[::-1].index("encoder"):]  # from the last "encoder" scope
    else:
        return None, False
    key = []
    for part in parts:
        match = _INDEX.match(part)
        key += [match.group(1), match.group(2)] if match else [part]
    transpose = key[-1] == "kernel"
    if key[-1] in ("kernel", "embeddings"):
        key[-1] = "weight"
    return ".".join(key), transpose


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("tf_model*.h5"))
    if not files:
        raise InputError(f"{folder}: no TensorFlow weights (tf_model.h5 or its shards tf_model-*.h5)")
    return files


def source_folder(source: str, revision: str | None = None) -> Path:
    """The local folder of ``source``: a directory with tf_model.h5 and config.json, or a Hub id
    whose TensorFlow weights, config and tokenizer huggingface_hub downloads (its cache)."""
    if Path(source).is_dir():
        folder = Path(source)
    else:
        from huggingface_hub import snapshot_download

        log.info("downloading %s (revision %s): %s", source, revision or "main", ", ".join(HUB_FILES))
        try:
            folder = Path(snapshot_download(repo_id=source, revision=revision, allow_patterns=HUB_FILES))
        except Exception as err:  # noqa: BLE001 - every failure of the Hub's, named with the source
            raise InputError(f"{source} (revision {revision or 'main'}) is no local directory and could not be "
                             f"downloaded from the Hub: {type(err).__name__}: {err}") from None
    if not (folder / "config.json").is_file():
        raise InputError(f"{source}: no config.json in {folder}")
    _weight_files(folder)
    return folder


def encoder_class(folder: Path):
    """(the config, the transformers encoder class) of a T5 or mT5 checkpoint's config.json."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise InputError(f"{folder / 'config.json'}: not a config transformers can read ({err})") from None
    classes = {"t5": transformers.T5EncoderModel, "mt5": transformers.MT5EncoderModel}
    assert tuple(classes) == MODEL_TYPES
    if config.model_type not in classes:
        raise InputError(f"{folder / 'config.json'}: model_type {config.model_type!r}; the TensorFlow conversion "
                         f"knows T5 and mT5 ({', '.join(classes)})")
    return config, classes[config.model_type]


def expected_parameters(config, cls) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``cls(config)`` (the shared vocabulary once, not again as the
    encoder's embed_tokens) and its shape, from a model built on the meta device."""
    import torch

    with torch.device("meta"):
        model = cls(config)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


def locate(files: list[Path], expected: dict[str, tuple[int, ...]]) -> dict[str, tuple[Path, str, bool]]:
    """{PyTorch key: (file, dataset path, transposed)} for every key of ``expected``, found once
    with its shape in the HDF5 ``files``; an InputError naming what is missing, found twice or
    misshapen otherwise, or an encoder weight that the class has no place for."""
    import h5py

    found: dict[str, list[tuple[Path, str, bool]]] = {}
    problems: list[str] = []
    for file in files:
        try:
            handle = h5py.File(file, "r")
        except OSError as err:
            raise InputError(f"{file}: not an HDF5 file h5py can read ({err})") from None
        with handle:
            def visit(path: str, item) -> None:
                if not isinstance(item, h5py.Dataset):
                    return
                key, transpose = parameter_key(path)
                if key is None:
                    return
                if key not in expected:
                    problems.append(f"{file.name}:{path}: maps to {key}, which the encoder has no parameter for")
                    return
                shape = tuple(item.shape[::-1] if transpose else item.shape)
                if shape != expected[key]:
                    problems.append(f"{file.name}:{path}: shape {tuple(item.shape)}"
                                    f"{' (transposed ' + str(shape) + ')' if transpose else ''}; {key} has "
                                    f"{expected[key]}")
                    return
                found.setdefault(key, []).append((file, path, transpose))

            handle.visititems(visit)
    for key, places in found.items():
        if len(places) > 1 and key != "shared.weight":  # the one table Keras lists under each user
            problems.append(f"{key}: found {len(places)} times ({', '.join(p for _, p, _ in places)})")
    missing = [key for key in expected if key not in found]
    if missing:
        problems.append(f"missing {len(missing)} of the encoder's {len(expected)} parameters: "
                        + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
    if problems:
        raise InputError(f"{', '.join(str(f) for f in files)}: the TensorFlow weights do not make the encoder:\n  "
                         + "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else ""))
    return {key: places[0] for key, places in found.items()}


def _shards(expected: dict[str, tuple[int, ...]], shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for key, shape in expected.items():
        nbytes = 4 * math.prod(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards


def convert(source: str, output: str | Path, *, revision: str | None = None,
            shard_bytes: int = SHARD_BYTES, progress: bool = True) -> Path:
    """Write the encoder of the T5/mT5 TensorFlow checkpoint ``source`` (a directory or a Hub id
    at ``revision``) to the new directory ``output``: float32 safetensors, config.json (its
    architecture the encoder class) and the tokenizer's files. Returns ``output``."""
    import h5py
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import save_file
    from tqdm import tqdm

    output = Path(output)
    if output.exists():
        raise InputError(f"{output}: exists; the conversion writes a new directory")
    folder = source_folder(source, revision)
    config, cls = encoder_class(folder)
    expected = expected_parameters(config, cls)
    files = _weight_files(folder)
    places = locate(files, expected)  # every check before anything is written
    shards = _shards(expected, shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    handles = {file: h5py.File(file, "r") for file in files}
    bar = tqdm(total=len(expected), desc=f"converting {cls.__name__}", unit="tensor", disable=not progress)
    total = 0
    try:
        with atomic_path(output, directory=True) as tmp:
            for name, keys in zip(names, shards):
                tensors = {}
                for key in keys:
                    file, path, transpose = places[key]
                    array = np.asarray(handles[file][path], dtype=np.float32)
                    tensors[key] = torch.from_numpy(np.ascontiguousarray(array.T if transpose else array))
                    total += tensors[key].numel() * 4
                    bar.update()
                save_file(tensors, str(tmp / name), metadata={"format": "pt"})
                del tensors
            if len(shards) > 1:
                index = {"metadata": {"total_size": total},
                         "weight_map": {key: name for name, keys in zip(names, shards) for key in keys}}
                (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
            config.architectures = [cls.__name__]
            config.save_pretrained(tmp)
            for item in TOKENIZER_FILES:
                if (folder / item).is_file():
                    shutil.copyfile(folder / item, tmp / item)
            if not (tmp / "tokenizer.json").is_file() and (tmp / "spiece.model").is_file():
                # the fast tokenizer's file, built once here rather than from spiece.model at every load
                transformers.AutoTokenizer.from_pretrained(str(tmp), local_files_only=True).save_pretrained(tmp)
            record_added_tokens(tmp)
    finally:
        bar.close()
        for handle in handles.values():
            handle.close()
    log.info("wrote %s: %s, %d parameters in %d file(s)", output, cls.__name__, total // 4, len(names))
    return output


def converted_root() -> Path:
    """Where Hub models' conversions are kept: ``$HF_HOME/modsent/converted`` (the compute
    nodes of a cluster see the same HF_HOME as ``modsent fetch``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "modsent" / "converted"


def _repo_root(repo_id: str) -> Path:
    return converted_root() / ("models--" + repo_id.replace("/", "--"))


def converted_folder(repo_id: str, revision: str | None = None) -> Path | None:
    """The conversion of the Hub model ``repo_id`` at ``revision`` (a commit, or a branch or tag
    whose commit the conversion recorded), made before; None if there is none."""
    root = _repo_root(repo_id)
    name = revision or "main"
    if _COMMIT.fullmatch(name):
        commit = name
    else:
        ref = root / "refs" / name
        if not ref.is_file():
            return None
        commit = ref.read_text(encoding="utf-8").strip()
    folder = root / "snapshots" / commit
    return folder if (folder / "config.json").is_file() else None


def hub_encoder(repo_id: str, revision: str | None = None, *, progress: bool = True) -> Path:
    """The converted encoder of the Hub model ``repo_id`` at ``revision``: the conversion made
    before, or its TensorFlow weights downloaded (huggingface_hub's cache) and converted now."""
    from filelock import FileLock

    found = converted_folder(repo_id, revision)
    if found is not None:
        return found
    snapshot = source_folder(repo_id, revision)  # huggingface_hub's cache: downloaded once
    commit = snapshot.name if _COMMIT.fullmatch(snapshot.name) else (revision or "main")
    root = _repo_root(repo_id)
    folder = root / "snapshots" / commit
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".lock")):  # jobs that start together convert once, one after another
        if not (folder / "config.json").is_file():
            log.warning("%s (revision %s) has no safetensors weights: converting its TensorFlow weights into %s "
                        "(once per commit)", repo_id, revision or "main", folder)
            convert(str(snapshot), folder, progress=progress)
        if (revision or "main") != commit:
            with atomic_path(root / "refs" / (revision or "main")) as tmp:
                tmp.write_text(commit + "\n", encoding="utf-8")
    return folder
