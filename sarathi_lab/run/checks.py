"""The checks `config.resolve` makes across components: a plug-in's node cleared of other
plug-ins' placeholders, speculation settings that can act, an SLO that belongs to the run's
model, random-weight keys only without weights, and (once the requests are built) deadline
admission only with deadlines. Each raises a `ConfigError` naming the setting."""
from __future__ import annotations

import dataclasses

from sarathi_lab.run.settings import SLOConfig
from sarathi_lab.settings import ConfigError


def drop_unread_knobs(node: dict, config_classes: tuple[type, ...], where: str, who: str,
                       user: list[str], notes: list[str] | None) -> None:
    """Edit a plug-in's node (scheduler, cluster) before parsing. A null is a placeholder (as
    in configs/scheduler/common.yaml): another plug-in's knob, or (for a setting that takes no
    null) this one's own default, and is dropped. With `notes` (a multirun), a setting the user
    made that the plug-in does not read is noted and dropped; without, parsing will refuse it."""
    fields = {f.name: f for c in config_classes for f in dataclasses.fields(c)}
    for k, v in list(node.items()):
        if v is None and (k not in fields or fields[k].default is not None):
            if k in fields and f"{where}.{k}" in user:
                raise ConfigError(f"{where}.{k}=null: must be set (default "
                                  f"{fields[k].default!r})")
            node.pop(k)
    if notes is not None:
        for k in sorted(set(node) - set(fields)):
            if f"{where}.{k}" in user:
                notes.append(f"{where}.{k}: not read by {who}")
                node.pop(k)


def check_speculation_keys(k: int, executor_cls, executor_cfg, user: list[str], unread) -> None:
    """Speculative decoding: with k > 0 an executor that runs it, with settings that can; with
    k = 0 its speculation settings are unread."""
    from sarathi_lab.executors.base import check_speculation
    if check_speculation(k, executor_cls):
        executor_cls.check_speculation_settings(executor_cfg, k)
        return
    defaults = {f.name: f for f in dataclasses.fields(executor_cfg)}
    for key in executor_cls.speculation_settings:
        if f"executor.{key}" in user:
            unread(f"executor.{key}", "read only with scheduler.num_speculative_tokens > 0")
            f = defaults[key]   # a multirun leaves it at its default
            setattr(executor_cfg, key, f.default if f.default is not dataclasses.MISSING
                    else f.default_factory())


def _presets(group: str) -> set[str]:
    """The shipped options of a config group (configs/<group>/*.yaml)."""
    from importlib.resources import files
    return {p.name[:-5] for p in files("sarathi_lab.configs").joinpath(group).iterdir()
            if p.name.endswith(".yaml")}


def check_slo_model(slo: SLOConfig | None, model: str | None, user: list[str]) -> None:
    """An SLO set for one model judges a run of another only when the user chose it (`slo=` on
    the command line): the default follows the model (configs/config.yaml: ``${model}-strict``),
    but an experiment's or a sweep's fixed SLO would otherwise judge another model silently.
    A model of the user's own (a `model.name` that is no preset) has no SLO of its own to offer
    instead, and is judged by the one composed."""
    if slo is not None and slo.model == "hf" and "slo" not in user:
        # model=hf is any config.json: no limits were set for it, so none is taken unasked
        raise ConfigError(
            f"slo={slo.name}: model=hf (a shape from any config.json) has no SLO of its own; "
            "choose one for this model's size with slo=<option> (configs/slo: e.g. "
            "slo=mistral-7b-strict for a ~7B dense model, slo=llama-2-70b-strict for ~70B), or "
            f"name slo={slo.name} on the command line to judge it by Mistral-7B's limits")
    if slo is None or slo.model is None or model is None or slo.model == model or "slo" in user:
        return
    if model not in _presets("model"):   # a model of the user's own: no SLO of its own to offer
        return
    raise ConfigError(
        f"slo={slo.name}: its limits were set for model {slo.model}, but this run's model is "
        f"{model}; choose this model's SLO (slo={model}-strict or slo={model}-relaxed, "
        f"configs/slo), or name slo={slo.name} on the command line to judge {model} by "
        f"{slo.model}'s limits anyway")


def check_random_weight_keys(model: dict, user: list[str], unread) -> None:
    """The random weights' seed and scale act only without ``model.path`` (weights loaded)."""
    if not model.get("path"):
        return
    for k in ("model.init_seed", "model.init_std"):
        if k in user:
            unread(k, f"random weights only: the weights are loaded from model.path="
                      f"{model['path']}")
