"""The run: the only layer that knows the config.

Modules, top to bottom: `runner` (build the topology from a resolved config, drive it, make
the tables, write the run directory), `config` (`resolve`: every component's settings typed and
checked, nothing set that no component reads), `disagg` (each pool of a disaggregated run
resolved as a run), `journal` (a served session's ended requests on disk, and their recovery),
and at the bottom `rundir` (run directories, atomic writes, reading results back),
`summary_text` (the summary a run prints) and `hydra_errors` (Hydra's composition errors
reworded to name the setting).
"""
