"""The documentation is true: the plug-in examples of the reference pages (sarathi_lab/docs/) run
through the CLI and do what their settings say, every relative link of the README and the pages
leads to a file (and a heading), the settings page names every config group, option and key, the
metrics page every column of a run, and every reference to the design document leads to a file."""
import json
import os
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
import tomllib
from conftest import LinearCost, req
from helpers import cli as sarathi_lab_cli
from helpers import composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.engine import Engine
from sarathi_lab.kv import KVCacheManager
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.run.runner import run

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "sarathi_lab" / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
PLUGINS_PAGE = DOCS / "plugins.md"
DESIGN_NAME = "DESIGN" + ".md"   # spelled apart: this file is among those scanned below
EXAMPLE = re.compile(r"<!-- example: (\S+) -->\s*\n```(\w+)\n(.*?)\n```", re.S)
SMALL = ("trace=synthetic", "trace.num_requests=20")


def examples() -> dict[str, str]:
    """The marked example blocks of the README and the pages, by file name."""
    found = {}
    for page in PAGES:
        for name, lang, code in EXAMPLE.findall(page.read_text()):
            assert name not in found, f"{page.relative_to(ROOT)}: example {name} given twice"
            found[name] = code + "\n"
    return found


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    """The examples written as modules, and the plug-in page's entry points as an installed
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
    """`sarathi-lab` in a subprocess with the example modules on PYTHONPATH, as the plug-in page
    tells a user to run them; the run's summary and tables."""
    path = os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])
    r = sarathi_lab_cli(f"hydra.run.dir={run_dir}", *args, cwd=run_dir.parent,
                        env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    return (summary, pd.read_parquet(run_dir / "requests.parquet"),
            pd.read_parquet(run_dir / "iterations.parquet"))


def test_plugin_page_marks_every_plugin_example():
    assert set(examples()) == {"pyproject.toml", "my_policy.py", "my_fair.py", "my_costs.py",
                               "my_executor.py", "my_router.py", "my_controller.py"}
    # all of them on the plug-in page, where a plug-in author looks
    assert {name for name, _, _ in EXAMPLE.findall(PLUGINS_PAGE.read_text())} == set(examples())
    text = PLUGINS_PAGE.read_text()
    # each module's run command, as printed on the page, names its class by dotted path
    for cmd in ("scheduler.name=my_policy:DecodeFirst", "scheduler.name=my_fair:LeastServedTenant",
                "scheduler.queue=my_fair:LongestPromptFirst",
                "executor.cost_model=my_costs:LinearCost", "executor.name=my_executor:TokenRate",
                "cluster.router=my_router:Sticky", "scheduler.controller=my_controller:StepCap"):
        assert cmd in text, cmd


@pytest.mark.slow   # a CLI subprocess
def test_policy_example_runs_and_its_setting_caps_prefills(plugins, tmp_path):
    policy = ("scheduler=custom", "scheduler.name=my_policy:DecodeFirst", *SMALL)
    s, reqs, it = cli(plugins, tmp_path / "capped", *policy, "+scheduler.prefill_chunk=48")
    assert s["num_finished"] == 20
    assert s["settings"]["scheduler"]["prefill_chunk"] == 48
    assert it["prefill_tokens"].max() == 48          # chunks of 48, never more
    _, _, it_default = cli(plugins, tmp_path / "default", *policy)
    assert it_default["prefill_tokens"].max() == 256   # the setting's default
    # its fast-forward declaration is exact: stepping every iteration gives the same run
    _, reqs_slow, it_slow = cli(plugins, tmp_path / "stepped", *policy,
                                "+scheduler.prefill_chunk=48", "fast_forward=false")
    assert len(it_slow) == len(it)
    for col in ("ttft", "e2e", "num_output_tokens"):
        assert reqs_slow[col].to_numpy() == pytest.approx(reqs[col].to_numpy(), rel=1e-12)


@pytest.mark.slow   # a CLI subprocess
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
    assert eng.fast_forward    # update overridden, with a matching declaration: still on
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


@pytest.mark.slow   # a CLI subprocess
def test_cost_model_example_sets_every_iteration_time(plugins, tmp_path):
    s, _, it = cli(plugins, tmp_path / "run",
                   "executor.cost_model=my_costs:LinearCost", "+executor.base_s=0.05",
                   "+executor.per_token_s=0", "+executor.per_kv_token_s=0", *SMALL)
    assert s["num_finished"] == 20 and s["simulated"] is True
    assert s["settings"]["executor"]["cost_model_settings"]["base_s"] == 0.05
    # stepped and fast-forwarded iterations alike (iteration_time, generic decode_run)
    assert (it["duration"] == 0.05).all()
    assert s["kv"]["blocks_total"] > 1000    # the roofline's memory sizing, delegated to


@pytest.mark.slow   # a CLI subprocess
def test_executor_example_decides_durations_and_ends(plugins, tmp_path):
    s, reqs, it = cli(plugins, tmp_path / "run", "executor=custom",
                      "executor.name=my_executor:TokenRate", "+executor.stop_after=3",
                      "+executor.tokens_per_s=1000", *SMALL)
    assert s["num_finished"] == 20 and s["simulated"] is True
    assert s["kv"]["blocks_total"] == 4096
    assert (reqs["num_output_tokens"] == 3).all() and (reqs["finish_reason"] == "stop").all()
    tokens = it["prefill_tokens"] + it["decode_tokens"]
    assert it["duration"].to_numpy() == pytest.approx((0.002 + tokens / 1000).to_numpy())


@pytest.mark.slow   # a CLI subprocess
def test_page_entry_points_register_the_examples(plugins, tmp_path):
    s, _, _ = cli(plugins, tmp_path / "run", "scheduler=custom", "scheduler.name=decode_first",
                  "executor=custom", "executor.name=sim", "+executor.cost_model=linear",
                  "+executor.base_s=0.02", "+executor.per_token_s=0",
                  "+executor.per_kv_token_s=0", *SMALL)
    assert s["settings"]["scheduler"]["class"] == "my_policy:DecodeFirst"
    assert s["makespan_s"] > 0 and s["num_finished"] == 20
    s, _, it = cli(plugins, tmp_path / "run2", "executor=custom", "executor.name=token_rate",
                   *SMALL)
    assert s["settings"]["executor"]["class"] == "my_executor:TokenRate"


@pytest.mark.slow    # a CLI subprocess
def test_controller_example_caps_every_iteration_it_prices(plugins, tmp_path):
    s, _, it = cli(plugins, tmp_path / "run", "scheduler.controller=my_controller:StepCap",
                   "+scheduler.max_step_s=0.04", *SMALL)
    assert s["num_finished"] == 20 and s["settings"]["scheduler"]["controller_settings"] == \
        {"max_step_s": 0.04}
    # budgets in steps of 64 (or the decodes alone) and every priced batch within 40 ms
    assert ((it["prefill_tokens"] + it["decode_tokens"]) <= 512).all()
    assert (it.loc[it["prefill_tokens"] > 0, "duration"] <= 0.04 + 1e-12).all()


@pytest.mark.slow    # a CLI subprocess (issue 21: those are the slow tier)
def test_router_example_keeps_each_tenant_on_one_replica(plugins, tmp_path):
    s, reqs, _ = cli(plugins, tmp_path / "run", "cluster.num_replicas=3",
                     "cluster.router=my_router:Sticky", "trace=mix", "trace.num_requests=40")
    assert s["num_finished"] == 40 and s["num_replicas"] == 3
    per_tenant = reqs.groupby("tenant")["replica"].nunique()
    assert len(per_tenant) >= 3 and (per_tenant == 1).all()
    assert reqs["replica"].nunique() >= 2    # the tenants spread over the fleet


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


# -- the pages ----------------------------------------------------------------------------------

FENCE = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
LINKED = [*PAGES, ROOT / "sarathi_lab" / DESIGN_NAME, ROOT / "experiments" / "README.md",
          *sorted((ROOT / "experiments").glob("*/README.md"))]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but - and _ dropped,
    spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)}


