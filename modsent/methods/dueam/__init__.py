"""DuEAM, the dual encoder with an anchor model: every weight of a multilingual encoder trained
with a word-mover's-distance anchor term and a cosine term, without negatives.

    L = L_A - lambda * L_B
    L_A = mean_i exp(|exp(-d_euc,i) - exp(-d_wmd,i)|)     d_euc = ||s'_i - t'_i||_2
    L_B = mean_i cos(s'_i, t'_i)                          lambda = 0.003

s'_i, t'_i are the learner's unnormalised mean-pooled vectors of a pair's two texts (one shared,
Siamese encoder); d_wmd is the exact earth mover's distance between the frozen anchor model's
token states of the two texts (:mod:`modsent.methods.dueam.wmd`), a constant per pair,
computed once in its own workflow stage and cached by content. The losses are
:class:`modsent.losses.DuEAMLoss` and its two terms.

Registered systems (a config enables any of them under ``methods:``):

    DuEAM-weak      weakly supervised pairs: the real premise/hypothesis pairs of XNLI (the
                    ``mnli`` rows: anchor + positive, and anchor + negative, the contradiction;
                    the labels are not used), mono (en-en, X-X) and cross-lingual (English
                    premise + X hypothesis, and the reverse)                  joint loss
    DuEAM-unsup     the same pairs randomly re-paired (no supervision)        joint loss
    DuEAM-parallel  English sentence + its translation (the translations)    joint loss
    DuEAM-LA-only   weak pairs, L_A alone                                     the paper's Fig. 2
    DuEAM-LB-only   weak pairs, -L_B alone                                    ablations

They differ only in the defaults of ``data`` and ``objective``. Pairs
(:mod:`modsent.methods.dueam.pairs`) are a pure function of the pair and translation files and
the settings, so the WMD stage and the training see exactly the same pairs.

Workflow: ``rules/methods/dueam.smk`` computes the WMD of a method's pairs in ``wmd_shards``
jobs, ``results/{base}/methods/DuEAM.wmd/{digest}/{i}-of-{n}.parquet`` (``digest``: a hash of
the settings that decide the pairs and their distances, so methods that share them, DuEAM-weak
and its loss ablations, share the jobs; a pair's shard: a hash of its pair id), each reading and
extending the content-addressed cache ``results/{base}/methods/DuEAM.wmd/cache/`` (a rerun, or
new shard files over known pairs, computes nothing again); :meth:`Method.extra_inputs` hands
the shard files to the training job as ``inputs["wmd"]``. The trained system is a plain
sentence-transformers directory (transformer + mean pooling), ``results/{base}/methods/{name}``.

This module imports nothing heavy: the workflow imports it while planning.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from modsent import layout
from modsent.languages import PIVOT_LANGUAGE
from modsent.methods import Method, register
from modsent.methods.dueam.settings import (ANCHOR_KEYS, DATA, GROUND_COSTS, LAMBDA, OBJECTIVES, PAIR_KEYS,
                                            SPECIAL_TOKENS, TOKEN_WEIGHTS, DuEAMConfig, anchor_is_base,
                                            uses_translations, wmd_job_settings)
from modsent.schema import (ROLE_KEY, RUNTIME, compile_property, length_groups_property, precision_property,
                            storage_dtype_property)

__all__ = ["ANCHOR_KEYS", "DATA", "GROUND_COSTS", "LAMBDA", "OBJECTIVES", "PAIR_KEYS", "SPECIAL_TOKENS",
           "TOKEN_WEIGHTS", "VARIANTS", "WMD_CACHE", "WMD_DIGEST", "WMD_SHARD", "anchor_is_base",
           "settings_schema", "uses_translations", "wmd_cache_dir", "wmd_config", "wmd_digest", "wmd_inputs",
           "wmd_job_settings", "wmd_settings_of", "wmd_shard_paths"]

# where the WMD shards and the cache live: under a directory of the results tree named like no
# configurable method (a name with a dot and "wmd"), one folder per distinct set of WMD settings
# ({wmd}: their digest), so methods with the same pairs and anchor (DuEAM-weak and its loss
# ablations) share the jobs and files; the cache beside them (Snakemake deletes a job's outputs
# before it runs, so the cache must not be one)
WMD_ROOT = f"{layout.RESULTS}/{layout.METHODS}/DuEAM.wmd"
WMD_SHARD = WMD_ROOT + "/{wmd}/{shard}-of-{shards}.parquet"
WMD_CACHE = WMD_ROOT + "/cache"
WMD_DIGEST = r"[0-9a-f]{12}"

_COUNT = {"type": "integer", "minimum": 1}
_OPTIONAL_NAME = {"oneOf": [{"type": "null"}, {"type": "string", "minLength": 1}], "default": None}


def settings_schema(*, data: str, objective: str) -> dict[str, dict]:
    """The JSON-schema properties of a DuEAM method's settings, with the variant's defaults
    (the paper's: 5 epochs, batch 64, 10K warm-up steps, lr 2e-5, lambda 0.003)."""
    return {
        "data": {"enum": list(DATA), "default": data,
                 "description": "the training pairs: weak (each pair id's anchor/positive in every language, "
                                "mono and English<->X), unsup (those pairs randomly re-paired), parallel "
                                "(English sentence + its translation), weak+parallel (both)"},
        "objective": {"enum": list(OBJECTIVES), "default": objective,
                      "description": "joint: L_A - lambda L_B; LA: L_A alone; LB: -L_B alone (ablations)"},
        "lambda": {"type": "number", "minimum": 0, "default": LAMBDA,
                   "description": "weight of the cosine term L_B in the joint loss (paper: 0.003)"},
        "model": {**_OPTIONAL_NAME,
                  "description": "the encoder to train: null = the workflow's base model; else a Hub id "
                                 "(FacebookAI/xlm-roberta-base) or a local model directory (safetensors)"},
        "revision": {**_OPTIONAL_NAME, "description": "Hub revision of model"},
        "anchor_model": {**_OPTIONAL_NAME,
                         "description": "the frozen anchor whose token states give the WMD: null = the "
                                        "model the learner starts from (the paper)"},
        "anchor_revision": {**_OPTIONAL_NAME, "description": "Hub revision of anchor_model"},
        "anchor_layer": {"type": "integer", "default": -1,
                         "description": "the anchor's hidden state used as token vectors: -1 = the last "
                                        "layer, 0 = the embeddings, i = after layer i"},
        "token_weights": {"enum": list(TOKEN_WEIGHTS), "default": "uniform",
                          "description": "the mass of each token in the transport: uniform, or idf "
                                         "(MoverScore's, over the distinct texts of the method's pairs)"},
        "special_tokens": {"enum": list(SPECIAL_TOKENS), "default": "drop",
                           "description": "the anchor's special tokens (<s>, </s>, [CLS], [SEP]): dropped "
                                          "or kept as tokens of the text"},
        "normalize_tokens": {"type": "boolean", "default": True,
                             "description": "L2-normalise each token vector before the ground cost"},
        "ground_cost": {"enum": list(GROUND_COSTS), "default": "euclidean",
                        "description": "cost of moving one token onto another: euclidean (as MoverScore), "
                                       "sqeuclidean, or cosine (1 - cos)"},
        "anchor_max_length": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 3}], "default": None,
                              "description": "tokens per text for the anchor: null = the anchor's own limit; "
                                             "longer texts are truncated and counted"},
        "datasets": {"oneOf": [{"type": "null"},
                               {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"}}],
                     "default": ["mnli"],
                     "description": "the paraphrase datasets (the pair files' dataset column) whose "
                                    "anchor/positive pairs are used (XNLI premise/hypothesis: mnli); null: all rows"},
        "contradictions": {"type": "boolean", "default": True,
                           "description": "weak pairs: each anchor also paired with its row's negative (an NLI "
                                          "row's contradiction), as the paper trains on XNLI's premise/hypothesis "
                                          "pairs with the labels dropped; false: anchor/positive pairs only"},
        "max_pairs": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                      "description": "at most this many training pairs (a seeded sample; with "
                                     "weak+parallel, of each part); null: all"},
        "eval_pairs": {"type": "integer", "minimum": 0, "default": 500,
                       "description": "held-out pairs (the English pairs' ids, held out in every language) "
                                      "for retrieval accuracy and cosine spread before and after"},
        "learning_rate": {"type": "number", "exclusiveMinimum": 0, "default": 2e-5,
                          "description": "peak AdamW learning rate (paper: 2e-5)"},
        "batch_size": {"type": "integer", "minimum": 1, "default": 64, "description": "pairs per batch (paper: 64)"},
        "epochs": {**_COUNT, "default": 5, "description": "passes over the pairs (paper: 5)"},
        "max_steps": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                      "description": "if set, replaces epochs: this many steps"},
        "warmup_steps": {"type": "integer", "minimum": 0, "default": 10000,
                         "description": "linear warm-up steps, then linear decay to zero (paper: 10K)"},
        "weight_decay": {"type": "number", "minimum": 0, "default": 0.01,
                         "description": "AdamW weight decay of the weight matrices"},
        "max_grad_norm": {"type": "number", "exclusiveMinimum": 0, "default": 1.0},
        "seq_len": {"type": "integer", "minimum": 3, "default": 128,
                    "description": "the learner's maximum tokens per text (longer texts are truncated and counted)"},
        "seed": {"type": "integer", "minimum": 0, "default": 0,
                 "description": "the unsupervised re-pairing, the max_pairs sample, batches and dropout"},
        "precision": precision_property(),
        "compile": compile_property(),
        "storage_dtype": storage_dtype_property(),
        "length_groups": length_groups_property("each kind of pair (mono, cross, parallel, random) in each pair "
                                                "of languages; DuEAM has no in-batch negatives, so only the padding "
                                                "and the order change"),
        "wmd_shards": {**_COUNT, "default": 1,
                       "description": "WMD jobs per method (each a share of the pair ids); a new count "
                                      "makes new shard files (from the cache: nothing is recomputed) and "
                                      "retrains"},
        "wmd_batch_size": {**_COUNT, "default": 64, ROLE_KEY: RUNTIME,
                           "description": "texts per forward pass of the anchor"},
        "log_every": {**_COUNT, "default": 10, ROLE_KEY: RUNTIME, "description": "steps between logged losses"},
        "checkpoint_every": {**_COUNT, "default": 2000, ROLE_KEY: RUNTIME,
                             "description": "optimizer steps between resumable checkpoints ({out}.checkpoint/: "
                                            "every weight and the AdamW moments, ~3x the model)"},
    }


