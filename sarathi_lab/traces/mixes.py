"""Workload mixes: one multi-class, multi-tenant trace built from several components.

A component is a stream of requests of one kind: its lengths drawn from a shipped trace (rows
drawn with replacement, prompt and output of a request from the same row) or from length specs,
its arrivals from its own process (poisson, gamma with a CV, on/off bursts, or ``trace``: the
first rows of a timestamped trace, such as Azure's, with their own gaps re-timed to the
component's rate), and its requests' service columns: ``slo_class`` (default: the component's
name), ``priority``, ``deadline`` (seconds after arrival for the first token) and ``tenant`` (one
name, N tenants ``<component>0..N-1`` with equal shares, or ``{name: share}``, each request's
tenant drawn with those shares).

Rates: every component gives a ``share`` (and the mix its total ``qps``), or every component
its ``qps`` (the total is their sum, or the mix's ``qps`` if set, which scales them all). A
component's rate is the total times its share (qps) over the sum of them. The mix's ``num_requests`` are split in the same
proportion (largest remainders), so every component spans about the same time, num_requests /
total rate. The components are merged by arrival time (ties: in the order the components are
listed). Each draws from random streams of its own, seeded by the mix's seed and its name, so
adding a component or changing one leaves the others' requests unchanged.
"""
from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sarathi_lab.settings import ConfigError, parse, setting
from sarathi_lab.traces.arrivals import ARRIVALS, burst_of, check_arrival_settings
from sarathi_lab.traces.clients import ClientSettings
from sarathi_lab.traces.frame import SERVICE_DEFAULTS
from sarathi_lab.traces.load import load_trace
from sarathi_lab.traces.synthetic import synthetic_trace

logger = logging.getLogger(__name__)


@dataclass
class ComponentConfig:
    """One component of a mix (``trace.components.<name>``)."""
    trace: str | None = setting(None, help="lengths drawn from this trace (a shipped name or a "
                                           "file); null: prompt_len and output_len")
    prompt_len: int | dict | None = setting(None, help="a length spec, as a synthetic trace's")
    output_len: int | dict | None = setting(None, help="a length spec, as a synthetic trace's")
    share: float | None = setting(None, gt=0, help="weight in the mix's qps and num_requests")
    qps: float | None = setting(None, gt=0, help="req/s (scaled with the others if the mix "
                                                 "sets qps)")
    arrival: str = setting("poisson", choices=ARRIVALS + ("trace",),
                           help="trace: the trace's own timestamps, re-timed to the rate")
    cv: float = setting(1.0, gt=0, help="gamma: coefficient of variation of the gaps")
    on_s: float | None = setting(None, gt=0, help="onoff: seconds of each burst")
    off_s: float | None = setting(None, gt=0, help="onoff: seconds of silence between bursts")
    max_total_tokens: int | None = setting(None, ge=2, help="longer requests redrawn")
    max_prompt_tokens: int | None = setting(None, ge=1, help="longer prompts redrawn")
    slo_class: str | None = setting(None, help="null: the component's name")
    priority: int = setting(0, help="lower is more urgent")
    deadline: float | None = setting(None, gt=0, help="s after arrival, for the first token")
    tenants: str | int | dict | None = setting(None, help="a name, N, or {name: share}; null: "
                                                          f"{SERVICE_DEFAULTS['tenant']!r}")

    def validate(self) -> None:
        if (self.share is None) == (self.qps is None):
            raise ValueError("share: give exactly one of share and qps")
        if self.trace is None:
            for key in ("prompt_len", "output_len"):
                if getattr(self, key) is None:
                    raise ValueError(f"{key}: a component without a trace needs it")
            if self.arrival == "trace":
                raise ValueError("arrival=trace: needs a timestamped trace (trace=azure_conv...)")
        else:
            for key in ("prompt_len", "output_len"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}={getattr(self, key)!r}: read only without a trace")
        if self.arrival != "trace":
            check_arrival_settings(self)
        elif self.cv != 1.0 or self.on_s is not None or self.off_s is not None:
            raise ValueError("arrival=trace: keeps the trace's own gaps; cv, on_s and off_s "
                             "are not read")
        # raises on a bad value; a count >= 1 is checked by the mix against the component's
        # requests before any name is built (a billion names ran away)
        if not _count(self.tenants) or self.tenants < 1:
            tenant_weights(self.tenants, "component")

    def tenant_names(self, component: str) -> tuple[list[str], np.ndarray]:
        return tenant_weights(self.tenants, component)


def _count(spec) -> bool:
    """Whether a component's ``tenants`` is a count (N tenants), not a name or shares."""
    return isinstance(spec, int) and not isinstance(spec, bool)


def tenant_weights(spec, component: str) -> tuple[list[str], np.ndarray]:
    """(tenant names, their shares summing to 1) from a component's ``tenants``."""
    if spec is None:
        return [SERVICE_DEFAULTS["tenant"]], np.ones(1)
    if isinstance(spec, str):
        if not spec.strip():
            raise ValueError("tenants='': a tenant needs a name")
        return [spec.strip()], np.ones(1)
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"tenants={spec}: must be >= 1")
        return [f"{component}{i}" for i in range(spec)], np.full(spec, 1.0 / spec)
    if isinstance(spec, dict) and spec:
        names = [str(k) for k in spec]
        w = np.array([v if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan
                      for v in spec.values()], float)
        if not (np.isfinite(w).all() and (w > 0).all()):
            raise ValueError(f"tenants={spec!r}: every share must be a number > 0")
        return names, w / w.sum()
    raise ValueError(f"tenants={spec!r}: must be a name, a count or {{name: share}}")


