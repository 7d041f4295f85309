"""The evaluation's encoding on the CPU: sentences sorted by characters or by tokens, side by side.

    python benchmarks/encode_order.py                                 # the built-in base model
    python benchmarks/encode_order.py --model resources/base_models/me5-small \\
        --tokenizers results/me5-small/tokenizers                     # after the demo: its tokenizers

Every system of the evaluation encodes each language's sentences through
modsent.training.loop.encode_in_batches: batches of the longest sentences first, each padded to
its longest. The padding a batch carries depends on how well the sort key predicts the model's
token count. This times one encoding pass of the built-in multilingual-e5-small (one thread, as
an evaluation job runs) over each language's built-in held-out parallel sentences, the sentences
of the demo's bitext mining and topic classification, in the order of each sort key and at
each batch size, with the base model's tokenizer or (``--tokenizers``) each language's own, as
the demo's modular systems tokenise: the base model's weights then take the new pieces' ids,
which costs the same arithmetic. Prints, per language, tokenizer, order and batch size: the
share of padded positions, sentences/s (the median of ``--repeat`` passes after an untimed one)
and the ratio against the order and batch the evaluation took before
(characters, ``--reference-batch``), measured in the same run. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def load_model(model_dir: str | None):
    """The SentenceTransformer at ``model_dir``, or the built-in base model converted into a
    temporary directory (the demo's ``base_model`` rule, offline)."""
    from sentence_transformers import SentenceTransformer

    if model_dir is None:
        from modsent.encoders.base_models import prepare_base_model

        model_dir = Path(tempfile.mkdtemp(prefix="encode-order-")) / "me5-small"
        prepare_base_model("builtin:multilingual-e5-small", model_dir)
    return SentenceTransformer(str(model_dir), device="cpu")


def encoder_for(model, tokenizer):
    """(prepare, forward, count) for encode_in_batches: ``tokenizer``'s padded batches through
    ``model``'s modules (its transformer, pooling and normalisation)."""
    from modsent.training.loop import token_counts

    max_length = model.max_seq_length

    def prepare(texts):
        return dict(tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                              return_tensors="pt"))

    def forward(features):
        return model(dict(features))["sentence_embedding"]

    def count(texts):
        return token_counts(prepare(texts))

    return prepare, forward, count


def main() -> None:
    from transformers import AutoTokenizer

    from modsent.sources.builtin import DEMO_LANGUAGES, builtin_parallel_eval
    from modsent.training.loop import encode_in_batches, encoding_order

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a SentenceTransformer directory (default: the built-in base model)")
    parser.add_argument("--tokenizers", help="a directory with one tokenizer per language ({lang}/), "
                                             "as the tokenizer rule writes them")
    parser.add_argument("--languages", nargs="+", default=list(DEMO_LANGUAGES))
    parser.add_argument("--batch-size", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--reference-batch", type=int, default=64,
                        help="the batch size of the reference row (characters): the CPU default before")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    model.eval()
    frame = builtin_parallel_eval(args.languages)
    sizes = sorted(set(args.batch_size) | {args.reference_batch})
    print(f"multilingual-e5-small ({args.model or 'built-in'}), CPU, {args.threads} thread(s); torch "
          f"{torch.__version__}; the built-in held-out parallel sentences ({len(frame)} per language)")
    print("ratio: sentences/s against 'chars' at the reference batch of the same language and tokenizer")
    print(f"{'lang':4} {'tokenizer':9} {'order':6} {'batch':>5} {'padding':>8} {'sent/s':>8} {'ratio':>6}")
    for lang in args.languages:
        sentences = frame[lang].tolist()
        tokenizers = {"base": model.tokenizer}
        if args.tokenizers:
            tokenizers[lang] = AutoTokenizer.from_pretrained(str(Path(args.tokenizers) / lang))
        for name, tokenizer in tokenizers.items():
            prepare, forward, count = encoder_for(model, tokenizer)
            tokens = count(sentences).tolist()
            rows = {}
            for order in ("chars", "tokens"):
                key = count if order == "tokens" else None
                sorted_tokens = [tokens[i] for i in encoding_order(sentences, key)]
                for batch in sizes:
                    padded = sum(max(sorted_tokens[k:k + batch]) * len(sorted_tokens[k:k + batch])
                                 for k in range(0, len(sorted_tokens), batch))
                    times = []
                    with torch.inference_mode():
                        for i in range(args.repeat + 1):
                            start = time.perf_counter()
                            encode_in_batches(sentences, batch, prepare, forward, count=key)
                            if i:
                                times.append(time.perf_counter() - start)
                    rows[order, batch] = (1 - sum(tokens) / padded, len(sentences) / statistics.median(times))
            reference = rows["chars", args.reference_batch][1]
            for (order, batch), (padding, rate) in rows.items():
                print(f"{lang:4} {name:9} {order:6} {batch:5d} {padding:8.1%} {rate:8.1f} {rate / reference:6.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
