"""Outputs written the same way on every run: files whose bytes came from hash-map order."""

from __future__ import annotations

import json
import struct

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from modsent.io import canonical_adapter_config, canonical_safetensors_header


def test_safetensors_metadata_is_written_in_one_order(tmp_path):
    """safetensors writes metadata in Rust hash-map order: four saves of the same tensors and
    metadata came out as four different files here; after canonical_safetensors_header they are
    one, and they load to the same tensors and metadata."""
    metadata = {key: value for key, value in zip("zyxwvutsrq", ["a", "ü", '{"x": 1}', "4", "5", "6", "7", "8", "9", ""])}
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.tensor([True, False, True])}
    paths = []
    for i in range(4):
        path = tmp_path / f"save{i}.safetensors"
        save_file(tensors, str(path), metadata=dict(reversed(metadata.items())) if i % 2 else metadata)
        size = path.stat().st_size
        canonical_safetensors_header(path)
        assert path.stat().st_size == size
        paths.append(path)
    assert len({path.read_bytes() for path in paths}) == 1
    with safe_open(str(paths[0]), "pt") as handle:
        assert handle.metadata() == metadata
    raw = paths[0].read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert list(header["__metadata__"]) == sorted(metadata)
    loaded = load_file(str(paths[0]))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[name], tensors[name]) for name in tensors)


def test_peft_target_modules_are_sorted(tmp_path):
    """PEFT writes target_modules from a Python set (string-hash order, per process); the saved
    config lists them sorted and PEFT still reads it."""
    from peft import LoraConfig, PeftConfig

    names = ["value", "query", "key", "dense", "intermediate.dense", "output.dense"]
    LoraConfig(r=4, target_modules=names).save_pretrained(str(tmp_path))
    canonical_adapter_config(tmp_path)
    written = json.loads((tmp_path / "adapter_config.json").read_text(encoding="utf-8"))
    assert written["target_modules"] == sorted(names)
    assert set(PeftConfig.from_pretrained(str(tmp_path)).target_modules) == set(names)
