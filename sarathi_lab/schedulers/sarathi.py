"""Sarathi-Serve (OSDI'24): stall-free batching with chunked prefills under a token budget.

The budget of each iteration is its controller's (`scheduler.controller`,
schedulers/controllers/): `static` (the default) is `token_budget` every iteration; the others
choose one up to it, from the batch's predicted time and the requests' SLOs.
"""
from dataclasses import dataclass, field, fields

from sarathi_lab.request import Status
from sarathi_lab.schedulers.base import Policy, SchedulerConfig
from sarathi_lab.schedulers.controllers.consult import Consulting, split_settings
from sarathi_lab.schedulers.mechanics.budget import Budget
from sarathi_lab.schedulers.mechanics.fast_forward import SARATHI
from sarathi_lab.schedulers.mechanics.progress import split_running
from sarathi_lab.schedulers.output import SchedulerOutput
from sarathi_lab.settings import setting


@dataclass
class SarathiConfig(SchedulerConfig):
    token_budget: int = setting(512, ge=1, help="tokens per iteration (the chunk size); the "
                                "cap of a controller's budget")
    controller: str = setting("static", help="who sets each iteration's budget: static | "
                              "tbt_target | slack | slo_dp | a dotted path "
                              "(schedulers/controllers/)")
    # the controller's typed settings, filled by parse_config from the same node
    controller_settings: object = field(default=None, metadata={"internal": True})


class Sarathi(Consulting, Policy):
    name = "sarathi"
    config_class = SarathiConfig
    fast_forward = SARATHI   # its steady decode and chunk runs (mechanics/fast_forward.py)
    speculates = True

    def __init__(self, cfg, kv, queue=None):
        super().__init__(cfg, kv, queue)
        self.init_controller()

    @classmethod
    def parse_config(cls, values, where="scheduler"):
        """The policy's settings and, from the same node, its controller's."""
        own = {f.name for f in fields(cls.config_class) if not f.metadata.get("internal")}
        mine, ctl = split_settings(values, own, where, f"policy {cls.name!r}")
        cfg = super().parse_config(mine, where)
        cfg.controller_settings = ctl
        return cfg

    @classmethod
    def setting_classes(cls, values):
        from sarathi_lab.schedulers.controllers.consult import controller_class
        try:
            return (cls.config_class,
                    controller_class(values.get("controller") or "static").config_class)
        except ValueError:   # an unknown controller: parse_config names it
            return (cls.config_class,)

    @classmethod
    def needs_predictor(cls, cfg):
        # the executor's cost model is read only by the oracle; the learned predictor learns
        # from the steps any executor runs
        if getattr(cfg.controller_settings, "predictor", None) == "oracle":
            return f"scheduler.predictor=oracle (scheduler.controller={cfg.controller})"
        return None

    @classmethod
    def unread_settings(cls, cfg):
        why = super().unread_settings(cfg)
        ctl = cfg.controller_settings
        if not cfg.num_speculative_tokens and ctl is not None:
            for k in ctl.speculation_settings:
                why[k] = (f"read only with scheduler.num_speculative_tokens > 0 (controller "
                          f"{cfg.controller!r} plans with it only when the run speculates)")
        return why

    def schedule(self, now):
        out, budget = SchedulerOutput(), Budget(self.iteration_budget(now))
        decodes, prefills = split_running(self.running)
        prefills = self.chunk_order(prefills)
        # decodes first: a running decode is never stalled by a prefill
        left = budget.left
        self.schedule_decodes(out, decodes if len(decodes) <= left else decodes[:left])
        budget.charge_decodes(out)   # a speculative decode costs 1 + k
        # then ongoing prefills, chunked to what is left; their blocks were taken at admission,
        # so they never preempt the decodes already in this batch
        for req in prefills:
            if not budget:
                break
            if req.status is Status.RUNNING:
                n = budget.chunk(req)
                new_blocks = self.kv.allocate_blocks(req, n)
                assert new_blocks == [], "prompt blocks are held from admission"
                budget.add(out, req, n)
        self.admit_waiting(out, budget)   # then new prefills, chunked to what is left
        return out

    def token_limit(self):
        return self.cfg.token_budget