@dataclass
class MixConfig(ClientSettings):
    """``trace=mix``: a trace built from components (module docstring)."""
    name: str | None = setting(None, help="label used in reports")
    num_requests: int = setting(1000, ge=1, help="all components together")
    qps: float | None = setting(None, gt=0, help="total req/s; null: the sum of the "
                                                 "components' qps")
    seed: int = setting(0, ge=0, help="every component's streams")
    components: dict = setting({}, help="name -> a component (ComponentConfig)")

    def validate(self) -> None:
        if not self.components:
            raise ValueError("components: a mix needs at least one")
        for name, node in self.components.items():
            if not isinstance(node, dict):
                raise ValueError(f"components.{name}={node!r}: must be a mapping of settings")
            try:
                self.components[name] = parse(ComponentConfig, node, f"components.{name}",
                                              f"mix component {name!r}")
            except ConfigError as e:   # re-raised as ValueError: parse puts "trace." in front
                raise ValueError(str(e)) from None
        by_share = [n for n, c in self.components.items() if c.share is not None]
        if by_share and len(by_share) < len(self.components):
            by_qps = next(n for n in self.components if n not in by_share)
            raise ValueError(f"components.{by_qps}.qps: components.{by_share[0]} gives a share; "
                             "give every component a share, or every one a qps")
        if self.qps is None and by_share:
            raise ValueError("qps: the components give shares, so the mix needs its total qps")
        for name, n in self.counts().items():
            tenants = self.components[name].tenants
            if _count(tenants) and tenants > n:   # names for them all would be built for nothing
                raise ValueError(f"components.{name}.tenants={tenants}: more tenants than the "
                                 f"component's {n} requests (of num_requests={self.num_requests}"
                                 f"); a tenant without a request has no service to measure "
                                 f"(set at most {n}, or more requests)")
        self.check_clients()

    def rates(self) -> dict[str, float]:
        """Component name -> its arrival rate, req/s."""
        w = {n: c.share if c.share is not None else c.qps for n, c in self.components.items()}
        total = self.qps if self.qps is not None else sum(w.values())
        return {n: total * v / sum(w.values()) for n, v in w.items()}

    def counts(self) -> dict[str, int]:
        """Component name -> its number of requests: num_requests split by rate (largest
        remainders, ties to the earlier component)."""
        rates = self.rates()
        exact = np.array(list(rates.values())) / sum(rates.values()) * self.num_requests
        n = np.floor(exact).astype(int)
        order = np.argsort(-(exact - n), kind="stable")
        n[order[:self.num_requests - n.sum()]] += 1
        return dict(zip(rates, n.tolist()))


def _stream_seed(seed: int, name: str, salt: int = 0) -> int:
    """A seed for a component's own streams, from the mix's seed and the component's name."""
    ss = np.random.SeedSequence([int(seed), zlib.crc32(name.encode()), salt])
    return int(ss.generate_state(1)[0])


def build_component(name: str, c: ComponentConfig, n: int, rate: float,
                    seed: int) -> pd.DataFrame:
    """One component's n requests at `rate`, with its service columns."""
    s = _stream_seed(seed, name)
    if c.arrival == "trace":
        df = load_trace(c.trace, num_requests=n, qps=rate, max_total_tokens=c.max_total_tokens,
                        max_prompt_tokens=c.max_prompt_tokens, seed=s)
        if df.attrs["format"] == "lengths":
            raise ValueError(f"components.{name}: arrival=trace needs a trace with timestamps; "
                             f"{c.trace!r} has lengths only")
        if len(df) < n:
            raise ValueError(f"components.{name}: trace {c.trace!r} has only {len(df)} "
                             f"requests, the mix needs {n}")
    else:
        lengths = ({"prompt_len": {"trace": c.trace}, "output_len": {"trace": c.trace}}
                   if c.trace is not None else
                   {"prompt_len": c.prompt_len, "output_len": c.output_len})
        df = synthetic_trace(n, rate, arrival=c.arrival, cv=c.cv, burst=burst_of(c),
                             max_total_tokens=c.max_total_tokens,
                             max_prompt_tokens=c.max_prompt_tokens, seed=s, **lengths)
    dropped = df.attrs.get("dropped", 0)
    df = df[["arrival_time", "num_prompt_tokens", "num_output_tokens"]].copy()
    names, shares = c.tenant_names(name)
    pick = np.random.default_rng(_stream_seed(seed, name, 1)).choice(len(names), n, p=shares)
    df["priority"] = np.full(n, c.priority, dtype=np.int64)
    df["tenant"] = np.array(names, dtype=object)[pick]
    df["slo_class"] = c.slo_class if c.slo_class is not None else name
    df["deadline"] = np.full(n, np.nan if c.deadline is None else c.deadline)
    df.attrs["dropped"] = dropped
    return df


def build_mix(mc: MixConfig) -> pd.DataFrame:
    """The mix as one trace (the frame of `traces.frame`, with every service column)."""
    rates, counts = mc.rates(), mc.counts()
    parts = []
    for name, c in mc.components.items():
        if counts[name] == 0:
            raise ValueError(f"trace.components.{name}: gets 0 of the mix's {mc.num_requests} "
                             "requests; raise trace.num_requests or its share")
        parts.append(build_component(name, c, counts[name], rates[name], mc.seed))
    dropped = sum(p.attrs["dropped"] for p in parts)
    df = pd.concat(parts, ignore_index=True)
    df = df.sort_values("arrival_time", kind="stable").reset_index(drop=True)
    df.attrs.update(source="mix", format="mix", dropped=dropped, name=mc.name or "mix",
                    rates=rates, counts=counts)
    logger.info("workload mix: %s", ", ".join(f"{n} {counts[n]} req at {rates[n]:.3g} req/s"
                                              for n in counts))
    return df
