"""Step 2 of monolingual specialisation: fastText vectors for the new tokenizer's tokens.

FOCUS needs an auxiliary embedding of every new token in which similar tokens are close. As in
the FOCUS paper and its reference implementation (deepfocus 1.0.1, ``fasttext_embs.py``), the
language's corpus is tokenised with the *new* tokenizer (tokens as strings, joined by spaces,
one line per sentence) and fastText is trained on that text, so every fastText "word" is a token.

Output directory (written atomically):

    fasttext.bin          the fastText model in fastText's own binary format (``fasttext.load_model``),
                          kept only with ``keep_model=True`` (config fasttext.keep_model): at the
                          default bucket count it is ~2.4 GB per language and FOCUS does not need it
    vectors.safetensors   ``vectors``: float32 [len(tokenizer), dim], row i = token id i;
                          ``mask``: bool [len(tokenizer)], True where the token has a vector
    report.json           parameters, corpus counts, coverage, seconds

Decisions, matching deepfocus where it has one:

- A token has a vector only if it is in fastText's vocabulary, i.e. it occurs at least
  ``min_count`` times in the tokenised corpus (deepfocus' ``is_very_rare_token``: ``token not in
  model`` or an all-zero vector). fastText could make up a vector for any string from its
  character n-grams, but deepfocus does not use those for unseen tokens and neither do we: FOCUS
  initialises such tokens at random. The vector of a token that *is* in the vocabulary is
  ``get_word_vector`` (its own vector averaged with its n-gram vectors), as deepfocus'
  ``model[token]``.
- fastText marks each line end with the word ``</s>``; a tokenizer whose vocabulary contains
  ``</s>`` (XLM-R's end-of-sequence token) therefore gets fastText's line-end vector for it, as in
  deepfocus.
- Defaults follow deepfocus' training call: CBOW (deepfocus: "CBOW is more closely aligned with
  Masked Language Modeling"), ``neg=10``, ``min_count=10``, 3 epochs; the dimension is 300 as in
  the paper's setup (deepfocus' default is 100). The other options are fastText's defaults,
  including ``bucket=2,000,000`` hashed n-gram rows: the .bin is (vocabulary + bucket) x dim
  float32, about 2.4 GB at dim 300, and saving it takes seconds (the training process itself
  stayed at 0.4-1.3 GB resident). Lower ``bucket`` for small runs.
- Small corpora need other settings than the paper's 10M sentences. Measured on the demo's German
  corpus (12,158 short lines, 8,000-token Unigram vocabulary, multilingual-e5-small base): with
  the defaults only 685 tokens get a vector and sparsemax keeps all 579 anchors in every
  combination (FOCUS degenerates to the anchors' mean); with ``min_count=3, epochs=30`` 3,552
  tokens get a vector and the combinations have 84 anchors on average (of 2,127); adding
  ``bucket=200_000`` gave the same figures with a 249 MB .bin instead of 2.4 GB (8 s instead of
  22 s). Too few buckets for a small corpus made CBOW diverge to NaN in some runs (5,000-20,000
  on 4,000 lines), which is reported as a RuntimeError.
- ``threads=1`` (the default) makes training deterministic: fastText's Python API always seeds its
  random generator with 0 (``train_unsupervised`` accepts no ``seed``). More threads are faster
  and not reproducible (fastText's lock-free parallel updates).
- Tokens containing a character fastText treats as a separator (space, tab, newline, vertical
  tab, form feed, carriage return, NUL) cannot be fastText words; they are left out of the
  tokenised text and get no vector.

The tokenised text is a temporary file inside the output's temporary directory (no cache in the
home directory) and is deleted before the directory is published.

fastText runs in a fresh Python process (``python -m modsent.modular.fasttext_embeddings JOB``) that
imports nothing but fastText, numpy and safetensors. Measured with fasttext-numpy2 0.10.4: one
training with ``threads=1`` gives the same vectors in every fresh process, but a second training
in the same process gives different vectors, and which one depends on what the process did
before (it behaves like a read of uninitialised memory); in a test process that had trained
tokenizers, a CBOW run even diverged to NaN where the same run in a fresh process did not.
The child process makes the result a function of the inputs only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from modsent.io import InputError, atomic_path, iter_utf8_lines, write_safetensors
from modsent.modular.tokenizer_training import load_tokenizer

log = logging.getLogger(__name__)

MODEL_NAME = "fasttext.bin"
VECTORS_NAME = "vectors.safetensors"
REPORT_NAME = "report.json"
#: Characters fastText splits words on (fastText's ``Dictionary::readWord``).
FASTTEXT_SEPARATORS = frozenset(" \t\n\v\f\r\0")


def vocab_fingerprint(tokenizer) -> str:
    """SHA-256 of the tokenizer's (token, id) pairs: ties vectors to the vocabulary they align with."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_tokenized_corpus(corpus_path: str | Path, tokenizer, out_path: str | Path, *,
                           max_sentences: int | None = None, batch_size: int = 1000) -> dict:
    """Tokenise each non-empty line with ``tokenizer`` (no special tokens) and write the tokens
    space-joined, one line per sentence. Returns counts: sentences, tokens, dropped tokens."""
    backend = tokenizer.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    sentences = tokens = dropped = 0

    def flush(batch: list[str], out) -> None:
        nonlocal tokens, dropped
        for encoding in backend.encode_batch(batch, add_special_tokens=False):
            kept = [t for t in encoding.tokens if t and FASTTEXT_SEPARATORS.isdisjoint(t)]
            dropped += len(encoding.tokens) - len(kept)
            tokens += len(kept)
            out.write(" ".join(kept) + "\n")

    with open(out_path, "w", encoding="utf-8") as out:
        batch: list[str] = []
        for _, line in iter_utf8_lines(corpus_path):
            if not line.strip():
                continue
            if max_sentences is not None and sentences >= max_sentences:
                break
            sentences += 1
            batch.append(line)
            if len(batch) == batch_size:
                flush(batch, out)
                batch = []
        if batch:
            flush(batch, out)
    return {"sentences": sentences, "tokens": tokens, "dropped_tokens": dropped}


