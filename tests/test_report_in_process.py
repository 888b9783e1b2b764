"""The report of a run made in-process (no CLI subprocess, so in the fast tier): the run's table,
a failed job listed beside it, the single-run timeline drawn, the plots the data cannot support
skipped with their reason, and report.md saying all of it."""
from helpers import composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.report import make_report
from sarathi_lab.run.runner import run


def test_report_of_one_run_and_a_failed_job(tmp_path):
    sweep = tmp_path / "sweep"
    cfg = composed("trace=synthetic", "trace.num_requests=12", "progress=false")
    s = run(cfg, sweep / "ok", resolved=check_config(cfg))
    (sweep / "ok" / ".hydra").mkdir()
    (sweep / "broken" / ".hydra").mkdir(parents=True)   # a job that failed: its error, no result
    (sweep / "broken" / "error.txt").write_text("Traceback ...\nValueError: boom\n")

    rep = make_report([sweep], tmp_path / "report")
    assert len(rep.table) == 1 and rep.table["num_finished"].iloc[0] == s["num_finished"] == 12
    assert rep.incomplete[["status", "detail"]].values.tolist() == [["failed", "ValueError: boom"]]
    assert rep.incomplete["run_dir"].iloc[0].endswith("broken")
    files, _ = rep.plots["timeline"]   # (the files saved, the data drawn)
    assert [f.name for f in files] == ["timeline.png"] and files[0].stat().st_size > 0
    assert "ttft_cdf" in rep.plots
    assert "closed-loop" in rep.skipped["open_closed"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "ValueError: boom" in md and "timeline" in md and "open_closed" in md
