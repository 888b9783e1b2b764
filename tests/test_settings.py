"""`settings.parse`: names, types and ranges checked, nothing coerced, every error naming the
setting as it is typed on the command line."""
import dataclasses
import re
import typing

import pytest

from sarathi_lab.executors.sim import SimConfig, SimExecutor
from sarathi_lab.run.settings import CapacityConfig, RunConfig, SLOConfig
from sarathi_lab.schedulers.sarathi import SarathiConfig
from sarathi_lab.settings import ConfigError, describe, missing, parse, plain, setting


@dataclasses.dataclass
class Knobs:
    count: int = setting(4, ge=1, le=64, help="how many")
    ratio: float = setting(0.5, gt=0, lt=1)
    limit: float | None = setting(None, gt=0)
    cap: int | None = setting(None, ge=2)
    flag: bool = setting(False)
    label: str = setting("x")
    mode: str = setting("fast", choices=("fast", "slow"))
    kind: typing.Literal["a", "b"] = setting("a")
    level: typing.Literal[1, 2] = setting(1)
    sizes: list[int] = setting([1, 2])
    names: list[str] = setting([])
    auto_or_n: int | str = setting("auto")
    filled_by_code: object = dataclasses.field(default=None, metadata={"internal": True})


@dataclasses.dataclass
class Needs:
    must: int = setting(ge=0)
    lo: int = setting(0)
    hi: int = setting(10)

    def validate(self):
        if self.hi <= self.lo:
            raise ValueError(f"hi={self.hi} must be > lo={self.lo}")


def fails(values, cls=Knobs, where="node"):
    with pytest.raises(ConfigError) as e:
        parse(cls, values, where)
    return str(e.value)


def test_defaults_and_good_values():
    assert parse(Knobs, {}, "node") == Knobs()
    k = parse(Knobs, {"count": 64, "ratio": 0.25, "limit": 3, "cap": 2, "flag": True,
                      "label": "y", "mode": "slow", "kind": "b", "level": 2,
                      "sizes": [3], "names": ["p", "q"], "auto_or_n": 8}, "node")
    assert (k.count, k.ratio, k.limit, k.cap, k.flag, k.label) == (64, 0.25, 3.0, 2, True, "y")
    assert (k.mode, k.kind, k.level, k.sizes, k.names, k.auto_or_n) == (
        "slow", "b", 2, [3], ["p", "q"], 8)
    # an int is accepted as a number, and becomes one
    assert type(k.limit) is float and type(k.ratio) is float
    # list defaults are not shared between instances
    a, b = parse(Knobs, {}, "node"), parse(Knobs, {}, "node")
    a.sizes.append(9)
    assert b.sizes == [1, 2]


@pytest.mark.parametrize("key, value, expect", [
    ("count", 512.5, "node.count=512.5: must be an integer"),
    ("count", 4.0, "node.count=4.0: must be an integer"),        # no silent truncation
    ("count", True, "node.count=True: must be an integer"),      # a bool is not an int
    ("count", "4", "node.count='4': must be an integer"),
    ("ratio", "1", "node.ratio='1': must be a number"),
    ("ratio", False, "node.ratio=False: must be a number"),
    ("flag", 1, "node.flag=1: must be true or false"),
    ("flag", "true", "node.flag='true': must be true or false"),
    ("label", 3, "node.label=3: must be a string"),
    ("limit", "2", "node.limit='2': must be a number or null"),
    ("cap", 2.5, "node.cap=2.5: must be an integer or null"),
    ("sizes", 3, "node.sizes=3: must be a list of an integer"),
    ("sizes", [1, 2.5], "node.sizes[1]=2.5: must be an integer"),
    ("sizes", [True], "node.sizes[0]=True: must be an integer"),
    ("names", "p", "node.names='p': must be a list of a string"),
    ("kind", "c", "node.kind='c': must be one of 'a', 'b'"),
    ("level", True, "node.level=True: must be one of 1, 2"),     # True == 1, but not a choice
    ("level", 1.0, "node.level=1.0: must be one of 1, 2"),
    ("auto_or_n", 2.5, "node.auto_or_n=2.5: must be an integer or a string"),
])
def test_wrong_type_is_named_not_coerced(key, value, expect):
    assert fails({key: value}) == expect


@pytest.mark.parametrize("key, value, allowed", [
    ("count", 0, "must be >= 1 (allowed: [1, 64])"),
    ("count", 65, "must be <= 64 (allowed: [1, 64])"),
    ("ratio", 0.0, "must be > 0 (allowed: (0, 1))"),
    ("ratio", 1.0, "must be < 1 (allowed: (0, 1))"),
    ("limit", -0.5, "must be > 0 (allowed: (0, inf))"),
    ("cap", 1, "must be >= 2 (allowed: [2, inf))"),
])
def test_out_of_range_names_the_allowed_range(key, value, allowed):
    msg = fails({key: value})
    assert msg.startswith(f"node.{key}={value!r}: ") and msg.endswith(allowed), msg


def test_non_finite_and_huge_numbers_are_errors():
    assert "must be a finite number" in fails({"ratio": float("nan")})
    assert "must be a finite number" in fails({"ratio": float("inf")})
    assert fails({"limit": float("inf")}).startswith("node.limit=inf: must be")
    # an integer too large for a float (a typo of many zeros) is a setting error, not a crash
    assert fails({"limit": 10 ** 400}).startswith("node.limit=1000")
    assert fails({"ratio": -10 ** 400}).endswith("0: must be a finite number")