def wmd_digest(settings: Mapping) -> str:
    """The folder name of a method's WMD shards: a digest of the settings that decide them."""
    text = json.dumps(wmd_job_settings(settings), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def wmd_shard_paths(base: str, settings: Mapping) -> list[str]:
    """The WMD shard files of a method with ``settings`` (``wmd_shards`` of them)."""
    shards = int(settings.get("wmd_shards", 1))
    return [WMD_SHARD.format(base=base, wmd=wmd_digest(settings), shard=i, shards=shards) for i in range(shards)]


def wmd_cache_dir(base: str) -> str:
    """The content-addressed WMD cache of one results tree."""
    return WMD_CACHE.format(base=base)


def wmd_settings_of(methods_config: Mapping[str, Mapping], digest: str) -> dict:
    """The WMD settings (:func:`wmd_job_settings`) of the configured DuEAM methods whose
    digest is ``digest``, and their names (``methods_config``: the config's ``methods``). A seed
    replicate's WMD jobs (config ``seeds``: every seed plus r, which decides the pairs) are found
    too: the digest names the settings of one replicate."""
    from modsent.config import replicate_methods

    for replicate in range(MAX_SEED_REPLICATES):
        methods = replicate_methods(dict(methods_config), replicate)
        names = [name for name, settings in methods.items()
                 if name in VARIANTS and wmd_digest(settings) == digest]
        if names:
            return {"settings": wmd_job_settings(methods[names[0]]), "methods": names}
    raise ValueError(f"no configured DuEAM method has WMD settings of digest {digest}")


MAX_SEED_REPLICATES = 100  # the schema's maximum of seeds


def wmd_config(methods_config: Mapping[str, Mapping], digest: str) -> tuple[list[str], "DuEAMConfig"]:
    """(the configured DuEAM methods whose WMD settings have ``digest``, the config a WMD job of
    theirs runs with): the WMD settings and the WMD job's own runtime key (``wmd_batch_size``;
    the training's ``gpus``, ``log_every`` and ``checkpoint_every`` are not its business)."""
    found = wmd_settings_of(methods_config, digest)
    name = found["methods"][0]
    runtime = {key: value for key, value in methods_config[name].items() if key == "wmd_batch_size"}
    return found["methods"], DuEAMConfig.from_settings(name, {**found["settings"], **runtime})


def wmd_inputs(settings: Mapping, base: str, languages: Sequence[str]) -> dict[str, str | list[str]]:
    """The WMD jobs' inputs: every language's pair file, the translations of the non-English
    languages when the data uses them, and the base model when it is the anchor."""
    inputs: dict[str, str | list[str]] = {"pairs": [layout.pairs(lang) for lang in languages]}
    if uses_translations(settings):
        inputs["translations"] = [layout.translations(lang) for lang in languages if lang != PIVOT_LANGUAGE]
    if anchor_is_base(settings):
        inputs["base"] = layout.base_model(base)
    return inputs


def _trainer(name: str, schema: dict[str, dict]):
    defaults = {key: value["default"] for key, value in schema.items()}

    def train(inputs: dict, out_dir, settings: dict, *, device=None, progress=True) -> dict:
        from modsent.methods.dueam import training

        return training.train_dueam(name, inputs, out_dir, {**defaults, **settings}, device=device,
                                    progress=progress)

    return train


def _extra_inputs(base: str, settings: Mapping, languages: Sequence[str]) -> dict[str, list[str]]:
    return {"wmd": wmd_shard_paths(base, settings)}


VARIANTS = {  # name: (description, data, objective)
    "DuEAM-weak": ("DuEAM: every weight, L_A (WMD anchor) - 0.003 L_B (cosine) on weakly supervised "
                   "premise/hypothesis pairs, mono and cross-lingual", "weak", "joint"),
    "DuEAM-unsup": ("DuEAM: every weight, L_A - 0.003 L_B on randomly re-paired sentences", "unsup", "joint"),
    "DuEAM-parallel": ("DuEAM: every weight, L_A - 0.003 L_B on English sentences and their translations",
                       "parallel", "joint"),
    "DuEAM-LA-only": ("DuEAM ablation: the WMD anchor loss L_A alone, weak pairs", "weak", "LA"),
    "DuEAM-LB-only": ("DuEAM ablation: the cosine term L_B alone, weak pairs", "weak", "LB"),
}

for _name, (_description, _data, _objective) in VARIANTS.items():
    _schema = settings_schema(data=_data, objective=_objective)
    register(Method(_name, _description, _trainer(_name, _schema), ("base", "pairs", "translations"), _schema,
                    extra_inputs=_extra_inputs, data_parallel=True, family="DuEAM"))
