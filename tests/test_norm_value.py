"""--norm_value in every trainer: the critic predicts standardized returns, and every value the algorithm uses (GAE,
bootstrapping, the clipped value loss) is in the reward's units. Exact resume with it: tests/test_ppo.py."""

import gymnasium as gym
import pytest
import torch

import ippo
import ppo
import ppo_rgb
import ppo_rnn
import tests.envs  # noqa: F401  (registers the test envs)
from tests.test_parts import fake_envs
from tests.util import load, spy_on_advantages

ENVS = {ppo: "tests.envs:PointMass-v0", ppo_rnn: "tests.envs:PointMass-v0", ppo_rgb: "tests.envs:PointMassPixels-v0",
        ippo: "vmas:tests.vmas_scenarios:Clock"}
TRAINERS = pytest.mark.parametrize("trainer", list(ENVS), ids=lambda trainer: trainer.__name__)


@TRAINERS
def test_value_statistics_are_those_of_every_return_so_far(tmp_path, monkeypatch, trainer):
    """Against a two-pass mean and variance of all the value targets (returns) of the run's rollouts."""
    pytest.importorskip("vmas") if trainer is ippo else None
    captured = spy_on_advantages(monkeypatch, trainer)
    monkeypatch.chdir(tmp_path)
    argv = ["--env_id", ENVS[trainer], "--exp_name", "run", "--num_envs", "2", "--num_steps", "16",
            "--num_minibatches", "2", "--update_epochs", "2", "--total_timesteps", "128", "--norm_value",
            "--gamma", "0.99", "--no_capture_video", "--num_eval_envs", "1", "--eval_freq", "100"]
    assert trainer.cli(argv) == 0
    assert len(captured) == 4
    agents = captured[0]["values"].shape[2:]  # ippo's: one statistic per agent
    returns = torch.cat([(c["advantages"] + c["values"]).reshape(-1, *agents) for c in captured]).double()
    var, mean = torch.var_mean(returns, dim=0, correction=0)
    model = load(tmp_path / "runs/run/final_ckpt.pt")["model"]
    count = model["value_normalizer.count"]  # ippo's: one per agent
    assert count.flatten().tolist() == pytest.approx([len(returns)] * count.numel(), abs=1e-3)
    # atol: the statistics start from a prior (mean 0, variance 1) of weight 1e-4, 1e-6 of the run's 128 returns
    torch.testing.assert_close(model["value_normalizer.mean"].reshape(mean.shape), mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model["value_normalizer.var"].reshape(var.shape), var, rtol=1e-5, atol=1e-5)
    assert abs(mean).max() > 1  # PointMass's returns are not already standardized


def critic_output(agent, trainer, bias: float):
    """Make the critic's output the constant bias, whatever the observation."""
    last = agent.critic if trainer is ppo_rnn else agent.critic[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(bias)


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ippo], ids=lambda trainer: trainer.__name__)
def test_values_come_back_in_the_rewards_units(trainer):
    """A critic that outputs 0.25 under statistics of mean 500 and std 100 values every observation at 525."""
    agent = trainer.make_agent(trainer.Args(norm_value=True), fake_envs())
    critic_output(agent, trainer, 0.25)
    agent.value_normalizer.mean.fill_(500.0)
    agent.value_normalizer.var.fill_(100.0**2)
    obs = torch.randn(5, 2, 3) if trainer is ippo else torch.randn(5, 3)
    if trainer is ppo_rnn:
        value = agent.get_value(obs[:, None], agent.initial_state(5, torch.device("cpu")), torch.ones(5, 1, dtype=bool))
    else:
        value = agent.get_value(obs)
    torch.testing.assert_close(value, torch.full_like(value, 525.0))


def test_the_rollout_bootstraps_and_the_loss_standardizes_in_the_right_units():
    """ppo.py's rollout stores values and the bootstrap values of its truncated episodes in the reward's units (525,
    as above); ppo_loss's value terms equal a hand computation on standardized values, clipped and not."""
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("tests.envs:PointMass-v0")] * 2,
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = ppo.TorchVecEnv(vector, torch.device("cpu"), torch_native=False)
    args = ppo.Args(num_envs=2, num_steps=16, norm_value=True, clip_coef=0.2)
    torch.manual_seed(0)
    agent = ppo.make_agent(args, envs)
    critic_output(agent, ppo, 0.25)
    agent.value_normalizer.mean.fill_(500.0)
    agent.value_normalizer.var.fill_(100.0**2)
    buf = ppo.RolloutBuffer(16, envs, torch.device("cpu"))
    ppo.rollout(agent, envs, buf, envs.reset(seed=0), agent.get_action_and_value, None, args, "truncated")
    envs.close()
    assert buf.dones[-1].all() and not buf.dones[:-1].any()  # PointMass's 16-step episodes end with the rollout
    torch.testing.assert_close(buf.bootstrap_values[-1], torch.full((2,), 525.0))
    torch.testing.assert_close(buf.values, torch.full_like(buf.values, 525.0))

    obs, actions = buf.obs[0], buf.actions[0]
    returns, old_values = torch.tensor([300.0, 700.0]), torch.tensor([600.0, 540.0])
    advantages, old_logprobs = torch.zeros(2), torch.zeros(2)
    for clip_vloss in (False, True):
        (_, v_loss, _), _, _ = ppo.ppo_loss(agent, ppo.Args(norm_value=True, clip_coef=0.2, clip_vloss=clip_vloss),
                                            obs, actions, old_logprobs, advantages, returns, old_values)
        new, targets, old = 0.25, (returns - 500.0) / 100.0, (old_values - 500.0) / 100.0  # standardized
        unclipped = (new - targets) ** 2
        clipped = (old + torch.clamp(new - old, -0.2, 0.2) - targets) ** 2
        expected = 0.5 * (torch.max(unclipped, clipped) if clip_vloss else unclipped).mean()
        torch.testing.assert_close(v_loss, expected, rtol=1e-5, atol=1e-6)