def train_token_fasttext(
    corpus_path: str | Path,
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    dim: int = 300,
    epochs: int = 3,
    min_count: int = 10,
    threads: int = 1,
    *,
    model: str = "cbow",
    neg: int = 10,
    lr: float = 0.05,
    bucket: int = 2_000_000,
    minn: int = 3,
    maxn: int = 6,
    max_sentences: int | None = None,
    keep_model: bool = False,
) -> dict:
    """Train token-level fastText on ``corpus_path`` tokenised with the tokenizer in
    ``tokenizer_dir``; write ``out_dir`` (see the module docstring). Returns the report.

    fastText runs in a fresh Python process (see the module docstring: reproducibility).
    Raises InputError for a missing or empty corpus, invalid UTF-8 (file and line), or a corpus in
    which no token occurs ``min_count`` times; RuntimeError if fastText diverges (NaN).
    """
    corpus_path, out_dir = Path(corpus_path), Path(out_dir)
    if not corpus_path.is_file():
        raise InputError(f"{corpus_path}: corpus file not found")
    if model not in ("cbow", "skipgram"):
        raise InputError(f"fastText model must be 'cbow' or 'skipgram', not {model!r}")
    tokenizer = load_tokenizer(tokenizer_dir, "new tokenizer")
    params = {"model": model, "dim": dim, "epoch": epochs, "minCount": min_count, "neg": neg, "lr": lr,
              "thread": threads, "bucket": bucket, "minn": minn, "maxn": maxn}

    with atomic_path(out_dir, directory=True) as tmp:
        text_path = tmp / "tokenized.txt"
        start = time.perf_counter()
        counts = write_tokenized_corpus(corpus_path, tokenizer, text_path, max_sentences=max_sentences)
        tokenize_seconds = time.perf_counter() - start
        if counts["tokens"] == 0:
            raise InputError(f"{corpus_path}: the corpus is empty (no non-empty line); fastText needs text")
        log.info("tokenised %d sentences (%d tokens) in %.1f s; training fastText %s", counts["sentences"],
                 counts["tokens"], tokenize_seconds, params)
        fingerprint = vocab_fingerprint(tokenizer)
        start = time.perf_counter()
        result = _run_child(tmp, {
            "text": str(text_path), "params": params, "vocab": tokenizer.get_vocab(),
            "rows": len(tokenizer), "metadata": {"vocab_sha256": fingerprint, "dim": str(dim), "format": "np"},
        })
        train_seconds = time.perf_counter() - start
        error = result.get("error")
        if error == "empty_vocabulary":
            raise InputError(
                f"{corpus_path}: no token occurs min_count={min_count} times in the "
                f"{counts['sentences']} tokenised sentences; use a larger corpus or a lower min_count"
            )
        if error == "nan":
            raise RuntimeError(f"fastText diverged (NaN) on {corpus_path} with {params}; try a lower lr, "
                               f"a larger bucket or more text")
        if error:
            raise RuntimeError(f"fastText training failed on {corpus_path}: {result['message']}")
        text_path.unlink()
        if not keep_model:
            # FOCUS reads vectors.safetensors only; the .bin is (vocab + bucket) x dim floats
            (tmp / MODEL_NAME).unlink(missing_ok=True)
        report = {
            "model_kept": keep_model,
            "corpus": str(corpus_path),
            "tokenizer": str(tokenizer_dir),
            "vocab_sha256": fingerprint,
            "fasttext": params,
            **counts,
            "vocab_size": len(tokenizer),
            "fasttext_words": result["fasttext_words"],
            "tokens_with_vector": result["tokens_with_vector"],
            "tokens_without_vector": len(tokenizer) - result["tokens_with_vector"],
            "seconds_tokenize": round(tokenize_seconds, 3),
            "seconds_train": round(train_seconds, 3),
        }
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("fastText: %d of %d tokens have a vector (%.1f s) -> %s", report["tokens_with_vector"],
             report["vocab_size"], train_seconds, out_dir)
    return report


