"""Bandit policies: epsilon-greedy with EMA values and warm-up, EXP3, fixed arm."""
import copy
import math
import pickle

import numpy as np
import pytest

from algorithms.bandits import EpsilonGreedyEMA, Exp3, FixedArm, forced, make_policy

ARMS = ["topk", "randomk", "periodick"]


def warm(policy, rewards):
    """Run the warm-up feeding rewards[arm] lists in order; returns the chosen arms."""
    rng = np.random.default_rng(0)
    it = {a: iter(v) for a, v in rewards.items()}
    chosen = []
    while policy.in_warmup:
        arm, reason = policy.choose(rng)
        assert reason == "warmup"
        chosen.append(arm)
        policy.update(arm, next(it[arm]))
    return chosen


# ------------------------------------------------------------------ epsilon-greedy


def test_warmup_round_robin_each_arm_warmup_times():
    for w in (1, 2, 3):
        p = EpsilonGreedyEMA(ARMS, warmup=w)
        chosen = warm(p, {a: [0.0] * w for a in ARMS})
        assert chosen == ARMS * w
        assert p.epsilon() == 1.0  # 1 * 3 / 1 capped at 1


def test_q_after_warmup_is_mean_of_warmup_rewards():
    p = EpsilonGreedyEMA(ARMS, warmup=2)
    warm(p, {"topk": [0.2, 0.4], "randomk": [-0.5, 0.1], "periodick": [0.9, 0.7]})
    p.choose(np.random.default_rng(1))  # first post-warm-up choice closes the warm-up
    q = p.q_values()
    assert q["topk"] == pytest.approx(0.3, abs=1e-15)
    assert q["randomk"] == pytest.approx(-0.2, abs=1e-15)
    assert q["periodick"] == pytest.approx(0.8, abs=1e-15)


def test_arm_without_warmup_reward_gets_overall_mean():
    p = EpsilonGreedyEMA(["a", "b"], warmup=1)
    rng = np.random.default_rng(0)
    p.choose(rng)
    p.update("a", 0.6)
    p.choose(rng)  # "b": reward dropped (rollback)
    p.choose(rng)
    assert p.q_values() == {"a": 0.6, "b": 0.6}


def test_ema_update_exact_numbers_and_only_chosen_arm():
    p = EpsilonGreedyEMA(ARMS, warmup=1, lam=0.3)
    warm(p, {"topk": [0.5], "randomk": [0.1], "periodick": [0.0]})
    p.choose(np.random.default_rng(0))
    p.update("randomk", 1.0)
    assert p.q_values()["randomk"] == (1 - 0.3) * 0.1 + 0.3 * 1.0
    p.update("randomk", -1.0)
    assert p.q_values()["randomk"] == (1 - 0.3) * ((1 - 0.3) * 0.1 + 0.3 * 1.0) + 0.3 * -1.0
    assert p.q_values()["topk"] == 0.5 and p.q_values()["periodick"] == 0.0


def test_mean_update_is_the_sample_mean_of_the_kept_rewards():
    # v3 blocks of 2: each block's first reward is dropped, so each Q starts from one kept reward
    p = EpsilonGreedyEMA(ARMS, warmup=2, blocks=True, mean=True)
    warm(p, {"topk": [9.0 / 10, 0.4], "randomk": [-0.9, 0.1], "periodick": [0.9, 0.0]})
    p.choose(np.random.default_rng(0))
    for r in (1.0, -0.5, 0.25):
        p.update("randomk", r)
    assert p.q_values()["randomk"] == pytest.approx(np.mean([0.1, 1.0, -0.5, 0.25]), abs=1e-15)
    assert p.q_values()["topk"] == pytest.approx(0.4) and p.q_values()["periodick"] == 0.0
    # an arm with no kept warm-up reward starts from the fallback, then is its own rewards' mean
    q = EpsilonGreedyEMA(["a", "b"], warmup=1, mean=True)
    rng = np.random.default_rng(0)
    q.choose(rng)
    q.update("a", 0.6)
    q.choose(rng)  # "b": reward dropped
    q.choose(rng)
    q.update("b", -0.2)
    q.update("b", 0.4)
    assert q.q_values() == pytest.approx({"a": 0.6, "b": 0.1})


