"""The progress bar: when it shows, what it says, and what the engine reports to it."""
import sys

import pytest
import tqdm
from conftest import LinearCost, make_policy, req
from helpers import composed

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request
from sarathi_lab.run import runner


class FakeBar:
    made = []

    def __init__(self, **kw):
        self.kw, self.n, self.postfix, self.closed = kw, 0, None, False
        FakeBar.made.append(self)

    def update(self, k):
        self.n += k

    def set_postfix_str(self, s, refresh=True):
        self.postfix = s

    def close(self):
        self.closed = True


@pytest.fixture
def fake_tqdm(monkeypatch):
    FakeBar.made = []
    monkeypatch.setattr(tqdm, "tqdm", FakeBar)
    monkeypatch.delenv("CI", raising=False)
    return FakeBar


def tty(monkeypatch, on: bool):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: on, raising=False)


def test_auto_on_a_terminal_shows_after_two_seconds(fake_tqdm, monkeypatch):
    tty(monkeypatch, True)
    bar, update = runner._progress_bar(10, "auto", simulated=False)
    assert bar.kw["desc"] == "real run" and bar.kw["delay"] == 2.0 and bar.kw["total"] == 10
    update(1, 100)
    update(1, 160)     # an iteration that finished nothing still reports its tokens
    update(3, 250)
    assert bar.n == 3 and bar.postfix.startswith("250 tokens, ")


def test_simulation_bar_counts_requests_only(fake_tqdm, monkeypatch):
    tty(monkeypatch, True)
    bar, update = runner._progress_bar(10, "auto", simulated=True)
    update(4, 999)
    assert bar.kw["desc"] == "simulating" and bar.n == 4 and bar.postfix is None


@pytest.mark.parametrize("on_tty, ci", [(False, None), (True, "1")])
def test_auto_logs_lines_in_ci_and_off_a_terminal(fake_tqdm, monkeypatch, on_tty, ci):
    tty(monkeypatch, on_tty)
    if ci:
        monkeypatch.setenv("CI", ci)
    bar, update = runner._progress_bar(10, "auto", simulated=False)
    assert bar is None and isinstance(update, runner.ProgressLines) and not fake_tqdm.made
    assert (update.total, update.next - update.t0, update.every_s) == (10, 10.0, 30.0)


def test_progress_lines_after_the_first_wait_then_one_per_interval(caplog, monkeypatch):
    # the wall clock by hand: started at 100 s, the first line due at 110 s, then every 30 s
    clock = iter([100.0, 112.0, 130.0, 145.0])
    monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
    caplog.set_level("INFO", logger="sarathi_lab.run.runner")
    lines = runner.ProgressLines(16, simulated=False)
    lines(1, 1200)   # 12 s in: 1,200 tokens / 12 s
    lines(2, 2400)   # 30 s in, before 112 + 30: no line
    lines(3, 4500)   # 45 s in: 4,500 / 45
    assert [r.getMessage() for r in caplog.records] == [
        "real run: 1 of 16 requests done, 1,200 tokens computed (100 tok/s) after 12 s",
        "real run: 3 of 16 requests done, 4,500 tokens computed (100 tok/s) after 45 s"]
    clock = iter([0.0, 5.0])
    quick = runner.ProgressLines(16, simulated=True, first_s=10.0)   # the first 10 s: none
    quick(5, 0)
    assert len(caplog.records) == 2


def test_true_shows_it_anywhere_at_once_false_never(fake_tqdm, monkeypatch):
    tty(monkeypatch, False)
    monkeypatch.setenv("CI", "1")
    bar, _ = runner._progress_bar(3, True, simulated=False)
    assert bar.kw["delay"] == 0.0
    assert runner._progress_bar(3, False) == (None, None)


def test_a_bad_progress_setting_is_named():
    with pytest.raises(ValueError, match="^progress='yes'"):
        runner._progress_bar(3, "yes")


def test_engine_reports_done_requests_and_tokens_every_iteration():
    # a: prompt 4, 3 tokens; b (arrives at 0.005): prompt 8, 1 token. Iterations: a's prompt
    # (4); b's prompt and a's decode (8 + 1, b done); a's decode (1, a done)
    calls = []
    p = make_policy("sarathi", token_budget=64)
    Engine(p, LinearCost(base=0.01, per_token=0.0), fast_forward=False,
           progress=lambda *a: calls.append(a)).run([req(0, 4, 3), req(1, 8, 1, t=0.005)])
    assert calls == [(0, 4), (1, 13), (2, 14)]


def test_runner_labels_the_bar_and_closes_it(fake_tqdm):
    c = composed("progress=true", "scheduler.num_kv_blocks=64")
    runner.run(c, None, requests=[Request(0, 0.0, 8, 3), Request(1, 0.0, 8, 2)], write=False)
    (bar,) = fake_tqdm.made
    assert bar.kw["desc"] == "simulating" and bar.n == 2 and bar.closed


def test_a_real_run_is_labelled_and_counts_its_tokens(fake_tqdm):
    c = composed("executor=torch", "model=tiny-llama", "progress=true",
                 "scheduler.num_kv_blocks=16", "scheduler.max_model_len=64")
    reqs = [Request(0, 0.0, 5, 3, prompt_token_ids=[1, 2, 3, 4, 5]),
            Request(1, 0.0, 4, 2, prompt_token_ids=[9, 8, 7, 6])]
    runner.run(c, None, requests=reqs, write=False)
    (bar,) = fake_tqdm.made
    # every token computed once: prompts 5 + 4, then the decodes 2 + 1
    assert bar.kw["desc"] == "real run" and bar.n == 2 and bar.closed
    assert bar.postfix.startswith("12 tokens, ")