def test_slug_is_githubs():
    assert _slug("Pipeline stages (`executor.pipeline_parallel`)") == \
        "pipeline-stages-executorpipeline_parallel"
    assert _slug("Disaggregated prefill/decode (`cluster=disagg`)") == \
        "disaggregated-prefilldecode-clusterdisagg"


def test_the_reading_path_counts_its_lines():
    # docs/reading.md: the core's files in order, with their lines; the first table is the core
    import re
    rows = re.findall(r"^\| \d+ \| \[`([^`]+)`\]\(([^)]+)\) \| (\d+) \|",
                      (DOCS / "reading.md").read_text(), re.M)
    assert len(rows) >= 10
    for name, link, lines in rows:
        path = (DOCS / link).resolve()
        assert path == ROOT / "sarathi_lab" / name, name
        # a count within 10% (or 10 lines) holds; a file that grew past it is to be re-read
        actual = len(path.read_text().splitlines())
        assert abs(actual - int(lines)) <= max(10, int(lines) // 10), \
            f"reading.md: {name} has {actual} lines, the page says {lines}"
    # the page's promise: a core a newcomer reads in an hour
    assert sum(int(n) for *_, n in rows) <= 3000


def test_every_relative_link_leads_to_a_file_and_heading():
    broken, checked = [], 0
    for page in LINKED:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):          # http(s), mailto: not ours to check
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    assert checked > 50      # the README and the index link every page


def test_readme_and_index_link_every_page():
    index = DOCS / "README.md"
    for page in sorted(DOCS.glob("*.md")):
        if page != index:
            assert f"({page.name})" in index.read_text(), f"{index.name} omits {page.name}"
            assert f"(sarathi_lab/docs/{page.name})" in README.read_text(), \
                f"README.md omits {page.name}"


