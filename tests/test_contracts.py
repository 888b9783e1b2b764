"""The plug-in contracts of issue 7: a policy that overrides `update` gets every update (the
fast-forward is switched off for it, or goes through the `advance_decodes` it declares); the
fast-forward opt-in holds only for the schedule() and update() it was declared for (issue 21);
no policy can read
a request's true output length unless it declares itself an oracle; the config files mirror the
settings classes."""
import collections
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import LinearCost, make_policy
from helpers import composed, defaults, random_requests

from sarathi_lab.engine import Engine
from sarathi_lab.executors.base import Executor
from sarathi_lab.registry import (
    BUILTIN,
    controller_class,
    cost_model_class,
    executor_class,
    policy_class,
)
from sarathi_lab.request import Request, Status
from sarathi_lab.run.settings import CapacityConfig, RunConfig, SLOConfig
from sarathi_lab.schedulers.base import SchedulerConfig
from sarathi_lab.schedulers.mechanics.fast_forward import FastForward
from sarathi_lab.settings import parse
from sarathi_lab.sweeps.bookkeeping import register_resolvers
from sarathi_lab.traces import to_requests

POLICIES = ["request_level", "orca", "vllm", "sarathi", "sarathi_priority", "edf", "vtc"]
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


# -- fast-forward and policies that override update() ----------------------------------------------
def state(r):
    return (r.request_id, r.num_computed_tokens, r.num_output_tokens, r.status.name)


class CountsUpdates:
    """Counts update() calls and keeps its own per-request token count and a log of every state
    change, as a research policy that keeps statistics in update() would."""

    def update(self, out, step, start, end):
        self.updates += 1
        before = {id(r): r.num_output_tokens for r in out.reqs}
        done = super().update(out, step, start, end)
        for r in out.reqs:
            self.tokens[r.request_id] += r.num_output_tokens - before[id(r)]
        self.log.append((end, tuple(state(r) for r in out.reqs),
                         tuple(r.request_id for r in out.preempted), tuple(map(state, done))))
        return done


def counted_advance(inner):
    """An advance_decodes that does what CountsUpdates.update would have done in each of the
    skipped batches (`inner`: the built-in's), the requests in `ended` finishing in the last."""
    def advance(policy, times, ended=()):
        k = len(times)
        policy.advanced += k
        start = [(r, r.request_id, r.num_computed_tokens, r.num_output_tokens)
                 for r in policy.running]
        done = inner(policy, times, ended)
        for j, t in enumerate(times, 1):
            last = j == k
            policy.log.append((t, tuple((i, c + j, o + j, r.status.name if last else "RUNNING")
                                        for r, i, c, o in start),
                               (), tuple(map(state, done)) if last else ()))
        for r, *_ in start:
            policy.tokens[r.request_id] += k
        return done
    return advance


def counts_advances(ff):
    """The class body of a CountsUpdates policy that declares the matching advance_decodes."""
    return {"fast_forward": FastForward(steady_decode=ff.steady_decode,
                                        advance_decodes=counted_advance(ff.advance_decodes))}


class CountsSchedules:
    def schedule(self, now):
        self.schedules += 1
        return super().schedule(now)


def subclass(mixin, name, body=None, **kw):
    """`mixin` over the built-in policy `name`, on a fresh KV cache; `body(fast_forward)`: the
    class body, given the built-in's declaration (None: an empty body)."""
    base = make_policy(name, **kw)
    ns = body(type(base).fast_forward) if body is not None else {}
    cls = type(f"{mixin.__name__}{type(base).__name__}", (mixin, type(base)), ns)
    p = cls(base.cfg, base.kv)
    p.updates = p.advanced = p.schedules = 0
    p.tokens, p.log = collections.Counter(), []
    return p


def trace(seed=7, n=30):
    return random_requests(seed, n, rate=20.0, max_prompt=60, max_output=40)


def run(p, ff):
    reqs = trace()
    eng = Engine(p, LinearCost(per_ctx=1e-5), fast_forward=ff)
    eng.run(reqs)
    return eng, reqs


