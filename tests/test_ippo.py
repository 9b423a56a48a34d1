"""ippo.py: agents that learn independently, GAE and bootstrapping per agent, reward normalization per agent, VMAS
and ManiSkill end to end, determinism, resume, --compile, non-finite guard, bad input."""

import importlib.util
import json
import signal

import numpy as np
import pytest
import torch

import ippo
import ppo_eval
from tests.test_advantages import GAMMA, LAM, random_rollout, reference
from tests.util import (REPO, TIMING_TAGS, assert_same_numbers, fast_args, load, refused_in_one_line, run_script,
                        run_scripts, scalars, sigterm_beside_full_run, spy_on_advantages, video_frames)

CLOCK = "vmas:tests.vmas_scenarios:Clock"
MEET = "pz:tests.pz_envs:meet"
NAVIGATION = ["--env_kwargs", "n_agents=3"]
BOX = {"type": "Box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]}
DISCRETE = {"type": "Discrete", "n": 3, "start": 0}


@pytest.mark.parametrize("centralized_critic", [False, True], ids=["own-obs-critic", "centralized-critic"])
@pytest.mark.parametrize("action_space", [BOX, DISCRETE], ids=["Box", "Discrete"])
def test_one_agents_loss_changes_only_its_own_parameters(action_space, centralized_critic):
    """A loss on agent 1's outputs alone, through per-agent clipping and Adam: every parameter of agent 1 moves,
    none of agents 0 and 2 does (with a centralized critic too, whose inputs include the others' observations)."""
    torch.manual_seed(0)
    agent = ippo.Agent(3, 5, [action_space] * 3, norm_obs=True, norm_value=False, hidden_sizes=(16, 16),
                       activation="tanh", log_std_init=-0.5, share_parameters=False,
                       state_index=torch.arange(15) if centralized_critic else None)
    agent.obs_normalizer.update(torch.randn(64, 3, 5))
    before = {name: p.detach().clone() for name, p in agent.named_parameters()}
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.01)
    _, logprob, entropy, value = agent.get_action_and_value(agent.normalize_obs(torch.randn(32, 3, 5)))
    loss = (logprob[:, 1] + entropy[:, 1] + value[:, 1] ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    # clips agent 1's gradient, leaves the zero ones zero
    ippo.clip_grad_norm_per_net(list(agent.parameters()), max_norm=1e-3)
    optimizer.step()
    for name, p in agent.named_parameters():
        assert p.shape[0] == 3, name
        assert (p[1] != before[name][1]).any(), name
        assert torch.equal(p[[0, 2]], before[name][[0, 2]]), name


def test_gradient_clipping_is_per_agent():
    torch.manual_seed(0)
    agent = ippo.Agent(2, 4, [BOX] * 2, norm_obs=False, norm_value=False, hidden_sizes=(8,), activation="tanh",
                       log_std_init=-0.5, share_parameters=False, state_index=None)
    for p in agent.parameters():
        p.grad = torch.ones_like(p)
        p.grad[0] *= 1000.0  # agent 0's gradient is huge, agent 1's small
    small = {name: p.grad[1].clone() for name, p in agent.named_parameters()}
    norms = ippo.clip_grad_norm_per_net(list(agent.parameters()), max_norm=1e3)
    assert norms[0] > 1e3 > norms[1]
    clipped = torch.cat([p.grad[0].flatten() for p in agent.parameters()]).norm()
    assert clipped == pytest.approx(1e3, rel=1e-4)
    for name, p in agent.named_parameters():
        assert torch.equal(p.grad[1], small[name]), name


def test_shared_parameters_tell_agents_apart_by_their_id():
    torch.manual_seed(0)
    agent = ippo.Agent(3, 4, [BOX] * 3, norm_obs=False, norm_value=False, hidden_sizes=(16,), activation="tanh",
                       log_std_init=-0.5, share_parameters=True, state_index=torch.arange(12))
    assert all(p.shape[0] == 1 for p in agent.parameters())
    obs = torch.randn(1, 4).expand(5, 3, 4)  # every agent sees the same observation
    mean = agent.get_action(obs, deterministic=True)
    value = agent.get_value(obs)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert not torch.allclose(mean[:, i], mean[:, j]) and not torch.allclose(value[:, i], value[:, j])
    no_ids = ippo.Agent(3, 4, [BOX] * 3, norm_obs=False, norm_value=False, hidden_sizes=(16,), activation="tanh",
                        log_std_init=-0.5, share_parameters=True, state_index=None)
    no_ids.agent_ids.zero_()  # without the id, one network gives identical agents identical outputs
    assert torch.equal(no_ids.get_value(obs)[:, 0], no_ids.get_value(obs)[:, 1])


@pytest.mark.parametrize("share_parameters", [False, True], ids=["own-networks", "shared-network"])
def test_written_out_normal_gives_torch_distributions_numbers(share_parameters):
    """Sample, log-probability and entropy of every agent's Gaussian, bit for bit torch.distributions.Normal's
    (summed over the action dimension, one per agent), each agent with its own log-std, gradients included."""
    torch.manual_seed(0)
    agent = ippo.Agent(3, 5, [{**BOX, "shape": [4]}] * 3, norm_obs=False, norm_value=False, hidden_sizes=(16,),
                       activation="tanh", log_std_init=-0.5, share_parameters=share_parameters, state_index=None)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.randn_like(agent.actor_logstd))
    obs = torch.randn(32, 3, 5)
    torch.manual_seed(1)
    action, logprob, entropy, value = agent.get_action_and_value(obs)
    mean = agent.run(agent.actor, obs)
    dist = torch.distributions.Normal(mean, agent.actor_logstd.expand_as(mean).exp())
    torch.manual_seed(1)
    assert torch.equal(action, dist.sample()) and action.shape == (32, 3, 4)
    assert torch.equal(logprob, dist.log_prob(action).sum(-1)) and logprob.shape == (32, 3)
    assert torch.equal(entropy, dist.entropy().sum(-1)) and entropy.shape == (32, 3)
    assert torch.equal(value, agent.get_value(obs))
    torch.manual_seed(1)
    assert torch.equal(agent.get_action(obs), action)

    def gradients(logprob, entropy):  # of a loss with an entropy bonus
        agent.zero_grad()
        (logprob.mean() - 0.01 * entropy.mean()).backward()
        return [p.grad.clone() for p in (agent.actor_logstd, *agent.actor.parameters())]

    # the same gradients as well
    mean = agent.run(agent.actor, obs)
    dist = torch.distributions.Normal(mean, agent.actor_logstd.expand_as(mean).exp())
    want = gradients(dist.log_prob(action).sum(-1), dist.entropy().sum(-1))
    _, logprob, entropy, _ = agent.get_action_and_value(obs, action)
    got = gradients(logprob, entropy)
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and agent.actor_logstd.grad.abs().min() > 0


