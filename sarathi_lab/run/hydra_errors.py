"""What `sarathi-lab` says when Hydra cannot compose the command line: one line a user can act on,
in place of Hydra's generic advice (append an unknown key with `+`, which for a misspelt key is
wrong; every file of a config group, bases included, as a choice; a grammar error with no hint
that a path needs quoting). Errors this module does not recognise get Hydra's own words."""
from __future__ import annotations

import difflib
import shlex

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException


def _close(word: str, choices) -> list[str]:
    return difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)


def unknown_key(ex: ConfigCompositionException) -> str | None:
    """`scheduler.token_budgt=1024`: the setting does not exist. The accepted keys are those of
    the config node it was looked up in (the chosen scheduler's, here), so a close one is
    offered; `+` is never advised: a key no component reads is refused at the next step anyway
    (config.resolve: unread settings)."""
    cause = ex.__cause__
    parent = getattr(cause, "parent_node", None)
    full_key, key = getattr(cause, "full_key", None), getattr(cause, "key", None)
    if not str(ex).startswith("Could not override") or full_key is None or parent is None \
            or not hasattr(parent, "keys"):
        return None
    prefix = str(full_key)[: -len(str(key))] if str(full_key).endswith(str(key)) else ""
    accepted = [str(k) for k in parent.keys()]
    where = f"the settings of {prefix.rstrip('.')}" if prefix else "the top-level settings"
    if str(full_key) == "model.hf_config":
        # a hand-written preset has a shape of its own, which a config.json would replace
        return ("model.hf_config: this model preset has a shape of its own; for the shape of "
                "a config.json choose model=hf model.hf_config=PATH (a config.json, a model "
                "directory or a shipped name)")
    if (new := renamed(prefix.rstrip("."), parent, str(key))) is not None:
        from sarathi_lab.settings import renamed_message
        return renamed_message(prefix.rstrip("."), str(key), new)
    near = _close(str(key), accepted)
    if near:
        return (f"{full_key}: no such setting; did you mean "
                f"{' or '.join(prefix + n for n in near)}?")
    return f"{full_key}: no such setting; {where} are: {', '.join(sorted(accepted))}"


def renamed(group: str, node, key: str) -> str | None:
    """The new name of `key`, an old name of a setting (a config class's `renamed`): of the
    executor chosen in config node `node`, or of the chosen budget controller, else of any
    registered one (a controller's setting is set flat under `scheduler`)."""
    from sarathi_lab import registry
    try:
        if group == "executor":
            classes = [registry.executor_class(node.get("name"))]
        elif group == "scheduler":
            chosen = node.get("controller") or "static"
            classes = [registry.controller_class(n)
                       for n in (chosen, *sorted(registry.known("sarathi_lab.controllers")))]
        else:
            return None
    except Exception:   # an unknown or unloadable component: resolving it names the problem
        return None
    for cls in classes:
        if (new := getattr(cls.config_class, "renamed", {}).get(key)) is not None:
            return new
    return None


def bases(group: str, options) -> set[str]:
    """The options of a config group that other options build on (named in their `defaults`,
    as scheduler/common.yaml is): parts of a choice, not choices."""
    import importlib.resources

    import yaml
    root = importlib.resources.files("sarathi_lab.configs") / group
    used = set()
    for opt in options:
        try:
            doc = yaml.safe_load((root / f"{opt}.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):   # not one of ours (a search path): no bases known
            continue
        for entry in doc.get("defaults", ()) if isinstance(doc, dict) else ():
            if isinstance(entry, str) and entry in options and entry != opt:
                used.add(entry)
    return used


def missing_option(ex: MissingConfigException) -> str | None:
    """`scheduler=nosuch`: no such option in the group; the choices exclude the bases."""
    missing, options = getattr(ex, "missing_cfg_file", None), getattr(ex, "options", None)
    if not missing or not options or "/" not in str(missing):
        return None
    group, _, name = str(missing).rpartition("/")
    choices = [o for o in options if o not in bases(group, options)]
    near = _close(name, choices)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return f"{group}={name}: no such {group}; {hint}choices: {', '.join(choices)}"


def _quoted(key_value: str) -> str:
    """The override as the shell should be given it: the value in Hydra's quotes, the whole in
    the shell's."""
    key, _, value = key_value.partition("=")
    q = "'" if '"' in value else '"'
    return shlex.quote(f"{key}={q}{value}{q}")


def parse_error(ex: OverrideParseException, argv: list[str]) -> str | None:
    """An override Hydra's grammar rejects. A value with a space, a non-ASCII letter or a
    bracket needs Hydra's quotes; a word with no `=` right after a `key=value` is most likely
    the rest of that value, split by the shell at a space."""
    override = str(getattr(ex, "override", "") or "")
    if not override or override not in argv:
        return None
    if "=" not in override:
        i = argv.index(override)
        if i > 0 and "=" in argv[i - 1]:
            joined = f"{argv[i - 1]} {override}"
            return (f"'{override}' is not an override (no '='): if it is the rest of "
                    f"'{argv[i - 1]}', split at a space by the shell, quote the whole: "
                    f"{_quoted(joined)}")
        return None
    key, _, value = override.partition("=")
    return (f"{key}: Hydra's override grammar cannot read the value {value!r}; a value with "
            f"spaces, non-ASCII letters or brackets needs quotes: {_quoted(override)}")


def explain(ex: BaseException, argv: list[str]) -> str | None:
    """The message for a composition error of Hydra's, or None for any other."""
    if isinstance(ex, MissingConfigException):
        return missing_option(ex)
    if isinstance(ex, OverrideParseException):
        return parse_error(ex, argv)
    if isinstance(ex, ConfigCompositionException):
        return unknown_key(ex)
    return None