def assert_same_run(a, b):
    """Same requests' fates and token times, and the same iteration table."""
    (ea, ra), (eb, rb) = a, b
    for x, y in zip(ra, rb):
        assert (x.status, x.num_output_tokens, x.num_preemptions, x.finish_reason,
                x.rejection_reason) == (y.status, y.num_output_tokens, y.num_preemptions,
                                        y.finish_reason, y.rejection_reason)
        np.testing.assert_allclose(x.token_times, y.token_times, rtol=1e-12)
        np.testing.assert_allclose([x.first_scheduled_time, x.finish_time],
                                   [y.first_scheduled_time, y.finish_time], rtol=1e-12)
    np.testing.assert_allclose(ea.iterations(), eb.iterations(), rtol=1e-12)


def assert_same_log(a, b):
    assert len(a) == len(b)
    assert [entry[1:] for entry in a] == [entry[1:] for entry in b]
    np.testing.assert_allclose([e[0] for e in a], [e[0] for e in b], rtol=1e-12)


SCENARIOS = [dict(num_blocks=300, max_num_seqs=128),   # long steady decode runs
             dict(num_blocks=60, max_num_seqs=128),    # KV blocks the queue head; preemptions
             dict(num_blocks=300, max_num_seqs=3)]     # max_num_seqs blocks the queue head


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_policy_overriding_update_gets_every_update(name, scenario):
    kw = dict(max_model_len=128, token_budget=32, max_num_batched_tokens=128, **scenario)
    builtin = make_policy(name, **kw)
    assert builtin.fast_forward is not None
    reference = run(builtin, True)      # the built-in policy, fast-forwarded

    # update() overridden alone: fast-forward switched off, asked for or not
    logs = {}
    for ff in (True, False):
        p = subclass(CountsUpdates, name, **kw)
        assert p.fast_forward is None        # its update() is not the one vouched for
        eng, reqs = run(p, ff)
        assert eng.fast_forward is False
        assert p.updates == eng.num_iterations      # one update() per iteration, none skipped
        assert_same_run((eng, reqs), reference)
        assert p.tokens == {r.request_id: r.num_output_tokens for r in reqs if r.num_output_tokens}
        logs[ff] = p.log
    assert_same_log(logs[True], logs[False])

    # update() overridden and a matching advance_decodes declared: fast-forward stays on, goes
    # through advance_decodes, and does what the skipped update() calls would have done
    p = subclass(CountsUpdates, name, counts_advances, **kw)
    assert p.fast_forward is not None
    eng, reqs = run(p, True)
    assert eng.fast_forward is True
    assert p.advanced > 0 and p.updates < eng.num_iterations     # it really skipped
    assert p.updates + p.advanced == eng.num_iterations
    assert_same_run((eng, reqs), reference)
    assert p.tokens == {r.request_id: r.num_output_tokens for r in reqs if r.num_output_tokens}
    assert_same_log(p.log, logs[False])
    # and without fast-forward it is stepped like the rest
    q = subclass(CountsUpdates, name, counts_advances, **kw)
    eng, reqs = run(q, False)
    assert q.advanced == 0 and q.updates == eng.num_iterations
    assert_same_log(q.log, logs[False])


@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_overriding_schedule_without_declaring_is_stepped(name):
    kw = dict(num_blocks=300, max_model_len=128, token_budget=32, max_num_batched_tokens=128)
    reference = run(make_policy(name, **kw), True)
    p = subclass(CountsSchedules, name, **kw)
    assert p.fast_forward is None
    eng, reqs = run(p, True)
    assert eng.fast_forward is False
    assert p.schedules >= eng.num_iterations
    assert_same_run((eng, reqs), reference)
    # re-declared (here: the built-in's declaration, vouched for) it is skipped
    q = subclass(CountsSchedules, name, lambda ff: {"fast_forward": ff}, **kw)
    assert q.fast_forward is not None
    eng, reqs = run(q, True)
    assert eng.fast_forward is True and q.schedules < eng.num_iterations
    assert_same_run((eng, reqs), reference)


