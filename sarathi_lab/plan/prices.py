"""The price table: $/GPU-hour per hardware preset, with where each figure comes from.

The shipped table is sarathi_lab/data/prices.yaml; a user's (plan.prices=PATH) has the same
layout. Every entry must name a hardware preset (configs/hardware) and give a positive price, a
source and a date, so that a ranking never rests on a figure nobody can trace."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml

from sarathi_lab.settings import ConfigError

SHIPPED = "sarathi_lab/data/prices.yaml"
FIELDS = ("usd_per_gpu_hour", "source", "date")


def hardware_presets() -> set[str]:
    """The shipped hardware presets (configs/hardware/*.yaml)."""
    return {p.name[:-5] for p in files("sarathi_lab.configs").joinpath("hardware").iterdir()
            if p.name.endswith(".yaml")}


def load_prices(path: str | None = None, overrides: dict | None = None) -> dict[str, dict]:
    """{hardware: {usd_per_gpu_hour, source, date}} from `path` (None: the shipped table), with
    `overrides` ({hardware: price}) replacing single prices (their source: "plan.price_overrides")."""
    where = path or SHIPPED
    if path is None:
        text = files("sarathi_lab").joinpath("data", "prices.yaml").read_text()
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"plan.prices={path}: no such file")
        text = p.read_text()
    try:
        table = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"plan.prices={where}: not valid YAML: {e}") from None
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"plan.prices={where}: must map hardware presets to "
                          f"{{{', '.join(FIELDS)}}}; it holds {type(table).__name__}")
    known = hardware_presets()
    out = {}
    for hw, entry in table.items():
        if hw not in known:
            raise ConfigError(f"plan.prices={where}: {hw!r} is not a hardware preset (the "
                              f"presets: {', '.join(sorted(known))})")
        if not isinstance(entry, dict) or set(FIELDS) - set(entry):
            raise ConfigError(f"plan.prices={where}: {hw}: needs {', '.join(FIELDS)} (a price "
                              f"with its source and date); it has {entry!r}")
        out[hw] = {k: entry[k] for k in FIELDS}
    for hw, price in (overrides or {}).items():
        if hw not in known:
            raise ConfigError(f"plan.price_overrides.{hw}: not a hardware preset (the presets: "
                              f"{', '.join(sorted(known))})")
        out[hw] = {"usd_per_gpu_hour": price, "source": "plan.price_overrides", "date": None}
    for hw, entry in out.items():
        price = entry["usd_per_gpu_hour"]
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price <= 0:
            raise ConfigError(f"plan.prices={where}: {hw}: usd_per_gpu_hour={price!r} must be "
                              "a positive number")
        entry["usd_per_gpu_hour"] = float(price)
    return out


def price_of(prices: dict[str, dict], hardware: str, where: str) -> float:
    """The price of `hardware`; an error naming the table when it has none."""
    if hardware not in prices:
        raise ConfigError(f"plan.space.hardware: {hardware!r} has no price in {where} (it prices "
                          f"{', '.join(sorted(prices))}); add it there or set "
                          f"plan.price_overrides.{hardware}=USD_PER_GPU_HOUR")
    return prices[hardware]["usd_per_gpu_hour"]
