"""`model.hf_config`: a model's shape from a Hugging Face config.json, for every executor.

The setting names a config.json, a directory holding one, or a config shipped with the package
(sarathi_lab/data/models/NAME/config.json, sources in its README). `resolve_model` fills the model
node's shape keys from it before anything reads the node, so the simulator, the real executor and
the run's recorded config all see the one shape; `dtype` and `max_model_len` in the node are
serving choices (vLLM's --dtype, --max-model-len) and override the file's. Any other shape key the
node sets must agree with the file: a preset's own shape is never silently replaced.
"""
from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from sarathi_lab.models.shape import ModelShape

#: node keys that override the config.json's (how the model is served, not what it is)
SERVING_KEYS = ("dtype", "max_model_len")


def shipped_configs() -> list[str]:
    """The names of the configs shipped with the package."""
    root = files("sarathi_lab").joinpath("data", "models")
    return sorted(p.name for p in root.iterdir() if p.joinpath("config.json").is_file())


def config_file(ref, where: str = "model.hf_config") -> Path:
    """The config.json that `ref` names: a file, a directory with one, or a shipped name."""
    p = Path(str(ref)).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        return p
    if "/" not in str(ref) and not str(ref).endswith(".json"):
        f = files("sarathi_lab").joinpath("data", "models", str(ref), "config.json")
        if f.is_file():
            return Path(str(f))
    raise FileNotFoundError(f"{where}={str(ref)!r}: no such config.json (a path to one, a "
                            f"directory holding one, or a shipped config: "
                            f"{', '.join(shipped_configs())})")


def read_shape(ref, name: str | None = None, where: str = "model.hf_config") -> ModelShape:
    """The shape in the config.json `ref` names; `name` (default: its folder's) names the model."""
    f = config_file(ref, where)
    try:
        hf = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}={str(ref)!r}: {f} is not valid JSON ({e})") from None
    return ModelShape.from_hf(hf, str(f), name=name or f.parent.name)


def resolve_model(node: dict, where: str = "model") -> dict:
    """The model node with its shape keys filled from `hf_config` (the node itself without)."""
    ref = node.get("hf_config")
    if not ref:
        return node
    if ref == "???":   # configs/model/hf.yaml's placeholder (Hydra's "must be set")
        raise ValueError(f"{where}.hf_config: must be set: the model preset takes its shape from "
                         f"a config.json ({where}.hf_config=PATH: a config.json, a model "
                         f"directory, or a shipped config: {', '.join(shipped_configs())})")
    shape = read_shape(ref, node.get("name"), f"{where}.hf_config")
    serving = {k: node[k] for k in SERVING_KEYS if node.get(k) is not None}
    if serving:
        try:
            shape = ModelShape(**{**shape.to_preset(), **serving})
        except ValueError as e:
            raise ValueError(f"{where}.hf_config={ref}: {e}") from None
    keys = shape.to_preset()
    clash = [f"{k}={node[k]!r} (the config.json: {keys[k]!r})" for k in keys
             if k not in SERVING_KEYS and k != "name" and node.get(k) is not None
             and node[k] != keys[k]]
    if clash:
        raise ValueError(
            f"{where}.hf_config={ref}: the model preset sets {', '.join(clash)}; a preset with "
            f"a shape of its own cannot take another's config.json: choose model=hf "
            f"{where}.hf_config={ref} (a preset with no shape), or a preset of this model")
    return {**node, **keys}
