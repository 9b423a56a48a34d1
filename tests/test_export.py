"""ppo_eval.py --export: the deterministic policy of a checkpoint as ONNX (run with onnxruntime) and as a torch.export
program, against the trainer's own actions, as its env takes them (values and dtype), on 100 recorded observations,
for every action kind of every trainer; a recurrent policy stepped through episodes with its exported state; a
privileged critic's policy, which takes no privileged input."""

import contextlib
import importlib
import json
import sys

import numpy as np
import pytest
import torch

import ippo
import ppo
import ppo_eval
import ppo_rgb
import ppo_rnn
import tests.envs  # noqa: F401  (registers the test envs)
from tests.util import REPO, fast_args, load, run_script

onnxruntime = pytest.importorskip("onnxruntime")
EXPORT_FORMATS = ("onnx", "pt2")

KINDS = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
CASES = {  # name: (trainer, env, flags)
    **{f"{trainer.TRAINER}_{kind}": (trainer, f"tests.envs:{env}{'' if kind == 'Box' else kind}-v0", dict(
        norm_obs=True, **(dict(rnn_hidden_size=16) if trainer is ppo_rnn else {})))
       for trainer, env in ((ppo, "PointMass"), (ppo_rgb, "PointMassPixels"), (ppo_rnn, "PointMass"))
       for kind in KINDS},
    "ippo": (ippo, "vmas:tests.vmas_scenarios:Clock", dict(norm_obs=True, hidden_sizes=16)),
    "ippo_shared": (ippo, "vmas:tests.vmas_scenarios:Clock", dict(norm_obs=True, share_parameters=True)),
    "ippo_pz_apart": (ippo, "pz:tests.pz_envs:meet", dict(
        norm_obs=True, centralized_critic=True, max_episode_steps=8,
        env_kwargs="wide_b=True fast_b=True continuous=True with_state=True")),
    **{f"ippo_pz_{kind.lower()}": (ippo, "pz:tests.pz_envs:meet", dict(max_episode_steps=8, env_kwargs=kwargs))
       for kind, kwargs in (("Discrete", "wide_b=True fast_b=True"), ("MultiDiscrete", "multi=MultiDiscrete"),
                            ("MultiBinary", "multi=MultiBinary fast_b=True"))},
    "box_critic": (ppo, "tests.envs:PointMassCritic-v0", dict(norm_obs=True, critic_obs=True)),
    "dict_critic": (ppo_rgb, "tests.envs:PointMassPixelsCritic-v0", dict(norm_obs=True, critic_obs=True)),
    "lstm_critic": (ppo_rnn, "tests.envs:PointMassCritic-v0", dict(norm_obs=True, critic_obs=True,
                                                                  rnn_hidden_size=16)),
}


def trained(tmp_path, name: str):
    """A short run's checkpoint, and its agent and eval envs rebuilt with the trainer's own code. The run is the
    trainer's cli() in this process: a process of its own would add a start of torch and the simulators."""
    trainer, env_id, flags = CASES[name]
    argv = fast_args(env_id, "run", num_eval_envs=4, **{k: v for k, v in flags.items() if k != "env_kwargs"})
    argv += ["--env_kwargs", *flags["env_kwargs"].split()] if "env_kwargs" in flags else []
    with contextlib.chdir(tmp_path):
        assert trainer.cli(argv) == 0
    ckpt = load(tmp_path / "runs/run/final_ckpt.pt")
    args = ppo_eval.run_args(trainer, ckpt, ppo_eval.EvalArgs(checkpoint="unused"))
    envs = trainer.make_envs(args, False, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=16)
    agent = trainer.make_agent(args, envs)
    trainer.load_weights(agent, ckpt, args, envs)
    return trainer, agent.eval(), envs


def to_env(action: torch.Tensor, space) -> torch.Tensor:
    """What the env takes, written out from its space: Box actions clamped, discrete ones from the start."""
    if hasattr(space, "low"):
        return torch.clamp(action, torch.as_tensor(space.low), torch.as_tensor(space.high))
    return (action + torch.as_tensor(getattr(space, "start", 0))).to(torch.from_numpy(np.zeros(0, space.dtype)).dtype)


