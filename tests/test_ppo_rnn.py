"""ppo_rnn.py: recurrent state semantics, rollout/update identity, bootstrapping from memory, evaluation, run safety."""

import re

import gymnasium as gym
import pytest
import torch

import ppo_rnn
import tests.envs  # noqa: F401  (registers the test envs)
from tests.util import (assert_same_numbers, fast_args, load, run_script, run_scripts, scalars, spy_on_advantages,
                        video_frames)

POINT_MASS = "tests.envs:PointMass-v0"
POINT_MASS_ENDS = "tests.envs:PointMassEnds-v0"  # episodes alternate: a termination after 8 steps, a truncation at 16
SMALL = dict(rnn_hidden_size=16)


def network_flags(args: dict) -> dict:
    """The Agent's arguments among a checkpoint's network flags; the run had no privileged critic."""
    assert not args["critic_obs"]
    return {name: args[name] for name in ppo_rnn.NETWORK_FIELDS if name != "critic_obs"}


def rnn_args(env_id: str, exp_name: str, **overrides) -> list[str]:
    return fast_args(env_id, exp_name, **{**SMALL, **overrides})


def make_agent(rnn_type: str, shared_rnn: bool) -> ppo_rnn.Agent:
    torch.manual_seed(0)
    return ppo_rnn.Agent(3, {"type": "Box", "shape": [2]}, False, False, "tanh", -0.5, rnn_type, 16, 2, shared_rnn)


AGENTS = [("lstm", False), ("gru", False), ("lstm", True), ("gru", True)]
AGENT_IDS = ["lstm", "gru", "lstm-shared", "gru-shared"]


