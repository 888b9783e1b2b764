"""Disaggregated prefill/decode (``cluster=disagg``): a prefill pool and a decode pool on one
virtual clock, a request's KV moving between them over a link.

- `transfer`: the link (`Link`, from the hardware preset) and the time a KV move takes
  (`Transfer`);
- `pools`: the settings (`DisaggConfig`, each pool resolved as a run: `resolve_disagg`) and
  `build_pools`;
- `driver`: `Disaggregated`, the loop over both pools, and its tables and summary.

Design and metrics: sarathi_lab/DESIGN.md, "Disaggregated prefill/decode".
"""
from sarathi_lab.disagg.driver import Disaggregated
from sarathi_lab.disagg.pools import DisaggConfig, DisaggResolved, build_pools, resolve_disagg
from sarathi_lab.disagg.transfer import Link, Transfer

__all__ = ["DisaggConfig", "DisaggResolved", "Disaggregated", "Link", "Transfer",
           "build_pools", "resolve_disagg"]
