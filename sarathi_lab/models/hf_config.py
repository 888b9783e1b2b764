"""`model.hf_config`: which Hugging Face config.json a model's shape comes from.

The setting names a config.json, a directory holding one, or a config shipped with the package
(sarathi_lab/data/models/NAME/config.json, sources in its README). `models.shape` reads the shape
from it (`read_shape`; `resolve_model` fills the model node's shape keys before anything reads
the node); this module only finds the file, below the shape, so that a preset's shape can follow
its hf_config without an import cycle.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


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