def test_reward_normalizer_scales_each_agent_by_its_own_returns():
    """Agent i's rewards divided by the std of the discounted returns of agent i seen so far at the steps it acted
    in, whatever the other agents' reward scale; each agent's return restarts after its episode ends."""
    rng = np.random.default_rng(0)
    steps, num_envs, num_agents, gamma = 60, 3, 2, 0.9
    rewards = rng.normal(2.0, 5.0, size=(steps, num_envs, num_agents)) * np.array([1.0, 100.0])
    dones = rng.random((steps, num_envs, num_agents)) < 0.1
    alive = rng.random((steps, num_envs, num_agents)) < 0.8
    rewards[~alive] = 0.0  # an agent that left earns nothing
    assert dones.any() and not alive.all()
    normalizer = ippo.RewardNormalizer(num_envs, num_agents, gamma)
    returns_seen, discounted = [[] for _ in range(num_agents)], np.zeros((num_envs, num_agents))
    for t in range(steps):
        discounted = gamma * discounted + rewards[t]
        for i in range(num_agents):
            returns_seen[i].extend(discounted[alive[t, :, i], i])
        want = np.clip(rewards[t] / np.array([np.std(seen) for seen in returns_seen]), -10, 10)
        got = normalizer(torch.as_tensor(rewards[t], dtype=torch.float32), torch.as_tensor(dones[t]),
                         torch.as_tensor(alive[t]))
        assert got.dtype == torch.float32 and got.shape == (num_envs, num_agents)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-3)
        discounted[dones[t]] = 0.0
    # equal first returns have no spread yet: the scaled reward is clipped
    first = ippo.RewardNormalizer(num_envs, num_agents, gamma)(torch.ones(num_envs, num_agents),
                                                              torch.zeros(num_envs, num_agents, dtype=torch.bool),
                                                              torch.ones(num_envs, num_agents, dtype=torch.bool))
    assert first.tolist() == [[10.0, 10.0]] * num_envs


