"""m-ST5, Multilingual Sentence-T5 (LREC-COLING 2024): the encoder of mT5, frozen,
with LoRA trained by SimCSE's triplet InfoNCE on NLI triplets (premise, entailment,
contradiction), and mean pooling over the real tokens.

Four registered systems, the four m-ST5 rows of the paper's Table 1:

    mST5-xnli       cross-lingual triplets, LoRA on q+v          lr 5e-5
    mST5-en         English triplets only, LoRA on q+v           lr 5e-4
    mST5-xnli-all   cross-lingual triplets, LoRA on every linear  lr 5e-5
    mST5-en-all     English triplets only, LoRA on every linear   lr 5e-4

The variants differ only in defaults: ``targets`` ("qv" or "all-linear") and ``learning_rate``
are settings, so any variant can be configured as any other; the separate names exist so that
one results tree can hold several of them (a method's name is its summary row and directory).
Likewise ``model`` chooses the encoder: null trains on the workflow's base model (any
sentence-transformers encoder: its pooling is kept), a Hub id or local directory names a
T5/mT5/UMT5 checkpoint (the paper: google/mt5-large, -xl, -xxl) or any encoder-only model. One
model size per method name: a scaling study runs one config (or results tree) per size.

Data (:mod:`modsent.methods.mst5.training`): the ``mnli`` rows (setting ``datasets``) of the
multi-parallel paraphrase files, whose pairs are (premise, entailment, contradiction) in every
language. Cross-lingual triplets are built the mSimCSE way: for every pair id and every language
L, the premise in L, its entailment in a random language and its contradiction in a random
language; English-only triplets are the English rows, those of the datasets that are not
translated included (``paraphrases.{name}.english_only``: SNLI, for the paper's English SNLI +
MNLI set) when ``datasets`` names them or is null. Batches never hold two triplets of one pair id (they
would be each other's false negatives).

Output: ``results/{base}/methods/{name}/``, the LoRA merged into the encoder, saved as a plain
sentence-transformers directory with ``metrics.json`` and the loss curve.

This module imports nothing heavy: the workflow imports it while planning; ``train`` imports
the training code.
"""

from __future__ import annotations

from modsent.methods import Method, register
from modsent.schema import (ROLE_KEY, RUNTIME, compile_property, length_groups_property, precision_property,
                            storage_dtype_property)

TARGETS = ("qv", "all-linear")
DATASETS = ["mnli"]
# learning rates of the paper (chosen on the STS-B dev set): cross-lingual XNLI / English NLI
XNLI_LEARNING_RATE = 5e-5
ENGLISH_LEARNING_RATE = 5e-4

_COUNT = {"type": "integer", "minimum": 1}


