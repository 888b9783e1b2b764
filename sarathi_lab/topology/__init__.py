"""Topologies: engines composed on one clock, driven by one event-driven driver.

- `driver`: the heap of events and the loop (`Driver`, `drive`), the `Topology` protocol, and
  open-loop arrivals (`OpenLoop`);
- `clients`: closed-loop users as a source of events (`ClosedLoop`), on any topology, and
  multi-turn sessions (`Sessions`);
- `fleet`: one engine (`Single`) and N engines behind a router (`Fleet`);
- `pipeline`: pipeline stages served by virtual engines (`PipelineReplica`, `Pipeline`);
- `disagg`: a prefill pool and a decode pool with KV transfers (`Disaggregated`);
- `results`: the table and summary pieces the topologies share.

Design: sarathi_lab/DESIGN.md, "The driver".
"""
from sarathi_lab.topology.clients import ClosedLoop, Sessions
from sarathi_lab.topology.driver import Driver, OpenLoop, Topology, drive
from sarathi_lab.topology.fleet import Fleet, Single

__all__ = ["ClosedLoop", "Driver", "Fleet", "OpenLoop", "Sessions", "Single", "Topology", "drive"]