def exported(tmp_path, fmt: str, agent: str = ""):
    """The exported file (ippo.py's: the agent's) as a function of named numpy inputs, and its description."""
    path = tmp_path / f"policy.{fmt}"
    if not agent:
        assert ppo_eval.cli([str(tmp_path / "runs/run"), "--export", str(path)]) == 0
    path = path.with_name(f"policy{agent}.{fmt}")
    description = json.loads(path.with_name(path.name + ".json").read_text(),  # strict JSON: no Infinity or NaN
                             parse_constant=lambda constant: pytest.fail(f"{constant} in {path}.json"))
    names = [spec["name"] for spec in description["inputs"]]
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(str(path))
        return (lambda inputs: session.run(None, inputs)), description
    module = torch.export.load(str(path)).module()

    def run(inputs):
        with torch.no_grad():
            outputs = module(*(torch.from_numpy(inputs[name]) for name in names))
        return [x.numpy() for x in (outputs if isinstance(outputs, tuple) else (outputs,))]

    return run, description


def record(agent, envs):
    """100 observations of 4 envs under random actions, episodes ending among them."""
    obs, recorded = envs.reset(seed=0), []
    torch.manual_seed(0)
    for _ in range(25):
        recorded.append(obs)
        with torch.no_grad():
            obs = envs.step(agent.get_action(agent.normalize_obs(obs)))[0]
    if isinstance(obs, dict):
        return {key: torch.cat([o[key] for o in recorded]) for key in obs}
    return torch.cat(recorded)


