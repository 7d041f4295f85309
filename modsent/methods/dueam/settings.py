"""A DuEAM method's settings: their allowed values, which of them decide the WMD stage's output,
and one typed object (the schema and its defaults: :func:`modsent.methods.dueam.settings_schema`).
Imports nothing heavy."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from modsent.io import InputError
from modsent.schema import PRECISIONS, STORAGE_DTYPES

DATA = ("weak", "unsup", "parallel", "weak+parallel")
OBJECTIVES = ("joint", "LA", "LB")
TOKEN_WEIGHTS = ("uniform", "idf")
SPECIAL_TOKENS = ("drop", "keep")
GROUND_COSTS = ("euclidean", "sqeuclidean", "cosine")
LAMBDA = 0.003  # the paper's weight of L_B

# the settings that decide the pairs, and those that decide a pair's WMD: the WMD jobs' params
PAIR_KEYS = ("data", "datasets", "contradictions", "eval_pairs", "max_pairs", "seed")
ANCHOR_KEYS = ("model", "revision", "anchor_model", "anchor_revision", "anchor_layer", "token_weights",
               "special_tokens", "normalize_tokens", "ground_cost", "anchor_max_length")


def wmd_job_settings(settings: Mapping) -> dict:
    """The settings that decide a WMD shard's content (the pairs and each pair's WMD)."""
    return {key: settings[key] for key in PAIR_KEYS + ANCHOR_KEYS if key in settings}


def anchor_is_base(settings: Mapping) -> bool:
    """Whether the anchor is the workflow's base model (no model named)."""
    return settings.get("anchor_model") is None and settings.get("model") is None


def uses_translations(settings: Mapping) -> bool:
    """Whether the data setting reads the translations (parallel pairs)."""
    return "parallel" in settings.get("data", "weak")


@dataclasses.dataclass(frozen=True)
class DuEAMConfig:
    data: str = "weak"
    objective: str = "joint"
    lambda_: float = LAMBDA
    model: str | None = None
    revision: str | None = None
    anchor_model: str | None = None
    anchor_revision: str | None = None
    anchor_layer: int = -1
    token_weights: str = "uniform"
    special_tokens: str = "drop"
    normalize_tokens: bool = True
    ground_cost: str = "euclidean"
    anchor_max_length: int | None = None
    datasets: tuple[str, ...] | None = ("mnli",)
    contradictions: bool = True  # weak pairs: each anchor with its row's negative too
    max_pairs: int | None = None
    eval_pairs: int = 500
    learning_rate: float = 2e-5
    batch_size: int = 64
    epochs: int = 5
    max_steps: int | None = None
    warmup_steps: int = 10000
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seq_len: int = 128
    seed: int = 0
    precision: str = "auto"
    storage_dtype: str = "float32"  # the saved weights (how the result is saved: not in the fingerprint)
    length_groups: int = 1  # > 1: batches grouped by length within each kind and languages (training.STRATA)
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place); a runtime setting
    wmd_shards: int = 1
    wmd_batch_size: int = 64
    log_every: int = 10
    checkpoint_every: int = 2000

    @classmethod
    def from_settings(cls, name: str, settings: Mapping) -> "DuEAMConfig":
        """From ``methods.{name}`` (the setting ``lambda`` is the field ``lambda_``); missing
        keys take the defaults, unknown keys are an error."""
        from modsent.methods import settings_config

        return settings_config(cls, name, settings, renames={"lambda": "lambda_"}, tuples=("datasets",))

    def check(self, name: str) -> None:
        """The schema's rules, for direct library use (the workflow's config is already checked)."""
        problems = {
            "data": self.data not in DATA,
            "objective": self.objective not in OBJECTIVES,
            "lambda": not self.lambda_ >= 0,
            "token_weights": self.token_weights not in TOKEN_WEIGHTS,
            "special_tokens": self.special_tokens not in SPECIAL_TOKENS,
            "ground_cost": self.ground_cost not in GROUND_COSTS,
            "anchor_max_length": self.anchor_max_length is not None and self.anchor_max_length < 3,
            "max_pairs": self.max_pairs is not None and self.max_pairs < 1,
            "eval_pairs": self.eval_pairs < 0,
            "learning_rate": not self.learning_rate > 0,
            "batch_size": self.batch_size < 1,
            "epochs": self.epochs < 1,
            "max_steps": self.max_steps is not None and self.max_steps < 1,
            "warmup_steps": self.warmup_steps < 0,
            "seq_len": self.seq_len < 3,
            "seed": self.seed < 0,
            "precision": self.precision not in PRECISIONS,
            "storage_dtype": self.storage_dtype not in STORAGE_DTYPES,
            "wmd_shards": self.wmd_shards < 1,
        }
        from modsent.training.pairs import check_length_groups

        check_length_groups(self.length_groups, f"methods.{name}.length_groups")
        bad = [key for key, wrong in problems.items() if wrong]
        if bad:
            raise InputError(f"methods.{name}: invalid value(s) for {', '.join(bad)} "
                             "(see the method's settings schema)")

    def wmd_settings(self) -> dict:
        """What decides one pair's WMD besides its texts and the anchor's weights."""
        return {"anchor_layer": self.anchor_layer, "token_weights": self.token_weights,
                "special_tokens": self.special_tokens, "normalize_tokens": self.normalize_tokens,
                "ground_cost": self.ground_cost, "anchor_max_length": self.anchor_max_length}

    def anchor_source(self, base: str | None) -> tuple[str | None, str | None]:
        """(the anchor model, its revision): ``anchor_model``, else the learner's start
        (``model``, else the base model ``base``)."""
        if self.anchor_model is not None:
            return self.anchor_model, self.anchor_revision
        if self.model is not None:
            return self.model, self.revision
        return (str(base) if base is not None else None), None
