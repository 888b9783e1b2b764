"""``executor.cost_model=auto``: the measured profile that matches the run, else the roofline.

Profiles are looked for under ``executor.profile_dirs`` (folders, ``os.pathsep``-separated; null:
the environment variable ``SARATHI_LAB_PROFILES``; nothing is downloaded): every Vidur directory
(one holding ``mlp.csv``) and every project profile (a ``.parquet`` whose metadata, or a ``.csv``
whose first row, names model, device and tensor_parallel). The first, in path order, measured
for the run's model (preset or Hugging Face name), dtype, hardware and tensor-parallel degree and
holding every operator the profiled model needs prices the run; one log line at start-up names it,
or says why the roofline prices the run instead. The choice is what `describe()` records, under
``chosen_by``, in the summary's ``cost_model``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path

from sarathi_lab.costmodels.profiled import (
    ProfiledConfig,
    ProfiledCostModel,
    mismatches,
    model_names,
)
from sarathi_lab.costmodels.profiles import ProfileError, peek
from sarathi_lab.costmodels.roofline import RooflineConfig, RooflineCostModel
from sarathi_lab.models.shape import ModelShape
from sarathi_lab.settings import ConfigError

log = logging.getLogger(__name__)

ENV = "SARATHI_LAB_PROFILES"


def profile_paths(dirs: str) -> list[Path]:
    """Every profile under the folders in `dirs` (os.pathsep-separated), in path order."""
    found = set()
    for d in filter(None, dirs.split(os.pathsep)):
        root = Path(d)
        if not root.is_dir():
            raise ConfigError(f"executor.profile_dirs: {d} is not a directory (from "
                              f"executor.profile_dirs or ${ENV})")
        found |= {p.parent for p in root.rglob("mlp.csv")}
        found |= {p for ext in ("*.parquet", "*.csv") for p in root.rglob(ext)
                  if p.name not in ("mlp.csv", "attention.csv")}
    return sorted(found)


def choose(model: dict, hardware: dict, tp: int, roof: RooflineConfig | None,
           profile_dirs: str | None):
    """(the cost model, the sentence saying why it was chosen)."""
    roof = roof or RooflineConfig()
    dirs = profile_dirs if profile_dirs is not None else os.environ.get(ENV, "")
    shape = ModelShape.from_config(model)
    names = model_names(model) | {shape.name.lower()}
    run = (f"model={shape.name} dtype={shape.dtype} hardware={hardware.get('name')} "
           f"tensor_parallel={tp}")
    refused = []
    for path in profile_paths(dirs) if dirs else []:
        made = peek(path)
        if made is None or mismatches(made, shape, names, str(hardware.get("name")), tp):
            continue
        try:
            cm = ProfiledCostModel(model, hardware, tp, ProfiledConfig(
                profile=str(path), iteration_overhead_s=roof.iteration_overhead_s))
        except ProfileError as e:   # e.g. Vidur's TP, or a missing operator: said below
            refused.append(str(e))
            continue
        unread = [k for k, v in asdict(roof).items()
                  if v is not None and k != "iteration_overhead_s"]
        if unread:
            raise ConfigError(
                f"executor.{unread[0]}: a setting of the roofline, but cost_model=auto chose the "
                f"measured profile {path}, which does not read it; set "
                "executor.cost_model=roofline to use it")
        why = f"auto: the measured profile {path} matches {run}"
        log.info("cost model: profiled (%s)", why)
        return cm, why
    where = f"under {dirs}" if dirs else \
        f"(no folders: executor.profile_dirs and ${ENV} are unset)"
    why = f"auto: no measured profile for {run} {where}; the roofline"
    if refused:
        why += " (profiles for this run refused: " + "; ".join(refused) + ")"
    log.info("cost model: roofline (%s)", why)
    return RooflineCostModel(model, hardware, tp, roof), why