@pytest.mark.parametrize("packed", [False, True], ids=["stretches", "packed"])
@pytest.mark.parametrize("rnn_type,shared_rnn", AGENTS, ids=AGENT_IDS)
def test_replay_equals_step_by_step_and_resets_are_fresh_starts(monkeypatch, rnn_type, shared_rnn, packed):
    """The update replays sequences (a call per stretch between episode starts, or on CUDA one packed call), the
    rollout steps through them: both give the same log-probs, values and final state; after an episode start an env
    computes exactly what a fresh zero state computes; one env's inputs never reach another's outputs; and a reset
    mask shifted by one step breaks the identity."""
    monkeypatch.setattr(ppo_rnn, "PACKED_REPLAY_DEVICES", ("cpu",) if packed else ())
    agent = make_agent(rnn_type, shared_rnn)
    steps, num_envs = 12, 3
    obs, actions = torch.randn(num_envs, steps, 3), torch.randn(num_envs, steps, 2)  # (batch, time, ...)
    starts = torch.zeros(num_envs, steps, dtype=torch.bool)
    starts[:2, 0] = True  # env 2 continues an episode from before the sequence, with its carried state
    starts[0, 4] = starts[1, 7] = starts[2, 7] = True
    carried = torch.randn(agent.initial_state(num_envs, torch.device("cpu")).shape)

    with torch.no_grad():
        state, stepped = carried, []
        for t in range(steps):
            _, logprob, _, value, state = agent.get_action_and_value(obs[:, t:t + 1], state, starts[:, t:t + 1],
                                                                     actions[:, t:t + 1])
            stepped.append((logprob[:, 0], value[:, 0]))
        _, logprob, _, value, replay_state = agent.get_action_and_value(obs, carried, starts, actions)
    torch.testing.assert_close(logprob, torch.stack([lp for lp, _ in stepped], 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(value, torch.stack([v for _, v in stepped], 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(replay_state, state, rtol=0, atol=1e-6)

    with torch.no_grad():
        # env 0 from its start at step 4 on, alone, from a zero state and with no start flag
        _, fresh_logprob, _, fresh_value, _ = agent.get_action_and_value(
            obs[:1, 4:], agent.initial_state(1, torch.device("cpu")), torch.zeros(1, steps - 4, dtype=torch.bool),
            actions[:1, 4:])
        torch.testing.assert_close(logprob[0, 4:], fresh_logprob[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(value[0, 4:], fresh_value[0], rtol=0, atol=1e-6)
        # env 2 continues its episode from the carried state until its start at step 7; env 0 starts at step 0
        other = carried.clone()
        other[:, 0] += 1.0
        other[:, 2] += 1.0
        _, logprob_other, _, value_other, _ = agent.get_action_and_value(obs, other, starts, actions)
        assert torch.equal(logprob_other[:2], logprob[:2]) and torch.equal(value_other[:2], value[:2])
        assert ((value_other[2, :7] - value[2, :7]).abs() > 1e-4).all()
        torch.testing.assert_close(value_other[2, 7:], value[2, 7:], rtol=0, atol=1e-6)
        # a mutation: the reset one step late
        shifted = torch.zeros_like(starts)
        shifted[:, 0], shifted[:, 1:] = starts[:, 0], starts[:, :-1]
        _, _, _, value_shifted, _ = agent.get_action_and_value(obs, carried, shifted, actions)
        assert (value_shifted - value).abs().max() > 1e-2


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
def test_first_minibatch_ratio_is_one(tmp_path, rnn_type):
    """In real runs whose rollouts hold episode starts mid-sequence and sequences that start mid-episode (from their
    stored states), the update recomputes the rollout's log-probs: Box with separate cores, Discrete with a shared
    core and observation normalization."""
    runs = {"box": dict(env_id=POINT_MASS_ENDS, seq_len=12),
            "discrete": dict(env_id="CartPole-v1", shared_rnn=True, norm_obs=True)}
    results = run_scripts([("ppo_rnn.py", rnn_args(flags.pop("env_id"), name, rnn_type=rnn_type, num_steps=24,
                                                   total_timesteps=48 * 3, target_kl=None, **flags))
                           for name, flags in runs.items()], tmp_path)
    for name, result in zip(runs, results):
        assert result.returncode == 0, result.stderr
        tags = scalars(tmp_path / "runs" / name)
        errors = [v for _, v in tags["losses/first_minibatch_ratio_error"]]
        assert len(errors) == 3 and max(errors) < 1e-5, errors
        assert [v for _, v in tags["losses/minibatch_steps"]] == [4.0] * 3
        assert tags["train/episode_len"]  # episodes did end inside the rollouts


def test_first_minibatch_ratio_is_one_with_the_packed_replay(tmp_path, monkeypatch):
    """The packed replay that CUDA takes, in a real run on the CPU: the update recomputes the rollout's log-probs."""
    monkeypatch.setattr(ppo_rnn, "PACKED_REPLAY_DEVICES", ("cpu",))
    packed_calls = []
    pack = torch.nn.utils.rnn.pack_padded_sequence
    monkeypatch.setattr(torch.nn.utils.rnn, "pack_padded_sequence",
                        lambda *args, **kwargs: packed_calls.append(1) or pack(*args, **kwargs))
    monkeypatch.chdir(tmp_path)
    argv = rnn_args(POINT_MASS_ENDS, "packed", num_steps=24, seq_len=12, total_timesteps=48 * 3, target_kl=None)
    assert ppo_rnn.cli(argv) == 0
    errors = [v for _, v in scalars(tmp_path / "runs/packed")["losses/first_minibatch_ratio_error"]]
    assert len(errors) == 3 and max(errors) < 1e-5 and packed_calls, errors


def test_the_ratio_check_catches_a_reset_one_step_late(tmp_path, monkeypatch):
    """The check above can fail: the same Box run with the update's reset mask shifted by one step."""
    forward = ppo_rnn.RecurrentCore.forward

    def late_reset(self, obs, state, episode_starts):
        if obs.shape[-2] > 1:  # the update's replay; the rollout steps one observation at a time
            episode_starts = torch.cat((episode_starts[..., :1], episode_starts[..., :-1]), -1)
        return forward(self, obs, state, episode_starts)

    monkeypatch.setattr(ppo_rnn.RecurrentCore, "forward", late_reset)
    monkeypatch.chdir(tmp_path)
    argv = rnn_args(POINT_MASS_ENDS, "late", num_steps=24, seq_len=12, total_timesteps=48 * 3, target_kl=None)
    assert ppo_rnn.cli(argv) == 0
    errors = [v for _, v in scalars(tmp_path / "runs/late")["losses/first_minibatch_ratio_error"]]
    assert min(errors) > 1e-4, errors  # every iteration fails the 1e-5 check above tenfold


@pytest.mark.parametrize("shared_rnn", [False, True], ids=["separate", "shared"])
def test_final_value_comes_from_the_ended_episodes_memory(tmp_path, monkeypatch, shared_rnn):
    """The recurrence is replaced by a counter of the episode's observations, so the critic is a linear function of
    the memory: v(k) = v(1) + (k - 1) * a. An episode that ended after L steps must bootstrap from v(L + 1), its
    final observation seen with its own memory; a reset memory would give v(1).

    PointMassEnds episodes alternate: a termination after 8 steps (final count 9), a truncation at 16 (count 17)."""
    def counting_forward(self, obs, state, episode_starts):
        outputs = []
        for t in range(obs.shape[-2]):
            state = torch.where(episode_starts[:, t][None, :, None], 0.0, state) + 1.0
            outputs.append(state[-1, :, :self.rnn.hidden_size])
        return torch.stack(outputs, 1), state

    monkeypatch.setattr(ppo_rnn.RecurrentCore, "forward", counting_forward)
    captured = spy_on_advantages(monkeypatch, ppo_rnn)
    monkeypatch.chdir(tmp_path)
    argv = rnn_args(POINT_MASS_ENDS, "spy", num_steps=24, total_timesteps=2 * 24 * 2, bootstrap_at_done="always",
                    save_model=False, shared_rnn=shared_rnn)
    assert ppo_rnn.cli(argv) == 0
    assert len(captured) == 2
    for call in captured:
        values, dones, bootstrap_values = call["values"], call["dones"], call["bootstrap_values"]
        assert dones[:, 0].nonzero().flatten().tolist() == [7, 23]
        v1, slope = values[0], values[1] - values[0]  # the counts of steps 0 and 1 are 1 and 2
        assert (slope.abs() > 1e-3).all()
        torch.testing.assert_close(bootstrap_values[7], v1 + 8 * slope)
        torch.testing.assert_close(bootstrap_values[23], v1 + 16 * slope)
        assert not bootstrap_values[dones == 0].any()


def test_memory_is_needed_and_used(tmp_path):
    """CueRecall-v0 shows a cue at the first step and rewards recalling it at the eighth: ppo_rnn.py learns it, ppo.py
    with the same budget and settings stays at chance (its last-step observation is the same whatever the cue)."""
    common = ["--env_id", "pomdp:CueRecall-v0", "--num_envs", "8", "--num_steps", "32", "--num_minibatches", "4",
              "--update_epochs", "4", "--gamma", "0.99", "--gae_lambda", "0.95", "--learning_rate", "1e-3",
              "--target_kl", "None", "--total_timesteps", "10240", "--eval_freq", "1000", "--num_eval_envs", "32",
              "--no_capture_video"]
    recurrent, memoryless = run_scripts([("ppo_rnn.py", common + ["--exp_name", "rnn", "--rnn_hidden_size", "64"]),
                                         ("ppo.py", common + ["--exp_name", "mlp"])], tmp_path)  # side by side
    assert recurrent.returncode == 0, recurrent.stderr
    assert memoryless.returncode == 0, memoryless.stderr
    success = {name: scalars(tmp_path / "runs" / name)["eval/return"][-1][1] for name in ("rnn", "mlp")}
    assert success["rnn"] >= 0.9 and success["mlp"] <= 0.75, success


def test_evaluation_carries_and_resets_each_envs_memory(monkeypatch):
    """Each eval env's state is zeroed exactly where its episodes start (a 4-step env beside a 16-step one), and
    each env's first episode counts once."""
    short = gym.make(POINT_MASS, max_episode_steps=4)
    vector = gym.vector.SyncVectorEnv([lambda: gym.make(POINT_MASS), lambda: short],
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    eval_envs = ppo_rnn.TorchVecEnv(vector, torch.device("cpu"), torch_native=False)
    agent = ppo_rnn.Agent(2, ppo_rnn.space_to_dict(vector.single_action_space), True, False, "tanh", -0.5, "lstm", 8, 1,
                          False)
    seen_starts = []
    get_action = ppo_rnn.Agent.get_action

    def spy(self, obs, state, episode_starts, deterministic=False, action_mask=None):
        assert deterministic
        seen_starts.append(episode_starts[:, 0].tolist())
        return get_action(self, obs, state, episode_starts, deterministic, action_mask)

    monkeypatch.setattr(ppo_rnn.Agent, "get_action", spy)
    metrics = ppo_rnn.evaluate(agent, eval_envs, num_eval_steps=16, seed=0)
    assert metrics["episodes"].tolist() == [2.0] and sorted(metrics["episode_len"].tolist()) == [4.0, 16.0]
    assert [t for t, (_, start) in enumerate(seen_starts) if start] == [0, 4, 8, 12]
    assert [t for t, (start, _) in enumerate(seen_starts) if start] == [0]
    eval_envs.close()


def test_evaluation_does_not_disturb_training(tmp_path):
    """Evaluating every iteration or never, training computes the same numbers."""
    argv = dict(total_timesteps=32 * 4, norm_obs=True, seq_len=8)
    for result in run_scripts([("ppo_rnn.py", rnn_args(POINT_MASS_ENDS, name, eval_freq=eval_freq, **argv))
                               for name, eval_freq in (("often", 1), ("never", 1000))], tmp_path):
        assert result.returncode == 0, result.stderr
    often, never = scalars(tmp_path / "runs/often"), scalars(tmp_path / "runs/never")
    assert len(often["eval/return"]) == 4 and len(never["eval/return"]) == 1
    for tag in ("losses/policy_loss", "losses/value_loss", "train/return"):
        assert often[tag] == never[tag], tag


def test_same_seed_same_numbers_and_checkpoint_contents(tmp_path):
    argv = dict(norm_obs=True, total_timesteps=32 * 4, lr_schedule="adaptive", seq_len=8, rnn_type="gru",
                rnn_num_layers=2)
    for result in run_scripts([("ppo_rnn.py", rnn_args("Pendulum-v1", name, **argv)) for name in ("a", "b")],
                              tmp_path):
        assert result.returncode == 0, result.stderr
    assert_same_numbers(tmp_path / "runs/a", tmp_path / "runs/b")

    ckpt = load(tmp_path / "runs/a/final_ckpt.pt")
    assert ckpt["trainer"] == "ppo_rnn" and ckpt["format"] == ppo_rnn.CHECKPOINT_FORMAT
    assert ckpt["iteration"] == 4 and ckpt["global_step"] == 128
    saved = ckpt["args"]
    assert (saved["rnn_type"], saved["rnn_hidden_size"], saved["rnn_num_layers"], saved["shared_rnn"],
            saved["seq_len"]) == ("gru", 16, 2, False, 8)
    # the checkpoint alone rebuilds the network (--critic_obs's width would come from the observation space)
    agent = ppo_rnn.Agent(ckpt["observation_space"]["shape"][0], ckpt["action_space"],
                          log_std_init=saved["log_std_init"], **network_flags(saved))
    agent.load_state_dict(ckpt["model"])

    # --checkpoint needs the same network, said in words; resuming from a ppo.py checkpoint is refused; a resume
    # continues one experiment: the network and the sequence scheme are fixed (SIGTERM and resume:
    # tests/test_reliability.py). Three refusals, side by side.
    torch.save({**ckpt, "trainer": "ppo"}, tmp_path / "ppo.pt")
    mismatch, foreign, changed = run_scripts([
        ("ppo_rnn.py", rnn_args("Pendulum-v1", "c", norm_obs=True, rnn_num_layers=2,
                                checkpoint="runs/a/final_ckpt.pt")),
        ("ppo_rnn.py", ["--resume", "ppo.pt"]),
        ("ppo_rnn.py", ["--resume", "runs/a", "--rnn_type", "lstm", "--seq_len", "4", "--total_timesteps", "256"])],
        tmp_path)
    assert mismatch.returncode == 2
    assert mismatch.stderr.strip().splitlines()[-1] == ("error: the checkpoint was trained with --rnn_type=gru, and "
                                                        "its network needs the same: pass --rnn_type=gru")
    assert foreign.returncode == 2 and "written by ppo.py" in foreign.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "runs/c").exists() and not (tmp_path / "runs/d").exists()
    assert changed.returncode == 2
    error = changed.stderr.strip().splitlines()[-1]
    assert "--rnn_type" in error and "--seq_len" in error and "--checkpoint" in error


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    # rewards turn NaN after 200 steps of each env: iteration 13 of 16-step rollouts
    result = run_script("ppo_rnn.py", rnn_args("tests.envs:PointMassNaN-v0", "nan", total_timesteps=32 * 40,
                                               eval_freq=5), tmp_path)
    assert result.returncode == 1
    assert "non-finite loss at iteration 13" in result.stderr and "ckpt_10.pt is untouched" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in (tmp_path / "runs/nan").glob("*.pt")) == ["ckpt_10.pt", "ckpt_5.pt"]


BAD_INPUTS = [
    (dict(num_steps=16, seq_len=5), "--seq_len=5 does not divide --num_steps=16"),
    (dict(num_envs=3, num_steps=16, seq_len=8, num_minibatches=4), "6 sequences"),
    (dict(num_envs=2, num_steps=16, seq_len=8, num_minibatches=3), "--num_minibatches=3"),
    (dict(rnn_type="transformer"), "--rnn_type must be lstm or gru"),
    (dict(rnn_hidden_size=0), "--rnn_hidden_size"),
    (dict(rnn_num_layers=0), "--rnn_num_layers"),
    (dict(seq_len=0), "--seq_len"),
    (dict(seq_len=-4), "--seq_len"),
    (dict(keep_checkpoints=0), "--keep_checkpoints"),
    (dict(critic_obs=True, shared_rnn=True), "drop --shared_rnn"),
    (dict(critic_obs=True), "CartPole-v1 does not"),
]


@pytest.mark.parametrize("flags,mention", BAD_INPUTS, ids=[str(f) for f, _ in BAD_INPUTS])
def test_bad_input_is_one_clear_line(tmp_path, monkeypatch, capfd, flags, mention):
    monkeypatch.chdir(tmp_path)
    assert ppo_rnn.cli(rnn_args("CartPole-v1", "bad", **flags)) == 2
    stderr = capfd.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and mention in errors[0] and "Traceback" not in stderr, stderr
    assert not (tmp_path / "runs").exists()


def test_cpu_worker_cap_suggests_whole_sequence_minibatches(tmp_path, monkeypatch, capsys):
    """The GPU-sized defaults on the CPU simulation are refused with flags that fit; those flags pass validation."""
    pytest.importorskip("mani_skill")
    monkeypatch.chdir(tmp_path)
    assert ppo_rnn.cli(["--env_id", "PickCube-v1", "--sim_backend", "cpu", "--no_capture_video"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    suggestion = re.search(r"try (--num_envs=\d+ --num_eval_envs=\d+ --num_minibatches=\d+)", error).group(1)
    args = ppo_rnn.Args(env_id="PickCube-v1", sim_backend="cpu", **{k.lstrip("-"): int(v) for k, v in
                                                 (flag.split("=") for flag in suggestion.split())})
    ppo_rnn.validate(args, maniskill=True, time_limit=50)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("num_envs,num_eval_envs", [(1, 2), (2, 1)], ids=["one-env-train", "worker-train"])
def test_pick_cube_on_both_cpu_paths(tmp_path, num_envs, num_eval_envs):
    """ManiSkill's CPU simulation through ManiSkillVectorEnv (one env: the GPU path's tensor code) and through worker
    processes, for training and evaluation alike: logs, ManiSkill's metrics, a checkpoint that rebuilds the agent;
    videos where evaluation takes ManiSkillVectorEnv and its RecordEpisode (rendering takes half of a run's time; both
    paths' videos are checked copies of ppo.py's code, tests/test_maniskill.py). 10-step episodes
    (--max_episode_steps) of PickCube's 50."""
    pytest.importorskip("mani_skill")
    video = num_eval_envs == 1
    result = run_script("ppo_rnn.py", rnn_args("PickCube-v1", "pick", num_envs=num_envs, num_eval_envs=num_eval_envs,
                                               num_steps=10, seq_len=5, num_minibatches=1, update_epochs=1, eval_freq=1,
                                               total_timesteps=20 * num_envs, capture_video=video, gamma=0.8,
                                               gae_lambda=0.9, max_episode_steps=10), tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs/pick"
    assert "bootstrap_rule=always" in result.stdout
    tags = scalars(run)
    for tag in ("eval/return", "eval/success_once", "eval/success_at_end", "losses/value_loss", "charts/SPS"):
        assert tag in tags, tag
    assert all(value == 10 for _, value in tags["eval/episode_len"])  # --max_episode_steps: 10 of PickCube's 50
    assert all(value == num_eval_envs for _, value in tags["eval/episodes"])
    assert sorted(p.name for p in run.glob("*.pt")) == ["ckpt_1.pt", "ckpt_2.pt", "final_ckpt.pt"]
    ckpt = load(run / "final_ckpt.pt")
    assert ckpt["observation_space"]["shape"] == [42] and ckpt["action_space"]["shape"] == [8]
    agent = ppo_rnn.Agent(42, ckpt["action_space"], log_std_init=ckpt["args"]["log_std_init"],
                          **network_flags(ckpt["args"]))
    agent.load_state_dict(ckpt["model"])
    videos = list((run / "videos").glob("*.mp4"))
    assert len(videos) == (2 if video else 0) and all(video_frames(v)[0] == 11 for v in videos)  # reset + 10 steps


@pytest.mark.parametrize("env_id,base_id,hidden", [("pomdp:CartPoleNoVel-v1", "CartPole-v1", [1, 3]),
                                                   ("pomdp:PendulumNoVel-v1", "Pendulum-v1", [2])])
def test_masked_envs_hide_the_velocities_and_nothing_else(env_id, base_id, hidden):
    masked, full = gym.make(env_id), gym.make(base_id)
    assert masked.spec.max_episode_steps == full.spec.max_episode_steps
    masked_obs, _ = masked.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    for _ in range(5):
        shown = [i for i in range(len(full_obs)) if i not in hidden]
        assert (masked_obs[hidden] == 0).all() and (full_obs[hidden] != 0).any()
        assert (masked_obs[shown] == full_obs[shown]).all()
        action = full.action_space.sample()
        masked_obs, *_ = masked.step(action)
        full_obs, *_ = full.step(action)