def _documented_runs():
    """Every `sarathi-lab` command in the bash blocks of the README and the pages: (page,
    multirun, overrides). A line with `...` is an elided sketch, not a command."""
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                m = re.match(r"(?:PYTHONPATH=\$PWD )?sarathi-lab (.*)", line.split(" #")[0].strip())
                if m and "..." not in m.group(1):
                    args = shlex.split(m.group(1))
                    yield page.name, "-m" in args, [a for a in args if a != "-m"]


@pytest.mark.slow    # about 50 compositions of the config: 30 s on a loaded machine
def test_every_documented_command_has_valid_settings(plugins, monkeypatch):
    """The commands the pages show compose and pass the start-up checks (types, ranges, names,
    settings no component reads), every value of a sweep's lists; the plug-in examples
    importable as the pages tell a user to make them."""
    monkeypatch.syspath_prepend(str(plugins))
    checked = 0
    for page, multirun, args in _documented_runs():
        # a sweep's comma lists (not inside {...} or [...] values), each value in one check:
        # a sweep drops per job the settings its components do not read, so no value depends
        # on another's; the launcher is Hydra's, not a setting
        values = [[a] if not multirun or re.search(r"[{\[]", a) else
                  [a.split("=", 1)[0] + "=" + v for v in a.split("=", 1)[1].split(",")]
                  for a in args if not a.startswith("hydra")]
        for i in range(max(map(len, values))):
            combo = [v[min(i, len(v) - 1)] for v in values]
            try:
                check_config(composed(*combo), list(combo), multirun=multirun)
            except Exception as e:
                pytest.fail(f"{page}: sarathi-lab {' '.join(args)}: {e}")
            checked += 1
    assert checked > 45


def test_every_experiment_readme_is_linked_from_the_pages():
    linked = {(page.parent / target).resolve() for page in (DOCS / "studies.md", DOCS / "README.md")
              for target in LINK.findall(page.read_text())}
    unlinked = [r.parent.name for r in sorted((ROOT / "experiments").glob("*/README.md"))
                if r.resolve() not in linked]
    assert not unlinked, f"studies.md (or the index) links no README of {unlinked}"


def _mentioned(page: Path) -> set[str]:
    """Every name written in backticks on the page, and each dotted or slashed part of it."""
    words = set()
    for span in re.findall(r"`([^`]+)`", FENCE.sub("", page.read_text())):
        for w in re.findall(r"[\w][\w.\-/]*", span):
            words |= {w, *re.split(r"[./]", w)}
    return words


def test_settings_page_names_every_group_option_and_key():
    import yaml
    configs = ROOT / "configs"
    page = DOCS / "settings.md"
    named = _mentioned(page)
    missing = []
    for group in sorted(p for p in configs.rglob("*") if p.is_dir() and "__" not in p.name):
        files = sorted(group.glob("*.yaml"))
        if not files:
            continue                           # configs/hydra holds only the launcher group
        name = group.relative_to(configs).as_posix()
        missing += [f"group {name}"] * (name not in named)
        missing += [f"option {name}={f.stem}" for f in files if f.stem not in named]
        if name in ("experiment", "hydra/launcher"):
            continue     # presets of other groups' keys; the launcher plug-ins' own settings
        for f in files:
            keys = (yaml.safe_load(f.read_text()) or {}).keys() - {"defaults"}
            missing += [f"key {name}.{k} ({f.name})" for k in keys
                        if not k.startswith("_") and k not in named]
    top = yaml.safe_load((configs / "config.yaml").read_text())
    keys = [k for k in top if k not in ("defaults", "hydra")]
    keys += [f"capacity.{k}" for k in top["capacity"]]
    missing += [f"top-level {k}" for k in keys if k not in named]
    assert not missing, f"{page.relative_to(ROOT)} does not name {missing}"


@pytest.mark.parametrize("overrides, page", [
    ((), "metrics.md"),
    (("cluster.num_replicas=2",), "topologies.md"),
    (("executor.pipeline_parallel=2",), "topologies.md"),
    (("cluster=disagg",), "topologies.md"),
    (("scheduler.num_speculative_tokens=2", "executor.draft_cost_ratio=0.1",
      "executor.acceptance_rate=0.5"), "speculation.md"),
    pytest.param(("executor=torch", "model=tiny-llama", "trace.num_requests=3"),
                 "real_model.md", marks=pytest.mark.slow),   # builds a model: 30 s when loaded
])
def test_pages_name_every_column_and_summary_key(overrides, page, tmp_path):
    """A run's columns and summary keys are named on metrics.md, or (those a topology or the
    real model adds) on the page that describes that setting."""
    run(composed("trace=synthetic", "trace.num_requests=12", *overrides), tmp_path)
    named = _mentioned(DOCS / "metrics.md") | _mentioned(DOCS / page)
    found = {*pd.read_parquet(tmp_path / "requests.parquet").columns,
             *pd.read_parquet(tmp_path / "iterations.parquet").columns,
             *json.loads((tmp_path / "summary.json").read_text())}
    # a numbered family (bubble_stage0, bubble_stage1, ...) is named by its first member
    found = {re.sub(r"\d+$", "0", name) for name in found}
    assert len(found) > 60
    assert not found - named, f"{page} and metrics.md do not name {sorted(found - named)}"
