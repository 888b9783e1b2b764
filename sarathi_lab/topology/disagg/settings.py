"""The settings of disaggregated prefill/decode (``cluster=disagg``): the link between the pools.
Each pool's own settings are a run's, resolved by the run layer (`sarathi_lab.run.disagg`)."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.settings import setting
from sarathi_lab.topology.disagg.transfer import LINKS

POOLS = ("prefill", "decode")


@dataclass
class DisaggConfig:
    """The link between the pools (`cluster=disagg`); each pool's own settings are under
    ``cluster.prefill`` and ``cluster.decode`` (a fleet's: num_replicas, router and its knobs,
    plus ``scheduler`` and ``executor`` overrides of the run's nodes)."""
    link: str = setting("net", choices=LINKS,
                        help="nvlink: the preset's link_* (same node) | net: its net_* (one NIC "
                             "per GPU, another node) | pcie: its pcie_* (through host memory)")
    link_bandwidth: float | None = setting(None, gt=0, help="bytes/s per GPU pair, one "
                                           "direction; null: the preset's for `link`")
    link_eff: float | None = setting(None, gt=0, le=1,
                                     help="share of link_bandwidth a transfer gets; null: preset")
    link_latency_s: float | None = setting(None, ge=0,
                                           help="per transfer, s; null: the preset's")
    transfer: str = setting("whole", choices=("whole", "layerwise"),
                            help="whole: the KV moves after the first token, once the decode "
                                 "replica takes it at an iteration boundary (DistServe) | "
                                 "layerwise: room is reserved at the first token and the KV "
                                 "streams layer by layer during the last prefill iteration "
                                 "(Splitwise)")
