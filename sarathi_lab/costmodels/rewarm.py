"""Decode steps that run slower right after a prompt step: the profile's ``decode_rewarm`` rows,
and the state a simulated run keeps of them.

On a CPU a decode step right after a step that computed a prompt chunk takes longer than a
steady one, and the next few less so each (every part of the step: input preparation, the
layers, the LM head, sampling; more after a longer prompt step). A cost model that prices a
batch by its shape alone charges every decode its steady time, and a run's first decodes after
each admission come out too fast: on experiments/fidelity's model, single decodes took 1.60x the
profile's steady price in the first step after a prompt step, 1.41x in the second, ~1.04 from
the 9th (`results/fidelity/decode_streams.csv`, before this was charged).

`sarathi-lab-profile` measures it (`Harness.stream`: a prompt of T tokens, then its request's
decodes, each timed): per prompt size T, the step's time at place p (1: the first decode after
the prompt step) and the steady time (place 0). `Rewarm` holds the factors time(p) / steady,
and `Warmth` follows a run: each step's factor (1 for a step with a prompt chunk, which resets
the place; a decode-only step at place p after a prompt step of T tokens takes factor(T, p)).
"""
from __future__ import annotations

import numpy as np

from sarathi_lab.costmodels.profile_rows import ProfileError, monotone, number


class Rewarm:
    """factor(T, p): how much slower than steady a decode-only step runs at place p (1, 2, ...)
    after a step that computed T prompt tokens; 1 beyond the measured places. Read linearly
    between the measured prompt sizes and flat beyond them (clamped to the smallest and largest:
    no prompt step is known to cost its decodes more than the largest measured one did).
    Monotone: never below 1, nonincreasing in place, nondecreasing in T (noise pooled by
    `profile_rows.monotone`)."""

    def __init__(self, prompts, places, factors, what: str = "decode_rewarm"):
        prompts = np.asarray(prompts, dtype=float)
        f = np.asarray(factors, dtype=float)
        if f.shape != (prompts.size, len(places)) or not prompts.size or not len(places):
            raise ProfileError(f"{what}: factors must be prompts x places, got {f.shape} for "
                               f"{prompts.size} prompt sizes and {len(places)} places")
        if list(places) != list(range(1, len(places) + 1)):
            raise ProfileError(f"{what}: the places must be 1..n without gaps, got "
                               f"{list(places)}")
        if not np.all(np.isfinite(f)) or np.any(f <= 0):
            raise ProfileError(f"{what}: factors must be finite and > 0")
        f = np.maximum(f, 1.0)
        f = np.array([monotone(row[::-1])[::-1] for row in f])      # nonincreasing in place
        f = np.column_stack([monotone(col) for col in f.T])          # nondecreasing in T
        # pooling across T can break the order in place of a row: restore it
        f = np.minimum.accumulate(f, axis=1)
        self.prompts, self.factors = prompts, f
        self.places = f.shape[1]

    @classmethod
    def from_rows(cls, rows, where: str) -> "Rewarm":
        """From ``decode_rewarm`` rows (num_tokens T, place p, time_s; place 0: the steady
        time): per T, time(p) / time(0)."""
        by_t: dict[float, dict[int, float]] = {}
        for r in rows:
            T, p = number(r, "num_tokens", where), number(r, "place", where)
            if p != int(p) or p < 0:
                raise ProfileError(f"{where}: decode_rewarm place must be an integer >= 0, "
                                   f"got {p}")
            by_t.setdefault(T, {})[int(p)] = number(r, "time_s", where)
        prompts = sorted(by_t)
        places = sorted({p for d in by_t.values() for p in d} - {0})
        for T in prompts:
            d = by_t[T]
            if d.get(0, 0) <= 0:
                raise ProfileError(f"{where}: decode_rewarm rows at num_tokens={T:g} lack the "
                                   "steady time (a row with place 0 and time_s > 0)")
            if sorted(set(d) - {0}) != places:
                raise ProfileError(f"{where}: decode_rewarm rows at num_tokens={T:g} have "
                                   f"places {sorted(set(d) - {0})}, others {places}")
        return cls(prompts, places, [[by_t[T][p] / by_t[T][0] for p in places]
                                     for T in prompts], f"{where}: decode_rewarm")

    def factor(self, prompt_tokens: float, place: int) -> float:
        if place < 1 or place > self.places or prompt_tokens <= 0:
            return 1.0
        return float(np.interp(prompt_tokens, self.prompts, self.factors[:, place - 1]))

    def track(self) -> "Warmth":
        return Warmth(self)

    def describe(self) -> dict:
        return {"prompt_tokens": self.prompts.tolist(), "places": self.places,
                "first_place": self.factors[:, 0].round(3).tolist()}


class Warmth:
    """Where a run stands: the prompt tokens of its last step that had any, and how many
    decode-only steps ran since. `step` is the one place it changes."""
    __slots__ = ("rewarm", "prompt_tokens", "place")

    def __init__(self, rewarm: Rewarm):
        self.rewarm, self.prompt_tokens, self.place = rewarm, 0, 0

    def step(self, prompt_tokens: int) -> float:
        """The factor on the next step's time, which computes `prompt_tokens` tokens of prompt
        chunks (0: a decode-only step); the state moves past it."""
        if prompt_tokens > 0:
            self.prompt_tokens, self.place = prompt_tokens, 0
            return 1.0
        self.place += 1
        return self.rewarm.factor(self.prompt_tokens, self.place)


def prompt_tokens(reqs, num_new_tokens) -> int:
    """The tokens of a batch's prompt chunks: entries of more than one token (as `batch_shape`
    counts a prefill; a recomputation's too) that start before the request's last token (a
    speculative decode verifies 1 + k tokens from its last one: not a prompt)."""
    return sum(n for r, n in zip(reqs, num_new_tokens)
               if n > 1 and r.num_computed_tokens < r.num_prompt_tokens + r.num_output_tokens - 1)
