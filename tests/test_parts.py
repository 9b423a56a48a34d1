"""Pieces of the trainers with rules of their own: evaluation counting, the adaptive learning rate, the network
flags."""

import dataclasses
import types

import gymnasium as gym
import pytest
import torch

import ippo
import ppo
import ppo_eval
import ppo_rnn
import tests.envs  # noqa: F401  (registers the test envs)


def test_evaluation_counts_the_first_episode_of_each_env():
    """A 4-step env finishes four episodes while a 16-step env finishes one: each counts once, and the
    observation statistics stay frozen."""
    short = gym.make("tests.envs:PointMass-v0", max_episode_steps=4)
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("tests.envs:PointMass-v0"), lambda: short],
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    eval_envs = ppo.TorchVecEnv(vector, torch.device("cpu"), torch_native=False)
    agent = ppo.Agent(2, ppo.space_to_dict(vector.single_action_space), norm_obs=True, norm_value=False,
                      hidden_sizes=(256, 256, 256), activation="tanh", log_std_init=-0.5)
    statistics = {k: v.clone() for k, v in agent.state_dict().items()}
    metrics = ppo.evaluate(agent, eval_envs, num_eval_steps=16, seed=0)
    assert metrics["episodes"].tolist() == [2.0]
    assert sorted(metrics["episode_len"].tolist()) == [4.0, 16.0]
    assert all(torch.equal(statistics[k], v) for k, v in agent.state_dict().items())
    # with too few steps for the long env, only the short env's first episode counts
    metrics = ppo.evaluate(agent, eval_envs, num_eval_steps=10, seed=None)
    assert metrics["episodes"].tolist() == [1.0] and metrics["episode_len"].tolist() == [4.0]
    eval_envs.close()


@pytest.mark.parametrize("kl,expected", [(0.05, 2e-4), (0.021, 2e-4), (0.01, 3e-4), (0.0049, 4.5e-4), (0.0, 4.5e-4)])
def test_adaptive_learning_rate(kl, expected):
    args = ppo.Args(kl_target=0.01, lr_factor=1.5)
    assert ppo.adapt_learning_rate(3e-4, kl, args) == pytest.approx(expected)


def test_adaptive_learning_rate_bounds():
    args = ppo.Args(kl_target=0.01, lr_factor=1.5, min_learning_rate=1e-4, max_learning_rate=1e-3)
    assert ppo.adapt_learning_rate(1.2e-4, 1.0, args) == 1e-4
    assert ppo.adapt_learning_rate(9e-4, 0.0, args) == 1e-3


def test_cuda_rng_state_is_the_learner_gpus_alone(monkeypatch):
    """A job moved to a node with another number of GPUs resumes: only the learner's GPU state is saved and
    restored (faked here: this machine has no GPU)."""
    gpus = {"count": 4}

    def get_rng_state(device="cuda"):
        return torch.full((8,), torch.device(device).index or 0, dtype=torch.uint8)

    restored = []

    def set_rng_state(state, device="cuda"):
        index = torch.device(device).index or 0
        if index >= gpus["count"]:
            raise RuntimeError(f"invalid device index {index}")
        restored.append((index, state.clone()))

    monkeypatch.setattr(torch.cuda, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [get_rng_state(i) for i in range(gpus["count"])])
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                        lambda states: [set_rng_state(s, i) for i, s in enumerate(states)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus["count"])
    torch_state = torch.get_rng_state()
    states = ppo.rng_states(torch.device("cuda", 2))
    gpus["count"] = 1
    ppo.set_rng_states(states, torch.device("cuda", 0))
    assert len(restored) == 1 and restored[0][0] == 0 and restored[0][1].tolist() == [2] * 8
    restored.clear()
    ppo.set_rng_states(states, torch.device("cpu"))  # a GPU run resumed on a CPU learner
    assert restored == [] and torch.equal(torch.get_rng_state(), torch_state)