def test_the_fast_forward_opt_in_holds_only_for_the_schedule_and_update_it_was_declared_for():
    from sarathi_lab.schedulers.sarathi import Sarathi
    ours = FastForward(steady_decode=lambda policy: False)

    class A(Sarathi):                # update changed, nothing declared: stepped
        def update(self, *a):
            return super().update(*a)

    class B(A):                      # declares for A's update: its own declaration
        fast_forward = ours

    class C(B):                      # update changed again below the declaration: stepped
        def update(self, *a):
            return super().update(*a)

    class D(Sarathi):                # a victim rule, inside schedule(): Sarathi's declaration
        def preemption_victim(self, candidates):
            return candidates[0]

    class E(B):                      # nothing changed: B's declaration
        pass

    class Mixin:                     # a mixin's schedule counts as the class's own
        def schedule(self, now):
            return super().schedule(now)

    class F(Mixin, Sarathi):
        pass

    class G(Sarathi):                # says so explicitly
        fast_forward = None

    verdict = {c.__name__: c.fast_forward for c in (A, B, C, D, E, F, G)}
    assert verdict == {"A": None, "B": ours, "C": None, "D": Sarathi.fast_forward, "E": ours,
                       "F": None, "G": None}
    kv = make_policy("sarathi").kv
    for cls, on in ((A, False), (B, True), (D, True), (F, False)):
        assert Engine(cls(cls.config_class(), kv), LinearCost()).fast_forward is on, cls


def test_an_old_style_fast_forward_hook_or_a_wrong_declaration_is_refused():
    from sarathi_lab.schedulers.sarathi import Sarathi
    with pytest.raises(TypeError, match=r"^policy class test_contracts\..*<locals>\.Old defines "
                       r"steady_decode\(\): the fast-forward hooks are no longer methods"):
        class Old(Sarathi):
            def steady_decode(self):
                return True

    class Hooks:                     # in a mixin too: nothing would call it
        def advance_decodes(self, times, ended=()):
            return []

    with pytest.raises(TypeError, match=r"defines advance_decodes\(\)"):
        type("Mixed", (Hooks, Sarathi), {})
    with pytest.raises(TypeError, match=r"^policy class test_contracts\..*<locals>\.Flag: "
                       r"fast_forward=True must be a FastForward or None$"):
        class Flag(Sarathi):
            fast_forward = True
    with pytest.raises(TypeError, match=r"^FastForward\(steady_decode=True\): must be a "
                       r"function of the policy$"):
        FastForward(steady_decode=True)


# -- no policy reads the true output length -----------------------------------------------------
SECRETS = (4242, 31337)
# counters of work done, which pass through every value up to a request's length on the way
PROGRESS = {"num_computed_tokens", "num_output_tokens", "num_stored_tokens"}


def leaks(root, secrets=SECRETS):
    """Paths from `root` to an int in `secrets`, following attributes (__dict__ and __slots__)
    and containers; raises if the walk reaches an executor or an engine."""
    found, seen, todo = [], set(), [(root, "policy")]
    while todo:
        obj, path = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, float, bool)):
            continue
        seen.add(id(obj))
        if type(obj) is int or isinstance(obj, np.integer):
            if int(obj) in secrets:
                found.append(path)
            continue
        if isinstance(obj, (Executor, Engine)):
            raise AssertionError(f"{path}: the policy can reach the {type(obj).__name__}")
        if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType,
                            types.BuiltinFunctionType)):
            continue
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind in "iu" and np.isin(obj, secrets).any():
                found.append(path)
            continue
        if isinstance(obj, dict):
            todo.extend((k, f"{path}.key") for k in obj)
            todo.extend((v, f"{path}[{k!r}]") for k, v in obj.items())
            continue
        if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(obj))
            continue
        names = set(getattr(obj, "__dict__", {}))
        for klass in type(obj).__mro__:
            names.update(n for n in getattr(klass, "__slots__", ()) if not n.startswith("__"))
        for n in names - PROGRESS:
            if hasattr(obj, n):
                todo.append((getattr(obj, n), f"{path}.{n}"))
    return found


