"""Action masks (docs/ppo.md, "Action masks"): the masked distribution against sb3-contrib's MaskableCategorical, each
trainer on envs whose forbidden actions raise (Gymnasium's info["action_mask"], PettingZoo's Dict observations, also
each agent's in ippo.py, MultiDiscrete masks per dimension and flat, a torch-native env's tensors), the rollout's
stored masks, evaluation and export with masks, --num_seeds, --resume and torchrun, and the error of a mask that
allows nothing."""

import functools
import json
import re
import signal

import numpy as np
import pytest
import torch
from sb3_contrib.common.maskable.distributions import MaskableCategorical, MaskableMultiCategoricalDistribution

import ippo
import ppo
import tests.envs  # noqa: F401  (registers the envs that the in-process runs make)
from tests.test_reliability import run_torchrun
from tests.util import (REPO, fast_args, load, refused_in_one_line, run_script, runs_ahead, scalars,
                        sigterm_beside_full_run)

# its runs_ahead runs start once: its tests run in one worker under pytest-xdist's --dist loadgroup
pytestmark = pytest.mark.xdist_group("test_action_masks")

LEARN = dict(total_timesteps=2048, update_epochs=4, eval_freq=16, num_eval_envs=2)
# (trainer, env, its best return, the least a trained policy gets, None where 2,048 steps teach too little to tell);
# random play among the allowed actions gets 8 of MaskedChoice's 16 and about 21 of MaskedTargets' 48. ippo.py's Meet
# forbids moves apart, so that any policy ends near its best, 0.
RUNS = {
    "ppo_info": ("ppo.py", "tests.envs:MaskedChoice-v0", 16, 16),
    "ppo_dict": ("ppo.py", "tests.envs:MaskedChoiceDict-v0", 16, 16),
    "ppo_multidiscrete": ("ppo.py", "tests.envs:MaskedTargets-v0", 48, 32),
    "ppo_multidiscrete_flat": ("ppo.py", "tests.envs:MaskedTargetsFlat-v0", 48, 32),
    "ppo_torch_native": ("ppo.py", "tests.envs:MaskedChoiceTorch-v0", 16, 16),
    "ppo_rnn_info": ("ppo_rnn.py", "tests.envs:MaskedChoice-v0", 16, 16),
    "ppo_rnn_dict": ("ppo_rnn.py", "tests.envs:MaskedChoiceDict-v0", 16, 16),
    "ppo_rnn_multidiscrete": ("ppo_rnn.py", "tests.envs:MaskedTargets-v0", 48, None),
    "ppo_rgb_info": ("ppo_rgb.py", "tests.envs:MaskedChoicePixels-v0", 16, 16),
    "ppo_rgb_dict": ("ppo_rgb.py", "tests.envs:MaskedChoicePixelsDict-v0", 16, 16),
    # agents of different action spaces (b's Discrete(5), a's 3), one that leaves early; a MultiDiscrete mask
    "ippo_agents": ("ippo.py", "pz:tests.pz_envs:meet", 0, None),
    "ippo_multidiscrete": ("ippo.py", "pz:tests.pz_envs:meet", 0, None),
}
FLAGS = {"ppo_rnn.py": {"rnn_hidden_size": 16}, "ippo.py": {"max_episode_steps": 8}}
ENV_KWARGS = {"ippo_agents": ["--env_kwargs", "masked=True", "fast_b=True", "b_leaves=True"],
              "ippo_multidiscrete": ["--env_kwargs", "masked=True", "multi=MultiDiscrete"]}


def train_and_evaluate(name: str, directory):
    trainer, env_id, _, _ = RUNS[name]
    argv = fast_args(env_id, "masked", **LEARN, **FLAGS.get(trainer, {})) + ENV_KWARGS.get(name, [])
    trained = run_script(trainer, argv, directory)
    assert trained.returncode == 0, trained.stderr[-3000:]
    evaluated = run_script("ppo_eval.py", ["runs/masked", "--num_episodes", "4", "--output", "eval.json"], directory)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    return directory / "runs/masked"


