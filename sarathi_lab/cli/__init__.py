"""The `sarathi-lab` command: `main` (the entry point: compose, check, run or sweep, print)
and `loggers` (a finished run's summary to CSV or wandb). The other commands live with their
packages: `sarathi-lab-report` (report), `-serve` (serve), `-replay` (replay), `-plan` (plan),
`-profile` (profiler), `-prepare-model` (models.prepare).
"""