def assert_acts_as(action: np.ndarray, expected: torch.Tensor, space):
    """The exported action equals what the env takes from the trainer, in the env's action dtype."""
    assert action.dtype == space.dtype, (action.dtype, space)
    assert action.shape == tuple(expected.shape)
    np.testing.assert_allclose(action.astype(np.float64), expected.double().numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trainer", ["ppo", "ppo_rgb"])
def test_exported_policy_acts_as_the_trainer_on_recorded_observations(tmp_path, trainer, kind):
    """ppo.py's vector and ppo_rgb.py's image-and-vector PointMass in each action kind, ONNX and .pt2."""
    trainer, agent, envs = trained(tmp_path, f"{trainer}_{kind}")
    recorded = record(agent, envs)
    space = envs.single_action_space
    with torch.no_grad():
        expected = to_env(agent.get_action(agent.normalize_obs(recorded), deterministic=True), space)
    envs.close()
    inputs = ({key: x.numpy() for key, x in recorded.items()} if isinstance(recorded, dict)
              else {"obs": recorded.numpy()})
    for fmt in EXPORT_FORMATS:
        run, description = exported(tmp_path, fmt)
        assert [spec["name"] for spec in description["inputs"]] == list(inputs)
        assert all(spec["shape"][0] == "batch" for spec in description["inputs"])
        (action,) = run(inputs)
        assert len(action) == 100
        assert_acts_as(action, expected, space)
        assert description["action_space"] == load(tmp_path / "runs/run/final_ckpt.pt")["action_space"]
        assert description["outputs"][0]["dtype"] == str(space.dtype)
        observation_space = load(tmp_path / "runs/run/final_ckpt.pt")["observation_space"]
        if trainer.__name__ == "ppo":  # PointMass's unbounded observations: null bounds
            assert observation_space["low"] == [-np.inf] * 2 and description["observation_space"]["low"] == [None] * 2
    # the .pt2 program holds the tensors the action reads, as the ONNX file does: not the critic's
    held = torch.export.load(str(tmp_path / "policy.pt2")).state_dict
    assert held and not [name for name in held if "critic" in name], list(held)
    assert (tmp_path / "policy.pt2").stat().st_size < 1.2 * (tmp_path / "policy.onnx").stat().st_size
    # each file described in its own JSON, which the next export to the same stem leaves alone
    assert {path.name: json.loads(path.read_text())["format"] for path in tmp_path.glob("policy*.json")} == {
        f"policy.{fmt}.json": fmt for fmt in EXPORT_FORMATS}


@pytest.mark.parametrize("kind", KINDS)
def test_exported_recurrent_policy_carries_its_state_through_episodes(tmp_path, kind):
    """24 steps of 4 envs across PointMass's 16-step episodes, in each action kind: the exported policy (ONNX and
    .pt2), fed back its own next_rnn_state and the episode starts, acts as the trainer's policy with the trainer's
    state."""
    trainer, agent, envs = trained(tmp_path, f"ppo_rnn_{kind}")
    space = envs.single_action_space
    for fmt in EXPORT_FORMATS:
        run, description = exported(tmp_path, fmt)
        assert [spec["name"] for spec in description["inputs"]] == ["obs", "rnn_state", "episode_start"]
        assert description["inputs"][1]["shape"] == [1, "batch", 64]  # h and c of the actor's and the critic's LSTM
        obs = envs.reset(seed=0)
        state = agent.initial_state(4, torch.device("cpu"))
        exported_state = state.numpy()
        start = torch.ones(4, dtype=torch.bool)
        starts_seen = 0
        for _ in range(24):
            with torch.no_grad():
                action, state = agent.get_action(agent.normalize_obs(obs)[:, None], state, start[:, None],
                                                 deterministic=True)
            exported_action, exported_state = run({"obs": obs.numpy(), "rnn_state": exported_state,
                                                   "episode_start": start.numpy()})
            assert_acts_as(exported_action, to_env(action[:, 0], space), space)
            np.testing.assert_allclose(exported_state, state.numpy(), atol=1e-5, rtol=0)
            obs, _, terminated, truncated, _, _ = envs.step(action[:, 0])
            start = terminated | truncated
            starts_seen += int(start.sum())
        assert starts_seen == 4  # every env began a second episode on the way
    envs.close()


def test_an_export_prints_its_line_and_nothing_of_torchs(tmp_path):
    """A process of its own: the ONNX exporter's warnings (one per torchvision operator, without torchvision) come
    once a process."""
    trained(tmp_path, "ppo_Box")[2].close()
    exported = run_script("ppo_eval.py", ["runs/run", "--export", "policy.onnx"], tmp_path, timeout=300)
    assert exported.returncode == 0 and exported.stderr == "", exported.stderr
    assert exported.stdout.startswith("policy      policy.onnx (onnx), described in policy.onnx.json; ")


def test_export_refuses_another_suffix_in_one_line(tmp_path, capfd):
    assert ppo_eval.cli([str(tmp_path), "--export", "policy.zip"]) == 2
    assert "--export must be a file name ending in .onnx or .pt2" in capfd.readouterr().err


@pytest.mark.parametrize("name", ["ippo", "ippo_shared", "ippo_pz_apart", "ippo_pz_discrete", "ippo_pz_multidiscrete",
                                  "ippo_pz_multibinary"])
def test_exported_multi_agent_policies_are_one_file_per_agent(tmp_path, name):
    """ippo.py's checkpoint, with a network per agent or one shared, or PettingZoo agents of different spaces and a
    critic of the env's state(), in each action kind: policy_<agent>.onnx and .pt2 take that agent's own
    observation, give its own action, and act as the trainer's agent on 100 recorded observations."""
    pytest.importorskip("vmas" if "pz" not in name else "pettingzoo")
    trainer, agent, envs = trained(tmp_path, name)
    obs, recorded = envs.reset(seed=0), []
    torch.manual_seed(0)
    for _ in range(25):
        recorded.append(obs)
        with torch.no_grad():
            obs = envs.step(agent.get_action(agent.normalize_obs(obs)))[0]
    recorded = torch.cat(recorded)
    assert len(recorded) == 100  # 4 envs
    with torch.no_grad():
        expected = agent.get_action(agent.normalize_obs(recorded), deterministic=True)
    for fmt in EXPORT_FORMATS:
        assert ppo_eval.cli([str(tmp_path / "runs/run"), "--export", str(tmp_path / f"policy.{fmt}")]) == 0
        for i, agent_name in enumerate(envs.agents):
            run, description = exported(tmp_path, fmt, f"_{agent_name}")
            assert description["agent"] == agent_name
            space, obs_dim = envs.action_spaces[i], envs.agent_obs_dims[i]
            assert description["observation_space"]["shape"] == [obs_dim]
            (action,) = run({"obs": recorded[:, i, :obs_dim].numpy()})
            assert_acts_as(action, to_env(expected[:, i, :space.shape[0]] if space.shape else expected[:, i], space),
                           space)
    if name == "ippo_pz_apart":  # b observes 4 entries and acts in 2, a 3 and 1; the critic reads state() besides
        assert envs.agent_obs_dims == [3, 4] and envs.obs_dim == 8 and [s.shape for s in envs.action_spaces] == [
            (1,), (2,)]
    envs.close()



@pytest.mark.parametrize("name", ["box_critic", "dict_critic", "lstm_critic"])
def test_a_privileged_critics_policy_takes_the_actors_observation_alone(tmp_path, name):
    """--critic_obs: ppo_eval.py evaluates the checkpoint; the exported policy's input is the observation without the
    critic's vector, and it acts as the trainer's policy on the whole training observation (ppo_rnn.py's: with the
    trainer's state, step by step)."""
    trainer, agent, envs = trained(tmp_path, name)
    assert ppo_eval.cli([str(tmp_path / "runs/run"), "--num_episodes", "4", "--no_capture_video"]) == 0
    run, description = exported(tmp_path, "onnx")
    assert "critic_obs" in description
    if trainer is ppo_rnn:
        obs, state = envs.reset(seed=0), agent.initial_state(4, torch.device("cpu"))
        exported_state, start = state.numpy(), torch.ones(4, dtype=torch.bool)
        for _ in range(20):
            with torch.no_grad():
                action, state = agent.get_action(agent.normalize_obs(obs)[:, None], state, start[:, None],
                                                 deterministic=True)
            exported_action, exported_state = run({"obs": obs[:, :2].numpy(), "rnn_state": exported_state,
                                                   "episode_start": start.numpy()})
            np.testing.assert_allclose(exported_action, to_env(action[:, 0], envs.single_action_space).numpy(),
                                       atol=1e-5, rtol=0)
            np.testing.assert_allclose(exported_state, state.numpy(), atol=1e-5, rtol=0)
            obs, _, terminated, truncated, _, _ = envs.step(action[:, 0])
            start = terminated | truncated
        envs.close()
        return
    recorded = record(agent, envs)
    envs.close()
    with torch.no_grad():
        expected = to_env(agent.get_action(agent.normalize_obs(recorded), deterministic=True),
                          envs.single_action_space)
    if trainer is ppo_rgb:
        assert [spec["name"] for spec in description["inputs"]] == ["image", "state"]
        (action,) = run({"image": recorded["image"].numpy(), "state": recorded["state"].numpy()})
    else:
        assert description["inputs"][0]["shape"] == ["batch", 2]  # PointMass's x and time; x^2 and t are the critic's
        (action,) = run({"obs": recorded[:, :2].numpy()})
    np.testing.assert_allclose(action, expected.numpy(), atol=1e-5, rtol=0)


SQUASH = ("        return torch.clamp(action, envs.action_low, envs.action_high)\n",
          "        return 0.5 * torch.tanh(action) + 0.25\n")


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_a_copys_env_action_is_exported_as_its_envs_receive_it(tmp_path, fmt, monkeypatch):
    """A copy that squashes its actions in env_action(): the exported policy returns what the copy's envs received
    in training (recorded where TorchVecEnv hands the action to the Gymnasium vector env), not a clamp of the mean."""
    source = (REPO / "ppo.py").read_text()
    assert source.count(SQUASH[0]) == 1
    (tmp_path / "my_squash.py").write_text(source.replace(*SQUASH))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_squash", raising=False)
    copy = importlib.import_module("my_squash")
    with contextlib.chdir(tmp_path):
        assert copy.cli(fast_args("tests.envs:PointMass-v0", "run", norm_obs=True)) == 0
    ckpt = load(tmp_path / "runs/run/final_ckpt.pt")
    args = ppo_eval.run_args(copy, ckpt, ppo_eval.EvalArgs(checkpoint="unused"))
    envs = copy.make_envs(args, False, torch.device("cpu"), evaluation=True, run_dir=tmp_path, num_eval_steps=16)
    agent = copy.make_agent(args, envs)
    copy.load_weights(agent, ckpt, args, envs)
    received = []
    vector_step = envs.env.step
    monkeypatch.setattr(envs.env, "step", lambda action: received.append(action.copy()) or vector_step(action))
    obs, recorded = envs.reset(seed=0), []
    for _ in range(10):
        recorded.append(obs)
        with torch.no_grad():
            obs = envs.step(agent.get_action(agent.normalize_obs(obs), deterministic=True))[0]
    envs.close()
    monkeypatch.chdir(tmp_path)  # where ppo_eval.py finds the copy
    run, _ = exported(tmp_path, fmt)
    (action,) = run({"obs": torch.cat(recorded).numpy()})
    np.testing.assert_allclose(action, np.concatenate(received), atol=1e-5, rtol=0)
    assert np.abs(action - 0.25).max() < 0.5  # squashed: every action lies in (-0.25, 0.75)
