"""InteMATs (Integrating Granularity-Specific Multilingual Adapters; Liu et al., 2024): a frozen
multilingual encoder with two sets of serial bottleneck adapters trained with InfoNCE, one on
sentence pairs (MATs-ST) and one on document pairs (MATs-DT), then fused per token by
AdapterFusion attention with both adapter sets frozen.

Three registered systems, three jobs (``rules/methods.smk``'s ``train_method``), each its own
row of the summary:

    InteMATs-ST   serial adapters (ReLU, reduction 16, after the attention and the FFN of every
                  layer) on the frozen backbone, InfoNCE (t 0.1) between each English sentence
                  and its aligned sentence in language X, in-batch negatives
    InteMATs-DT   the same on pseudo-documents: k consecutive pair ids (the same ids in every
                  language) concatenated, up to max_length tokens (384)
    InteMATs      both adapter sets frozen, AdapterFusion at every site trained with MNRL on
                  the paraphrase pairs (a departure: the paper trains the fusion per downstream
                  task; an embedding suite needs one model, so the fusion learns from the same
                  paraphrase pairs the other systems use)

The fusion job reads the ST and DT systems' directories (``Method.extra_inputs`` names
``results/{base}/methods/InteMATs-ST`` and ``-DT``, so Snakemake trains them first) and takes
its backbone from InteMATs-ST's directory; a config with ``InteMATs`` but without
``InteMATs-ST`` and ``InteMATs-DT`` is an error of ``modsent check-config`` naming them
(``Method.requires``). Their settings are their own: the fusion has no ``model`` setting.

Data (:mod:`modsent.methods.intemats.training`): the multi-parallel paraphrase files (the same
pair ids in every language) stand in for the paper's entity-aligned Wikipedia summaries; the
pair ids held out (``eval_pairs``, the English pairs' smallest hashes, as the other recipes)
leave every stage's training data. Output: a sentence-transformers directory whose first module
is :class:`modsent.encoders.intemats.InteMATsTransformer` (the backbone unchanged or rounded to
``storage_dtype``, the adapters and fusion in ``serial_adapters.safetensors``), mean pooling over
``pooling_layers``.

This module imports nothing heavy: the workflow imports it while planning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from modsent import layout
from modsent.methods import Method, register
from modsent.methods.intemats.settings import DT, FUSED, FUSION_PAIRS, SITES, ST
from modsent.schema import (ROLE_KEY, RUNTIME, compile_property, length_groups_property, precision_property,
                            storage_dtype_property)

__all__ = ["DT", "FUSED", "FUSION_PAIRS", "SITES", "ST", "adapter_schema", "fusion_schema"]


_COUNT = {"type": "integer", "minimum": 1}
_OPTIONAL_NAME = {"oneOf": [{"type": "null"}, {"type": "string", "minLength": 1}], "default": None}
_LAYERS = {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "integer"}}


def _training_schema(*, epochs: int, warmup_steps: int) -> dict[str, dict]:
    """The settings every InteMATs stage has (the paper's: batch 8 x accumulation 2, lr 5e-5,
    10K warm-up steps, 5 epochs per adapter set, max length 384; Adam without weight decay, as
    the paper and the authors' GranCATs code train (its --weight_decay 1e-4 reaches no optimizer),
    and clipping at 1.0 from that code)."""
    return {
        "pooling_layers": {**_LAYERS, "default": [-2],
                           "description": "hidden states averaged, then mean-pooled over the real tokens, in "
                                          "training and in the saved system (0 = embeddings, i = after layer i, "
                                          "-1 = last; paper: the penultimate layer [-2] in training, first and "
                                          "last [1, -1] for STS)"},
        "datasets": {"oneOf": [{"type": "null"},
                               {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"}}],
                     "default": None,
                     "description": "the paraphrase datasets (the pair files' dataset column) used; null: every row"},
        "learning_rate": {"type": "number", "exclusiveMinimum": 0, "default": 5e-5,
                          "description": "peak AdamW learning rate (paper: 5e-5)"},
        "batch_size": {"type": "integer", "minimum": 2, "default": 8,
                       "description": "pairs per forward pass: the in-batch negatives (paper: 8)"},
        "gradient_accumulation": {**_COUNT, "default": 2,
                                  "description": "batches per optimizer step (paper: 2); each batch's loss has "
                                                 "its own in-batch negatives"},
        "epochs": {**_COUNT, "default": epochs, "description": "passes over the training data"},
        "max_steps": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                      "description": "if set, replaces epochs: this many optimizer steps"},
        "warmup_steps": {"type": "integer", "minimum": 0, "default": warmup_steps,
                         "description": "linear warm-up steps, then linear decay to zero"},
        "weight_decay": {"type": "number", "minimum": 0, "default": 0.0,
                         "description": "AdamW weight decay of the weight matrices (the paper's Adam: none; "
                                        "GranCATs declares 1e-4 but its optimizer never receives it)"},
        "max_grad_norm": {"type": "number", "exclusiveMinimum": 0, "default": 1.0},
        "max_length": {"type": "integer", "minimum": 3, "default": 384,
                       "description": "maximum tokens per text (paper: 384); longer texts are truncated"},
        "eval_pairs": {"type": "integer", "minimum": 0, "default": 500,
                       "description": "held-out pair ids (the English pairs' smallest hashes, held out in every "
                                      "language) for retrieval accuracy before and after"},
        "seed": {"type": "integer", "minimum": 0, "default": 0,
                 "description": "initialisation, batches and dropout"},
        "precision": precision_property(),
        "compile": compile_property(),
        "storage_dtype": storage_dtype_property(),
        "length_groups": length_groups_property("each language (ST: each paraphrase dataset in each language); "
                                                "the fusion's batches keep the baselines' (each dataset)"),
        "log_every": {**_COUNT, "default": 10, ROLE_KEY: RUNTIME, "description": "steps between logged losses"},
        "checkpoint_every": {**_COUNT, "default": 500, ROLE_KEY: RUNTIME,
                             "description": "optimizer steps between resumable checkpoints ({out}.checkpoint/: the "
                                            "adapter or fusion weights and their AdamW moments)"},
    }


def adapter_schema(*, documents: bool) -> dict[str, dict]:
    """The settings of InteMATs-ST (``documents`` False) or InteMATs-DT (True)."""
    schema = {
        "model": {**_OPTIONAL_NAME,
                  "description": "the frozen backbone: null = the workflow's base model; else a Hub id "
                                 "(FacebookAI/xlm-roberta-large) or a local directory of a BERT-layout encoder "
                                 "(BERT, XLM-R; safetensors weights)"},
        "revision": {**_OPTIONAL_NAME, "description": "Hub revision of model"},
        "reduction_factor": {"type": "number", "exclusiveMinimum": 0, "default": 16,
                             "description": "bottleneck size = hidden size / reduction_factor (paper: 16)"},
        "sites": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": SITES},
                  "default": list(SITES),
                  "description": "where in each layer: after the attention output projection and/or after "
                                 "the feed-forward output projection (Houlsby's two sites; the paper: both)"},
        "adapter_layers": {"oneOf": [{"type": "null"}, {**_LAYERS, "items": {"type": "integer", "minimum": 0}}],
                           "default": None, "description": "the layers with adapters: null = every layer"},
        "temperature": {"type": "number", "exclusiveMinimum": 0, "default": 0.1,
                        "description": "InfoNCE temperature (not in the paper; the authors' earlier code: 0.1)"},
        **_training_schema(epochs=5, warmup_steps=10000),
    }
    if documents:
        schema["document_sentences"] = {
            **_COUNT, "default": 16,
            "description": "k: a pseudo-document joins up to k consecutive pair ids (the same ids in every "
                           "language), fewer where the next sentence would pass max_length tokens"}
    return schema


def fusion_schema() -> dict[str, dict]:
    """The settings of InteMATs (the fusion). Its backbone and adapters come from InteMATs-ST and
    InteMATs-DT; not in the paper (it fuses per downstream task): the pairs, scale, epochs."""
    return {
        "pairs": {"enum": list(FUSION_PAIRS), "default": "crosslingual",
                  "description": "crosslingual: each pair id's anchor and positive in randomly drawn languages "
                                 "(Full_c's pairs); monolingual: each batch one language's pairs (Full_m's)"},
        "scale": {"type": "number", "exclusiveMinimum": 0, "default": 20.0,
                  "description": "MNRL scale (inverse temperature; hard negatives included where present)"},
        **_training_schema(epochs=1, warmup_steps=1000),
    }


def _trainer(name: str, schema: dict[str, dict]):
    defaults = {key: value["default"] for key, value in schema.items()}

    def train(inputs: dict, out_dir, settings: dict, *, device=None, progress=True) -> dict:
        from modsent.methods.intemats import training

        return training.train_intemats(name, inputs, out_dir, {**defaults, **settings}, device=device,
                                       progress=progress)

    return train


def _fusion_inputs(base: str, settings: Mapping, languages: Sequence[str]) -> dict[str, str]:
    """The adapter systems the fusion reads (trained by their own train_method jobs)."""
    return {"st": layout.method_output(base, ST), "dt": layout.method_output(base, DT)}


def _same_storage(settings: Mapping[str, Mapping]) -> list[str]:
    """InteMATs-ST and -DT saved in one dtype: the fusion attaches DT's adapters to ST's saved
    backbone and checks that they were trained on that backbone by its fingerprint (its
    embeddings rounded to bfloat16), which a backbone rounded through float16 otherwise fails:
    the one rule is simpler than the pairs that happen to agree."""
    st, dt = settings[ST]["storage_dtype"], settings[DT]["storage_dtype"]  # defaults filled in
    if st == dt:
        return []
    return [f"methods.{DT}.storage_dtype: {dt}, but methods.{ST}.storage_dtype is {st}: the fusion ({FUSED}) "
            f"attaches {DT}'s adapters to {ST}'s saved backbone, so both must be saved in one dtype"]


_ST_SCHEMA, _DT_SCHEMA = adapter_schema(documents=False), adapter_schema(documents=True)
_FUSION_SCHEMA = fusion_schema()
register(Method(ST, "InteMATs MATs-ST: serial adapters on the frozen backbone, InfoNCE on English-X sentence pairs",
                _trainer(ST, _ST_SCHEMA), ("base", "pairs"), _ST_SCHEMA, family=FUSED))
register(Method(DT, "InteMATs MATs-DT: serial adapters on the frozen backbone, InfoNCE on English-X "
                    "pseudo-documents", _trainer(DT, _DT_SCHEMA), ("base", "pairs"), _DT_SCHEMA, family=FUSED))
register(Method(FUSED, "InteMATs: MATs-ST and MATs-DT frozen, AdapterFusion trained with MNRL on paraphrase pairs",
                _trainer(FUSED, _FUSION_SCHEMA), ("base", "pairs"), _FUSION_SCHEMA,
                extra_inputs=_fusion_inputs, requires=(ST, DT), family=FUSED, check_required=_same_storage))
