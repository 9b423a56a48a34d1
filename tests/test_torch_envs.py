"""Torch-native vector envs (Gymnasium's vector_entry_point convention): tests/envs.py's reference versions step
the same episodes as their Gymnasium versions, bit for bit."""

import contextlib
import json
import signal

import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.envs
import ppo
import ppo_eval
import ppo_rgb
import ppo_rnn
from tests.util import (HostSyncs, assert_same_numbers, fast_args, load, refused_in_one_line, run_script,
                        scalars, sigterm_beside_full_run, spy_on_advantages)


@pytest.mark.parametrize("torch_id, gym_id", [("PointMassTorch-v0", "PointMass-v0"),
                                              ("PointMassEndsTorch-v0", "PointMassEnds-v0"),
                                              ("PointMassEndsWhereEndedTorch-v0", "PointMassEnds-v0")])
def test_a_torch_env_steps_the_episodes_of_its_gymnasium_version(torch_id, gym_id):
    """Its final observations every step, or (WhereEnded) on the steps where an episode ended alone, as
    SyncVectorEnv gives them."""
    num_envs = 3
    torch_envs = gym.make_vec(f"tests.envs:{torch_id}", num_envs=num_envs, vectorization_mode="vector_entry_point")
    gym_envs = gym.vector.SyncVectorEnv([lambda: gym.make(f"tests.envs:{gym_id}")] * num_envs,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert torch_envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    torch_obs, _ = torch_envs.reset(seed=1)
    gym_obs, _ = gym_envs.reset(seed=1)
    assert isinstance(torch_obs, torch.Tensor) and np.array_equal(torch_obs.numpy(), gym_obs)
    actions = np.random.default_rng(0).uniform(-1.5, 1.5, size=(100, num_envs, 1)).astype(np.float32)
    terminations = truncations = 0
    for action in actions:
        *torch_out, torch_info = torch_envs.step(torch.as_tensor(action))
        *gym_out, gym_info = gym_envs.step(action)
        for torch_value, gym_value in zip(torch_out, gym_out):  # observation, reward, terminated, truncated
            assert np.array_equal(torch_value.numpy(), gym_value)
        ended = gym_info.get("_final_obs", np.zeros(num_envs, dtype=bool))
        assert ("_final_obs" in torch_info) == ("_final_obs" in gym_info or "WhereEnded" not in torch_id)
        assert np.array_equal(torch_info.get("_final_obs", torch.zeros(num_envs, dtype=torch.bool)).numpy(), ended)
        if ended.any():
            assert np.array_equal(torch_info["final_obs"].numpy()[ended], np.stack(gym_info["final_obs"][ended]))
        terminations += int(gym_out[2].sum())
        truncations += int(gym_out[3].sum())
    assert truncations > 0 and (terminations > 0) == ("Ends" in gym_id)  # each kind of end was compared


def test_host_syncs_are_counted_and_a_torch_env_step_makes_none():
    x, mask = torch.randn(5), torch.tensor([True, False, True, False, True])
    with HostSyncs() as syncs:  # each of these would wait for a CUDA device
        x[0].item(), x.tolist(), x.cpu(), x.to("cpu"), bool(mask.any()), x[mask], torch.nonzero(mask), torch.where(mask)
        x[mask] = 0.0
    assert syncs.calls == ["item", "tolist", "cpu", "to", "__bool__", "__getitem__", "nonzero", "where",
                           "__setitem__"]
    with HostSyncs() as syncs:  # and these would not
        torch.where(mask, x, 0.0), x[1:], x[torch.tensor([0, 2])], mask.any(), (x * 2).sum()
    assert syncs.calls == []
    envs = gym.make_vec("tests.envs:PointMassEndsTorch-v0", num_envs=4, vectorization_mode="vector_entry_point")
    envs.reset(seed=1)
    with HostSyncs() as syncs:
        for _ in range(3 * tests.envs.EPISODE_STEPS):  # terminations, truncations and resets among them
            envs.step(torch.ones(4, 1))
    assert syncs.calls == []


def test_cartpole_torch_has_gymnasiums_dynamics_terminations_and_time_limit():
    """From 2,000 states on both sides of the bounds, with both actions: CartPoleEnv's next state and termination."""
    rng = np.random.default_rng(0)
    states = rng.uniform([-2.6, -2, -0.25, -2], [2.6, 2, 0.25, 2], size=(2000, 4))
    actions = rng.integers(0, 2, size=2000)
    torch_envs = tests.envs.CartPoleVector(num_envs=2000)
    torch_envs.reset(seed=0)
    torch_envs.state = torch.as_tensor(states)
    _, reward, terminated, truncated, info = torch_envs.step(torch.as_tensor(actions))
    reference = gym.make("CartPole-v1").unwrapped
    reference.reset(seed=0)
    expected_state, expected_terminated = [], []
    for state, action in zip(states, actions):
        reference.state, reference.steps_beyond_terminated = state.copy(), None
        _, _, ended, _, _ = reference.step(int(action))
        expected_state.append(reference.state)
        expected_terminated.append(ended)
    np.testing.assert_allclose(info["final_obs"].numpy(), np.float32(expected_state), rtol=1e-6, atol=1e-7)
    assert np.array_equal(terminated.numpy(), expected_terminated) and 0.2 < terminated.float().mean() < 0.8
    assert torch.equal(reward, torch.ones(2000)) and not truncated.any()
    # the time limit: every episode that survives 500 steps is truncated at its 500th, and restarts
    envs = gym.make_vec("tests.envs:CartPoleTorch-v1", num_envs=2, vectorization_mode="vector_entry_point")
    envs.reset(seed=1)
    envs.unwrapped.state, envs.unwrapped.t = torch.zeros(2, 4, dtype=torch.float64), torch.tensor([0, 499])
    obs, _, terminated, truncated, info = envs.step(torch.tensor([0, 1]))
    assert truncated.tolist() == [False, True] and not terminated.any() and info["_final_obs"].tolist() == [False, True]
    assert obs[1].abs().max() <= 0.05 and not torch.equal(obs[1], info["final_obs"][1])


TRAINERS = {"ppo": (ppo, "PointMassEnds", {}), "ppo_rgb": (ppo_rgb, "PointMassPixelsEnds", {}),
            "ppo_rnn": (ppo_rnn, "PointMassEnds", dict(rnn_hidden_size=8, seq_len=8))}


@pytest.mark.parametrize("name, final_obs", [(name, final_obs) for name in TRAINERS
                                             for final_obs in ("every step", "where ended")])
def test_a_trainer_on_a_torch_env_computes_what_it_computes_on_the_gymnasium_version(tmp_path, monkeypatch, name,
                                                                                     final_obs):
    """PointMass with terminations and truncations, through the torch-native path (its final observations every
    step, or where an episode ended alone) and through SyncVectorEnv and numpy: every rollout's rewards, values,
    dones, bootstrap values and advantages, the logged numbers and the weights, bit for bit."""
    trainer, env, extra = TRAINERS[name]
    flags = dict(num_envs=3, num_steps=24, total_timesteps=3 * 24 * 6, norm_obs=True, norm_reward=True,
                 num_minibatches=3, **extra)
    captured = spy_on_advantages(monkeypatch, trainer)
    monkeypatch.chdir(tmp_path)
    torch_id = f"tests.envs:{env}{'WhereEnded' * (final_obs == 'where ended')}Torch-v0"
    assert trainer.cli(fast_args(torch_id, "torch", **flags)) == 0
    torch_rollouts, captured[:] = captured[:], []
    assert trainer.cli(fast_args(f"tests.envs:{env}-v0", "gym", **flags)) == 0
    assert len(torch_rollouts) == len(captured) == 6
    for torch_rollout, gym_rollout in zip(torch_rollouts, captured):
        for key, value in gym_rollout.items():
            assert torch.equal(torch_rollout[key], value), key
    ends = torch.stack([rollout["dones"] for rollout in captured])
    bootstrapped = torch.stack([rollout["bootstrap_values"] for rollout in captured]) != 0
    assert bootstrapped.any() and (ends.bool() & ~bootstrapped).any()  # truncations and terminations among them
    assert_same_numbers(tmp_path / "runs/torch", tmp_path / "runs/gym", tags={"train/return", "eval/return"})


@pytest.mark.parametrize("name, env_id, num_seeds", [("ppo", "CartPoleTorch-v1", 1), ("ppo", "CartPoleTorch-v1", 2),
                                                    ("ppo_rnn", "CartPoleTorch-v1", 1),
                                                    ("ppo_rgb", "PointMassPixelsEndsTorch-v0", 1),
                                                    ("ppo", "PointMassEndsWhereEndedTorch-v0", 1),
                                                    ("ppo", "PointMassEndsWhereEndedTorch-v0", 2)])
def test_a_rollout_on_a_torch_env_waits_for_the_device_only_after_its_last_step(tmp_path, monkeypatch, name, env_id,
                                                                                num_seeds):
    """Observation and reward normalization, terminations and truncations: a training run's rollouts make no host
    synchronization in their steps; their finished episodes are selected once, after the last step (one boolean-mask
    read per metric: return, episode length, and under --num_seeds the seed index). An env that gives its final
    observations where an episode ended alone is checked at the last step (one read of each env's: did an episode
    end on a step without them?)."""
    trainer = TRAINERS[name][0]
    syncs_of_rollouts, rollout = [], trainer.rollout

    def counted_rollout(*args, **kwargs):
        with HostSyncs() as syncs:
            result = rollout(*args, **kwargs)
        syncs_of_rollouts.append(syncs.calls)
        return result

    monkeypatch.setattr(trainer, "rollout", counted_rollout)
    monkeypatch.chdir(tmp_path)
    flags = dict(num_envs=4, num_steps=48, total_timesteps=4 * 48 * 3, norm_obs=True, norm_reward=True,
                 max_episode_steps=20, **({"seq_len": 8} if name == "ppo_rnn" else {}))
    if num_seeds > 1:
        flags["num_seeds"] = num_seeds
    assert trainer.cli(fast_args(f"tests.envs:{env_id}", "syncs", **flags)) == 0
    checks = ["item"] * num_seeds if "WhereEnded" in env_id else []  # an env each seed under --num_seeds
    expected = checks + ["__getitem__"] * (2 if num_seeds == 1 else 3)
    # under --num_seeds the first rollout's first policy step is also run for each seed alone, and compared: it waits
    # there, and then as the other rollouts do
    first = syncs_of_rollouts[0] if num_seeds == 1 else syncs_of_rollouts[0][-len(expected):]
    assert first == expected and syncs_of_rollouts[1:] == [expected] * 2, syncs_of_rollouts
    logged = scalars(tmp_path / ("runs/syncs" if num_seeds == 1 else "runs/syncs/syncs__seed1"))
    assert len(logged["train/return"]) == 3  # episodes finished in each rollout


def test_each_seed_of_a_torch_env_trains_as_a_run_of_that_seed_alone(tmp_path, monkeypatch):
    """--num_seeds 2 on CartPole's torch version, whose starts each seed draws from its own generator: each seed's
    episodes, returns and weights are those of a run of it alone (weights to float rounding: the seeds' layers
    multiply in one batched matmul)."""
    flags = dict(num_envs=4, num_steps=32, total_timesteps=4 * 32 * 4, max_episode_steps=20, norm_obs=True)
    monkeypatch.chdir(tmp_path)
    assert ppo.cli(fast_args("tests.envs:CartPoleTorch-v1", "batch", seed=5, num_seeds=2, **flags)) == 0
    for seed in (5, 6):
        assert ppo.cli(fast_args("tests.envs:CartPoleTorch-v1", f"alone{seed}", seed=seed, **flags)) == 0
        batch_run, alone_run = tmp_path / f"runs/batch/batch__seed{seed}", tmp_path / f"runs/alone{seed}"
        in_batch, alone = load(batch_run / "final_ckpt.pt"), load(alone_run / "final_ckpt.pt")
        for key in alone["model"]:
            torch.testing.assert_close(in_batch["model"][key], alone["model"][key], rtol=1e-4, atol=1e-5, msg=key)
        logged_in_batch, logged_alone = scalars(batch_run), scalars(alone_run)
        for tag in ("train/return", "train/episode_len", "eval/return"):
            torch.testing.assert_close(torch.tensor([value for _, value in logged_in_batch[tag]]),
                                       torch.tensor([value for _, value in logged_alone[tag]]), rtol=1e-3, atol=1e-5)
    returns = [[value for _, value in scalars(tmp_path / f"runs/alone{seed}")["train/return"]] for seed in (5, 6)]
    assert returns[0] != returns[1]  # the seeds' episodes differ, so a mixed-up block would show


def test_seeds_of_an_env_that_gives_final_observations_where_episodes_ended_train_as_with_them_every_step(
        tmp_path, monkeypatch):
    """--num_seeds 2: each seed's env gives them on its own steps (the seeds' episodes end on different steps),
    and the blocks' infos are merged (the others' observations stand in): the same weights as the env that gives them
    every step, bit for bit."""
    monkeypatch.chdir(tmp_path)
    flags = dict(num_envs=4, num_steps=24, total_timesteps=4 * 24 * 3, num_seeds=2)
    merged, step = [], ppo.EnvBlocks.step

    def recording_step(self, action):
        result = step(self, action)
        merged.append(sum(block.env.lockstep_t == 0 for block in self.blocks) == 1)  # one block's episodes ended
        return result
    monkeypatch.setattr(ppo.EnvBlocks, "step", recording_step)
    for name, env_id in (("every", "PointMassEndsBySeedTorch-v0"), ("where", "PointMassEndsBySeedWhereEndedTorch-v0")):
        assert ppo.cli(fast_args(f"tests.envs:{env_id}", name, **flags)) == 0
    assert any(merged)  # steps where one block's episodes ended and the other's did not
    for seed in (1, 2):
        every, where = (load(tmp_path / f"runs/{name}/{name}__seed{seed}/final_ckpt.pt") for name in ("every", "where"))
        for key in every["model"]:
            assert torch.equal(every["model"][key], where["model"][key]), key


@pytest.mark.parametrize("name, env_id", [("ppo", "CartPoleTorch-v1"), ("ppo_rnn", "CartPoleTorch-v1"),
                                          ("ppo_rgb", "PointMassPixelsTorch-v0")])
def test_ppo_eval_evaluates_and_exports_a_torch_env_run(tmp_path, monkeypatch, name, env_id):
    """ppo_eval.py evaluates a torch-native env's run on the episodes asked for, and exports its policy (ppo.py's:
    acting as the trained agent)."""
    trainer = TRAINERS[name][0]
    monkeypatch.chdir(tmp_path)
    extra = {"seq_len": 8} if name == "ppo_rnn" else {}
    assert trainer.cli(fast_args(f"tests.envs:{env_id}", "run", max_episode_steps=16, num_eval_envs=3, **extra)) == 0
    assert ppo_eval.cli(["runs/run", "--num_episodes", "3", "--output", "results.json"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["evaluation"]["num_episodes"] == 3 and results["metrics"]["episode_len"]["mean"] <= 16
    assert ppo_eval.cli(["runs/run", "--export", "policy.pt2"]) == 0
    exported = torch.export.load("policy.pt2").module()
    if trainer is not ppo:
        return
    ckpt = load(tmp_path / "runs/run/final_ckpt.pt")
    args = ppo_eval.run_args(ppo, ckpt, ppo_eval.EvalArgs(checkpoint="unused"))
    envs = ppo.make_envs(args, False, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=16)
    agent = ppo.make_agent(args, envs)
    ppo.load_weights(agent, ckpt, args, envs)
    obs = torch.randn(50, 4) * 0.1
    with torch.no_grad():
        assert torch.equal(exported(obs), agent.get_action(agent.normalize_obs(obs), deterministic=True))


@pytest.mark.parametrize("name", TRAINERS)
def test_a_torch_env_run_stopped_and_resumed_equals_the_uninterrupted_run(tmp_path, name):
    """PointMass's torch versions, whose resets ignore the seed and whose episodes end with each 16-step rollout: a
    resumed run continues them exactly."""
    trainer, env, extra = TRAINERS[name]
    script, env_id, iterations, signal_after = f"{name}.py", f"tests.envs:{env.replace('Ends', '')}Torch-v0", 30, 10
    argv = dict(total_timesteps=32 * iterations, eval_freq=signal_after, norm_obs=True, norm_reward=True,
                lr_schedule="linear", **extra)
    run = tmp_path / "runs" / "cut"
    full, cut = sigterm_beside_full_run(script, fast_args(env_id, "full", **argv), fast_args(env_id, "cut", **argv),
                                        run / f"ckpt_{signal_after}.pt", tmp_path)
    assert full.returncode == 0 and cut.returncode == 128 + signal.SIGTERM, (full.stderr, cut.stderr)
    assert not (run / "final_ckpt.pt").exists()
    resumed = run_script(script, ["--resume", "runs/cut"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    a, b = load(tmp_path / "runs/full/final_ckpt.pt"), load(run / "final_ckpt.pt")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


class NextStepReset(tests.envs.PointMassVector):
    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}


class NoFinalObs(tests.envs.PointMassVector):
    def step(self, action):
        return *super().step(action)[:4], {}


class NoDeviceArgument(tests.envs.PointMassVector):
    def __init__(self, num_envs: int = 1, max_episode_steps: int = tests.envs.EPISODE_STEPS):
        super().__init__(num_envs, max_episode_steps)


class NoDeviceKept(tests.envs.PointMassVector):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        del self.device


class WrongShape(tests.envs.PointMassVector):
    def _obs(self):
        return torch.cat([super()._obs(), self.x[:, None].float()], dim=1)


class NumpyOut(tests.envs.PointMassVector):
    def step(self, action):
        obs, *rest = super().step(action)
        return obs.numpy(), *rest


class FourTuple(tests.envs.PointMassVector):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated | truncated, info


class BareReset(tests.envs.PointMassVector):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=options)[0]


class InfoNone(tests.envs.PointMassVector):
    def step(self, action):
        return *super().step(action)[:4], None


class SomeStepsMetrics(tests.envs.PointMassVector):
    def step(self, action):
        *out, info = super().step(action)
        if int(self.t[0]) % 2:
            info["final_info"] = {"episode": {"success_once": torch.zeros(self.num_envs)}}
        return *out, info


class ChangingMetrics(tests.envs.PointMassVector):
    def step(self, action):
        *out, info = super().step(action)
        info["final_info"] = {"episode": {"success_once" if int(self.t[0]) % 2 else "fail_once":
                                          torch.zeros(self.num_envs)}}
        return *out, info


class FinalInfoList(tests.envs.PointMassVector):
    def step(self, action):
        *out, info = super().step(action)
        return *out, {**info, "final_info": [{}] * self.num_envs}


class FinalInfoWithoutFinalObs(tests.envs.PointMassVector):
    def step(self, action):
        *out, info = super().step(action)
        return *out, {"final_info": {"episode": {"success_once": torch.zeros(self.num_envs)}}}


class MissesAnEnd(tests.envs.PointMassVector):
    """Its final observations where episodes ended, but for the truncations of its third episodes."""

    def step(self, action):
        *out, info = super().step(action)
        return *out, {} if int(self.episodes[0]) == 4 else info


class BrokenConstructor(tests.envs.PointMassVector):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        torch.zeros(2, dtype="float32")  # a bug of the env's own: its traceback, not a message about its signature


for broken in (NextStepReset, NoFinalObs, NoDeviceArgument, NoDeviceKept, WrongShape, NumpyOut, FourTuple,
               BareReset, InfoNone, SomeStepsMetrics, ChangingMetrics, FinalInfoList, FinalInfoWithoutFinalObs,
               MissesAnEnd, BrokenConstructor):
    gym.register(f"{broken.__name__}-v0", vector_entry_point=broken, max_episode_steps=tests.envs.EPISODE_STEPS)


@pytest.mark.parametrize("env_id, flags, words", [
    ("tests.envs:PointMassTorch-v0", dict(capture_video=True), "--capture_video does not apply"),
    ("tests.envs:PointMassTorch-v0", dict(critic_obs=True), "--critic_obs does not apply"),
    ("tests.envs:PointMassTorch-v0", dict(async_envs=True), "--async_envs does not apply"),
    ("tests.test_torch_envs:NextStepReset-v0", {}, "metadata['autoreset_mode'] is <AutoresetMode.NEXT_STEP"),
    ("tests.test_torch_envs:NoFinalObs-v0", {}, "step() ended an episode without info['final_obs']"),
    ("tests.test_torch_envs:MissesAnEnd-v0", {}, "step() ended an episode without info['final_obs']"),
    ("tests.test_torch_envs:WrongShape-v0", {}, "reset() returned obs (2, 3), not a tensor of shape (2, 2)"),
    ("tests.test_torch_envs:NumpyOut-v0", {}, "step() returned obs ndarray, not a tensor of shape (2, 2)"),
    ("tests.test_torch_envs:FourTuple-v0", {}, "step() returned tuple, not (obs, reward, terminated, truncated, info)"),
    ("tests.test_torch_envs:BareReset-v0", {}, "reset() returned Tensor, not (obs, info)"),
    ("tests.test_torch_envs:InfoNone-v0", {}, "step() returned info NoneType, not a dict"),
    ("tests.test_torch_envs:SomeStepsMetrics-v0", {}, "with keys [], and ['success_once'] before"),
    ("tests.test_torch_envs:ChangingMetrics-v0", {}, "with keys ['fail_once'], and ['success_once'] before"),
    ("tests.test_torch_envs:FinalInfoList-v0", {}, "returned info['final_info'] list, not a dict: "),
    ("tests.test_torch_envs:FinalInfoWithoutFinalObs-v0", {}, "info['final_info'] or info['_final_obs'] without "
                                                              "info['final_obs']"),
    ("tests.test_torch_envs:NoDeviceArgument-v0", {}, "its constructor takes num_envs, device"),
    ("tests.test_torch_envs:NoDeviceKept-v0", {}, "keeps the device it is given in self.device"),
])
def test_what_a_torch_env_cannot_do_or_lacks_is_refused_in_one_line(tmp_path, capfd, env_id, flags, words):
    error = refused_in_one_line(ppo, fast_args(env_id, "bad", **flags), tmp_path, capfd, whole_process=False)
    assert words in error, error


def test_a_bug_inside_a_torch_envs_constructor_keeps_its_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="dtype"):
        ppo.cli(fast_args("tests.test_torch_envs:BrokenConstructor-v0", "bug"))


def test_ppo_eval_refuses_videos_of_a_torch_env_in_one_line(tmp_path, capfd):
    with contextlib.chdir(tmp_path):
        assert ppo.cli(fast_args("tests.envs:PointMassTorch-v0", "run")) == 0
    error = refused_in_one_line(ppo_eval, ["runs/run", "--capture_video"], tmp_path, capfd, whole_process=False)
    assert "--capture_video does not apply" in error, error


class GlobalDraws(tests.envs.PointMassVector):
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.x += torch.rand(())  # torch's global generator, which the seeds of --num_seeds share
        return self._obs(), info


class Successes(tests.envs.PointMassVector):
    def step(self, action):
        *out, info = super().step(action)
        near = (info["final_obs"][:, 0].abs() < 0.5).float()  # the ended episodes' success: close to 0 at their end
        return *out, {**info, "final_info": {"episode": {"success_at_end": near}}}


for env_class in (GlobalDraws, Successes):
    gym.register(f"{env_class.__name__}-v0", vector_entry_point=env_class, max_episode_steps=tests.envs.EPISODE_STEPS)


def test_a_torch_envs_global_draws_are_named_and_its_success_metrics_logged_under_num_seeds(tmp_path, capfd):
    with contextlib.chdir(tmp_path):
        assert ppo.cli(fast_args("tests.test_torch_envs:GlobalDraws-v0", "draws", num_seeds=2)) == 0
        assert "draws from torch's global random generator" in capfd.readouterr().err
        assert ppo.cli(fast_args("tests.test_torch_envs:Successes-v0", "successes", num_seeds=2)) == 0
    for seed in (1, 2):
        logged = scalars(tmp_path / f"runs/successes/successes__seed{seed}")
        assert len(logged["train/success_at_end"]) == len(logged["train/return"]) == 4
        assert all(0 <= value <= 1 for _, value in logged["train/success_at_end"] + logged["eval/success_at_end"])
