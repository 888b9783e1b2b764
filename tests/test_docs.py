"""The documentation is true: the README's plug-in examples run through the CLI and do what
their settings say, and every reference to the design document leads to a file."""
import json
import os
import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from conftest import LinearCost, req
from test_cli import cli as sarathi_lab_cli

from sarathi_lab.engine import Engine
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.metrics import iterations_table, requests_table, summarize

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DESIGN_NAME = "DESIGN" + ".md"   # spelled apart: this file is among those scanned below
EXAMPLE = re.compile(r"<!-- example: (\S+) -->\s*\n```(\w+)\n(.*?)\n```", re.S)
SMALL = ("trace=synthetic", "trace.num_requests=20")


def examples() -> dict[str, str]:
    """The README's marked example blocks, by file name."""
    found = {}
    for name, lang, code in EXAMPLE.findall(README.read_text()):
        assert name not in found, f"README: example {name} given twice"
        found[name] = code + "\n"
    return found


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    """The examples written as modules, and the README's entry points as an installed
    distribution's metadata (what `pip install` of a package with that pyproject.toml leaves)."""
    d = tmp_path_factory.mktemp("plugins")
    for name, code in examples().items():
        if name.endswith(".py"):
            (d / name).write_text(code)
    groups = tomllib.loads(examples()["pyproject.toml"])["project"]["entry-points"]
    info = d / "my_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in groups.items()))
    return d


