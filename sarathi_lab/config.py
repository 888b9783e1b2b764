"""Config values as plain Python, whether they come from Hydra (OmegaConf) or from code."""
from __future__ import annotations


def plain(cfg):
    """A plain dict/list from an OmegaConf config, a copy of a dict, {} for None; any other
    value (an int length spec, a string) unchanged. omegaconf is imported only when needed."""
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg
