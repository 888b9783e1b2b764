"""Disaggregated prefill/decode (``cluster=disagg``): a prefill pool and a decode pool on the
driver's clock, a request's KV moving between them over a link.

- `transfer`: the link (`Link`, from the hardware preset) and the time a KV move takes
  (`Transfer`);
- `settings`: the link's settings (`DisaggConfig`; each pool is resolved as a run by the run
  layer, `sarathi_lab.run.disagg`);
- `topology`: `Disaggregated`, both pools as one topology, and its tables and summary.

Design and metrics: sarathi_lab/DESIGN.md, "Disaggregated prefill/decode".
"""
from sarathi_lab.topology.disagg.settings import POOLS, DisaggConfig
from sarathi_lab.topology.disagg.topology import Disaggregated
from sarathi_lab.topology.disagg.transfer import Link, Transfer

__all__ = ["POOLS", "DisaggConfig", "Disaggregated", "Link", "Transfer"]