@pytest.mark.parametrize("finite_horizon", [False, True])
@pytest.mark.parametrize("rule", ["always", "truncated", "never"])
def test_advantages_per_agent_match_the_single_agent_reference(rule, finite_horizon):
    """Three agents with their own rewards, values and final values, in envs whose episodes end together."""
    rollouts = [random_rollout(seed) for seed in (0, 1, 2)]
    terminated, truncated = rollouts[0]["terminated"], rollouts[0]["truncated"]
    stacked = {key: torch.as_tensor(np.stack([r[key] for r in rollouts], axis=-1))
               for key in ("rewards", "values", "final_values", "next_value")}
    t_terminated, t_truncated = torch.as_tensor(terminated), torch.as_tensor(truncated)
    dones = (t_terminated | t_truncated).double().unsqueeze(-1).expand(-1, -1, 3)
    mask = ippo.bootstrap_mask(rule, t_terminated, t_truncated).unsqueeze(-1)
    bootstrap_values = torch.where(mask, stacked["final_values"], 0.0)
    got = ippo.compute_advantages(stacked["rewards"], stacked["values"], dones, bootstrap_values, stacked["next_value"],
                                  GAMMA, LAM, finite_horizon)
    assert got.shape == (12, 6, 3)
    for i, r in enumerate(rollouts):
        want = reference(r["rewards"], r["values"], terminated, truncated, r["final_values"], r["next_value"], rule,
                         finite_horizon)
        np.testing.assert_allclose(got[..., i].numpy(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("ending", ["terminated", "truncated"])
@pytest.mark.parametrize("rule", ["always", "truncated", "never"])
def test_rollout_bootstraps_each_agent_from_its_final_observation(tmp_path, monkeypatch, rule, ending):
    """Episodes end after 6 steps, by termination or by the time limit. The critic is replaced by
    V(obs) = 1000 * (steps elapsed / 8) + agent index, so agent i's final observation is worth 750 + i and the reset
    observation that replaces it i."""
    captured = spy_on_advantages(monkeypatch, ippo)
    monkeypatch.setattr(ippo.Agent, "get_value", lambda self, obs: 1000.0 * obs[..., 2] + obs[..., 3])
    monkeypatch.chdir(tmp_path)
    ends = ["--env_kwargs", "terminate_after=6"] if ending == "terminated" else ["--max_episode_steps", "6"]
    argv = fast_args(CLOCK, rule, num_steps=12, total_timesteps=2 * 12 * 2, bootstrap_at_done=rule, save_model=False,
                     num_eval_steps=12)
    assert ippo.cli(argv + ends) == 0
    bootstraps = rule == "always" or (rule == "truncated" and ending == "truncated")
    assert len(captured) == 2
    for call in captured:
        dones, bootstrap_values = call["dones"], call["bootstrap_values"]
        assert dones.shape == (12, 2, 2) and bootstrap_values.shape == (12, 2, 2)
        assert torch.equal(dones[..., 0], dones[..., 1]) and dones[:, :, 0].nonzero()[:, 0].tolist() == [5, 5, 11, 11]
        for t in (5, 11):
            assert bootstrap_values[t].tolist() == ([[750.0, 751.0]] * 2 if bootstraps else [[0.0, 0.0]] * 2)
        assert not bootstrap_values[dones == 0].any()


def navigation_args(name: str, **overrides) -> list[str]:
    return fast_args("vmas:navigation", name, **{"max_episode_steps": 16, **overrides}) + NAVIGATION


def test_same_seed_same_numbers_and_evaluation_leaves_training_alone(tmp_path):
    """VMAS draws every env's resets from one random stream; each vector env has its own, so evaluating every
    iteration or only at the end gives training the same episodes."""
    runs = [("ippo.py", navigation_args(name, norm_obs=True, eval_freq=eval_freq, num_eval_envs=2))
            for name, eval_freq in (("a", 1), ("b", 1), ("rare", 100))]
    runs.append(("ippo.py", navigation_args("c", norm_obs=True, seed=2)))
    for result in run_scripts(runs, tmp_path):  # side by side
        assert result.returncode == 0, result.stderr
    assert_same_numbers(tmp_path / "runs/a", tmp_path / "runs/b", tags={"losses/agent_0/policy_loss", "eval/return"})
    a, rare = scalars(tmp_path / "runs/a"), scalars(tmp_path / "runs/rare")
    for tag in set(a) - TIMING_TAGS:
        if not tag.startswith("eval/"):
            assert a[tag] == rare[tag], tag
    assert scalars(tmp_path / "runs/c")["losses/agent_0/policy_loss"] != a["losses/agent_0/policy_loss"]


def test_checkpoint_rebuilds_every_agent_and_refuses_another_network(tmp_path):
    result = run_script("ippo.py", navigation_args("run", norm_obs=True, share_parameters=True,
                                                     centralized_critic=True, hidden_sizes=32), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "bootstrap_rule=truncated" in result.stdout  # VMAS's default: time limits are not terminal
    ckpt = load(tmp_path / "runs/run/final_ckpt.pt")
    assert ckpt["trainer"] == "ippo" and ckpt["agents"] == ["agent_0", "agent_1", "agent_2"]
    assert ckpt["observation_space"]["shape"] == [18] and ckpt["action_space"]["shape"] == [2]
    assert ckpt["args"]["env_kwargs"] == ("n_agents=3",) and ckpt["args"]["max_episode_steps"] == 16
    model, args = ckpt["model"], ckpt["args"]
    assert model["state_index"].tolist() == list(range(54)) and model["obs_normalizer.mean"].shape == (3, 18)
    agent = ippo.Agent(len(ckpt["agents"]), ckpt["observation_space"]["shape"][0], ckpt["action_spaces"],
                       args["norm_obs"], args["norm_value"], tuple(args["hidden_sizes"]), args["activation"],
                       args["log_std_init"], args["share_parameters"], model["state_index"])
    agent.load_state_dict(model)
    assert agent.get_value(torch.zeros(4, 3, 18)).shape == (4, 3)
    tags = scalars(tmp_path / "runs/run")
    for name in ckpt["agents"]:
        assert {f"losses/{name}/policy_loss", f"losses/{name}/value_loss", f"losses/{name}/approx_kl",
                f"eval/{name}/return", f"train/{name}/return"} <= set(tags)
    returns = [tags[f"eval/agent_{i}/return"][-1][1] for i in range(3)]
    assert tags["eval/return"][-1][1] == pytest.approx(np.mean(returns), rel=1e-5)

    mismatch = run_script("ippo.py", navigation_args("again", norm_obs=True, centralized_critic=True, hidden_sizes=32,
                                                       checkpoint="runs/run/final_ckpt.pt"), tmp_path)
    assert mismatch.returncode == 2
    assert "pass --share_parameters" in mismatch.stderr and "Traceback" not in mismatch.stderr
    assert ippo.cli_flag("hidden_sizes", (64, 64)) == "--hidden_sizes 64 64"  # as tyro reads it


def test_compile_stays_close_to_eager_and_falls_back_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = dict(total_timesteps=32 * 2, eval_freq=2, max_episode_steps=8)
    assert ippo.cli(fast_args(CLOCK, "eager", **argv)) == 0
    assert ippo.cli(fast_args(CLOCK, "compiled", compile=True, **argv)) == 0
    assert "warning" not in capsys.readouterr().err
    eager, compiled = scalars(tmp_path / "runs/eager"), scalars(tmp_path / "runs/compiled")
    for tag in ("losses/agent_0/policy_loss", "losses/agent_1/policy_loss", "losses/agent_0/value_loss",
                "losses/agent_1/value_loss", "eval/return"):
        assert [v for _, v in compiled[tag]] == pytest.approx([v for _, v in eager[tag]], rel=1e-3, abs=1e-5), tag

    def unavailable(fn, **kwargs):
        raise RuntimeError("no C++ compiler found\nmore detail")

    monkeypatch.setattr(torch, "compile", unavailable)
    assert ippo.cli(fast_args(CLOCK, "fallback", compile=True, **argv)) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert warnings == ["warning: --compile: torch.compile failed (no C++ compiler found); running eagerly"] * 2
    assert_same_numbers(tmp_path / "runs/eager", tmp_path / "runs/fallback",
                        tags={"losses/agent_0/policy_loss", "eval/return"})


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    # rewards turn NaN after 200 steps of the scenario: in iteration 13 of 16-step rollouts
    result = run_script("ippo.py", fast_args(CLOCK, "nan", total_timesteps=32 * 40, eval_freq=5, max_episode_steps=16)
                        + ["--env_kwargs", "nan_reward_after=200"], tmp_path)
    assert result.returncode == 1
    assert "non-finite loss at iteration 13" in result.stderr and "ckpt_10.pt is untouched" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in (tmp_path / "runs/nan").glob("*.pt")) == ["ckpt_10.pt", "ckpt_5.pt"]


def test_vmas_evaluation_videos(tmp_path):
    result = run_script("ippo.py", navigation_args("vid", capture_video=True, total_timesteps=32 * 2, eval_freq=1),
                        tmp_path)
    assert result.returncode == 0, result.stderr
    videos = sorted((tmp_path / "runs/vid/videos").glob("*.mp4"))
    # two evaluations: the first episode of eval env 0 in each, 16 steps of a 700x700 scene
    assert [p.name for p in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all(video_frames(p) == (17, (700, 700)) for p in videos)  # 16 steps and the reset's frame


def test_local_observations_hold_the_agents_own_entries():
    """TwoRobotPickCube-v1: each agent's local view against the entries of the task's own state_dict observation,
    and the global state rebuilt from both views."""
    import gymnasium as gym

    kwargs = dict(obs_mode="state_dict", sim_backend="physx_cpu", render_backend="cpu")
    env = ippo.build_maniskill_env("TwoRobotPickCube-v1", 1, kwargs, "local", None, None, None)
    plain = gym.make("TwoRobotPickCube-v1", num_envs=1, **kwargs)
    try:
        views = env.get_wrapper_attr("agent_views")
        assert views["agents"] == ["panda_wristcam-0", "panda_wristcam-1"]
        obs, _ = env.reset(seed=0)
        state, _ = plain.reset(seed=0)
        per_agent = obs[:, torch.tensor(views["obs_index"])]
        for i, side in enumerate(("left", "right")):
            robot, extra = state["agent"][f"panda_wristcam-{i}"], state["extra"]
            want = torch.cat([robot["qpos"], robot["qvel"], extra[f"{side}_arm_tcp"], extra["cube_pose"],
                              extra[f"{side}_arm_tcp_to_cube_pos"], extra["cube_to_goal_pos"]], dim=1)
            assert torch.equal(per_agent[:, i], want), side
        assert torch.equal(per_agent.flatten(1)[:, torch.tensor(views["state_index"])], obs)
        assert obs.shape == (1, 66)
    finally:
        env.close()
        plain.close()


def check_maniskill_run(run_dir, obs_dim: int):
    ckpt = load(run_dir / "final_ckpt.pt")
    assert ckpt["agents"] == ["panda_wristcam-0", "panda_wristcam-1"]
    assert ckpt["observation_space"]["shape"] == [obs_dim] and ckpt["action_space"]["shape"] == [8]
    tags = scalars(run_dir)
    assert {"eval/return", "eval/success_once", "eval/panda_wristcam-0/return", "eval/panda_wristcam-1/return",
            "losses/panda_wristcam-1/policy_loss", "train/return"} <= set(tags)
    return ckpt


def test_maniskill_one_env_and_eval_workers_local_observations(tmp_path):
    argv = fast_args("TwoRobotPickCube-v1", "ms", num_envs=1, num_steps=20, num_eval_envs=2, total_timesteps=40,
                     eval_freq=1, max_episode_steps=10, agent_obs="local", centralized_critic=True, capture_video=True)
    result = run_script("ippo.py", argv, tmp_path)
    assert result.returncode == 0, result.stderr
    ckpt = check_maniskill_run(tmp_path / "runs/ms", obs_dim=38)
    assert ckpt["model"]["state_index"].shape == (66,)  # the critic sees the whole state
    videos = list((tmp_path / "runs/ms/videos").glob("*.mp4"))
    assert len(videos) == 2 and all(video_frames(p)[0] == 11 for p in videos)  # 10-step episodes


def test_maniskill_workers_full_observations_shared_parameters(tmp_path):
    argv = fast_args("TwoRobotPickCube-v1", "ms", num_envs=2, num_steps=10, total_timesteps=40, max_episode_steps=10,
                     share_parameters=True)
    result = run_script("ippo.py", argv, tmp_path)
    assert result.returncode == 0, result.stderr
    ckpt = check_maniskill_run(tmp_path / "runs/ms", obs_dim=66)
    assert ckpt["args"]["agent_obs"] == "full" and ckpt["model"]["agent_ids"].shape == (2, 2)


BAD_INPUTS = [
    (["--env_id", "CartPole-v1"], "single-agent Gymnasium env"),
    (["--env_id", "PickCube-v1", "--num_envs", "1", "--num_minibatches", "2"], "single-agent task"),
    (["--env_id", "vmas:navigation", "--agent_obs", "local"], "--agent_obs"),
    (["--env_id", "TwoRobotPickCube-v1", "--agent_obs", "partial"], "--agent_obs"),
    (["--env_id", "vmas:no_such_scenario"], "unknown VMAS scenario 'no_such_scenario'"),
    (["--env_id", "vmas:tests.vmas_scenarios:NoSuchClass"], "NoSuchClass"),
    (["--env_id", "vmas:navigation", "--env_kwargs", "n_agentz=3"], "n_agentz"),
    (["--env_id", "vmas:navigation", "--env_kwargs", "num_envs=3"], "own flags"),
    (["--env_id", "vmas:navigation", "--env_kwargs", "n_agents"], "KEY=VALUE"),
    (["--env_id", "vmas:navigation", "--env_kwargs", "multidiscrete_actions=True"], "cannot make vmas:navigation"),
    (["--env_id", "vmas:navigation", "--save_train_video_freq", "2"], "--save_train_video_freq"),
    (["--env_id", "vmas:navigation", "--hidden_sizes", "64", "0"], "--hidden_sizes"),
    (["--env_id", "vmas:navigation", "--max_episode_steps", "0"], "--max_episode_steps"),
    (["--env_id", "vmas:navigation", "--checkpoint_freq", "0"], "--checkpoint_freq"),
    (["--env_id", "pz:tests.pz_envs:no_such_fn", "--max_episode_steps", "8"], "cannot load 'no_such_fn'"),
    (["--env_id", MEET, "--max_episode_steps", "8", "--env_kwargs", "wide_b=True", "--share_parameters"],
     "needs them alike"),
    (["--env_id", "vmas:navigation", "--async_envs"], "--async_envs steps PettingZoo envs"),
    (["--env_id", MEET, "--max_episode_steps", "8", "--env_kwargs", "box_b=True"], "but all of one kind"),
    (["--env_id", MEET], "--max_episode_steps or --num_eval_steps"),
    (["--env_id", MEET, "--env_kwargs", "no_such_option=1"], "cannot make pz:tests.pz_envs:meet"),
]


# This one runs in a process of its own, the others in the test's (refused_in_one_line)
WHOLE_PROCESS = (["--env_id", "vmas:no_such_scenario"],)
assert all(any(argv == bad for bad, _ in BAD_INPUTS)
           for argv in WHOLE_PROCESS), "WHOLE_PROCESS names an input not in BAD_INPUTS"


@pytest.mark.parametrize("argv,mentions", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_clear_line(tmp_path, capfd, argv, mentions):
    full_argv = argv + ["--no_capture_video", "--num_eval_envs", "1", "--num_steps", "8"]
    assert mentions in refused_in_one_line(ippo, full_argv, tmp_path, capfd, whole_process=argv in WHOLE_PROCESS)
    assert not (tmp_path / "runs").exists()


def test_missing_vmas_names_the_package(tmp_path, monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vmas" else real_find_spec(name, *a))
    monkeypatch.chdir(tmp_path)
    assert ippo.cli(["--env_id", "vmas:navigation"]) == 2
    assert capsys.readouterr().err.strip() == ("error: vmas:navigation is a VMAS scenario and VMAS is not installed: "
                                               "pip install vmas")


def test_vmas_multi_discrete_actions(tmp_path):
    """VMAS's discrete navigation with one action per axis (MultiDiscrete([3, 3]) for each agent): trains, stores the
    space in its checkpoint, and ppo_eval.py evaluates it with each dimension's mode."""
    argv = fast_args("vmas:navigation", "multi", total_timesteps=32 * 4, max_episode_steps=16)
    argv += ["--env_kwargs", "n_agents=2", "continuous_actions=False", "multidiscrete_actions=True"]
    result = run_script("ippo.py", argv, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = load(tmp_path / "runs/multi/final_ckpt.pt")
    assert ckpt["action_space"] == {"type": "MultiDiscrete", "shape": [2], "nvec": [3, 3], "start": [0, 0]}
    evaluated = run_script("ppo_eval.py", ["runs/multi", "--num_episodes", "2", "--num_envs", "2"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


def test_a_pettingzoo_env_trains_and_ppo_eval_evaluates_each_agent(tmp_path):
    """PettingZoo Parallel envs of the project's own with IPPO and MAPPO: agents of the same spaces (MAPPO's critics
    read both agents' observations), and agents of different observation and action spaces, one leaving its
    episodes early, Discrete and Box, with a state() that MAPPO's critics read (the log line says which). Each
    agent's return is logged, the checkpoint holds each agent's spaces, and ppo_eval.py evaluates the run per
    agent."""
    pytest.importorskip("pettingzoo")
    apart = "wide_b=True fast_b=True b_leaves=True with_state=True".split()
    cases = (("ippo", {}, 3, "own_observation"), ("mappo", dict(centralized_critic=True), 6, "all_observations"),
             ("apart", dict(env_kwargs=apart), 4, "own_observation"),
             ("apart_mappo", dict(env_kwargs=apart, centralized_critic=True), 4, "state()"),
             ("apart_box", dict(env_kwargs=apart + ["continuous=True"], centralized_critic=True), 4, "state()"))
    runs = [("ippo.py", fast_args(MEET, name, max_episode_steps=8, **{k: v for k, v in flags.items()
                                                                      if k != "env_kwargs"})
             + (["--env_kwargs", *flags["env_kwargs"]] if "env_kwargs" in flags else [])) for name, flags, *_ in cases]
    # the five runs side by side
    for (name, flags, critic_inputs, critic_input), result in zip(cases, run_scripts(runs, tmp_path)):
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"critic_input={critic_input}" in result.stdout
        tags = scalars(tmp_path / "runs" / name)
        assert "eval/a/return" in tags and "eval/b/return" in tags
        assert [value for _, value in tags["eval/episode_len"]] == [8.0, 8.0]
        ckpt = load(tmp_path / "runs" / name / "final_ckpt.pt")
        assert ckpt["agents"] == ["a", "b"]
        assert ckpt["model"]["critic.0.weight"].shape[1] == critic_inputs  # (agents, inputs, width)
        if name.startswith("apart"):
            assert [space["shape"] for space in ckpt["observation_spaces"]] == [[3], [4]]
            assert ckpt["observation_space"]["shape"] == ([8] if "mappo" in name or "box" in name else [4])
            own = ([{"type": "Discrete", "n": 3, "start": 0}, {"type": "Discrete", "n": 5, "start": 0}]
                   if name != "apart_box" else [[1], [2]])
            assert (ckpt["action_spaces"] if name != "apart_box"
                    else [space["shape"] for space in ckpt["action_spaces"]]) == own
            # b's episodes end after 3 steps, a's after 8
            assert max(value for _, value in tags["train/b/return"]) >= -3 / 6 * 3 - 1e-6
        else:
            assert ckpt["action_space"] == {"type": "Discrete", "n": 3, "start": 0}
        assert ppo_eval.cli([str(tmp_path / "runs" / name), "--num_episodes", "4", "--no_capture_video"]) == 0


@pytest.mark.parametrize("max_cycles", [None, 10])
def test_a_pettingzoo_envs_own_horizon_is_the_time_limit(tmp_path, monkeypatch, capsys, max_cycles):
    """MPE states its episode length (max_cycles, 25 by default): without --max_episode_steps, that is the time
    limit, the startup line says where it came from, and evaluation episodes last that long."""
    pytest.importorskip("mpe2")
    monkeypatch.chdir(tmp_path)
    argv = fast_args("pz:mpe2.simple_spread_v3", "spread", num_steps=25, num_minibatches=5, total_timesteps=2 * 25 * 2,
                     eval_freq=2, capture_video=False)
    assert ippo.cli(argv + (["--env_kwargs", f"max_cycles={max_cycles}"] if max_cycles else [])) == 0
    steps = max_cycles or 25
    assert f"max_episode_steps={steps} (from the unwrapped env's max_cycles)" in capsys.readouterr().out
    assert [value for _, value in scalars(tmp_path / "runs/spread")["eval/episode_len"]] == [steps]


def test_pettingzoo_workers_give_the_numbers_of_one_process(tmp_path):
    """--async_envs splits the envs over worker processes, each env seeded as in one process: the same episodes,
    hence the same numbers, with agents that leave early and of different spaces."""
    pytest.importorskip("pettingzoo")
    kwargs = ["--env_kwargs", "wide_b=True", "fast_b=True", "b_leaves=True"]
    runs = [("ippo.py", fast_args(MEET, name, max_episode_steps=8, num_envs=3, num_minibatches=3, norm_obs=True,
                                  norm_reward=True, **flags) + kwargs)
            for name, flags in (("one", {}), ("workers", dict(async_envs=True)))]
    for result in run_scripts(runs, tmp_path):  # side by side
        assert result.returncode == 0, result.stderr[-3000:]
    assert_same_numbers(tmp_path / "runs/one", tmp_path / "runs/workers",
                        tags={"losses/a/policy_loss", "losses/b/value_loss", "train/b/return", "eval/return"})


@pytest.mark.parametrize("rule", ["always", "truncated", "never"])
def test_pettingzoo_agents_that_leave_are_masked_and_bootstrap_on_their_own(tmp_path, monkeypatch, rule):
    """Meet with b leaving after 3 of the episode's 8 steps, and agents of different spaces. The critic is replaced
    by V(obs) = 1000 * (the time entry), so a final observation is worth 375 (b's termination) or 1000 (a's
    truncation). b is alive in steps 0-2 and 8-10 of a 16-step rollout, observes zeros and earns nothing in the
    others; its episode ends with step 2 (terminated), a's with step 7 (truncated); each agent bootstraps from its own
    final observation as the rule says, and GAE over each agent's steps alive equals the single-agent reference."""
    pytest.importorskip("pettingzoo")
    captured = spy_on_advantages(monkeypatch, ippo)
    buffers, rollout_buffer = [], ippo.RolloutBuffer
    monkeypatch.setattr(ippo, "RolloutBuffer", lambda *a: buffers.append(rollout_buffer(*a)) or buffers[-1])
    compute_advantages = ippo.compute_advantages

    def with_buffer(*args):
        captured_alive.append(buffers[-1].alive.clone())
        captured_obs.append(buffers[-1].obs.clone())
        return compute_advantages(*args)

    captured_alive, captured_obs = [], []
    monkeypatch.setattr(ippo, "compute_advantages", with_buffer)
    monkeypatch.setattr(ippo.Agent, "get_value", lambda self, obs: 1000.0 * obs[..., 2])
    monkeypatch.chdir(tmp_path)
    argv = fast_args(MEET, rule, num_steps=16, total_timesteps=2 * 16 * 2, bootstrap_at_done=rule, save_model=False,
                     max_episode_steps=8, gamma=GAMMA, gae_lambda=LAM)
    assert ippo.cli(argv + ["--env_kwargs", "wide_b=True", "fast_b=True", "b_leaves=True"]) == 0
    assert len(captured) == 2
    b_alive = [t % 8 < 3 for t in range(16)]
    final_value = {"a": 1000.0 if rule != "never" else 0.0, "b": 375.0 if rule == "always" else 0.0}
    for call, alive, obs in zip(captured, captured_alive, captured_obs):
        dones, bootstrap_values, rewards = call["dones"], call["bootstrap_values"], call["rewards"]
        assert alive[..., 0].all() and alive[..., 1].tolist() == [[b] * 2 for b in b_alive]
        assert not obs[~alive].any() and not rewards[~alive].any()
        assert dones[:, :, 0].nonzero()[:, 0].tolist() == [7, 7, 15, 15]
        assert dones[:, :, 1].nonzero()[:, 0].tolist() == [2, 2, 10, 10]
        for t, agent in ((7, 0), (15, 0), (2, 1), (10, 1)):
            assert bootstrap_values[t, :, agent].tolist() == [final_value["ab"[agent]]] * 2
        assert bootstrap_values.count_nonzero() == (8 if rule == "always" else 4 if rule == "truncated" else 0)
        for env in range(2):
            for agent in range(2):
                steps = alive[:, env, agent]
                ended = dones[steps, env, agent].bool().numpy()[:, None]
                want = reference(rewards[steps, env, agent].double().numpy()[:, None],
                                 call["values"][steps, env, agent].double().numpy()[:, None],
                                 ended if agent == 1 else np.zeros_like(ended),
                                 ended if agent == 0 else np.zeros_like(ended),
                                 np.full(ended.shape, 1000.0 if agent == 0 else 375.0), np.zeros(1), rule, False)
                np.testing.assert_allclose(call["advantages"][steps, env, agent].numpy(), want[:, 0], rtol=1e-5,
                                           atol=1e-3)


def record_meet_transitions(monkeypatch) -> list[list[dict]]:
    """Every Meet env's own transitions, one list per env in the order the envs were made: after each step, the
    observations it returned and its state()."""
    from tests.pz_envs import Meet

    envs, make, step = [], Meet.__init__, Meet.step

    def recording_init(self, **kwargs):
        make(self, **kwargs)
        self.transitions = []
        envs.append(self.transitions)

    def recording_step(self, actions):
        result = step(self, actions)
        self.transitions.append({"obs": result[0], "state": self.state()})
        return result

    monkeypatch.setattr(Meet, "__init__", recording_init)
    monkeypatch.setattr(Meet, "step", recording_step)
    return envs


@pytest.mark.parametrize("rule", ["always", "truncated"])
@pytest.mark.parametrize("critic", ["state()", "all_observations"])
def test_a_centralized_critic_bootstraps_from_its_episodes_last_state(tmp_path, monkeypatch, critic, rule):
    """Meet with a, the agent whose row carries the critic's state, leaving after 3 of the episode's 8 steps, and b
    truncated after 8. The critic is replaced by the weights 10^k over its input's entries, so that its value tells
    which entries of which row it read. Every bootstrap value equals that critic on the input made from the env's own
    transitions: its state() after the episode's last step, or the agents' last observations laid end to end, zeros
    for a, which had left; never the next episode's start."""
    pytest.importorskip("pettingzoo")
    captured = spy_on_advantages(monkeypatch, ippo)
    transitions = record_meet_transitions(monkeypatch)
    run = ippo.Agent.run

    def linear_critic(self, net, x):
        if net is not self.critic:
            return run(self, net, x)
        return (x * 10.0 ** torch.arange(x.shape[-1], dtype=x.dtype)).sum(-1, keepdim=True)

    monkeypatch.setattr(ippo.Agent, "run", linear_critic)
    monkeypatch.chdir(tmp_path)
    argv = fast_args(MEET, "run", num_steps=16, total_timesteps=2 * 16 * 2, bootstrap_at_done=rule, save_model=False,
                     max_episode_steps=8, centralized_critic=True)
    kwargs = ["a_leaves=True"] + (["with_state=True"] if critic == "state()" else [])
    assert ippo.cli(argv + ["--env_kwargs", *kwargs]) == 0
    training = [env for env in transitions if len(env) == 32]  # 2 envs x 2 rollouts of 16 steps
    assert len(training) == 2 and len(captured) == 2

    def critic_of(transition) -> float:
        if critic == "state()":
            x = transition["state"]
        else:
            x = np.concatenate([transition["obs"].get(agent, np.zeros(3, np.float32)) for agent in ("a", "b")])
        return float((x.astype(np.float64) * 10.0 ** np.arange(len(x))).sum())

    for iteration, call in enumerate(captured):
        dones, bootstrap_values = call["dones"], call["bootstrap_values"]
        assert dones[:, :, 0].nonzero()[:, 0].tolist() == [2, 2, 10, 10]  # a terminated
        assert dones[:, :, 1].nonzero()[:, 0].tolist() == [7, 7, 15, 15]  # b truncated
        bootstraps = [(t, 1) for t in (7, 15)] + ([(t, 0) for t in (2, 10)] if rule == "always" else [])
        assert bootstrap_values.count_nonzero() == 2 * len(bootstraps)
        for env, env_transitions in enumerate(training):
            for t, agent in bootstraps:
                want = critic_of(env_transitions[16 * iteration + t])
                assert bootstrap_values[t, env, agent].item() == pytest.approx(want, rel=1e-6), (t, env, agent)


def test_an_agent_absent_from_an_episode_is_out_of_it_and_the_others_end_it(tmp_path, monkeypatch):
    """Meet with b in every other episode only (absent from reset on). b is not alive in its absent episodes (zero
    observations and rewards, no episode end), a is alive throughout, every episode ends at its 8th step and is
    logged: a return (the mean over the episode's agents: a's alone when b is absent) per episode, b's own only for
    the episodes it took part in. ppo_eval.py counts b's return over those alone and writes null for the others."""
    pytest.importorskip("pettingzoo")
    captured = spy_on_advantages(monkeypatch, ippo)
    buffers, rollout_buffer, rollout = [], ippo.RolloutBuffer, ippo.rollout
    monkeypatch.setattr(ippo, "RolloutBuffer", lambda *a: buffers.append(rollout_buffer(*a)) or buffers[-1])
    episodes = []
    monkeypatch.setattr(ippo, "rollout", lambda *a: (result := rollout(*a), episodes.append(result[1]))[0])
    alive_seen = []
    compute_advantages = ippo.compute_advantages
    monkeypatch.setattr(ippo, "compute_advantages",
                        lambda *a: alive_seen.append(buffers[-1].alive.clone()) or compute_advantages(*a))
    monkeypatch.chdir(tmp_path)
    argv = fast_args(MEET, "run", num_steps=16, total_timesteps=2 * 16 * 2, max_episode_steps=8, num_eval_envs=1)
    assert ippo.cli(argv + ["--env_kwargs", "b_every_other=True"]) == 0
    assert len(captured) == 2
    for iteration, (call, alive, finished) in enumerate(zip(captured, alive_seen, episodes)):
        b_present = [t < 8 for t in range(16)]  # the env's episodes 1 and 3 with b, 2 and 4 without
        assert alive[..., 0].all() and alive[..., 1].tolist() == [[b] * 2 for b in b_present]
        assert not call["rewards"][~alive].any()
        assert call["dones"][:, :, 0].nonzero()[:, 0].tolist() == [7, 7, 15, 15]
        assert call["dones"][:, :, 1].nonzero()[:, 0].tolist() == [7, 7]
        assert len(finished["return"]) == 4 and len(finished["episode_len"]) == 4
        b_return = finished["b/return"]
        assert b_return.isnan().tolist() == [False, False, True, True]
        both = finished["return"][:2], (finished["a/return"][:2] + b_return[:2]) / 2
        torch.testing.assert_close(*both)
        torch.testing.assert_close(finished["return"][2:], finished["a/return"][2:])
    # b's logged return: its episodes' alone
    logged = [value for _, value in scalars(tmp_path / "runs/run")["train/b/return"]]
    assert logged == pytest.approx([finished["b/return"][:2].mean().item() for finished in episodes])
    results = tmp_path / "results.json"
    assert ppo_eval.cli(["runs/run", "--num_episodes", "2", "--no_capture_video", "--output", str(results)]) == 0
    evaluation = json.loads(results.read_text())
    assert evaluation["metrics"]["b/return"]["episodes"] == 1 and evaluation["metrics"]["a/return"]["episodes"] == 2
    assert [episode["b/return"] is None for episode in evaluation["episodes"]] == [False, True]


def test_steps_of_agents_that_left_count_in_no_loss_or_statistic():
    """ppo_loss over a minibatch with some agents' steps not alive equals, for each agent, the loss over its steps
    alive alone, whatever the others hold; the running statistics of observations count each agent's steps alive."""
    torch.manual_seed(0)
    agent = ippo.Agent(2, 4, [DISCRETE, {**DISCRETE, "n": 5}], norm_obs=True, norm_value=False, hidden_sizes=(16,),
                       activation="tanh", log_std_init=-0.5, share_parameters=False, state_index=None)
    args = ippo.Args(norm_adv=True, clip_vloss=True, clip_coef=0.2)
    batch = 64
    obs, advantages, returns, values = torch.randn(batch, 2, 4), torch.randn(batch, 2), torch.randn(batch, 2), \
        torch.randn(batch, 2)
    with torch.no_grad():
        actions, logprobs, _, _ = agent.get_action_and_value(obs)
    logprobs = logprobs + 0.1 * torch.randn_like(logprobs)  # ratios away from 1
    alive = torch.rand(batch, 2) < 0.7
    garbage = [torch.where(alive, x, 1e3) for x in (advantages, returns, values)]
    (pg, v, ent), _, _ = ippo.ppo_loss(agent, args, obs, actions, logprobs, *garbage, alive)
    for i in range(2):
        rows = alive[:, i]
        (pg_i, v_i, ent_i), _, _ = ippo.ppo_loss(agent, args, obs[rows], actions[rows], logprobs[rows],
                                                 advantages[rows], returns[rows], values[rows],
                                                 torch.ones(int(rows.sum()), 2, dtype=torch.bool))
        for got, want in ((pg, pg_i), (v, v_i), (ent, ent_i)):
            assert got[i].item() == pytest.approx(want[i].item(), rel=1e-5, abs=1e-6)
    # b's logits beyond its 5, a's beyond its 3, are never drawn
    assert (actions[:, 0] < 3).all() and (actions[:, 1] < 5).all() and (actions[:, 1] >= 3).any()
    rms = ippo.RunningMeanStd((2, 4))
    x = torch.randn(batch, 2, 4, dtype=torch.float64) * 3 + 1
    rms.update(x, alive)
    for i in range(2):
        own = x[alive[:, i], i].numpy()
        np.testing.assert_allclose(rms.mean[i].numpy(), own.mean(0), rtol=1e-5)
        np.testing.assert_allclose(rms.var[i].numpy(), own.var(0), rtol=1e-4)
        assert rms.count[i].item() == pytest.approx(len(own), abs=1e-3)


def test_pettingzoo_sigterm_then_resume_with_workers_equals_uninterrupted_run(tmp_path):
    """Meet's fixed starts ignore the seeds and its episodes end at the 16-step rollouts' boundaries; b leaves early.
    A run cut by SIGTERM and resumed (in worker processes: --async_envs may change on resume) ends with the
    uninterrupted run's weights and statistics. (VMAS's SIGTERM and resume: tests/test_reliability.py's, under
    torchrun.)"""
    pytest.importorskip("pettingzoo")
    iterations = 60
    argv = dict(total_timesteps=32 * iterations, eval_freq=10, norm_obs=True, norm_reward=True, norm_value=True,
                max_episode_steps=8)
    kwargs = ["--env_kwargs", "b_leaves=True", "fixed_start=True", "wide_b=True", "with_state=True"]
    run = tmp_path / "runs" / "cut"
    full, cut = sigterm_beside_full_run(
        "ippo.py", *(fast_args(MEET, name, centralized_critic=True, **argv) + kwargs for name in ("full", "cut")),
        run / "ckpt_10.pt", tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr
    assert "resume with: python " + str(REPO / "ippo.py") + " --resume runs/cut" in cut.stderr
    saved = max(int(p.stem.split("_")[1]) for p in run.glob("ckpt_*.pt"))
    assert 10 <= saved < iterations and not (run / "final_ckpt.pt").exists()
    resumed = run_script("ippo.py", ["--resume", "runs/cut", "--async_envs"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = load(tmp_path / "runs/full/final_ckpt.pt"), load(run / "final_ckpt.pt")
    assert a["global_step"] == b["global_step"] == 32 * iterations
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("return_rms.mean", "return_rms.var", "return_rms.count"):
        assert torch.equal(a["reward_normalizer"][key], b["reward_normalizer"][key]), key
    # b acted in 3 of every 8 steps: its statistics counted those alone
    counts = b["model"]["obs_normalizer.count"].flatten()
    assert (counts[0].item() == pytest.approx(32 * iterations, abs=1)
            and counts[1].item() == pytest.approx(12 * iterations, abs=1))


def test_pettingzoo_evaluation_videos(tmp_path):
    """As VMAS's: the first episode of evaluation env 0 in each evaluation, built with render_mode="rgb_array"."""
    pytest.importorskip("pettingzoo")
    argv = fast_args(MEET, "video", max_episode_steps=8, capture_video=True, total_timesteps=32 * 2, eval_freq=1)
    result = run_script("ippo.py", argv + ["--env_kwargs", "b_leaves=True"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    videos = sorted((tmp_path / "runs/video/videos").glob("*.mp4"))
    assert [p.name for p in videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all(video_frames(p) == (9, (112, 64)) for p in videos)  # 8 steps and the reset's frame
