"""Small I/O helpers shared by every stage: atomic outputs and strict UTF-8 input.

Every output is written to a temporary sibling first and renamed into place only when it is
complete, so an interrupted job never leaves a file or directory that a rerun would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path


class InputError(ValueError):
    """Bad user input: the message names the file, line or key and what was expected."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it to ``path`` only on success.

    With ``directory=True`` the temporary path is an empty directory. On an exception the
    temporary is removed and ``path`` is left untouched (an older complete version survives).
    A finished older version is never deleted before the new one is complete: it is renamed
    aside, the new one renamed into place, and only then is the old one removed.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=final.parent)
        os.close(fd)
        tmp = Path(name)
    # mkdtemp/mkstemp create 0700/0600; results are shared on clusters: honour the umask
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)
    try:
        yield tmp
        if directory:
            for item in tmp.rglob("*"):  # e.g. safetensors writes 0600 files
                if item.is_file() and item.stat().st_mode & 0o777 == 0o600:
                    os.chmod(item, 0o666 & ~umask)
            _replace_directory(tmp, final)
        else:
            os.replace(tmp, final)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def _replace_directory(new: Path, final: Path) -> None:
    """Move the complete directory ``new`` to ``final``, replacing what is there.

    ``os.replace`` cannot replace a non-empty directory, so an existing ``final`` is first
    renamed to a hidden sibling (one rename: ``final`` holds the old version until that
    instant), ``new`` renamed into place, and the old version removed last. If the second
    rename fails, the old version is renamed back."""
    if not final.exists() and not final.is_symlink():
        os.replace(new, final)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    aside = old / final.name
    try:
        os.replace(final, aside)
    except BaseException:
        shutil.rmtree(old, ignore_errors=True)
        raise
    try:
        os.replace(new, final)
    except BaseException:
        os.replace(aside, final)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator:
    """``open()`` for writing whose result appears at ``path`` only when the block succeeds."""
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as handle:
            yield handle


def write_parquet(frame, path: str | os.PathLike) -> None:
    """A pandas DataFrame to parquet at ``path``, atomically, without the index."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def iter_utf8_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` of a UTF-8 text file, newline stripped.

    Invalid UTF-8 raises :class:`InputError` naming the file, the 1-based line number and the
    byte offset inside that line, instead of a bare ``UnicodeDecodeError`` somewhere later.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(
                    f"{path}: line {number}: invalid UTF-8 at byte {err.start} of the line "
                    f"({raw[max(0, err.start - 10):err.start + 10]!r}); the file must be UTF-8 text"
                ) from None
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            yield number, text.rstrip("\r\n")


def read_json(path: str | os.PathLike, what: str):
    """The JSON value in ``path``; an InputError naming the file when it is missing (``what``
    says what was expected there) or is not valid UTF-8 JSON."""
    import json

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path.parent}: not {what} (no {path.name})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON: {err}") from None


def read_safetensors(path: str | os.PathLike) -> dict:
    """Every tensor of the safetensors file ``path`` (torch); an InputError naming the file
    when it is missing, truncated or otherwise unreadable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path.parent}: no {path.name}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise _unreadable_safetensors(path, err) from None