def _run_child(work_dir: Path, job: dict) -> dict:
    """Run :func:`_child_main` in a fresh interpreter on ``job``; return its result dict."""
    job_path, result_path = work_dir / "fasttext_job.json", work_dir / "fasttext_result.json"
    job["result"] = str(result_path)
    job["out_dir"] = str(work_dir)
    job_path.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # so the child imports this modsent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    try:
        process = subprocess.run([sys.executable, "-m", __name__, str(job_path)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not result_path.is_file():
            raise RuntimeError(f"the fastText process ended with status {process.returncode} and no "
                               f"result; its output:\n{process.stdout[-4000:]}")
        return json.loads(result_path.read_text(encoding="utf-8"))
    finally:
        job_path.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)


def _child_main(job_path: str) -> None:
    """In the fresh process: train fastText, save the .bin and the vectors, write the result."""
    import fasttext

    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    out_dir = Path(job["out_dir"])
    try:
        ft = fasttext.train_unsupervised(job["text"], verbose=0, **job["params"])
    except (ValueError, RuntimeError) as err:
        message = str(err)
        kind = ("empty_vocabulary" if "empty vocabulary" in message.lower()
                else "nan" if "nan" in message.lower() else "other")
        result = {"error": kind, "message": message}
    else:
        vectors, mask = token_vectors(ft, job["vocab"], job["rows"])
        write_safetensors({"vectors": vectors, "mask": mask}, out_dir / VECTORS_NAME, job["metadata"])
        ft.save_model(str(out_dir / MODEL_NAME))
        result = {"fasttext_words": len(ft.words), "tokens_with_vector": int(mask.sum())}
    Path(job["result"]).write_text(json.dumps(result), encoding="utf-8")


def token_vectors(ft, vocab: dict[str, int], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(vectors float32 [rows, dim], mask bool [rows]) from a fastText model, row i = token id i.

    Only tokens in fastText's vocabulary with a non-zero vector count (deepfocus' rule); other
    rows are zero with mask False.
    """
    words = set(ft.words)
    vectors = np.zeros((rows, ft.get_dimension()), dtype=np.float32)
    mask = np.zeros(rows, dtype=bool)
    for token, index in vocab.items():
        if token in words:
            vector = ft.get_word_vector(token)
            if np.abs(vector).sum() > 0:
                vectors[index], mask[index] = vector, True
    return vectors, mask


def load_token_vectors(fasttext_dir: str | Path, tokenizer=None) -> tuple[np.ndarray, np.ndarray]:
    """Read ``vectors.safetensors``; with ``tokenizer``, check it is the vocabulary they align with."""
    from safetensors import safe_open

    path = Path(fasttext_dir) / VECTORS_NAME
    if not path.is_file():
        raise InputError(f"{path}: not found (expected the output of train_token_fasttext)")
    with safe_open(str(path), framework="np") as handle:
        metadata = handle.metadata() or {}
        vectors, mask = handle.get_tensor("vectors"), handle.get_tensor("mask")
    if tokenizer is not None:
        fingerprint = vocab_fingerprint(tokenizer)
        if metadata.get("vocab_sha256") != fingerprint or len(mask) != len(tokenizer):
            raise InputError(
                f"{path}: the vectors were made for another vocabulary ({len(mask)} rows, vocab "
                f"sha256 {metadata.get('vocab_sha256', '?')[:12]}) than the tokenizer "
                f"{tokenizer.name_or_path} ({len(tokenizer)} tokens, sha256 {fingerprint[:12]})"
            )
    return vectors, mask


if __name__ == "__main__":
    _child_main(sys.argv[1])