class Inspects:
    """Looks at everything it can reach, and at every attribute of every request it is shown,
    whenever the engine calls it (its fast-forward declaration too, so that stays on)."""

    def look(self, reqs=()):
        self.looks += 1
        for r in reqs:
            assert type(r) is Request and r._output_len is None
            assert r.take_output_len() is None
        found = leaks(self) + leaks(list(reqs))
        assert not found, f"true output length reachable at {found}"
        for r in reqs:
            with pytest.raises(PermissionError, match="oracle = True"):
                self.oracle_output_len(r)

    def schedule(self, now):
        self.look(list(self.waiting) + self.running)
        return super().schedule(now)

    def update(self, out, step, start, end):
        self.look(out.reqs)
        return super().update(out, step, start, end)


def inspected(ff):
    """The class body of an Inspects policy: the built-in's declaration, looking first."""
    def steady(policy):
        policy.look()
        return ff.steady_decode(policy)

    def advance(policy, times, ended=()):
        policy.look(policy.running)
        return ff.advance_decodes(policy, times, ended)
    return {"fast_forward": FastForward(steady_decode=steady, advance_decodes=advance)}


class Oracle(CountsSchedules):
    oracle = True

    def schedule(self, now):
        for r in self.waiting:
            self.seen[r.request_id] = self.oracle_output_len(r)
        return super().schedule(now)


def secret_trace():
    df = pd.DataFrame({"arrival_time": [0.0, 0.5], "num_prompt_tokens": [7, 5],
                       "num_output_tokens": list(SECRETS[::-1]), "priority": [1, 0]})
    return to_requests(df)


@pytest.mark.parametrize("name", POLICIES)
def test_no_policy_can_read_the_true_output_length(name):
    # long enough that nothing but the trace's length ends a request; blocks numbered below
    # the secrets (a block id is an int the walk sees)
    kw = dict(num_blocks=2600, block_size=32, max_model_len=40000, token_budget=256)
    p = subclass(Inspects, name, inspected, **kw)
    p.looks = 0
    reqs = secret_trace()
    assert leaks(reqs) != []             # the walk finds them where they are
    eng = Engine(p, LinearCost(per_ctx=1e-7))
    assert eng.fast_forward
    eng.run(reqs)
    # it looked at each stepped iteration's schedule() and update(), and at the declaration's
    assert p.looks > 2 * len(eng.rows) > 0
    assert [r.num_output_tokens for r in reqs] == [31337, 4242]
    assert all(r.status is Status.FINISHED and r.finish_reason == "stop" for r in reqs)
    # the lengths were in the system all along: the executor holds them
    assert [eng.executor.output_len(r) for r in reqs] == [31337, 4242]
    assert leaks(eng.output_lens) != []
    # an oracle policy reads them, through the one door
    o = subclass(Oracle, name, **kw)
    o.seen = {}
    Engine(o, LinearCost()).run(secret_trace())
    assert o.seen == {0: 31337, 1: 4242}


# -- the config files mirror the settings classes ------------------------------------------------
def options(group):
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml")
                  if p.stem not in ("custom", "common"))


