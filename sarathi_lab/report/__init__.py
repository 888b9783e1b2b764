"""`sarathi-lab-report PATH... [--out DIR] [--pdf]`: the tables and plots of a set of runs.

PATH is a sweep directory, a run directory, or any directory above them: every `summary.json`
below is a run (one row of `summary.csv`), every `capacity.json` a capacity search (`capacity.csv`).
Runs that differ only in their seeds are one configuration: with several seeds per configuration
the report also writes `summary_by_config.csv` (mean and interval of every metric, see
report.seeds) and the plots draw means with bands or error bars. Only the plots the data supports
are made; the others are listed with the reason. Jobs without a result (failed, unfinished,
never started) are listed beside the table. Below a PATH with no run but an earlier report's
tables, the report is drawn from those tables (without the plots that need the runs' files).

Modules: tables (the run and capacity tables), seeds (configurations, aggregation over seeds),
cells (a table cell read back: plain),
jobs (jobs without a result), markdown (report.md), chrome_trace (one run as a Chrome/Perfetto
trace, --chrome), command (make_report, the command).
"""
from sarathi_lab.report.command import MAX_LINES, Report, main, make_report, single_run_plots
from sarathi_lab.report.jobs import incomplete_jobs, incomplete_lines
from sarathi_lab.report.seeds import by_config, config_columns, is_seed_key, spread, t_quantile
from sarathi_lab.report.tables import (
                                       POLICY_ORDER,
                                       capacity_table,
                                       find,
                                       flat_metrics,
                                       identity,
                                       labelled,
                                       read_overrides,
                                       run_table,
                                       saved_tables,
)

__all__ = ["MAX_LINES", "POLICY_ORDER", "Report", "by_config", "capacity_table", "config_columns",
           "find", "flat_metrics", "identity", "incomplete_jobs", "incomplete_lines",
           "is_seed_key", "labelled", "main", "make_report", "read_overrides", "run_table", "saved_tables",
           "single_run_plots", "spread", "t_quantile"]
