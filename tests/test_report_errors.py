"""`sarathi-lab-report` on result files it cannot read: the error names the file."""
import pytest

from sarathi_lab.report import main as report_main


@pytest.mark.parametrize("name,text,why", [
    ("summary.json", '{"throughput_rps": 1.0, "tb', "not valid JSON (Unterminated string"),
    ("capacity.json", "", "not valid JSON (Expecting value"),
    ("summary.json", "[1, 2]", "expected a JSON object, got list"),
])
def test_an_unreadable_result_file_is_named(tmp_path, name, text, why):
    run = tmp_path / "sweeps" / "s" / "scheduler=vllm"
    run.mkdir(parents=True)
    (run / name).write_text(text)
    with pytest.raises(SystemExit) as e:
        report_main([str(tmp_path / "sweeps" / "s"), "--out", str(tmp_path / "rep")])
    assert str(e.value).startswith(f"sarathi-lab-report: {run / name}: {why}"), e.value
