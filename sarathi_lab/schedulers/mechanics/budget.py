"""An iteration's token budget as an object that knows what each entry of the batch costs.

A policy that fills a batch under a token budget spends it on decodes, speculative decodes and
prompt chunks, each costing what it computes: a decode 1 token, a speculative decode 1 + k (its
k drafts are verified in the same pass), a chunk its length. `Budget` keeps that account, so a
policy never does the arithmetic (SGLang's `PrefillAdder` and vLLM v0's `SchedulingBudget`
keep the same kind of account); the toolkit's `admit_waiting` / `admit` take what is `left`.
"""
from __future__ import annotations

from sarathi_lab.request import Request
from sarathi_lab.schedulers.output import SchedulerOutput


class Budget:
    """What is left of `tokens` while a batch is built. `charge_decodes(out)` charges the
    decodes `schedule_decodes` added to `out` since the last charge (speculative or not); `add(out, req, n)` adds an entry and charges it; `chunk(req)` is the most of `req`'s
    remaining tokens that fits. False once nothing is left."""
    __slots__ = ("left", "_charged")

    def __init__(self, tokens: int):
        self.left = tokens
        self._charged = 0   # entries of the batch already charged

    def __bool__(self) -> bool:
        return self.left > 0

    def charge_decodes(self, out: SchedulerOutput) -> int:
        """Charge the decodes `schedule_decodes` added to `out` since the last charge: each
        costs the tokens it computes, 1, or 1 + k for a speculative one. Returns what is
        left."""
        ns = out.num_new_tokens
        i, n = self._charged, len(ns)
        # without speculation every decode computes one token (no sum over the batch)
        self.left -= (sum(ns[i:]) if i else sum(ns)) if out.spec_lens else n - i
        self._charged = n
        return self.left

    def chunk(self, req: Request) -> int:
        """How many of the tokens `req` has left to compute fit in what is left."""
        n = req.num_tokens_to_compute
        return n if n < self.left else self.left

    def add(self, out: SchedulerOutput, req: Request, n: int) -> None:
        """Add `n` tokens of `req` to `out`, charged."""
        out.add(req, n)
        self.left -= n
        self._charged += 1


def check_budget(budget, who: str) -> None:
    """The toolkit's calls that fill a batch take a `Budget` (so what each entry costs is
    charged in one place); a plain number is refused, naming the call."""
    if not isinstance(budget, Budget):
        raise TypeError(f"{who}(out, budget): budget must be a Budget "
                        f"(sarathi_lab.schedulers.mechanics.budget), not "
                        f"{type(budget).__name__} {budget!r}; e.g. Budget(self.token_limit())")