def test_decaying_epsilon_values():
    p = EpsilonGreedyEMA(ARMS)  # c = 1 (spec v2), |S| = 3, eps_min = 0.03
    assert [p.epsilon_at(t) for t in (1, 3)] == [1.0, 1.0]
    assert p.epsilon_at(4) == pytest.approx(0.75)
    assert p.epsilon_at(10) == pytest.approx(0.3)
    assert p.epsilon_at(100) == pytest.approx(0.03)
    assert p.epsilon_at(10_000) == 0.03
    assert EpsilonGreedyEMA(ARMS, c=3.0).epsilon_at(18) == pytest.approx(0.5)  # the first version's c
    warm(p, {a: [0.0, 0.0] for a in ARMS})
    rng = np.random.default_rng(0)
    for t in range(1, 40):
        assert p.epsilon() == max(0.03, min(1.0, 3 / t))
        p.choose(rng)


def test_fixed_epsilon():
    p = make_policy("egreedy", ARMS, epsilon=0.0, warmup=1)
    warm(p, {"topk": [0.1], "randomk": [0.9], "periodick": [0.2]})
    rng = np.random.default_rng(0)
    assert p.epsilon() == 0.0
    assert all(p.choose(rng) == ("randomk", "exploit") for _ in range(50))
    p1 = make_policy("egreedy", ARMS, epsilon=1.0, warmup=0)
    reasons = {p1.choose(rng)[1] for _ in range(50)}
    assert reasons == {"explore"}
    half = make_policy("egreedy", ARMS, epsilon=0.25, warmup=0)
    n_explore = sum(half.choose(rng)[1] == "explore" for _ in range(4000))
    assert 0.22 < n_explore / 4000 < 0.28


def test_exploitation_ties_lowest_index():
    p = EpsilonGreedyEMA(ARMS, warmup=1, epsilon_fixed=0.0)
    warm(p, {"topk": [0.3], "randomk": [0.5], "periodick": [0.5]})
    assert p.choose(np.random.default_rng(0)) == ("randomk", "exploit")


def test_exploits_best_arm_on_stationary_stream():
    rng = np.random.default_rng(2026)
    env = np.random.default_rng(7)
    means = {"topk": 0.1, "randomk": 0.6, "periodick": 0.3}
    p = EpsilonGreedyEMA(ARMS)
    post, reasons = [], []
    for _ in range(2 * 3 + 300):
        warmup = p.in_warmup
        arm, reason = p.choose(rng)
        p.update(arm, float(np.clip(means[arm] + 0.1 * env.standard_normal(), -1, 1)))
        if not warmup:
            post.append(arm)
            reasons.append(reason)
    assert post.count("randomk") / len(post) > 0.8
    assert {"explore", "exploit"} <= set(reasons)


def test_same_rng_same_choices_and_picklable():
    def trace(policy, seed):
        rng = np.random.default_rng(seed)
        out = []
        for i in range(40):
            arm, reason = policy.choose(rng)
            policy.update(arm, math.sin(i))
            out.append((arm, reason))
        return out

    a, b = EpsilonGreedyEMA(ARMS), EpsilonGreedyEMA(ARMS)
    assert trace(a, 3) == trace(b, 3)
    c = pickle.loads(pickle.dumps(a))
    d = copy.deepcopy(a)
    assert trace(c, 9) == trace(d, 9) == trace(a, 9)