def cli(plugins: Path, run_dir: Path, *args):
    """`sarathi-lab` in a subprocess with the example modules on PYTHONPATH, as the README
    tells a user to run them; the run's summary and tables."""
    path = os.pathsep.join([str(plugins), str(ROOT), os.environ.get("PYTHONPATH", "")])
    r = sarathi_lab_cli(f"hydra.run.dir={run_dir}", *args, cwd=run_dir.parent,
                        env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    return (summary, pd.read_parquet(run_dir / "requests.parquet"),
            pd.read_parquet(run_dir / "iterations.parquet"))


def test_readme_marks_every_plugin_example():
    assert set(examples()) == {"pyproject.toml", "my_policy.py", "my_fair.py", "my_costs.py",
                               "my_executor.py"}
    text = README.read_text()
    # each module's run command, as printed in the README, names its class by dotted path
    for cmd in ("scheduler.name=my_policy:DecodeFirst", "scheduler.name=my_fair:LeastServedTenant",
                "scheduler.queue=my_fair:LongestPromptFirst",
                "executor.cost_model=my_costs:LinearCost", "executor.name=my_executor:TokenRate"):
        assert cmd in text, cmd


def test_policy_example_runs_and_its_setting_caps_prefills(plugins, tmp_path):
    policy = ("scheduler=custom", "scheduler.name=my_policy:DecodeFirst", *SMALL)
    s, reqs, it = cli(plugins, tmp_path / "capped", *policy, "+scheduler.prefill_chunk=48")
    assert s["num_finished"] == 20
    assert s["settings"]["scheduler"]["prefill_chunk"] == 48
    assert it["prefill_tokens"].max() == 48          # chunks of 48, never more
    _, _, it_default = cli(plugins, tmp_path / "default", *policy)
    assert it_default["prefill_tokens"].max() == 256   # the setting's default
    # its steady_decode is exact: stepping every iteration gives the same run
    _, reqs_slow, it_slow = cli(plugins, tmp_path / "stepped", *policy,
                                "+scheduler.prefill_chunk=48", "fast_forward=false")
    assert len(it_slow) == len(it)
    for col in ("ttft", "e2e", "num_output_tokens"):
        assert reqs_slow[col].to_numpy() == pytest.approx(reqs[col].to_numpy(), rel=1e-12)


def test_fair_policy_example_runs_with_its_queue(plugins, tmp_path):
    s, reqs, _ = cli(plugins, tmp_path / "run", "scheduler=custom",
                     "scheduler.name=my_fair:LeastServedTenant",
                     "scheduler.queue=my_fair:LongestPromptFirst", *SMALL)
    assert s["num_finished"] == 20
    assert s["settings"]["scheduler"]["queue"] == "my_fair:LongestPromptFirst"


def _fair_run(plugins, monkeypatch, fast_forward: bool):
    monkeypatch.syspath_prepend(str(plugins))
    import my_fair
    kv = KVCacheManager(24, 4, max_model_len=64)
    policy = my_fair.LeastServedTenant(
        my_fair.LeastServedTenant.parse_config({"block_size": 4, "token_budget": 16}), kv,
        my_fair.LongestPromptFirst())
    reqs = [req(i, 6 + 3 * (i % 4), 20, t=0.05 * i) for i in range(12)]
    for r in reqs:
        r.tenant = "a" if r.request_id % 3 else "b"
    eng = Engine(policy, LinearCost(), fast_forward=fast_forward)
    eng.run(reqs)
    return policy, eng, reqs


def test_fair_policy_example_counts_the_same_with_and_without_fast_forward(plugins,
                                                                           monkeypatch):
    fast, eng, reqs = _fair_run(plugins, monkeypatch, True)
    slow, _, _ = _fair_run(plugins, monkeypatch, False)
    assert eng.fast_forward    # update and advance_decodes overridden together: still on
    assert eng._fold           # and its advance_decodes ends requests inside skipped runs
    it = iterations_table(eng.iterations())
    assert it["preemptions"].sum() > 0     # the KV is small enough for its victim rule to act
    assert fast.served == slow.served
    # every token computed, recompute after preemption included, was counted for its tenant
    assert sum(fast.served.values()) == (it["prefill_tokens"] + it["decode_tokens"]).sum()
    assert all(r.status.name == "FINISHED" for r in reqs)


def test_fair_policy_example_hooks(plugins, monkeypatch):
    monkeypatch.syspath_prepend(str(plugins))
    import my_fair
    q = my_fair.LongestPromptFirst()
    for i, n in enumerate((5, 30, 12, 30)):
        q.push(req(i, n, 4, t=float(i)))
    assert [r.request_id for r in q] == [1, 3, 2, 0]   # longest first, ties by arrival
    policy, _, _ = _fair_run(plugins, monkeypatch, False)
    a1, b, a2 = req(10, 8, 4), req(11, 8, 4), req(12, 8, 4)
    a1.tenant, b.tenant, a2.tenant = "x", "y", "x"
    policy.served.update({"x": 50, "y": 5})
    assert policy.preemption_victim([a1, b, a2]) is a2
    policy.served["y"] = 500
    assert policy.preemption_victim([a1, b, a2]) is b


def test_cost_model_example_sets_every_iteration_time(plugins, tmp_path):
    s, _, it = cli(plugins, tmp_path / "run",
                   "executor.cost_model=my_costs:LinearCost", "+executor.base_s=0.05",
                   "+executor.per_token_s=0", "+executor.per_kv_token_s=0", *SMALL)
    assert s["num_finished"] == 20 and s["simulated"] is True
    assert s["settings"]["executor"]["cost_model_settings"]["base_s"] == 0.05
    # stepped and fast-forwarded iterations alike (iteration_time, generic decode_run)
    assert (it["duration"] == 0.05).all()
    assert s["kv"]["blocks_total"] > 1000    # the roofline's memory sizing, delegated to


def test_executor_example_decides_durations_and_ends(plugins, tmp_path):
    s, reqs, it = cli(plugins, tmp_path / "run", "executor=custom",
                      "executor.name=my_executor:TokenRate", "+executor.stop_after=3",
                      "+executor.tokens_per_s=1000", *SMALL)
    assert s["num_finished"] == 20 and s["simulated"] is True
    assert s["kv"]["blocks_total"] == 4096
    assert (reqs["num_output_tokens"] == 3).all() and (reqs["finish_reason"] == "stop").all()
    tokens = it["prefill_tokens"] + it["decode_tokens"]
    assert it["duration"].to_numpy() == pytest.approx((0.002 + tokens / 1000).to_numpy())


def test_readme_entry_points_register_the_examples(plugins, tmp_path):
    s, _, _ = cli(plugins, tmp_path / "run", "scheduler=custom", "scheduler.name=decode_first",
                  "executor=custom", "executor.name=sim", "+executor.cost_model=linear",
                  "+executor.base_s=0.02", "+executor.per_token_s=0",
                  "+executor.per_kv_token_s=0", *SMALL)
    assert s["settings"]["scheduler"]["class"] == "my_policy:DecodeFirst"
    assert s["makespan_s"] > 0 and s["num_finished"] == 20
    s, _, it = cli(plugins, tmp_path / "run2", "executor=custom", "executor.name=token_rate",
                   *SMALL)
    assert s["settings"]["executor"]["class"] == "my_executor:TokenRate"


# -- the design document ------------------------------------------------------------------------

def _text_files():
    # (pyproject.toml names it as package data, relative to the package: not a reference)
    for top in ("README.md", "sarathi_lab", "experiments", "configs", "tests", "kernels",
                "results"):
        p = ROOT / top
        files = [p] if p.is_file() else p.rglob("*")
        for f in files:
            if f.suffix in (".md", ".py", ".yaml", ".toml", ".txt", ".sh") and \
                    "__pycache__" not in f.parts:
                yield f


def test_every_design_reference_leads_to_a_file():
    ref = re.compile(r"[\w./-]*" + re.escape(DESIGN_NAME))
    seen = []
    for f in _text_files():
        text = f.read_text(errors="replace")
        for m in ref.finditer(text):
            target = m.group(0)
            # a Markdown link's target is relative to its file; any other mention, to the root
            link = m.start() >= 2 and f.suffix == ".md" and text[m.start() - 2:m.start()] == "]("
            base = f.parent if link else ROOT
            assert (base / target).is_file(), f"{f.relative_to(ROOT)}: {target} is not a file"
            seen.append(f.relative_to(ROOT))
    assert Path("README.md") in seen and Path("sarathi_lab/metrics/__init__.py") in seen


def test_design_defines_every_summary_figure():
    """A figure added to summary.json without a definition in the design document fails here."""
    design = (ROOT / "sarathi_lab" / DESIGN_NAME).read_text()
    design = re.sub(r"```.*?```", "", design, flags=re.S)   # fences would pair backticks wrongly
    defined = set(re.findall(r"`([^`]+)`", design))
    words = {w for d in defined for w in re.split(r"[^\w]+", d) if w}
    kv = KVCacheManager(64, 4, enable_prefix_caching=True, max_model_len=64)
    from sarathi_lab.registry import policy_class
    cls = policy_class("sarathi")
    policy = cls(cls.parse_config({"block_size": 4, "token_budget": 8,
                                   "enable_prefix_caching": True}), kv)
    reqs = [req(i, 9, 3, t=0.1 * i, ids=list(range(9))) for i in range(4)]
    eng = Engine(policy, LinearCost())
    eng.run(reqs)
    s = summarize(requests_table(reqs, eng.output_lens), iterations_table(eng.iterations()),
                  slo={"p99_tbt": 0.1, "ttft": 1.0}, kv_blocks_total=kv.num_blocks,
                  block_size=4, prefix_cache=kv.prefix_cache_stats())
    keys = set(s)
    for part in ("offered_load", "stalls", "kv", "prefix_cache"):
        keys |= set(s[part])
    keys |= set(s["slo"]) - {"p99_tbt", "ttft"}   # the SLO's own settings, echoed
    missing = sorted(k for k in keys if k not in words)
    assert not missing, f"sarathi_lab/{DESIGN_NAME} does not define {missing}"