def compose_raw(*overrides):
    """The composed config, interpolations left as written."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.fixture(autouse=True, scope="module")
def resolvers():
    register_resolvers()   # what the CLI does before Hydra composes


def test_options_exist():
    assert options("scheduler") == sorted(POLICIES)
    assert options("executor") == ["sim", "torch"]


@pytest.mark.parametrize("option", sorted(POLICIES))
def test_scheduler_files_mirror_the_policy_config(option):
    node = composed(f"scheduler={option}")["scheduler"]
    assert node.pop("name") == option
    cls = policy_class(option).config_class
    own = defaults(cls)
    assert node.keys() >= own.keys(), f"settings missing from the files: {own.keys() - node.keys()}"
    for k, v in node.items():
        if k in own:
            assert v == own[k], f"scheduler.{k}: {v!r} in the files, {own[k]!r} in {cls.__name__}"
        else:   # another policy's knob: null, which the policy does not read
            assert v is None, f"scheduler.{k}={v!r}: {option} does not read it"
    # common.yaml holds the shared settings, every built-in policy's own knob and every built-in
    # budget controller's (schedulers/controllers/), nothing else
    knobs = set().union(*(defaults(policy_class(n).config_class) for n in POLICIES),
                        *(defaults(controller_class(n).config_class)
                          for n in BUILTIN["sarathi_lab.controllers"]))
    assert set(node) == knobs
    assert defaults(SchedulerConfig).keys() <= knobs


@pytest.mark.parametrize("option", ["sim", "torch"])
def test_executor_files_mirror_the_executor_config(option):
    raw = compose_raw(f"executor={option}")
    run_seed = composed(f"executor={option}", "seed=5")
    node = composed(f"executor={option}")["executor"]
    assert node.pop("name") == option
    raw_node = raw["executor"]
    cls = executor_class(option)
    want = defaults(cls.config_class)
    if "cost_model" in want:   # the sim executor: its cost model's settings sit beside its own
        cm = defaults(cost_model_class(node["cost_model"]).config_class)
        assert not want.keys() & cm.keys()
        want.update(cm)
        # and every other built-in cost model's own settings as null (so that they can be set
        # without a +), as common.yaml does for the policies' knobs
        for name in BUILTIN["sarathi_lab.cost_models"]:
            for k in defaults(cost_model_class(name).config_class).keys() - want.keys():
                want[k] = None
    assert set(node) == set(want)
    for k, v in node.items():
        if isinstance(raw_node[k], str) and raw_node[k].startswith("${"):
            assert raw_node[k] == "${seed}" and k == "seed"    # follows the run's seed
            assert run_seed["executor"][k] == 5
            continue
        assert v == want[k] and type(v) is type(want[k]), \
            f"executor.{k}: {v!r} in {option}.yaml, {want[k]!r} in {cls.config_class.__name__}"
    # and the whole node is valid as it stands
    cls.parse_config(node)


def test_run_and_capacity_settings_mirror_the_classes():
    raw = compose_raw()
    c = composed()
    top = {k: v for k, v in c.items() if not isinstance(v, dict) and k != "experiment"}
    want = defaults(RunConfig)
    assert set(top) == set(want)
    assert raw["name"].startswith("${now:")        # a timestamp
    for k in set(want) - {"name"}:
        assert top[k] == want[k] and type(top[k]) is type(want[k]), (k, top[k], want[k])
    assert c["capacity"] == defaults(CapacityConfig)
    parse(RunConfig, top, "")
    parse(CapacityConfig, c["capacity"], "capacity")


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONFIGS / "slo").glob("*.yaml")))
def test_slo_presets_parse(preset):
    node = composed(f"slo={preset}")["slo"]
    if preset == "none":   # no SLO judged
        assert node is None
        return
    slo = parse(SLOConfig, node, "slo")
    assert slo.name == preset
    assert set(node) == set(defaults(SLOConfig))      # every criterion spelled out


def test_logger_presets_parse():
    from sarathi_lab.run.settings import LOGGERS
    for name in LOGGERS:
        node = composed(f"logger={name}")["logger"]
        parse(LOGGERS[name], node, "logger")
        assert set(node) == set(defaults(LOGGERS[name])), name
    assert composed("logger=csv")["logger"]["path"] == defaults(LOGGERS["csv"])["path"]


def test_registry_scans_the_installed_entry_points_once_and_lets_them_override(monkeypatch):
    """A run looks up several plug-ins (a capacity search, per probe): the installed
    distributions' entry points are read once per process, and a registered name wins over
    the built-in table's."""
    from importlib.metadata import EntryPoint, EntryPoints

    from sarathi_lab import registry
    scans = []

    def entry_points():
        scans.append(1)
        return EntryPoints([
            EntryPoint("sarathi", "tests_pkg.mine:Mine", "sarathi_lab.schedulers"),
            EntryPoint("tiny", "tests_pkg.mine:Tiny", "sarathi_lab.routers"),
            EntryPoint("sarathi", "elsewhere:X", "some.other.group")])
    monkeypatch.setattr(registry, "entry_points", entry_points)
    registry._registered.cache_clear()
    try:
        policies = registry.known("sarathi_lab.schedulers")
        routers = registry.known("sarathi_lab.routers")
        assert registry.known("sarathi_lab.queues") == BUILTIN["sarathi_lab.queues"]
    finally:
        registry._registered.cache_clear()   # the real scan for the tests after this one
    assert len(scans) == 1
    assert policies == {**BUILTIN["sarathi_lab.schedulers"], "sarathi": "tests_pkg.mine:Mine"}
    assert routers == {**BUILTIN["sarathi_lab.routers"], "tiny": "tests_pkg.mine:Tiny"}


