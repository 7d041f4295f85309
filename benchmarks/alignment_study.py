"""The cross-lingual alignment (CLA) stage in isolation, on a finished demo run: why the demo's
pp and pl adapters raise bitext-mining error, and what lowers it.

    python -m benchmarks.alignment_study --run DIR [--languages de zh ky] [--out FILE] [--quick]

DIR is a directory where ``./run demo`` (or ``snakemake --configfile config.yaml``) finished:
its ``resources/base_models/{base}``, the LAs and SE adapters under ``results/{base}``, the
English embeddings the CLA jobs trained against and the evaluation's cached English vectors.

1. Checks that the English vectors the CLA adapters were trained against equal the English
   vectors the evaluation mines with (``results/{base}/eval/embeddings/modular/en/Mod_m``), and
   both equal a fresh encoding by the English LA + SE (``ModularEncoder``, the evaluation's
   path): a mismatch there would make alignment pull L towards the wrong targets.
2. Trains pp and pl adapters of each language with the demo's settings and variations of one
   thing at a time: learning rate, the adapter's scaling, the data (the ~270 translations of the
   paraphrase data; plus N of the built-in human translations; all of them; MNRL instead of the
   cosine loss on them) and the number of epochs.
3. Scores each adapter on the built-in held-out parallel data as the evaluation does: xsim error
   (ratio margin, k = 4, the mean of English→L and L→English) against the evaluation's English
   vectors; and two diagnostics: the L embeddings' spread (mean pairwise cosine; 1 = all equal)
   and the mean cosine of each sentence with its own translation.

Prints one table (and writes it to ``--out``); minutes on 2 CPU cores (``--quick``: the demo
settings and the 1,500-pair data only).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from modsent.data.paraphrase import crosslingual_paraphrase_pairs, parallel_pairs, provided_sample
from modsent.evaluation import metrics
from modsent.modular import alignment as al
from modsent.sources.builtin import builtin_parallel_eval, builtin_translations

# the demo's CLA settings (config.yaml before the study)
DEMO = {"batch_size": 16, "learning_rate": 1e-3, "epochs": 1, "eval_pairs": 30, "log_every": 1000,
        "checkpoint_every": 1_000_000}


def _mean_pairwise_cosine(x: np.ndarray) -> float:
    return al.mean_pairwise_cosine(x)


class Study:
    def __init__(self, run: Path, base: str, work: Path):
        self.run, self.work = run, work
        self.base_dir = run / "resources" / "base_models" / base
        self.results = run / "results" / base
        self.eval = builtin_parallel_eval()
        frame = pd.read_parquet(self.results / "eval/embeddings/modular/en/Mod_m/builtin_parallel.parquet")
        self.english_eval = dict(zip(frame["text"], np.stack(frame["embedding"].to_numpy()).astype(np.float32)))
        self.english_file = work / "english.safetensors"

    def modules(self, lang):
        return self.results / "language_adapters" / lang, self.results / "sentence_adapters" / lang

    def check_english_targets(self) -> list[str]:
        """Training targets vs evaluation vectors vs a fresh encoding (max |difference|)."""
        from modsent.encoders.modular import ModularEncoder

        stored = al.read_english_embeddings(self.results / "alignment/english_embeddings.safetensors")
        units = pd.read_parquet(self.results / "alignment/english_embeddings.units.parquet")["text"].tolist()
        encoder = ModularEncoder(self.base_dir, device="cpu")
        la, se = self.modules("en")
        encoder.add_language("en", language_adapter=la, sentence_adapter=se)
        fresh_units = encoder.encode(units, "en")
        texts = [t for t in self.eval["en"] if isinstance(t, str) and t]
        fresh_eval = encoder.encode(texts, "en")
        cached = np.stack([self.english_eval[t] for t in texts])
        return [
            f"English targets of CLA training vs a fresh encoding (ModularEncoder, {len(units)} sentences): "
            f"max |diff| {np.abs(stored.lookup(units).numpy() - fresh_units).max():.2e}",
            f"evaluation's cached English vectors vs a fresh encoding ({len(texts)} sentences): "
            f"max |diff| {np.abs(cached - fresh_eval).max():.2e}",
        ]

    def embed_english(self, languages):
        """One English embeddings file for every English text any variation trains on."""
        texts = pd.read_parquet(self.results / "alignment/english_embeddings.units.parquet")["text"].tolist()
        for lang in languages:
            texts += builtin_translations(lang)["english"].tolist()
        la, se = self.modules("en")
        al.embed_english(self.base_dir, la, se, texts, self.english_file, device="cpu")

    def data(self, kind, lang, provided):
        if kind == "pp":
            return crosslingual_paraphrase_pairs(pd.read_parquet(self.run / "results/paraphrase/en.parquet"),
                                                 pd.read_parquet(self.run / f"results/paraphrase/{lang}.parquet"))
        translations = pd.read_parquet(self.run / f"results/translation/{lang}.parquet")
        if provided == 0:
            return parallel_pairs(translations)
        sample = provided_sample(builtin_translations(lang), None if provided == "all" else provided)
        return parallel_pairs(translations, sample)

    def score(self, lang, cla_dir) -> dict:
        present = lambda t: isinstance(t, str) and bool(t)  # noqa: E731
        rows = self.eval[self.eval["en"].map(present) & self.eval[lang].map(present)]
        english = np.stack([self.english_eval[t] for t in rows["en"]])
        la, se = self.modules(lang)
        encoder = al.load_aligned_encoder(self.base_dir, la, se, cla_dir, device="cpu")
        vectors = encoder.encode(rows[lang].tolist())
        xsim = (metrics.xsim_error_rate(english, vectors) + metrics.xsim_error_rate(vectors, english)) / 2
        return {"xsim": 100 * xsim, "spread": _mean_pairwise_cosine(vectors),
                "pair_cos": float((english * vectors).sum(axis=1).mean())}

    def train(self, name, kind, lang, provided=0, objective=None, **settings) -> dict:
        adapter = settings.pop("adapter", {})
        cfg = al.AlignmentConfig.from_config({**DEMO, **settings, "adapter": adapter})
        data = self.data(kind, lang, provided)
        if objective == "pp":  # MNRL on the parallel pairs
            data = pd.DataFrame({"anchor": data["english"], "positive": data["translation"]})
            kind = "pp"
        out = self.work / f"{name}-{lang}"
        start = time.perf_counter()
        m = al.train_alignment_adapter(kind, self.base_dir, *self.modules(lang), data, self.english_file, out, cfg,
                                       language=lang, device="cpu", progress=False)
        return {"variation": name, "lang": lang, "pairs": m["train_pairs"], "steps": m["steps"],
                "seconds": time.perf_counter() - start, **self.score(lang, out)}


VARIATIONS = [
    # name, kind, keyword arguments of Study.train
    ("pp demo", "pp", {}),
    ("pp lr 1e-4", "pp", {"learning_rate": 1e-4}),
    ("pl demo", "pl", {}),
    ("pl lr 1e-4", "pl", {"learning_rate": 1e-4}),
    ("pl scaling 1", "pl", {"adapter": {"scaling": 1.0}}),
    ("pl +1500 human", "pl", {"provided": 1500}),
    ("pl +1500 human, 2 epochs", "pl", {"provided": 1500, "epochs": 2}),
    ("pl +all human", "pl", {"provided": "all"}),
    ("pl +all human, 3 epochs", "pl", {"provided": "all", "epochs": 3}),
    ("MNRL on pl +all human", "pl", {"provided": "all", "objective": "pp"}),
]
QUICK = ("pp demo", "pl demo", "pl +1500 human")


def plot(report: dict, out_png: Path) -> None:
    """Mining error and spread of every pl variation against its steps, one line per language
    (the demo's variations at the left, more data and epochs to the right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for lang, base in report["baselines"].items():
        runs = sorted((r for r in report["runs"] if r["lang"] == lang and r["variation"].startswith("pl")
                       and "lr" not in r["variation"] and "scaling" not in r["variation"]),
                      key=lambda r: r["steps"])
        steps = [0] + [r["steps"] for r in runs]
        line, = axes[0].plot(steps, [base["xsim"]] + [r["xsim"] for r in runs], marker="o", label=lang)
        axes[1].plot(steps, [base["spread"]] + [r["spread"] for r in runs], marker="o", color=line.get_color(),
                     label=lang)
    axes[0].set(xscale="symlog", xlabel="pl steps (0: Mod_m)", ylabel="xsim error % (lower is better)",
                title="Bitext mining vs. alignment steps")
    axes[1].set(xscale="symlog", xlabel="pl steps (0: Mod_m)", ylabel="mean pairwise cosine of L",
                title="Spread of L's embeddings (1 = collapsed)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a directory where the demo finished")
    parser.add_argument("--base", default="me5-small")
    parser.add_argument("--languages", nargs="+", default=["de", "zh", "ky"])
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument("--quick", action="store_true", help="the demo settings and +1500 human pairs only")
    parser.add_argument("--quick-languages", nargs="*", default=[],
                        help="languages (among --languages) that get the --quick variations only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of error and spread against pl steps")
    parser.add_argument("--plot-from", type=Path, default=None,
                        help="only draw --plot from a report this script wrote (its last line)")
    args = parser.parse_args(argv)
    if args.plot_from:
        plot(json.loads(args.plot_from.read_text().strip().splitlines()[-1]), args.plot or Path("alignment-study.png"))
        return 0
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    lines = [f"# CLA study on {args.run} ({args.base}), {torch.get_num_threads()} CPU threads", ""]
    with tempfile.TemporaryDirectory() as tmp:
        study = Study(args.run, args.base, Path(tmp))
        lines += study.check_english_targets()
        print("\n".join(lines), flush=True)
        study.embed_english(args.languages)
        header = ("| variation | lang | pairs | steps | xsim err % | Δ vs Mod_m | L spread | pair cos | s |\n"
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|")
        lines += ["", header]
        print(header, flush=True)
        rows = []
        baselines = {}
        for lang in args.languages:
            baselines[lang] = study.score(lang, None)
            b = baselines[lang]
            line = f"| Mod_m (no CLA) | {lang} | | | {b['xsim']:.1f} | | {b['spread']:.3f} | {b['pair_cos']:.3f} | |"
            lines.append(line)
            print(line, flush=True)
        variations = [v for v in VARIATIONS if not args.quick or v[0] in QUICK]
        for name, kind, kwargs in variations:
            for lang in args.languages:
                if lang in args.quick_languages and name not in QUICK:
                    continue
                r = study.train(name, kind, lang, **kwargs)
                rows.append(r)
                line = (f"| {name} | {lang} | {r['pairs']} | {r['steps']} | {r['xsim']:.1f} | "
                        f"{r['xsim'] - baselines[lang]['xsim']:+.1f} | {r['spread']:.3f} | {r['pair_cos']:.3f} | "
                        f"{r['seconds']:.0f} |")
                lines.append(line)
                print(line, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n" + json.dumps({"baselines": baselines, "runs": rows}) + "\n")
    if args.plot:
        plot({"baselines": baselines, "runs": rows}, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