def settings_schema(*, learning_rate: float, targets: str) -> dict[str, dict]:
    """The JSON-schema properties of an m-ST5 method's settings, with the variant's defaults."""
    return {
        "model": {"oneOf": [{"type": "null"}, {"type": "string", "minLength": 1}], "default": None,
                  "description": "the encoder to train: null = the workflow's base model; else a Hub id "
                                 "(google/mt5-xxl) or a local directory of a T5/mT5/UMT5 or encoder-only "
                                 "model (safetensors weights; a sentence-transformers directory keeps its pooling)"},
        "revision": {"oneOf": [{"type": "null"}, {"type": "string", "minLength": 1}], "default": None,
                     "description": "Hub revision of model (commit, tag, branch or refs/pr/N): one with "
                                    "model.safetensors"},
        "dtype": {"enum": ["float32", "bfloat16"], "default": "float32",
                  "description": "dtype of the frozen weights in training (LoRA is float32); bfloat16 halves their "
                                 "memory. The LoRA is merged at full precision, and the model saved in "
                                 "storage_dtype (float32 by default)"},
        "targets": {"enum": list(TARGETS), "default": targets,
                    "description": "LoRA on the attention query and value (T5: q, v; BERT-like: query, value) "
                                   "or on every linear layer of the encoder (T5: q, k, v, o, wi_0, wi_1, wo)"},
        "lora_r": {**_COUNT, "default": 8, "description": "LoRA rank (paper: 8; 4 and 16 made no difference)"},
        "lora_alpha": {"type": "number", "exclusiveMinimum": 0, "default": 32, "description": "LoRA alpha (paper: 32)"},
        "lora_dropout": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.1},
        "temperature": {"type": "number", "exclusiveMinimum": 0, "default": 0.05,
                        "description": "InfoNCE temperature (not stated in the paper; mSimCSE's 0.05)"},
        "learning_rate": {"type": "number", "exclusiveMinimum": 0, "default": learning_rate,
                          "description": "peak AdamW learning rate (paper: 5e-5 cross-lingual, 5e-4 English)"},
        "batch_size": {"type": "integer", "minimum": 2, "default": 128,
                       "description": "triplets per batch, no pair id twice (paper: 128)"},
        "epochs": {**_COUNT, "default": 1, "description": "passes over the triplets (paper: 1)"},
        "max_steps": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                      "description": "if set, replaces epochs: this many steps"},
        "warmup_ratio": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.1,
                         "description": "share of the steps with linear warm-up, then linear decay to zero"},
        "weight_decay": {"type": "number", "minimum": 0, "default": 0.01,
                         "description": "AdamW weight decay of the LoRA matrices"},
        "max_grad_norm": {"type": "number", "exclusiveMinimum": 0, "default": 1.0},
        "seq_len": {"type": "integer", "minimum": 3, "default": 128, "description": "maximum tokens per sentence"},
        "datasets": {"oneOf": [{"type": "null"},
                               {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"}}],
                     "default": list(DATASETS),
                     "description": "the paraphrase datasets (the pair files' dataset column) that form "
                                    "triplets; null: every row with a negative"},
        "eval_pairs": {"type": "integer", "minimum": 0, "default": 500,
                       "description": "held-out pairs (the English pairs' ids, held out in every language) "
                                      "for retrieval accuracy before and after"},
        "gradient_checkpointing": {"type": "boolean", "default": False, ROLE_KEY: RUNTIME,
                                   "description": "recompute activations in the backward pass: much less "
                                                  "memory, about a third more time (mt5-xl/xxl at batch 128); "
                                                  "the same dropout draws, so the same training (with "
                                                  "compile: true too): a runtime setting"},
        "seed": {"type": "integer", "minimum": 0, "default": 0,
                 "description": "the triplets' languages, batches, LoRA initialisation and dropout"},
        "precision": precision_property(),
        "compile": compile_property(),
        "storage_dtype": storage_dtype_property(),
        "length_groups": length_groups_property("each paraphrase dataset in each anchor language"),
        "log_every": {**_COUNT, "default": 10, ROLE_KEY: RUNTIME, "description": "steps between logged losses"},
        "checkpoint_every": {**_COUNT, "default": 500, ROLE_KEY: RUNTIME,
                             "description": "optimizer steps between resumable checkpoints ({out}.checkpoint/: "
                                            "the LoRA weights and AdamW moments); a killed job continues "
                                            "from the last one when rerun"},
    }


def _trainer(name: str, english_only: bool, schema: dict[str, dict]):
    defaults = {key: value["default"] for key, value in schema.items()}

    def train(inputs: dict, out_dir, settings: dict, *, device=None, progress=True) -> dict:
        from modsent.methods.mst5 import training

        # the variant's defaults under the given settings (the workflow fills them in already)
        return training.train_mst5(name, inputs, out_dir, {**defaults, **settings}, english_only=english_only,
                                   device=device, progress=progress)

    return train


VARIANTS = {  # name: (description, english_only, targets, learning rate)
    "mST5-xnli": ("m-ST5: frozen encoder + LoRA (q, v), triplet InfoNCE on cross-lingual NLI triplets",
                  False, "qv", XNLI_LEARNING_RATE),
    "mST5-en": ("m-ST5: frozen encoder + LoRA (q, v), triplet InfoNCE on English NLI triplets",
                True, "qv", ENGLISH_LEARNING_RATE),
    "mST5-xnli-all": ("m-ST5: frozen encoder + LoRA (every linear layer), triplet InfoNCE on cross-lingual "
                      "NLI triplets", False, "all-linear", XNLI_LEARNING_RATE),
    "mST5-en-all": ("m-ST5: frozen encoder + LoRA (every linear layer), triplet InfoNCE on English NLI triplets",
                    True, "all-linear", ENGLISH_LEARNING_RATE),
}

for _name, (_description, _english_only, _targets, _lr) in VARIANTS.items():
    _schema = settings_schema(learning_rate=_lr, targets=_targets)
    register(Method(_name, _description, _trainer(_name, _english_only, _schema), ("base", "pairs"), _schema,
                    _english_only, family="mST5"))