def fake_envs() -> types.SimpleNamespace:
    """What make_agent and load_weights read of a trainer's envs (ippo's: per agent)."""
    box = gym.spaces.Box(-1, 1, (2,))
    return types.SimpleNamespace(obs_dim=3, critic_dim=0, single_observation_space=gym.spaces.Box(-1, 1, (3,)),
                                 single_action_space=box, num_agents=2, agents=["a", "b"], action_spaces=[box, box],
                                 joint_action_space=ippo.space_to_dict(box), agent_obs_dims=[3, 3], actor_dim=3)


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ippo])
@pytest.mark.parametrize("activation, log_std_init", [("tanh", -0.5), ("relu", -2.0)])
def test_activation_and_initial_log_std_reach_every_network(trainer, activation, log_std_init):
    agent = trainer.make_agent(trainer.Args(activation=activation, log_std_init=log_std_init), fake_envs())
    kinds = {type(layer) for layer in agent.modules()} & {torch.nn.Tanh, torch.nn.ReLU}
    assert kinds == {trainer.ACTIVATIONS[activation]}
    assert torch.equal(agent.actor_logstd.detach(), torch.full_like(agent.actor_logstd, log_std_init))


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ippo])
def test_a_checkpoint_from_before_the_network_flags_loads_with_their_defaults(trainer):
    """Evaluation, --checkpoint and --resume rebuild the network of a checkpoint without activation and log_std_init
    as tanh, and refuse to load it into a relu network."""
    envs = fake_envs()
    agent = trainer.make_agent(trainer.Args(), envs)
    saved = {name: value for name, value in dataclasses.asdict(trainer.Args()).items()
             if name not in ("activation", "log_std_init")}
    state = {"args": saved, "model": agent.state_dict(), "agents": envs.agents,
             "observation_space": trainer.space_to_dict(envs.single_observation_space),
             "action_space": trainer.space_to_dict(envs.single_action_space)}
    if trainer is ippo:
        state.update(ippo.agent_spaces(envs))
    run = ppo_eval.run_args(trainer, state, ppo_eval.EvalArgs(checkpoint="unused"))
    assert (run.activation, run.log_std_init) == ("tanh", -0.5)
    trainer.load_weights(trainer.make_agent(run, envs), state, run, envs)
    relu = dataclasses.replace(run, activation="relu")
    with pytest.raises(trainer.UserError, match="pass --activation=tanh"):
        trainer.load_weights(trainer.make_agent(relu, envs), state, relu, envs)


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn])
def test_written_out_gaussian_is_torch_normal_bit_for_bit(trainer):
    """The trainers write out Normal's sample, log-probability and entropy for speed: the same numbers and gradients."""
    torch.manual_seed(0)
    small = dict(rnn_hidden_size=16) if trainer is ppo_rnn else dict(hidden_sizes=(16,))
    agent = trainer.make_agent(trainer.Args(**small), fake_envs())
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.randn_like(agent.actor_logstd))
    obs = torch.randn(32, 3)
    if trainer is ppo_rnn:  # one step of 32 envs from a zero state
        state, starts = agent.initial_state(32, torch.device("cpu")), torch.ones(32, 1, dtype=torch.bool)
        policy = lambda action=None: agent.get_action_and_value(obs[:, None], state, starts, action)  # noqa: E731
        actor_mean = lambda: agent.actor(agent.cores(obs[:, None], state, starts)[0])  # noqa: E731
    else:
        policy = lambda action=None: agent.get_action_and_value(obs, action)  # noqa: E731
        actor_mean = lambda: agent.actor(obs)  # noqa: E731
    torch.manual_seed(1)
    action, logprob, entropy = policy()[:3]
    mean = actor_mean()
    dist = torch.distributions.Normal(mean, agent.actor_logstd.expand_as(mean).exp())
    torch.manual_seed(1)
    assert torch.equal(action, dist.sample())
    assert torch.equal(logprob, dist.log_prob(action).sum(-1)) and torch.equal(entropy, dist.entropy().sum(-1))

    def gradients(logprob, entropy):  # of a loss with an entropy bonus
        agent.zero_grad()
        (logprob.mean() - 0.01 * entropy.mean()).backward()
        return [p.grad.clone() for p in (agent.actor_logstd, *agent.actor.parameters())]

    mean = actor_mean()
    dist = torch.distributions.Normal(mean, agent.actor_logstd.expand_as(mean).exp())
    want = gradients(dist.log_prob(action).sum(-1), dist.entropy().sum(-1))
    assert all(torch.equal(g, w) for g, w in zip(gradients(*policy(action)[1:3]), want))


@pytest.mark.parametrize("trainer,env_id", [(ppo, "Pendulum-v1"), (ppo_rnn, "Pendulum-v1"),
                                            (ippo, "vmas:tests.vmas_scenarios:Clock")], ids=["ppo", "ppo_rnn", "ippo"])
def test_a_minibatch_step_waits_for_the_device_once(tmp_path, monkeypatch, trainer, env_id):
    """On a GPU every tensor read on the host (bool, item, float) waits for the device: without a KL stop or an
    adaptive learning rate, a minibatch step reads one for its own checks, whether the loss and the gradient are
    finite."""
    pytest.importorskip("vmas") if trainer is ippo else None
    reads, steps = [], []
    update = trainer.update

    def counting_update(*args, **kwargs):
        counted = []
        with pytest.MonkeyPatch.context() as patch:
            for name in ("__bool__", "item", "__float__", "__int__"):
                real = getattr(torch.Tensor, name)
                patch.setattr(torch.Tensor, name, lambda self, *a, real=real: counted.append(1) or real(self, *a))
            stats = update(*args, **kwargs)
        reads.append(len(counted))
        steps.append(stats["losses/minibatch_steps"])
        return stats

    monkeypatch.setattr(trainer, "update", counting_update)
    monkeypatch.chdir(tmp_path)
    argv = ["--env_id", env_id, "--num_envs", "2", "--num_steps", "8", "--num_minibatches", "2", "--update_epochs", "2",
            "--total_timesteps", "32", "--target_kl", "None", "--no_capture_video", "--no_save_model",
            "--num_eval_envs", "1", "--eval_freq", "100"]
    assert trainer.cli(argv) == 0
    # ppo_rnn.py's actor and critic cores each read whether an episode starts inside the minibatch's sequences
    per_step = 3 if trainer is ppo_rnn else 1
    assert steps == [4, 4] and reads == [per_step * 4] * 2


