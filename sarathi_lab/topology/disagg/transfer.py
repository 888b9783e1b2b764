"""The link between a prefill and a decode replica, and what moving a prompt's KV over it costs.

Bandwidth, efficiency and latency come from the hardware preset (`HardwareSpec`: NVLink's
`link_*`, the inter-node NIC's `net_*`, PCIe's `pcie_*`), or are set for the run
(`cluster.link_bandwidth`, `link_eff`, `link_latency_s`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

LINKS = ("nvlink", "net", "pcie")
_PRESET_PREFIX = {"nvlink": "link", "net": "net", "pcie": "pcie"}


@dataclass(frozen=True)
class Link:
    """A point-to-point link between one prefill GPU and one decode GPU (one direction)."""
    kind: str
    bandwidth: float     # bytes/s
    eff: float           # share of it a transfer gets
    latency_s: float     # per transfer

    @classmethod
    def from_hardware(cls, hardware, kind: str, bandwidth: float | None = None,
                      eff: float | None = None, latency_s: float | None = None) -> "Link":
        """The preset's link of `kind` (nvlink | net | pcie), with what is given overridden."""
        from sarathi_lab.costmodels.roofline import HardwareSpec
        hw = hardware if isinstance(hardware, HardwareSpec) else HardwareSpec.from_config(hardware)
        prefix = _PRESET_PREFIX[kind]
        preset = (getattr(hw, f"{prefix}_bandwidth"), getattr(hw, f"{prefix}_eff"),
                  getattr(hw, f"{prefix}_latency_s"))
        given = (bandwidth, eff, latency_s)
        bw, ef, lat = (g if g is not None else p for g, p in zip(given, preset))
        return cls(kind, float(bw), float(ef), float(lat))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Transfer:
    """How long moving a prompt's KV takes. The KV of n tokens is B = n x `kv_bytes_per_token`
    (all layers, K and V, each KV head once). Every GPU has its own link and they run in
    parallel, so the transfer takes as long as its busiest GPU's share, `link_bytes`: a decode
    GPU receives the heads it holds (B / TP_d each when the KV heads divide among its GPUs; with
    fewer heads than GPUs each holds one, replicated, B / heads), and the prefill GPUs send what
    all decode GPUs receive, split evenly among them. With TP_p, TP_d <= heads that is
    B / min(TP_p, TP_d).

    whole:      latency + T,  T = link_bytes / (bandwidth x eff)
    layerwise:  latency + max(T / L, T - d (L - 1) / L) for a transfer that starts at the first
                token: layer l's KV leaves once the last prefill iteration (d seconds, its L
                layers in sequence) has computed it, so only the last layer's share, or what the
                link could not keep up with, comes after the first token. A transfer that waited
                for room or for a link sends whole."""
    link: Link
    kv_bytes_per_token: int
    num_layers: int
    num_kv_heads: int
    tp_prefill: int = 1
    tp_decode: int = 1
    mode: str = "whole"

    def bytes(self, num_tokens: int) -> int:
        """The KV of `num_tokens` tokens, one copy."""
        return int(num_tokens) * self.kv_bytes_per_token

    def link_bytes(self, num_tokens: int) -> float:
        """Bytes over the busiest GPU link."""
        heads = self.num_kv_heads
        recv = self.bytes(num_tokens) * max(1, heads // self.tp_decode) / heads
        send = recv * self.tp_decode / self.tp_prefill
        return max(send, recv)

    def seconds(self, num_tokens: int, last_prefill_s: float = 0.0,
                overlapped: bool = False) -> float:
        link = self.link
        t = self.link_bytes(num_tokens) / (link.bandwidth * link.eff)
        if self.mode == "layerwise" and overlapped:
            L = self.num_layers
            t = max(t / L, t - last_prefill_s * (L - 1) / L)
        return link.latency_s + t

    @classmethod
    def for_model(cls, model, link: Link, tp_prefill: int = 1, tp_decode: int = 1,
                  mode: str = "whole") -> "Transfer":
        """From a model preset (or `ModelShape`): the KV is in the model's dtype."""
        from sarathi_lab.models.shape import ModelShape
        m = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
        # latent attention (MLA) keeps one latent per token, the same on every GPU of the group:
        # as one shared head, every decode GPU receives all of it
        heads = 1 if m.is_mla else m.num_kv_heads
        return cls(link, m.kv_bytes_per_token(), m.num_layers, heads, tp_prefill, tp_decode,
                   mode)

    def as_dict(self) -> dict:
        return {"link": self.link.as_dict(), "mode": self.mode,
                "kv_bytes_per_token": self.kv_bytes_per_token, "num_layers": self.num_layers,
                "num_kv_heads": self.num_kv_heads, "tp_prefill": self.tp_prefill,
                "tp_decode": self.tp_decode}
