"""Budget controllers: what chooses a chunking policy's token budget (and speculation length)
each iteration. `base.py` is the whole contract a plug-in needs; `consult.py` is the policies'
side (the view they build, the decision they apply); one short file per built-in controller:
`static.py` (the fixed budget, the default), `tbt_target.py` (Medha), `slack.py` (Niyama),
`slo_dp.py` (SLOs-Serve); `targets.py` holds the settings they share."""