def test_multi_discrete_and_multi_binary_policies_against_a_hand_computation():
    """Log-probabilities and entropies summed over the dimensions, each dimension's mode, samples that stay in each
    dimension's range, finite gradients; the reference is written with plain floats. ppo.py's DiscreteActions: the
    siblings' are checked copies of it."""
    import math

    torch.manual_seed(0)
    nvec = [3, 2, 4]
    cases = {"MultiDiscrete": (dict(type="MultiDiscrete", shape=[3], nvec=nvec, start=[0, 0, 0]), sum(nvec)),
             "MultiBinary": (dict(type="MultiBinary", shape=[3]), 3)}
    for kind, (space, num_logits) in cases.items():
        head = ppo.DiscreteActions(space)
        assert ppo.DiscreteActions.num_logits(space) == num_logits and not head.state_dict()
        logits = torch.randn(4, num_logits, dtype=torch.float64, requires_grad=True)
        pi = head.distribution(logits)
        samples = pi.sample((2000,))
        actions = samples[0]
        logprob, entropy = pi.log_prob(actions), pi.entropy()
        (logprob.sum() + entropy.sum()).backward()
        assert torch.isfinite(logits.grad).all()
        for row in range(4):
            values = logits[row].tolist()
            expected_logprob = expected_entropy = 0.0
            if kind == "MultiBinary":
                for value, action in zip(values, actions[row].tolist()):
                    p = 1 / (1 + math.exp(-value))
                    expected_logprob += math.log(p if action == 1 else 1 - p)
                    expected_entropy -= p * math.log(p) + (1 - p) * math.log(1 - p)
                expected_mode = [float(value > 0) for value in values]
            else:
                expected_mode, offset = [], 0
                for n, action in zip(nvec, actions[row].tolist()):
                    part = values[offset:offset + n]
                    offset += n
                    total = sum(math.exp(v) for v in part)
                    probs = [math.exp(v) / total for v in part]
                    expected_logprob += math.log(probs[action])
                    expected_entropy -= sum(p * math.log(p) for p in probs)
                    expected_mode.append(max(range(n), key=lambda i: part[i]))
            assert logprob[row].item() == pytest.approx(expected_logprob, abs=1e-9)
            assert entropy[row].item() == pytest.approx(expected_entropy, abs=1e-9)
            assert head.mode(logits[row:row + 1])[0].tolist() == expected_mode
        if kind == "MultiDiscrete":  # every dimension samples within its range, as often as its probabilities say
            for dim, n in enumerate(nvec):
                assert samples[..., dim].min() >= 0 and samples[..., dim].max() < n
            first = torch.softmax(logits[0, :3].detach(), -1)
            frequencies = torch.bincount(samples[:, 0, 0], minlength=3).double() / len(samples)
            assert torch.allclose(frequencies, first, atol=0.04)


def test_the_envs_refuse_an_action_of_another_shape_than_their_space():
    """A narrower action would broadcast through env_action()'s shift (MultiDiscrete's (1,) against (2,)), a wider
    one through its clamp: both refused in one line before they reach the env."""
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("tests.envs:PointMassMultiDiscrete-v0")] * 2,
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = ppo.TorchVecEnv(vector, torch.device("cpu"), torch_native=False)
    envs.reset(seed=0)
    for width in (1, 3):
        with pytest.raises(ppo.UserError, match=rf"the agent's actions have shape \({width},\) each"):
            envs.step(torch.zeros((2, width), dtype=torch.long))
    envs.step(torch.zeros((2, 2), dtype=torch.long))  # the space's own shape
    envs.close()


def test_layers_without_parameters_of_their_own_stack_per_seed():
    """stack_seeds(): a Linear without a bias, a LayerNorm without scale and shift (SimBa's recipe) and a BatchNorm
    whose statistics are its only tensors give each seed what its own module gives."""
    torch.manual_seed(0)
    networks = [torch.nn.Sequential(torch.nn.Linear(3, 4, bias=False), torch.nn.LayerNorm(4, elementwise_affine=False),
                                    torch.nn.BatchNorm1d(4, affine=False)).eval() for _ in range(2)]
    for network in networks:
        network[2].running_mean.normal_()
    x = torch.randn(2, 5, 3)
    stacked = ppo.stack_seeds(networks)
    for i, network in enumerate(networks):
        torch.testing.assert_close(stacked(x)[i], network(x[i]))


def test_a_statistic_a_seed_alone_never_logged_agrees_with_that_seeds_nan_alone():
    """differing(): a seed that stopped before its update's first step has NaN among the seeds where its run alone
    logged nothing; a number where its run alone logged nothing still differs."""
    together = {"losses/policy_loss": torch.tensor([float("nan"), 0.5])}
    assert ppo.differing(together, {}, 0, "its result") is None
    assert ppo.differing(together, {}, 1, "its result") == "its result losses/policy_loss (alone: none)"
