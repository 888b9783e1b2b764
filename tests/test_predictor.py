"""The budget controllers' learned predictor of iteration time (schedulers/controllers/
predictor.py), by hand: the fit recovers a known linear cost, the margin follows the error it
observes, a cold start prices every batch out of reach, coefficients stay >= 0, and in a run
it learns from executed steps only (never from the cost model)."""
import math

import numpy as np
import pytest
from conftest import LinearCost, make_policy

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request
from sarathi_lab.schedulers.controllers.predictor import (
    Learned,
    PredictedConfig,
    features,
    nonnegative_least_squares,
)

# a known cost: 12 ms + 60 ms per 1000 tokens + 5 ms per 1e6 prompt attention pairs + 9 ms per
# 1e5 decode context tokens
TRUE = (0.012, 0.060, 0.005, 0.009)


def cost(chunks, decodes, k=0):
    return sum(c * x for c, x in zip(TRUE, features(chunks, decodes, k)))


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        chunks = [(int(rng.integers(1, 1024)), int(rng.integers(0, 4096)))
                  for _ in range(int(rng.integers(0, 3)))]
        yield chunks, [int(c) for c in rng.integers(1, 4096, int(rng.integers(0, 64)))]


def learned(**kw):
    return Learned(PredictedConfig(**kw))


def test_the_fit_recovers_a_known_linear_cost_and_plans_at_it_without_noise():
    p = learned(predictor_quantile=0.99)
    for chunks, dec in batches(400):
        p.observe(chunks, dec, 0, cost(chunks, dec))
    fit = p.fits[(True, 0)]
    assert fit.theta == pytest.approx(TRUE, rel=1e-5)
    # no error to plan around: the price is the cost itself (a margin of 1), for a batch of a
    # kind it has seen (leverage ~ features / steps)
    chunks, dec = [(700, 1500)], [2000] * 30
    assert p(chunks, dec) == pytest.approx(cost(chunks, dec), rel=2e-2)
    assert fit.margin(0.99, p.forget) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("sigma", [0.05, 0.1, 0.2])
def test_the_margin_is_the_quantile_of_the_injected_error(sigma):
    """Each step takes cost x exp(sigma z): the q = 0.99 margin comes to exp(2.326 sigma)
    (1.12, 1.26, 1.59), the fit to the cost's coefficients x E[exp(sigma z)] (its mean)."""
    rng = np.random.default_rng(1)
    p = learned(predictor_window=2000)
    for chunks, dec in batches(2000, seed=2):
        p.observe(chunks, dec, 0, cost(chunks, dec) * math.exp(sigma * rng.standard_normal()))
    fit = p.fits[(True, 0)]
    assert fit.margin(0.99, p.forget) == pytest.approx(math.exp(2.326 * sigma), rel=0.03)
    # least squares fits the mean, exp(sigma^2 / 2) above the median: the median ratio is
    # exp(-sigma^2 / 2)
    assert fit.margin(0.5, p.forget) == pytest.approx(math.exp(-sigma ** 2 / 2), abs=0.01)


def test_the_margin_follows_a_change_of_noise_and_the_fit_a_slower_machine():
    rng = np.random.default_rng(3)
    p = learned(predictor_window=100)
    data = list(batches(1400, seed=4))
    for chunks, dec in data[:400]:
        p.observe(chunks, dec, 0, cost(chunks, dec))
    fit = p.fits[(True, 0)]
    quiet = fit.margin(0.99, p.forget)
    for chunks, dec in data[400:800]:
        p.observe(chunks, dec, 0, cost(chunks, dec) * math.exp(0.1 * rng.standard_normal()))
    noisy = fit.margin(0.99, p.forget)
    assert quiet < 1.001 and noisy == pytest.approx(math.exp(0.233), rel=0.06)
    # the machine turns 30% slower, without noise: after 6 windows (the old steps' weight
    # 0.99^600 = 0.2%) the fit is the new cost and the margin is back near 1
    for chunks, dec in data[800:]:
        p.observe(chunks, dec, 0, 1.3 * cost(chunks, dec))
    assert fit.theta == pytest.approx([1.3 * c for c in TRUE], rel=0.02)
    assert fit.margin(0.99, p.forget) < 1.02


def test_a_cold_start_prices_every_batch_out_of_reach_then_borrows_the_pooled_fit():
    p = learned(predictor_warmup=5)
    chunks, dec = [(512, 0)], []
    assert p(chunks, dec) == math.inf
    for n in (256, 512, 1024, 2048):
        p.observe([(n, 0)], [], 0, cost([(n, 0)], []))
    assert p(chunks, dec) == math.inf   # 4 steps < warmup 5
    p.observe([(300, 0)], [], 0, cost([(300, 0)], []))
    assert math.isfinite(p(chunks, dec))
    # a composition not seen yet (decodes only, k = 2) borrows the fit over every step
    assert p.fits.get((False, 2)) is None
    assert math.isfinite(p([], [100] * 8, spec_len=2))
    rec = p.record()
    assert rec["name"] == "learned" and rec["warmup"] == 5 and rec["pooled"]["steps"] == 5


def test_coefficients_stay_non_negative():
    """Two clusters a cold start sees (full prompt chunks alone; 17 tokens beside a decode) and
    steps whose noise makes more attention look faster: the unconstrained fit takes a negative
    attention coefficient and prices a chunk deep into a prompt below one at its start; the
    constrained one is optimal among theta >= 0 (KKT: zero gradient where free, >= 0 at 0)."""
    rng = np.random.default_rng(5)
    xs = [(1, 2.048, 2.1, 0.0)] * 3 + [(1, 2.048, 1.1, 0.0)] * 3 + [(1, 0.017, 0.012, 0.013)] * 10
    ts = [0.14, 0.141, 0.139, 0.15, 0.151, 0.149] + list(0.012 + 1e-4 * rng.standard_normal(10))
    A = sum(np.outer(x, x) for x in xs) + 1e-9 * np.eye(4)
    b = sum(t * np.asarray(x) for x, t in zip(xs, ts))
    free = np.linalg.solve(A, b)
    theta = nonnegative_least_squares(A, b, np.linalg.inv(A))
    assert free[2] < 0 and (theta >= 0).all()
    deep, start = np.array([1, 2.048, 6.3, 0.013]), np.array([1, 2.048, 2.1, 0.013])
    assert deep @ free < start @ free and deep @ theta >= start @ theta
    grad = A @ theta - b
    assert np.allclose(grad[theta > 0], 0, atol=1e-9) and (grad[theta == 0] >= -1e-12).all()


def test_in_a_run_it_learns_from_executed_steps_and_never_reads_the_cost_model():
    def forbidden(*a, **k):
        raise AssertionError("the learned predictor read the executor's cost model")
    p = make_policy("sarathi", token_budget=256, controller="tbt_target", target_tbt_s=0.05,
                    max_model_len=1024)
    p.bind_predictor(forbidden)
    ex = LinearCost()
    eng = Engine(p, ex, fast_forward=False)
    eng.run([Request(i, 0.05 * i, 200 + 10 * i, 30) for i in range(20)])
    rec = p.predictor_record()
    steps = eng.num_iterations
    assert rec["name"] == "learned" and rec["pooled"]["steps"] == steps
    assert sum(c["steps"] for c in rec["compositions"].values()) == steps