ahead = runs_ahead({name: ((f"test_every_trainer_learns_with_masks_and_never_takes_a_forbidden_action[{name}]",
                            *(["test_each_agents_exported_policy_takes_its_own_mask"] * (name == "ippo_agents"))),
                           functools.partial(train_and_evaluate, name)) for name in RUNS})


def random_masks(shape: tuple, nvec: list[int], generator: torch.Generator) -> torch.Tensor:
    """Masks that allow at least one action of each dimension, often exactly one."""
    masks = torch.rand(*shape, sum(nvec), generator=generator) < 0.4
    for start, n in zip(np.cumsum([0, *nvec[:-1]]).tolist(), nvec):
        keep = torch.randint(n, shape, generator=generator) + start
        masks.scatter_(-1, keep[..., None], True)
    return masks


@pytest.mark.parametrize("nvec", [[5], [3, 2, 4]])
def test_masked_distribution_matches_sb3_contribs(nvec):
    """Log-probabilities, entropies and their gradients as sb3-contrib's MaskableCategorical computes them (its
    MultiCategorical for MultiDiscrete): the update's ratios and KL, and its entropy bonus, count the allowed actions
    alone. Large logits on forbidden actions change nothing."""
    generator = torch.Generator().manual_seed(0)
    space = ({"type": "Discrete", "n": nvec[0], "start": 0} if len(nvec) == 1
             else {"type": "MultiDiscrete", "shape": [len(nvec)], "nvec": nvec, "start": [0] * len(nvec)})
    actions_of = ppo.DiscreteActions(space)
    logits = (torch.randn(64, sum(nvec), generator=generator) * 3).requires_grad_()
    masks = random_masks((64,), nvec, generator)
    logits.data[~masks] += 50.0  # forbidden actions the unmasked policy would prefer
    ours = actions_of.distribution(logits, masks)
    actions = ours.sample()
    if len(nvec) == 1:
        reference = MaskableCategorical(logits=logits, masks=masks)
        reference_logprob, reference_entropy = reference.log_prob(actions), reference.entropy()
    else:
        distribution = MaskableMultiCategoricalDistribution(nvec).proba_distribution(logits)
        distribution.apply_masking(masks)
        reference_logprob, reference_entropy = distribution.log_prob(actions), distribution.entropy()
    # to float rounding: MaskableCategorical normalizes the logits twice, before and after masking
    torch.testing.assert_close(ours.log_prob(actions), reference_logprob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.entropy(), reference_entropy, rtol=1e-5, atol=1e-5)
    weights = torch.randn(64, generator=generator)
    ours_grad = torch.autograd.grad((weights * (ours.log_prob(actions) + 0.1 * ours.entropy())).sum(), logits)[0]
    reference_grad = torch.autograd.grad((weights * (reference_logprob + 0.1 * reference_entropy)).sum(), logits)[0]
    torch.testing.assert_close(ours_grad, reference_grad, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(ours_grad).all() and (ours_grad[~masks] == 0).all()


@pytest.mark.parametrize("nvec", [[5], [3, 2, 4]])
def test_forbidden_actions_are_never_drawn_nor_the_mode(nvec):
    generator = torch.Generator().manual_seed(1)
    space = ({"type": "Discrete", "n": nvec[0], "start": 0} if len(nvec) == 1
             else {"type": "MultiDiscrete", "shape": [len(nvec)], "nvec": nvec, "start": [0] * len(nvec)})
    actions_of = ppo.DiscreteActions(space)
    logits = torch.randn(4096, sum(nvec), generator=generator)
    masks = random_masks((4096,), nvec, generator)
    logits[~masks] += 20.0
    offsets = torch.tensor(np.cumsum([0, *nvec[:-1]]))
    for actions in (actions_of.distribution(logits, masks).sample(), actions_of.mode(logits, masks)):
        assert masks.gather(1, actions.reshape(4096, -1) + offsets).all()


@pytest.mark.parametrize("name", RUNS)
def test_every_trainer_learns_with_masks_and_never_takes_a_forbidden_action(ahead, name):
    """Each env raises at a forbidden action, so a run that took one would have failed; the update scores each
    rollout's actions under the masks they were drawn with (its first minibatch's ratios are 1 before any step: with
    another mask, or none, they would not be); the trained policy reaches the env's best return, and ppo_eval.py
    evaluates it with the masks (the env would raise otherwise)."""
    _, _, _, least = RUNS[name]
    directory, run_dir = ahead[name]
    logged = scalars(run_dir)
    assert max(value for _, value in logged["losses/first_minibatch_ratio_error"]) < 1e-5
    results = json.loads((directory / "eval.json").read_text())
    if least is not None:
        assert logged["eval/return"][-1][1] >= least and results["metrics"]["return"]["mean"] >= least


def test_rollout_stores_the_mask_each_observation_came_with(tmp_path):
    """MaskedChoice allows the target its observation shows and the next action: the buffer's mask of each step is
    the one of its observation, across episode ends (the mask after an autoreset is the new episode's, which differs
    from the ended episode's last in 18-step episodes)."""
    args = ppo.parse_args(fast_args("tests.envs:MaskedChoice-v0", "rollout", num_steps=40, max_episode_steps=18))
    envs = ppo.make_envs(args, False, torch.device("cpu"), evaluation=False, run_dir=tmp_path, num_eval_steps=16)
    try:
        agent = ppo.make_agent(args, envs)
        next_obs = envs.reset(seed=0)
        buf = ppo.RolloutBuffer(args.num_steps, envs, torch.device("cpu"))
        ppo.rollout(agent, envs, buf, next_obs, agent.get_action_and_value, None, args, "truncated")
    finally:
        envs.close()
    targets = buf.obs.argmax(-1)
    expected = torch.zeros_like(buf.action_masks)
    expected.scatter_(-1, targets[..., None], True).scatter_(-1, (targets[..., None] + 1) % 4, True)
    assert torch.equal(buf.action_masks, expected)
    assert buf.dones[17].all() and buf.obs[18].argmax(-1).eq(0).all()  # the rollout crossed an episode's end
    allowed = buf.action_masks.gather(-1, buf.actions[..., None])
    assert allowed.all()


def test_a_mask_that_allows_nothing_is_one_error_line(tmp_path, capfd):
    line = refused_in_one_line(ppo, fast_args("tests.envs:MaskedChoiceForbidsAll-v0", "none"), tmp_path, capfd,
                               whole_process=False)
    assert "tests.envs:MaskedChoiceForbidsAll-v0's info['action_mask'] allows no action in env 0 after step 5" in line
    line = refused_in_one_line(ippo, fast_args("pz:tests.pz_envs:meet", "none", max_episode_steps=8) + [
        "--env_kwargs", "masked=True", "forbid_all_at=3"], tmp_path, capfd, whole_process=False)
    assert "pz:tests.pz_envs:meet's action mask allows agent a no action in env 0 after step 3 of its episode" in line


def test_each_agents_exported_policy_takes_its_own_mask(ahead):
    """ippo.py's files, one an agent: agent b acts in Discrete(5), a in Discrete(3); each file takes its agent's
    observation and its own mask, and returns an action that the mask allows."""
    import onnxruntime

    directory, run_dir = ahead["ippo_agents"]
    path = directory / "policy.onnx"
    exported = run_script("ppo_eval.py", [str(run_dir), "--export", str(path)], directory)
    assert exported.returncode == 0, exported.stderr[-3000:]
    for name, width in (("a", 3), ("b", 5)):
        session = onnxruntime.InferenceSession(str(path.with_name(f"policy_{name}.onnx")))
        assert [spec.name for spec in session.get_inputs()] == ["obs", "action_mask"]
        masks = np.eye(width, dtype=bool)  # each row allows one action
        obs = np.random.default_rng(0).uniform(-1, 1, (width, 3)).astype(np.float32)
        assert session.run(None, {"obs": obs, "action_mask": masks})[0].tolist() == list(range(width))


def wider(info: dict, at_reset: bool, calls: int) -> dict:
    return {**info, "action_mask": np.concatenate([info["action_mask"], info["action_mask"]], axis=-1)}


def none_at_reset(info: dict, at_reset: bool, calls: int) -> dict:
    return {key: value for key, value in info.items() if key != "action_mask"} if at_reset else info


def none_after_three_steps(info: dict, at_reset: bool, calls: int) -> dict:
    return {key: value for key, value in info.items() if key != "action_mask"} if calls > 3 else info


def none_in_env_1(info: dict, at_reset: bool, calls: int) -> dict:
    return {**info, "_action_mask": np.array([True, False])}


def on_box_actions(info: dict, at_reset: bool, calls: int) -> dict:
    return {**info, "action_mask": np.ones((2, 2), dtype=bool)}


@pytest.mark.parametrize("change, env_id, error", [
    (wider, "tests.envs:MaskedChoice-v0", "info['action_mask'] has shape (2, 8): one mask of 4 entries per env"),
    # Taxi-v4's forbidden actions cost, where MaskedChoice's would raise at the first step, drawn without a mask
    (none_at_reset, "Taxi-v4", "gave info['action_mask'] now and none at reset: give it at reset and on"),
    (none_after_three_steps, "tests.envs:MaskedChoice-v0", "gave info['action_mask'] before and none now: give it"),
    (none_in_env_1, "tests.envs:MaskedChoice-v0", "gave info['action_mask'] in some envs and none in env 1"),
    (on_box_actions, "tests.envs:PointMass-v0", "gives info['action_mask'] and its actions are Box(-1.0, 1.0, (1,), "
                                                "float32): ppo.py masks Discrete and MultiDiscrete actions"),
])
def test_a_mask_the_trainer_cannot_use_is_one_error_line(tmp_path, capfd, monkeypatch, change, env_id, error):
    """Masks of another size than the action space's, given at some steps or in some envs only, or for actions that
    are not discrete: refused by name, never broadcast or dropped."""
    original, calls = ppo.TorchVecEnv.read_action_mask, []

    def changed(self, info, at_reset=False):
        calls.append(1)
        return original(self, change(info, at_reset, len(calls)), at_reset)
    monkeypatch.setattr(ppo.TorchVecEnv, "read_action_mask", changed)
    line = refused_in_one_line(ppo, fast_args(env_id, "refused"), tmp_path, capfd, whole_process=False)
    assert error in line


@pytest.mark.parametrize("trainer", [ppo, ippo])
def test_a_policy_that_drops_the_mask_is_stopped_before_the_env_steps(tmp_path, capfd, monkeypatch, trainer):
    """A copy whose distribution forgets the mask takes a forbidden action within a few steps: the trainer names it
    before the env receives it (the env would raise)."""
    monkeypatch.setattr(trainer.DiscreteActions, "masked", staticmethod(lambda logits, action_mask: logits))
    if trainer is ppo:
        argv = fast_args("tests.envs:MaskedChoice-v0", "dropped")
        error = r"the agent took action \d \(counted from 0\) in env \d, which tests.envs:MaskedChoice-v0's action "
    else:
        argv = fast_args("pz:tests.pz_envs:meet", "dropped", max_episode_steps=8) + ["--env_kwargs", "masked=True"]
        error = r"agent [ab] took action \d \(counted from 0\) in env \d, which its action mask forbids"
    line = refused_in_one_line(trainer, argv, tmp_path, capfd, whole_process=False)
    assert re.search(error, line), line


def test_the_export_refuses_a_copy_whose_policy_ignores_the_mask(tmp_path):
    """A copy whose deterministic action skips the mask (changed after its run: in training, its evaluation would stop
    at the first forbidden action): --export probes the policy with masks that forbid what it takes unmasked, and
    refuses it in one line."""
    source = (REPO / "ppo.py").read_text()
    honest = "return self.discrete_actions.mode(logits_or_mean, action_mask) if self.discrete else logits_or_mean"
    assert source.count(honest) == 1
    (tmp_path / "nomask.py").write_text(source)
    trained = run_script(str(tmp_path / "nomask.py"), fast_args("tests.envs:MaskedChoice-v0", "nomask"), tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (tmp_path / "nomask.py").write_text(source.replace(honest, honest.replace(", action_mask)", ")")))
    exported = run_script("ppo_eval.py", ["runs/nomask", "--export", str(tmp_path / "policy.pt2")], tmp_path)
    assert exported.returncode == 2 and "Traceback" not in exported.stderr, exported.stderr[-3000:]
    assert "nomask.py's get_action() takes actions that its action_mask forbids" in exported.stderr
    assert not (tmp_path / "policy.pt2").exists()


@pytest.mark.parametrize("suffix", [".onnx", ".pt2"])
def test_the_exported_policy_takes_the_mask_and_never_returns_a_forbidden_action(tmp_path, suffix):
    """The file takes (obs, action_mask); where the mask forbids the action the policy prefers, it returns the best
    allowed one, in the env's numbering (MaskedChoice's actions start at -1)."""
    trained = run_script("ppo.py", fast_args("tests.envs:MaskedChoice-v0", "export", **LEARN), tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    path = tmp_path / f"policy{suffix}"
    exported = run_script("ppo_eval.py", ["runs/export", "--export", str(path)], tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    description = json.loads(path.with_name(path.name + ".json").read_text())
    assert [spec["name"] for spec in description["inputs"]] == ["obs", "action_mask"]
    obs = torch.eye(4)  # targets 0..3, which the trained policy takes
    preferred = torch.zeros(4, 4, dtype=torch.bool)
    preferred[torch.arange(4), torch.arange(4)] = True
    others = ~preferred
    others[torch.arange(4), (torch.arange(4) + 2) % 4] = False  # two allowed, neither the target
    if suffix == ".pt2":
        policy = torch.export.load(str(path)).module()
        with torch.no_grad():
            take = [policy(obs, mask).numpy() for mask in (preferred, others)]
    else:
        import onnxruntime
        session = onnxruntime.InferenceSession(str(path))
        take = [session.run(None, {"obs": obs.numpy(), "action_mask": mask.numpy()})[0] for mask in (preferred, others)]
    assert take[0].tolist() == [-1, 0, 1, 2]
    assert others[torch.arange(4), torch.as_tensor(take[1]).long() + 1].all()


def test_seeds_and_resume_and_torchrun_with_masks(tmp_path):
    """--num_seeds with masks (each seed learns, its own block's masks: tests/test_seeds.py); --resume of a masked run
    after SIGTERM equals the uninterrupted run; two torchrun ranks step their own masked envs."""
    argv = dict(total_timesteps=32 * 60, eval_freq=15, num_seeds=2)
    full, cut = sigterm_beside_full_run("ppo.py", fast_args("tests.envs:MaskedChoice-v0", "full", **argv),
                                        fast_args("tests.envs:MaskedChoice-v0", "cut", **argv),
                                        tmp_path / "runs/cut/ckpt_15.pt", tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    resumed = run_script("ppo.py", ["--resume", "runs/cut"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for seed in (1, 2):
        a = load(tmp_path / f"runs/full/full__seed{seed}/final_ckpt.pt")["model"]
        b = load(tmp_path / f"runs/cut/cut__seed{seed}/final_ckpt.pt")["model"]
        assert all(torch.equal(a[key], b[key]) for key in a)
        assert scalars(tmp_path / f"runs/full/full__seed{seed}")["eval/return"][-1][1] == 16
    ranks = run_torchrun([str(REPO / "ppo.py"), *fast_args("tests.envs:MaskedChoice-v0", "ranks", **LEARN)], tmp_path)
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    assert scalars(tmp_path / "runs/ranks")["eval/return"][-1][1] == 16

