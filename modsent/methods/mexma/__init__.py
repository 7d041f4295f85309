"""MEXMA: cross-unmasking with sentence- and token-level objectives (every weight of an MLM
encoder trained on bitext). The clean sentence vector (raw CLS) of one side conditions an
unmasking head that restores the other side's masked tokens; an alignment loss pulls the two
sides' vectors together and KoLeo spreads them (:mod:`modsent.methods.mexma.model`,
:mod:`modsent.methods.mexma.training`).

Registered systems (a config enables any of them under ``methods:``); they differ only in the
defaults of ``alignment``, the loss weights and ``detach_tokens``:

    MEXMA               MSE alignment 1, cross-unmasking 0.5, KoLeo 0.005       the paper's
    MEXMA-base          the same (a second name: MEXMA-base and MEXMA, xlm-roberta-base and
                        -large, side by side in one results tree)
    MEXMA-no-tok        the head's input detached: no token-level gradient      [T5] ablation
    MEXMA-contrastive   symmetric InfoNCE instead of MSE, no KoLeo              [T6] variant
    MEXMA-no-koleo      KoLeo weight 0                                          ablation
    MEXMA-unmask-only   cross-unmasking alone (no alignment, no KoLeo)          ablation

Data: English and its translations, ``results/translation/{lang}.parquet`` of every non-English
language, and with ``provided_translations: true`` also the human translations the config's
``translation.provided`` names (``resources/translations/{lang}.parquet``). Output:
``results/{base}/methods/{name}``, a sentence-transformers directory with CLS pooling.
Data-parallel on ``gpus`` GPUs of one node.

This module imports nothing heavy: the workflow imports it while planning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from modsent import layout
from modsent.languages import PIVOT_LANGUAGE
from modsent.methods import Method, register
from modsent.schema import (ROLE_KEY, RUNTIME, compile_property, length_groups_property, precision_property,
                            storage_dtype_property)

ALIGNMENTS = ("mse", "contrastive")
_COUNT = {"type": "integer", "minimum": 1}
_OPTIONAL_NAME = {"oneOf": [{"type": "null"}, {"type": "string", "minLength": 1}], "default": None}
_WEIGHT = {"type": "number", "minimum": 0}


def settings_schema(*, alignment: str, align_weight: float, koleo_weight: float, detach_tokens: bool) -> dict:
    """The JSON-schema properties of a MEXMA method's settings, with the variant's defaults (the
    paper's and the public repository's otherwise)."""
    return {
        "model": {**_OPTIONAL_NAME,
                  "description": "the encoder to train: null = the workflow's base model; else a Hub id "
                                 "(FacebookAI/xlm-roberta-large: MEXMA, -base: MEXMA-base) or a local directory"},
        "revision": {**_OPTIONAL_NAME, "description": "Hub revision of model (one with model.safetensors)"},
        "head_layers": {**_COUNT, "default": 6, "description": "transformer layers of the unmasking head (paper: 6)"},
        "head_heads": {**_COUNT, "default": 8, "description": "attention heads of the unmasking head (paper: 8)"},
        "head_intermediate_size": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                                   "description": "FFN width of the head's layers: null = the encoder's (the "
                                                  "public code uses XLMRobertaConfig's 3072 for both sizes)"},
        "mask_probability": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1, "default": 0.4,
                             "description": "share of non-special tokens masked in each side, 80/10/10 (paper: 40%)"},
        "alignment": {"enum": list(ALIGNMENTS), "default": alignment,
                      "description": "the sentence-level loss: mse on the clean CLS vectors (paper) or "
                                     "symmetric InfoNCE (the contrastive variant)"},
        "temperature": {"type": "number", "exclusiveMinimum": 0, "default": 0.05,
                        "description": "InfoNCE temperature (alignment: contrastive)"},
        "align_weight": {**_WEIGHT, "default": align_weight, "description": "weight of the alignment loss (1)"},
        "mlm_weight": {**_WEIGHT, "default": 0.5,
                       "description": "weight of the sum of the two cross-unmasking CEs (0.5 = the public "
                                      "script's 1 x their mean)"},
        "koleo_weight": {**_WEIGHT, "default": koleo_weight,
                         "description": "weight of KoLeo(S_A) + KoLeo(S_B) (0.005 = the public script's 0.01 x "
                                        "their mean). KoLeo's nearest neighbours are found within each GPU's "
                                        "share of a batch (as the public script does): with gpus > 1 the "
                                        "term, unlike the others, differs from one GPU's, and a run resumed "
                                        "with another gpus continues under the other term"},
        "detach_tokens": {"type": "boolean", "default": detach_tokens,
                          "description": "no-tok ablation: the masked passes' states are detached before the head"},
        "provided_translations": {"type": "boolean", "default": False,
                                  "description": "also train on the human translations of translation.provided "
                                                 "(resources/translations/{lang}.parquet)"},
        "max_pairs": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                      "description": "at most this many training pairs (a seeded sample); null: all"},
        "eval_pairs": {"type": "integer", "minimum": 0, "default": 200,
                       "description": "English sentences held out in every language for retrieval, mining "
                                      "error and spread before and after"},
        "learning_rate": {"type": "number", "exclusiveMinimum": 0, "default": 1e-4,
                          "description": "peak AdamW learning rate (public repo: 1e-4)"},
        "batch_size": {"type": "integer", "minimum": 2, "default": 1200,
                       "description": "pairs per micro-batch over all GPUs (paper: 8 GPUs x 150); KoLeo works "
                                      "within each GPU's share"},
        "grad_accum": {**_COUNT, "default": 2, "description": "micro-batches per optimizer step (paper: 2)"},
        "epochs": {**_COUNT, "default": 1, "description": "passes over the pairs"},
        "max_steps": {"oneOf": [{"type": "null"}, _COUNT], "default": None,
                      "description": "if set, replaces epochs: this many optimizer steps (paper: 300K)"},
        "warmup_ratio": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 0.3,
                         "description": "share of the steps with linear warm-up, then cosine to zero (public: 0.3)"},
        "warmup_start_factor": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.1,
                                "description": "the warm-up starts at this fraction of the learning rate (public: 0.1)"},
        "weight_decay": {"type": "number", "minimum": 0, "default": 0.0, "description": "AdamW weight decay (public: none)"},
        "max_grad_norm": {"type": "number", "exclusiveMinimum": 0, "default": 1.2, "description": "clipping (public: 1.2)"},
        "seq_len": {"type": "integer", "minimum": 3, "default": 200, "description": "maximum tokens per sentence (paper: 200)"},
        "seed": {"type": "integer", "minimum": 0, "default": 0,
                 "description": "the head's initialisation, held-out sentences, batches, masking and dropout"},
        "precision": precision_property(),
        "compile": compile_property(),
        "kernels": {"enum": ["eager", "triton"], "default": "eager", ROLE_KEY: RUNTIME,
                    "description": "triton: the cross-unmasking loss's cross-entropy over the vocabulary (250,002 "
                                   "words for XLM-R) as one Triton kernel each way (modsent.training.kernels."
                                   "cross_entropy: one read of the logits forward, one read and one write "
                                   "backward, no fp32 copy of them kept), on a CUDA GPU with Triton (refused "
                                   "before any work where a GPU has none); the same training up to float "
                                   "rounding. On the CPU the eager loss runs. Off by default: not yet measured "
                                   "on a GPU"},
        "loss_chunk_rows": {"oneOf": [{"type": "null"}, _COUNT], "default": None, ROLE_KEY: RUNTIME,
                            "description": "the cross-unmasking loss's vocabulary projection and cross-entropy "
                                           "computed this many masked positions at a time (e.g. 2048), no logits "
                                           "kept for the backward, which projects each chunk again "
                                           "(modsent.training.vocab_loss: a third more of the projection's "
                                           "FLOPs); null: all at once, their logits kept (fp32 log-softmax: 4 "
                                           "bytes a logit, 1 GB per 1,000 positions over XLM-R's 250,002 words; "
                                           "2 bytes with kernels: triton). The same training up to float "
                                           "rounding; a memory setting for larger micro-batches"},
        "gradient_checkpointing": {"type": "boolean", "default": False, ROLE_KEY: RUNTIME,
                                   "description": "keep only each transformer layer's input (the encoder's and the "
                                                  "head's) and run the layer again in the backward, drawing the "
                                                  "same dropout: the same training up to float rounding, most of "
                                                  "the activations' memory traded for one more forward; for more "
                                                  "pairs per GPU (with compile: true too)"},
        "storage_dtype": storage_dtype_property(),
        "length_groups": length_groups_property("each language (a pool of k steps, each step of batch_size x "
                                                "grad_accum pairs)"),
        "log_every": {**_COUNT, "default": 10, ROLE_KEY: RUNTIME, "description": "steps between logged losses"},
        "checkpoint_every": {**_COUNT, "default": 2000, ROLE_KEY: RUNTIME,
                             "description": "optimizer steps between resumable checkpoints ({out}.checkpoint/: the "
                                            "encoder, the head and the AdamW moments, ~3x the model)"},
    }


def _provided_inputs(base: str, settings: Mapping, languages: Sequence[str]) -> dict[str, list[str]]:
    if not settings.get("provided_translations"):
        return {}
    return {"provided": [layout.PROVIDED_TRANSLATIONS.format(lang=lang) for lang in languages
                         if lang != PIVOT_LANGUAGE]}


def _trainer(name: str, schema: dict[str, dict]):
    defaults = {key: value["default"] for key, value in schema.items()}

    def train(inputs: dict, out_dir, settings: dict, *, device=None, progress=True) -> dict | None:
        from modsent.methods.mexma import training

        inputs = dict(inputs)
        provided = inputs.get("provided")
        if isinstance(provided, (list, tuple)):  # the workflow's list (_provided_inputs)
            inputs["provided"] = provided_by_language(list(inputs.get("translations") or {}), provided)
        return training.train_mexma(name, inputs, out_dir, {**defaults, **settings}, device=device, progress=progress)

    return train


def provided_by_language(languages: Sequence[str], paths: Sequence[str]) -> dict[str, str]:
    """{language: provided translation file}: each of ``paths`` goes to the language whose
    workflow file (``resources/translations/{lang}.parquet``) it is, whatever the order of
    either; paths named otherwise (a library caller's) take the other languages in order."""
    if len(paths) != len(languages):
        raise ValueError(f"{len(paths)} provided translation files for {len(languages)} languages")
    owners: list[str | None] = []
    for path in paths:
        text = str(path).replace("\\", "/")
        found = [lang for lang in languages if text.endswith(layout.PROVIDED_TRANSLATIONS.format(lang=lang))]
        owners.append(found[0] if len(found) == 1 and found[0] not in owners else None)
    rest = iter([lang for lang in languages if lang not in owners])
    path_of = {owner or next(rest): path for owner, path in zip(owners, paths)}
    return {lang: path_of[lang] for lang in languages}


def check_settings(settings: Mapping) -> list[str]:
    """Each GPU's share of a batch needs a pair (and, with KoLeo, a second one: a nearest
    neighbour); the trainers would find out only inside torchrun (training.run_training)."""
    problems = []
    gpus, batch = settings.get("gpus", 1), settings["batch_size"]
    least = (2 if settings["koleo_weight"] else 1) * gpus
    if batch < least:
        problems.append(f"batch_size: {batch} pairs over gpus {gpus} leave a GPU no pair"
                        + (" or, with KoLeo, no nearest neighbour" if settings["koleo_weight"] else "")
                        + f": at least {least}, or fewer gpus")
    return problems


VARIANTS = {  # name: (description, alignment, align weight, KoLeo weight, detach tokens)
    "MEXMA": ("MEXMA: every weight, cross-unmasking from the other language's CLS + MSE alignment + KoLeo, "
              "on bitext", "mse", 1.0, 0.005, False),
    "MEXMA-base": ("MEXMA, a second name for the base-size model beside MEXMA (the large one) in one results tree",
                   "mse", 1.0, 0.005, False),
    "MEXMA-no-tok": ("MEXMA ablation: the unmasking head's input detached (no token-level gradient)",
                     "mse", 1.0, 0.005, True),
    "MEXMA-contrastive": ("MEXMA variant: symmetric InfoNCE instead of MSE, no KoLeo", "contrastive", 1.0, 0.0, False),
    "MEXMA-no-koleo": ("MEXMA ablation: without KoLeo", "mse", 1.0, 0.0, False),
    "MEXMA-unmask-only": ("MEXMA ablation: cross-unmasking alone (no alignment loss, no KoLeo)", "mse", 0.0, 0.0, False),
}

for _name, (_description, _alignment, _align, _koleo, _detach) in VARIANTS.items():
    _schema = settings_schema(alignment=_alignment, align_weight=_align, koleo_weight=_koleo, detach_tokens=_detach)
    register(Method(_name, _description, _trainer(_name, _schema), ("base", "translations"), _schema,
                    extra_inputs=_provided_inputs, data_parallel=True, family="MEXMA", check_settings=check_settings))
