"""The configuration's JSON schema (modsent/schemas/config.schema.yaml, shipped in the package:
the training library reads its defaults wherever modsent is installed): loading it and reading it.

No other modsent import, so that every module can read the schema (the defaults, the roles of
keys) without importing the config checks.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"
# `x-role: runtime`: how a job runs; `x-role: selection`: which outputs exist (modsent.config)
ROLE_KEY = "x-role"
# A training key added after outputs existed whose default keeps the old meaning: the default is
# left out of the job's params (modsent.config.job_settings), so upgrading retrains nothing, and any
# other value is part of them.
OMIT_DEFAULT_KEY = "x-omit-default"
RUNTIME, SELECTION = "runtime", "selection"
# $defs/precision's values (modsent.training.precision says what each runs)
PRECISIONS = ("auto", "fp16", "fp32")
# $defs/storage_dtype's values: the dtypes a trained system's weights may be saved in
STORAGE_DTYPES = ("float32", "float16", "bfloat16")


@functools.cache
def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_schema(path: str | Path = SCHEMA_PATH) -> dict:
    """The schema as a dict (a fresh copy: callers may change it)."""
    return copy.deepcopy(_load(str(path)))


def precision_property() -> dict:
    """A method's ``precision`` key (modsent.methods): the workflow schema's ``$defs/precision``
    (modsent.training.precision), default ``auto``."""
    return {**copy.deepcopy(load_schema()["$defs"]["precision"]), "default": "auto"}


def compile_property() -> dict:
    """A method's ``compile`` key (modsent.methods): the workflow schema's ``$defs/compile``
    (modsent.training.fastpath.compile_in_place), default false, a runtime setting."""
    return {**copy.deepcopy(load_schema()["$defs"]["compile"]), "default": False, ROLE_KEY: RUNTIME}


def storage_dtype_property() -> dict:
    """A method's ``storage_dtype`` key (modsent.methods): the workflow schema's
    ``$defs/storage_dtype`` (float32 by default, left out of the params at its default)."""
    return copy.deepcopy(load_schema()["$defs"]["storage_dtype"])


def length_groups_property(strata: str) -> dict:
    """A recipe's ``length_groups`` key (modsent.methods): the workflow schema's
    ``$defs/length_groups`` (modsent.training.pairs.no_duplicate_batches), default 1 (the
    paper's random batches), left out of the params at its default; ``strata`` says what each
    batch keeps its share of in this recipe."""
    prop = copy.deepcopy(load_schema()["$defs"]["length_groups"])
    return {**prop, "default": 1, OMIT_DEFAULT_KEY: True,
            "description": f"{prop['description'].strip()}. In this recipe a batch keeps the share of {strata}"}


def resolve(node: dict, schema: dict) -> dict:
    """``node`` with a local ``$ref`` (``#/$defs/...``) replaced by its target (siblings kept)."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"schema: only local $ref is supported, not {ref!r}")
        target = schema
        for part in ref[2:].split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def inline_refs(node, schema: dict):
    """``node`` with every local ``$ref`` inside it resolved: a fragment that stands alone."""
    if isinstance(node, dict):
        return {key: inline_refs(value, schema) for key, value in resolve(node, schema).items()}
    if isinstance(node, list):
        return [inline_refs(item, schema) for item in node]
    return node