def test_a_policy_cannot_shadow_a_toolkit_name_unknowingly():
    """A plug-in that defines a name of the toolkit its `schedule()` composes (mechanics/: here
    a helper of its own called `admit_waiting`, and a private `_finished`) would silently
    replace what the mechanics call: refused when the class is created, naming the name and
    the way to do it knowingly; the documented hooks and an `overrides` entry pass."""
    from sarathi_lab.schedulers.sarathi import Sarathi

    with pytest.raises(TypeError, match=r"defines 'admit_waiting', a name of the policy toolkit "
                       r"\(sarathi_lab.schedulers.mechanics.admit.Admission\).*overrides = "
                       r"\('admit_waiting',\)"):
        class OwnHelper(Sarathi):
            def admit_waiting(self, out, budget, whole=False):
                return budget

    with pytest.raises(TypeError, match="defines '_finished'"):
        class Mixin:
            _finished = None

        class WithMixin(Mixin, Sarathi):
            pass

    class Knowingly(Sarathi):
        overrides = ("admit_waiting",)

        def admit_waiting(self, out, budget, whole=False):
            return super().admit_waiting(out, budget, whole)

        def update(self, out, step, start, end):   # a hook: no entry needed
            return super().update(out, step, start, end)

    assert Knowingly.admit_waiting is not Sarathi.admit_waiting


def _policy_names_used(source: str) -> set[str]:
    """Attribute names read or called on a policy: `policy.x`, `<anything>.policy.x`,
    `policy_cls.x`, `<anything>.policy_cls.x`."""
    import ast
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            v = node.value
            holder = v.id if isinstance(v, ast.Name) else v.attr if isinstance(
                v, ast.Attribute) else None
            if holder in ("policy", "policy_cls"):
                names.add(node.attr)
    return names


def test_the_layers_above_use_only_the_policy_interface():
    """schedulers/interface.py lists what the engine, topologies, run and server use of a
    policy; a module outside schedulers/ that reaches past it (the toolkit, a private name)
    fails here, and so does a name the interface lists that Policy does not have."""
    from pathlib import Path

    import sarathi_lab
    from sarathi_lab.schedulers.base import Policy
    from sarathi_lab.schedulers.interface import NAMES
    pkg = Path(sarathi_lab.__file__).parent
    bad = {}
    for path in sorted(pkg.rglob("*.py")):
        if "schedulers" in path.relative_to(pkg).parts:
            continue
        extra = _policy_names_used(path.read_text()) - NAMES
        if extra:
            bad[str(path.relative_to(pkg))] = sorted(extra)
    assert bad == {}
    assert {"schedule", "update", "bind_engine", "running", "parse_config"} <= NAMES
    missing = [n for n in NAMES if not hasattr(Policy, n) and
               n not in Policy.__init__.__code__.co_names and n not in ("cfg", "kv")]
    assert missing == []
    # and the scan sees a reach past it
    assert _policy_names_used("e.policy._output_len = f\nself.policy.admit_waiting(o, b)\n") \
        == {"_output_len", "admit_waiting"}
