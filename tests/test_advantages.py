"""GAE and final-value bootstrapping against an independent reference written with plain loops: ppo.py's
compute_advantages, bootstrap_mask, RunningMeanStd and RewardNormalizer, and ippo.py's own RunningMeanStd. The
siblings' `# Copied from ppo.py` copies of them are checked equal to ppo.py's by
scripts/check_copies.py (tests/test_check_copies.py), so they are tested here once, on their source."""

import numpy as np
import pytest
import torch

import ippo
import ppo
from tests.util import fast_args, spy_on_advantages

GAMMA, LAM = 0.9, 0.8


def next_state_value(t, env, terminated, truncated, final_values, values, next_value, rule):
    """Value of the state after step t, as seen by step t's own episode."""
    if terminated[t, env] or truncated[t, env]:
        bootstraps = {"always": True, "truncated": bool(truncated[t, env] and not terminated[t, env]),
                      "never": False}[rule]
        return final_values[t, env] if bootstraps else 0.0
    return next_value[env] if t == len(values) - 1 else values[t + 1, env]


def segment_end(t, env, terminated, truncated):
    """Last step of the episode segment that contains step t, within the rollout."""
    T = terminated.shape[0]
    for k in range(t, T):
        if terminated[k, env] or truncated[k, env]:
            return k
    return T - 1


def reference(rewards, values, terminated, truncated, final_values, next_value, rule, finite_horizon):
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for env in range(N):
        for t in range(T):
            end = segment_end(t, env, terminated, truncated)
            v_next = [next_state_value(k, env, terminated, truncated, final_values, values, next_value, rule)
                      for k in range(T)]
            if not finite_horizon:
                # sum of discounted TD errors, forwards over the rest of the episode segment
                adv[t, env] = sum((GAMMA * LAM) ** (k - t) * (rewards[k, env] + GAMMA * v_next[k] - values[k, env])
                                  for k in range(t, end + 1))
            else:
                # lambda-weighted average of the n-step returns that fit in the segment
                horizon = end - t + 1
                n_step_returns = [sum(GAMMA**i * rewards[t + i, env] for i in range(n)) + GAMMA**n * v_next[t + n - 1]
                                  for n in range(1, horizon + 1)]
                weights = [LAM ** (n - 1) for n in range(1, horizon + 1)]
                adv[t, env] = np.dot(weights, n_step_returns) / sum(weights) - values[t, env]
    return adv


def random_rollout(seed, T=12, N=6):
    rng = np.random.default_rng(seed)
    terminated = rng.random((T, N)) < 0.15
    truncated = rng.random((T, N)) < 0.15  # some steps are both: termination wins under the "truncated" rule
    return dict(rewards=rng.normal(size=(T, N)), values=rng.normal(size=(T, N)), terminated=terminated,
                truncated=truncated, final_values=rng.normal(size=(T, N)), next_value=rng.normal(size=N))


