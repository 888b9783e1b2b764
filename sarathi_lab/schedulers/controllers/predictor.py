"""What a budget controller prices candidate batches with (`scheduler.predictor`).

The contract (`IterationPredictor`): called as ``predict(chunks, decode_contexts, spec_len=0)``
(`base.Predictor`: prefill chunks as (tokens, tokens already in KV) pairs, the decodes' contexts,
k draft tokens per decode) it returns the seconds it expects such an iteration to take;
`observe` is told, after each executed iteration, what ran and how long it took; `record` is
the summary's ``predictor`` entry. The policy (`consult.Consulting`) builds it, feeds it every
executed step, and hands it to the controller.

- `learned` (the default): learns iteration time online from the durations of the steps it has
  seen executed -- what a real engine observes -- and never reads the simulator's cost model or
  the true time of the step it is predicting. A least-squares fit per batch composition (with
  or without prompt tokens, and each speculation length k), in the features a transformer
  iteration's time is linear in piecewise: 1 (the launch and weight-read floor), the tokens
  computed (the linear layers), the prompt chunks' attention work sum n (c + (n + 1) / 2) and
  the decodes' attended context sum c (1 + k); exponentially forgetting (weight 1 - 1/window
  per step) so it follows a drifting machine. It plans with a margin: the fit's prediction times
  the `predictor_quantile` of its own relative errors, observed/predicted, over its last
  `predictor_window` steps, each step predicted by the current fit with that step left out
  (out of sample: a fit of few steps gets the wide margin it deserves), and times 1 + h, h the
  candidate's leverage x' S^-1 x capped at 1 (a prediction interval's growth: near 0 for a batch
  like those seen, up to 1 for one the fit extrapolates to, e.g. the first chunk with decodes
  beside it, or deep into a long prompt; uncapped, a direction no step has explored would be
  priced out of reach for good). A fit's features being only piecewise right, and the machine's
  noise, both show up in those errors, so the margin grows with either.
  Every coefficient is kept >= 0 (more work never takes less time: the cost model's shape, not
  its numbers), which keeps a fit of few steps from extrapolating to a large batch below a
  small one.
  Cold start: a composition with fewer than `predictor_warmup` steps borrows the fit over every
  step (pooled); until that one has them, every batch is priced +inf -- "does not fit", the
  controller's most cautious choice (its smallest chunk; `slack` relegates nothing on it). The
  first iterations of a run hold no decodes and the controllers leave them the whole budget,
  so the fit sees full-size prompt chunks from the start.
- `oracle`: the simulator's own cost model (`Executor.predictor`, the median step time without
  step_jitter): a perfect predictor at zero noise, for upper-bound studies. A real executor
  offers none (an error naming the setting).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from sarathi_lab.schedulers.controllers.base import ControllerConfig
from sarathi_lab.settings import setting

_NUM_FEATURES = 4
_RIDGE = 1e-9   # keeps a direction no step has explored at 0 instead of singular


@dataclass
class PredictedConfig(ControllerConfig):
    """Settings of a controller that prices batches (`needs_predictor`): which predictor."""

    predictor: str = setting("learned", choices=("learned", "oracle"), help=(
        "what prices candidate batches: learned (from the durations of executed steps, with a "
        "margin from its own errors) | oracle (the simulator's cost model: a perfect predictor "
        "at zero noise, for upper bounds; executor=sim only)"))
    predictor_quantile: float = setting(0.99, gt=0, lt=1, help=(
        "learned: plans with the fit times this quantile of its observed/predicted ratios"))
    predictor_window: int = setting(1000, ge=10, help=(
        "learned: steps its error quantile remembers; the fit forgets with weight 1 - 1/window "
        "per step"))
    predictor_warmup: int = setting(16, ge=1, help=(
        "learned: steps a fit needs before it predicts (until then a batch is "
        "priced +inf: the controller's smallest chunk)"))

    def validate(self) -> None:
        if self.predictor == "oracle":
            for f in ("predictor_quantile", "predictor_window", "predictor_warmup"):
                default = type(self).__dataclass_fields__[f].default
                if getattr(self, f) != default:
                    raise ValueError(f"{f}={getattr(self, f)}: read only with predictor=learned "
                                     "(the oracle is the cost model itself)")


class IterationPredictor(abc.ABC):
    """A predictor of iteration time, fed the executed steps."""

    name = "base"
    #: changes whenever its prices may have (a controller may cache prices while it holds)
    version = 0

    @abc.abstractmethod
    def __call__(self, chunks, decode_contexts, spec_len: int = 0) -> float:
        """Seconds an iteration of this batch is expected to take (math.inf: unknown yet)."""

    def observe(self, chunks, decode_contexts, spec_len: int, seconds: float) -> None:
        """An executed iteration of this batch took `seconds` (its compute; swaps excluded)."""

    @abc.abstractmethod
    def record(self) -> dict:
        """Which predictor ran, its settings and its state at the end (summary's `predictor`)."""


class Oracle(IterationPredictor):
    """The simulator's cost model (`Executor.predictor`)."""

    name = "oracle"

    def __init__(self, price):
        self.price = price

    def __call__(self, chunks, decode_contexts, spec_len=0):
        if spec_len:
            return self.price(chunks, decode_contexts, spec_len=spec_len)
        return self.price(chunks, decode_contexts)

    def record(self):
        return {"name": "oracle", "source": "the simulator's cost model (median step time, "
                                            "no step_jitter)"}


def features(chunks, decode_contexts, spec_len: int = 0) -> tuple:
    """(1, kilotokens computed, prompt attention in 1e6 token pairs, decode attention in 1e5
    context tokens): scaled to order 1 so the fit is well conditioned."""
    per = 1 + spec_len
    pre = sum(n for n, _ in chunks)
    attn = sum(n * (c + (n + 1) / 2) for n, c in chunks)
    return (1.0, (pre + per * len(decode_contexts)) / 1e3, attn / 1e6,
            per * sum(decode_contexts) / 1e5)


def nonnegative_least_squares(A: np.ndarray, b: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """argmin over theta >= 0 of theta' A theta - 2 b' theta (A = X'X, b = X't: least squares
    from its normal equations), by trying every set of free coefficients (2^4; the
    unconstrained solution, `inv` @ b, first). Every feature is work an iteration does, so none
    may make it faster: without this, a fit of few, clustered steps extrapolates with a negative
    coefficient to a large batch it has never seen and prices it below a small one."""
    theta = inv @ b
    if (theta >= 0).all():
        return theta
    best, best_obj = np.zeros(len(b)), 0.0
    for mask in range(1, 1 << len(b)):
        free = [i for i in range(len(b)) if mask >> i & 1]
        sub = np.linalg.solve(A[np.ix_(free, free)], b[free])
        if (sub < 0).any():
            continue
        t = np.zeros(len(b))
        t[free] = sub
        obj = t @ A @ t - 2 * b @ t
        if obj < best_obj:
            best, best_obj = t, obj
    return best


class _Fit:
    """An exponentially forgetting least-squares fit of time on `features`, and its margin: the
    quantile of observed/predicted over its last `window` steps, each predicted leaving that
    step out (the fit's leave-one-out prediction, e / (1 - h) from its hat value h: out of
    sample, so a fit of few steps is not trusted more than it deserves, and every ratio is the
    current fit's, not a stale one of the first steps). Its statistics take every step; it
    solves when next asked for a price, and refreshes the margin every step while it has few,
    then every 1/32 of its window (the margin moves slowly; a run prices ~10 batches a step)."""

    __slots__ = ("S", "b", "n", "floor", "X", "T", "_theta", "_inv", "_solved", "_margins")

    def __init__(self, window: int):
        self.S = np.zeros((_NUM_FEATURES, _NUM_FEATURES))
        self.b = np.zeros(_NUM_FEATURES)
        self.n = 0
        self.floor = math.inf   # the fastest step seen: no prediction goes below it
        self.X = np.zeros((window, _NUM_FEATURES))   # a ring of the last `window` steps
        self.T = np.zeros(window)
        self._solved = -1       # n when theta and S^-1 were last solved
        self._margins: dict = {}   # q -> (margin, n when computed)

    def add(self, x, t: float, forget: float) -> None:
        xv = np.asarray(x)
        self.S *= forget
        self.S += np.outer(xv, xv)
        self.b *= forget
        self.b += t * xv
        w = len(self.T)
        self.X[self.n % w] = xv
        self.T[self.n % w] = t
        self.n += 1
        self.floor = min(self.floor, t)

    def _solve(self) -> None:
        if self._solved != self.n:
            A = self.S + _RIDGE * np.eye(_NUM_FEATURES)
            inv = np.linalg.inv(A)
            self._theta = tuple(nonnegative_least_squares(A, self.b, inv).tolist())
            self._inv = inv.tolist()
            self._solved = self.n

    @property
    def theta(self) -> tuple:
        self._solve()
        return self._theta

    def raw(self, x) -> float:
        th = self.theta
        return max(th[0] * x[0] + th[1] * x[1] + th[2] * x[2] + th[3] * x[3], self.floor)

    def leverage(self, x) -> float:
        """x' S^-1 x: how unlike the steps seen a batch is (about features / steps for a
        typical one; 1 and more for one outside what the fit has seen)."""
        self._solve()
        inv = self._inv
        return sum(x[i] * sum(inv[i][j] * x[j] for j in range(_NUM_FEATURES))
                   for i in range(_NUM_FEATURES))

    def ratios(self, forget: float) -> np.ndarray:
        """observed / leave-one-out predicted, for the steps in the window."""
        self._solve()
        w = len(self.T)
        m = min(self.n, w)
        X, T = self.X[:m], self.T[:m]
        # each step's weight in the fit: forget ** its age in steps
        age = (self.n - 1 - np.arange(m)) % w
        h = forget ** age * ((X @ np.asarray(self._inv)) * X).sum(axis=1)
        pred = X @ np.asarray(self._theta)
        # a step the others barely determine (h >= 1/2: the one large batch among small ones)
        # is left out: its error is the extrapolation's, which the price's 1 + h carries
        keep = h < 0.5
        if keep.any():
            X, T, pred, h = X[keep], T[keep], pred[keep], h[keep]
        loo = T - (T - pred) / np.maximum(1 - h, 1e-3)
        return T / np.maximum(loo, self.floor)

    def margin(self, q: float, forget: float) -> float:
        """The q-quantile of `ratios`: the larger of the empirical one (the higher order
        statistic: of few, the largest) and a log-normal fit's, exp(mean + z_q sd) of their
        logs (steadier than the empirical tail while the window holds a few hundred)."""
        v, at = self._margins.get(q, (None, 0))
        if v is None or self.n - at >= max(1, min(self.n, len(self.T)) // 32):
            r = self.ratios(forget)
            logs = np.log(r)
            fitted = math.exp(logs.mean() + NormalDist().inv_cdf(q) * logs.std()) \
                if len(r) > 1 else 0.0
            v = max(float(np.quantile(r, q, method="higher")), fitted)
            self._margins[q] = v, self.n
        return v


class Learned(IterationPredictor):
    """Online per-composition least squares with a quantile margin (module docstring)."""

    name = "learned"

    def __init__(self, cfg: PredictedConfig):
        self.q, self.window, self.warmup = (cfg.predictor_quantile, cfg.predictor_window,
                                            cfg.predictor_warmup)
        self.forget = 1 - 1 / self.window
        self.fits: dict = {}
        self.pooled = _Fit(self.window)

    def _fit(self, key):
        fit = self.fits.get(key)
        if fit is not None and fit.n >= self.warmup:
            return fit
        fit = self.pooled
        return fit if fit.n >= self.warmup else None

    def __call__(self, chunks, decode_contexts, spec_len=0):
        fit = self._fit((bool(chunks), spec_len))
        if fit is None:
            return math.inf
        x = features(chunks, decode_contexts, spec_len)
        # a batch unlike any seen is priced up to twice: more would price every batch of a
        # direction no step has explored out of reach for good (slo_dp then never tries one)
        return fit.raw(x) * fit.margin(self.q, self.forget) * (1 + min(fit.leverage(x), 1.0))

    def observe(self, chunks, decode_contexts, spec_len, seconds):
        self.version += 1
        x = features(chunks, decode_contexts, spec_len)
        key = (bool(chunks), spec_len)
        fit = self.fits.get(key)
        if fit is None:
            fit = self.fits[key] = _Fit(self.window)
        fit.add(x, seconds, self.forget)
        self.pooled.add(x, seconds, self.forget)

    def record(self):
        def state(fit):
            ready = fit.n >= self.warmup
            return {"steps": fit.n,
                    "margin": fit.margin(self.q, self.forget) if ready else None,
                    "median_ratio": fit.margin(0.5, self.forget) if ready else None,
                    "coefficients": list(fit.theta)}
        return {"name": "learned", "quantile": self.q, "window": self.window,
                "warmup": self.warmup, "pooled": state(self.pooled),
                "compositions": {f"{'prompt' if p else 'decode-only'} k={k}": state(f)
                                 for (p, k), f in sorted(self.fits.items())}}


def build(cfg) -> IterationPredictor | None:
    """The learned predictor of a controller's settings, or None for the oracle (bound later,
    from the executor); a plug-in's settings without the fields get the learned default."""
    if getattr(cfg, "predictor", "learned") == "oracle":
        return None
    return Learned(cfg if isinstance(cfg, PredictedConfig) else PredictedConfig())