def canonical_safetensors_header(path: str | os.PathLike) -> None:
    """Rewrite the header of the safetensors file ``path`` with its metadata keys sorted. The
    library writes them in the order of a Rust hash map, which differs from save to save, so
    two saves of the same tensors and metadata differed in their bytes (two demo runs: every
    file whose metadata has more than one key). The header keeps its length (the same JSON,
    reordered, in the library's compact form), so the tensors' offsets do not move; a header
    that would not keep it is left as it is."""
    path = Path(path)
    with open(path, "r+b") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
        metadata = header.get("__metadata__")
        if not metadata or len(metadata) < 2:
            return
        header["__metadata__"] = dict(sorted(metadata.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) > size:
            return
        handle.seek(8)
        handle.write(text + b" " * (size - len(text)))  # the library pads with spaces


def write_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Save ``tensors`` (all torch tensors or all numpy arrays) to ``path`` with ``metadata``,
    the metadata keys in one order (:func:`canonical_safetensors_header`), so that the same
    tensors and metadata always make the same bytes."""
    import numpy as np

    if all(isinstance(value, np.ndarray) for value in tensors.values()):
        from safetensors.numpy import save_file
    else:
        from safetensors.torch import save_file
    save_file(tensors, str(path), metadata=metadata)
    canonical_safetensors_header(path)


def canonical_adapter_config(adapter_dir: str | os.PathLike) -> None:
    """Sort the ``target_modules`` list of a saved PEFT ``adapter_config.json``: PEFT keeps the
    names in a Python set, written in string-hash order, which differs from process to process
    (two demo runs wrote the same adapters with the list in other orders)."""
    path = Path(adapter_dir) / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def record_added_tokens(directory: str | os.PathLike) -> bool:
    """Write the added tokens of a saved tokenizer's ``tokenizer.json`` into its
    ``tokenizer_config.json`` as ``added_tokens_decoder``, where the config lacks them; returns
    whether it wrote. Every tokenizer directory modsent writes or copies goes through this.

    transformers 5 leaves ``added_tokens_decoder`` out of the config it saves for a fast
    (``tokenizers``) tokenizer. Its ``from_pretrained`` then takes its legacy path and parses the
    whole ``tokenizer.json`` with Python's ``json`` to find the added tokens, besides the Rust
    library's own reading of the file: multilingual-e5-small's 17 MB tokenizer loaded in 2.14 s
    against 1.28 s with the tokens listed (``benchmarks/tokenizer_load.py``). That is for the
    generic class (``PreTrainedTokenizerFast``, which the built-in base and the trained tokenizers
    name); classes with an ``__init__`` of their own (BERT's, NLLB's) parse the file anyway to
    rebuild themselves, and are merely unharmed. With the tokens in the config the loaded
    tokenizer is the same (the same ``AddedToken`` fields, read from the same entries). A
    directory with a ``special_tokens_map.json`` or ``added_tokens.json`` is left as it is (the
    legacy path reads those too), and so are files that are not what a save writes (the loader
    then reports them)."""
    directory = Path(directory)
    config_path, tokenizer_path = directory / "tokenizer_config.json", directory / "tokenizer.json"
    if (not config_path.is_file() or not tokenizer_path.is_file()
            or any((directory / name).exists() for name in ("special_tokens_map.json", "added_tokens.json"))):
        return False
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if not isinstance(config, dict) or "added_tokens_decoder" in config:
            return False
        with tokenizer_path.open(encoding="utf-8") as handle:
            added = json.load(handle).get("added_tokens") or []
        decoder = {str(token["id"]): {key: value for key, value in token.items() if key != "id"} for token in added}
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    config["added_tokens_decoder"] = decoder
    with atomic_open(config_path, encoding="utf-8") as handle:
        handle.write(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return True


def record_added_tokens_under(directory: str | os.PathLike) -> int:
    """:func:`record_added_tokens` for every tokenizer in ``directory`` and its subfolders (a
    sentence-transformers model keeps its tokenizer at the top or in its transformer's folder);
    returns how many configs it wrote."""
    return sum(record_added_tokens(config.parent) for config in Path(directory).rglob("tokenizer_config.json"))


def _unreadable_safetensors(path: Path, err: Exception) -> InputError:
    return InputError(f"{path}: unreadable safetensors file (truncated or damaged?): {err}")


def check_model_files(folder: str | os.PathLike) -> None:
    """Every JSON file under ``folder`` parses and every safetensors file's header matches its
    size (a truncated copy fails here): an InputError naming the file, before transformers or
    peft load the folder and report the damage without naming it, or name a temporary copy."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    for path in sorted(folder.rglob("*.json")):
        read_json(path, "a JSON file")
    for path in sorted(folder.rglob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise _unreadable_safetensors(path, err) from None