def test_choices():
    assert fails({"mode": "medium"}) == "node.mode='medium': must be one of fast, slow"
    assert parse(Knobs, {"mode": "slow"}, "node").mode == "slow"


def test_optional_fields_take_null():
    k = parse(Knobs, {"limit": None, "cap": None}, "node")
    assert k.limit is None and k.cap is None
    # a setting that is not Optional does not take null
    assert fails({"count": None}) == "node.count=None: must be an integer"


def test_unknown_keys_list_the_accepted_ones():
    msg = fails({"cuont": 3})
    accepted = ("auto_or_n, cap, count, flag, kind, label, level, limit, mode, names, ratio, "
                "sizes")
    assert msg == f"node.cuont: not a setting of Knobs; its settings are: {accepted}"
    msg = fails({"zz": 1, "aa": 2})
    assert msg.startswith("node.aa: not a setting of Knobs (nor are zz); its settings are:")
    # the component reading the node is named when given; an empty path names the bare key
    with pytest.raises(ConfigError, match=r"^budget: not a setting of policy 'p'; its"):
        parse(Knobs, {"budget": 1}, "", "policy 'p'")


def test_internal_fields_are_not_user_keys():
    msg = fails({"filled_by_code": 1})
    assert msg.startswith("node.filled_by_code: not a setting of Knobs")
    assert "filled_by_code" not in msg.split("its settings are:")[1]
    assert "filled_by_code" not in [row[0] for row in describe(Knobs)]
    # the real one: the sim executor's cost-model settings are filled in by its parse_config
    with pytest.raises(ConfigError, match=r"executor.cost_model_settings: not a setting"):
        SimExecutor.parse_config({"cost_model_settings": {}})
    with pytest.raises(ConfigError, match=r"x.cost_model_settings: not a setting of SimConfig"):
        parse(SimConfig, {"cost_model_settings": None}, "x")


def test_required_settings_and_cross_setting_rules():
    assert fails({}, Needs) == "node.must: required, and not set"
    assert parse(Needs, {"must": 0}, "node") == Needs(0, 0, 10)
    # validate()'s message gets the node's path in front
    assert fails({"must": 1, "lo": 5, "hi": 5}, Needs) == "node.hi=5 must be > lo=5"
    with pytest.raises(ConfigError, match=r"^capacity.qps_high=1.0 must be > qps_low=2.0$"):
        parse(CapacityConfig, {"qps_low": 2, "qps_high": 1}, "capacity")


def test_the_project_settings_classes():
    assert parse(RunConfig, {"progress": True, "num_threads": 3}, "").num_threads == 3
    with pytest.raises(ConfigError, match=r"^progress='sometimes': must be auto, true or false"):
        parse(RunConfig, {"progress": "sometimes"}, "")
    with pytest.raises(ConfigError, match=r"^num_threads=0: must be auto or an integer >= 1"):
        parse(RunConfig, {"num_threads": 0}, "")
    with pytest.raises(ConfigError, match=r"^capacity.criteria=\['tbt', 'p99'\]: must be a "
                                          r"non-empty list of tbt, attainment"):
        parse(CapacityConfig, {"criteria": ["tbt", "p99"]}, "capacity")
    with pytest.raises(ConfigError, match=r"^scheduler.block_size=12: must be a power of two"):
        parse(SarathiConfig, {"block_size": 12}, "scheduler")
    with pytest.raises(ConfigError, match=re.escape(
            "scheduler.kv_watermark=1.0: must be < 1 (allowed: [0, 1))")):
        parse(SarathiConfig, {"kv_watermark": 1.0}, "scheduler")
    assert parse(SLOConfig, {"ttft": 2}, "slo").ttft == 2.0


def test_describe_lists_type_default_and_range():
    rows = {name: rest for name, *rest in describe(Knobs)}
    assert rows["count"] == ["an integer", 4, "how many [1, 64]"]
    assert rows["limit"] == ["a number or null", None, "(0, inf)"]
    assert rows["mode"] == ["a string", "fast", "one of fast, slow"]
    assert rows["sizes"][:2] == ["a list of an integer", [1, 2]]
    assert rows["names"][1] == []
    assert describe(Needs)[0][2] == "required"


def test_plain_gives_plain_data_from_a_config_node():
    from omegaconf import OmegaConf
    node = OmegaConf.create({"a": 1, "b": {"c": [1, 2]}, "d": "${a}"})
    out = plain(node)
    assert out == {"a": 1, "b": {"c": [1, 2]}, "d": 1} and type(out) is dict
    assert type(out["b"]) is dict and type(out["b"]["c"]) is list
    given = {"a": 1}
    assert plain(given) == given and plain(given) is not given   # a copy
    assert plain(None) == {}
    assert plain(512) == 512 and plain("x") == "x"                # a length spec, a name


def test_missing_is_none_or_nan_and_nothing_else():
    import numpy as np
    assert missing(None) and missing(float("nan")) and missing(np.float64("nan"))
    assert not any(missing(v) for v in (0, 0.0, "", [], False, "nan", np.inf))