@pytest.mark.parametrize("finite_horizon", [False, True])
@pytest.mark.parametrize("rule", ["always", "truncated", "never"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantages_match_reference(rule, finite_horizon, seed):
    r = random_rollout(seed)
    assert r["terminated"].any() and r["truncated"].any() and (r["terminated"] & r["truncated"]).any()
    t = {k: torch.as_tensor(v) for k, v in r.items()}
    dones = (t["terminated"] | t["truncated"]).double()
    mask = ppo.bootstrap_mask(rule, t["terminated"], t["truncated"])
    bootstrap_values = torch.where(mask, t["final_values"], 0.0)
    got = ppo.compute_advantages(t["rewards"], t["values"], dones, bootstrap_values, t["next_value"], GAMMA, LAM,
                                 finite_horizon)
    want = reference(r["rewards"], r["values"], r["terminated"], r["truncated"], r["final_values"], r["next_value"],
                     rule, finite_horizon)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_rules_differ_where_they_should():
    """The reference itself distinguishes the rules (a reference blind to them would make the test above vacuous)."""
    r = random_rollout(0)
    results = {rule: reference(r["rewards"], r["values"], r["terminated"], r["truncated"], r["final_values"],
                               r["next_value"], rule, False) for rule in ("always", "truncated", "never")}
    assert not np.allclose(results["always"], results["truncated"])
    assert not np.allclose(results["truncated"], results["never"])


def test_bootstrap_mask():
    terminated = torch.tensor([True, True, False, False])
    truncated = torch.tensor([True, False, True, False])
    assert ppo.bootstrap_mask("always", terminated, truncated).tolist() == [True, True, True, False]
    assert ppo.bootstrap_mask("truncated", terminated, truncated).tolist() == [False, False, True, False]
    assert ppo.bootstrap_mask("never", terminated, truncated).tolist() == [False, False, False, False]


@pytest.mark.parametrize("trainer", [ppo, ippo], ids=["ppo", "ippo"])
def test_running_mean_std_matches_numpy(trainer):
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 17, 1, 40)]
    rms = trainer.RunningMeanStd((4,))
    for batch in batches:
        rms.update(torch.as_tensor(batch))
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-5)  # the 1e-4 prior count
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-4)
    normalized = rms(torch.as_tensor(data)).double().numpy()
    np.testing.assert_allclose(normalized, (data - data.mean(0)) / data.std(0), atol=1e-3)
    # far outside the statistics: clipped to +-10
    assert rms(torch.tensor([[1e6, -1e6, 3.0, 3.0]]))[0, :2].tolist() == [10.0, -10.0]


@pytest.mark.parametrize("rule,after_termination,after_truncation",
                         [("always", 500.0, 1000.0), ("truncated", 0.0, 1000.0), ("never", 0.0, 0.0)])
def test_rollout_bootstraps_from_the_final_observation(tmp_path, monkeypatch, rule, after_termination,
                                                       after_truncation):
    """In a real rollout, a finished episode bootstraps from V(its final observation), as the rule says.

    PointMassEnds episodes alternate: a termination after 8 steps, then a truncation at 16. The critic is replaced
    by V(obs) = 1000 * (fraction of the time limit elapsed), so the value of a final observation (500 after a
    termination, 1000 after a truncation) differs from that of the reset observation that replaces it (0).
    """
    captured = spy_on_advantages(monkeypatch, ppo)
    monkeypatch.setattr(ppo.Agent, "get_value", lambda self, obs: 1000.0 * obs[:, 1])
    monkeypatch.chdir(tmp_path)
    argv = fast_args("tests.envs:PointMassEnds-v0", rule, num_steps=24, total_timesteps=2 * 24 * 2,
                     bootstrap_at_done=rule, save_model=False)
    assert ppo.cli(argv) == 0
    assert len(captured) == 2  # two iterations of 24 steps: episodes end after steps 8, 24, 32 and 48
    for call in captured:
        dones, bootstrap_values = call["dones"], call["bootstrap_values"]
        ended = dones[:, 0].nonzero().flatten().tolist()
        assert ended == [7, 23]
        assert bootstrap_values[7].tolist() == [after_termination] * 2
        assert bootstrap_values[23].tolist() == [after_truncation] * 2
        assert not bootstrap_values[dones == 0].any()


def test_reward_normalizer_matches_reference():
    """Rewards divided by the std of every discounted return seen so far; a return restarts after its episode ends."""
    rng = np.random.default_rng(0)
    steps, num_envs, gamma = 60, 3, 0.9
    rewards = rng.normal(2.0, 5.0, size=(steps, num_envs))
    dones = rng.random((steps, num_envs)) < 0.1
    assert dones.any()
    normalizer = ppo.RewardNormalizer(num_envs, gamma)
    returns_seen, discounted = [], np.zeros(num_envs)
    for t in range(steps):
        discounted = gamma * discounted + rewards[t]
        returns_seen.extend(discounted)
        want = np.clip(rewards[t] / np.std(returns_seen), -10, 10)
        got = normalizer(torch.as_tensor(rewards[t], dtype=torch.float32), torch.as_tensor(dones[t]))
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-3)
        discounted[dones[t]] = 0.0
    # equal first returns have no spread yet: the scaled reward is clipped
    first = ppo.RewardNormalizer(num_envs, gamma)(torch.ones(num_envs), torch.zeros(num_envs, dtype=torch.bool))
    assert first.tolist() == [10.0] * num_envs