def test_egreedy_validation():
    with pytest.raises(ValueError, match="arms"):
        EpsilonGreedyEMA([])
    with pytest.raises(ValueError, match="distinct"):
        EpsilonGreedyEMA(["a", "a"])
    with pytest.raises(ValueError, match="lam"):
        EpsilonGreedyEMA(ARMS, lam=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        make_policy("egreedy", ARMS, epsilon=1.5)
    with pytest.raises(ValueError, match="reward"):
        EpsilonGreedyEMA(ARMS).update("topk", float("nan"))
    with pytest.raises(ValueError):
        EpsilonGreedyEMA(ARMS).update("nope", 0.0)


# ------------------------------------------------------------------ EXP3


def test_exp3_probabilities_exact_for_hand_set_weights():
    p = Exp3(ARMS, gamma=0.1)
    p.set_weights([1.0, 2.0, 5.0])
    want = np.array([0.9 * 1 / 8 + 0.1 / 3, 0.9 * 2 / 8 + 0.1 / 3, 0.9 * 5 / 8 + 0.1 / 3])
    np.testing.assert_allclose(p.probabilities(), want, rtol=1e-14)
    assert p.probabilities().sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(Exp3(ARMS).probabilities(), [1 / 3] * 3, rtol=1e-14)


def test_exp3_update_formula_exact():
    g = 0.2
    p = Exp3(ARMS, gamma=g)
    w = np.array([1.0, 2.0, 5.0])
    p.set_weights(w)
    probs = p.probabilities()
    r = 0.4
    rp = (r + 1) / 2
    p.update("randomk", r)
    w2 = w.copy()
    w2[1] *= math.exp(g * rp / (probs[1] * 3))
    np.testing.assert_allclose(p.weights(), w2 / w2.sum(), rtol=1e-12)
    np.testing.assert_allclose(p.probabilities(), (1 - g) * w2 / w2.sum() + g / 3, rtol=1e-12)
    # rewards are clipped into [-1, 1] before the mapping: r = -5 -> r' = 0 -> no change
    before = p.weights().copy()
    p.update("topk", -5.0)
    np.testing.assert_allclose(p.weights(), before, rtol=1e-12)


def test_exp3_uses_probability_at_choice_time():
    g = 0.3
    p = Exp3(ARMS, gamma=g)
    rng = np.random.default_rng(5)
    arm, reason = p.choose(rng)
    assert reason == "sample"
    i = ARMS.index(arm)
    p.update(arm, 1.0)  # p_i = 1/3 at choice time
    want = np.ones(3)
    want[i] = math.exp(g * 1.0 / ((1 / 3) * 3))
    np.testing.assert_allclose(p.weights(), want / want.sum(), rtol=1e-12)


def test_exp3_stays_finite_and_sums_to_one_over_many_updates():
    p = Exp3(ARMS, gamma=0.05)
    rng = np.random.default_rng(0)
    counts = {a: 0 for a in ARMS}
    for _ in range(5000):
        arm, _ = p.choose(rng)
        counts[arm] += 1
        p.update(arm, 1.0 if arm == "periodick" else -1.0)
        probs = p.probabilities()
        assert np.all(np.isfinite(probs)) and abs(probs.sum() - 1.0) < 1e-12
        assert probs.min() >= 0.05 / 3 - 1e-15
    assert counts["periodick"] > 4000
    assert np.all(np.isfinite(p.log_w)) and p.log_w.max() == 0.0


# ------------------------------------------------------------------ fixed, factory


def test_fixed_and_factory():
    f = make_policy("fixed", ARMS, arm="randomk")
    assert isinstance(f, FixedArm)
    rng = np.random.default_rng(0)
    assert all(f.choose(rng) == ("randomk", "fixed") for _ in range(5))
    f.update("randomk", 0.5)
    assert make_policy("fixed", ["topk"]).choose(rng) == ("topk", "fixed")
    assert forced("topk") == ("topk", "forced")
    assert isinstance(make_policy("exp3", ARMS, gamma=0.2), Exp3)
    e = make_policy("egreedy", ARMS, warmup=1, c=2.0, eps_min=0.1, lam=0.5)
    assert (e.warmup, e.c, e.eps_min, e.lam, e.epsilon_fixed) == (1, 2.0, 0.1, 0.5, None)
    with pytest.raises(ValueError, match="kind"):
        make_policy("ucb", ARMS)
    with pytest.raises(ValueError, match="arm"):
        make_policy("fixed", ARMS)
    with pytest.raises(ValueError, match="arm"):
        make_policy("fixed", ARMS, arm="nope")
