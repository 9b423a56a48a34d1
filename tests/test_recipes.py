"""recipes/ (docs/recipes.md): each recipe applies to today's ppo.py, by patch(1) as by scripts/recipes.py; its copy
keeps the contract (scripts/verify_copy.py, every check), lints clean and learns PointMass; what each idea computes
against references written here (the n-step estimator, the dual-clip loss, RPO's shifted mean, RND's intrinsic
advantages, PPG's KL and replay, the learned coefficient's direction, the reward head's optimizer); a change to ppo.py
inside a recipe's lines fails `recipes.py check` by name and `recipes.py refresh` merges the recipe onto it;
docs/recipes.md's table gives each recipe's size as its patch has it."""

import copy
import functools
import importlib.util
import shutil
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import gymnasium as gym
import pytest
import torch

from tests.test_verify_copy import rows
from tests.util import REPO, load, run_python, run_scripts, scalars

RECIPES = sorted(path.stem for path in (REPO / "recipes").glob("*.patch"))
# Each recipe's own flags in verify_copy's runs of 8 iterations and in the learning run: PPG's auxiliary phase every
# 2 (4) iterations, so that the runs hold several; SimBa's blocks with tanh, since float rounding flips ReLU units
# at their kink between a seed batched and alone (1.3e-5 of a weight where the seeds check allows 3e-6)
VERIFY_FLAGS = {"ppg": "--ppg_n_pi 2", "simba": "--activation tanh"}
LEARN_FLAGS = {"ppg": ["--ppg_n_pi", "4"], "rpo": ["--total_timesteps", "16384"]}  # RPO's noise slows PointMass
POINT_MASS = ["--env_id", "tests.envs:PointMass-v0", "--num_envs", "4", "--num_steps", "64", "--num_minibatches", "4",
              "--update_epochs", "4", "--eval_freq", "4", "--no_capture_video", "--total_timesteps", "4096"]
PROMISED = -6.0  # PointMass's return: -16 where the policy does not move, -2.85 at best; ppo.py ends at -3.1


def tool(*arguments, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(cwd / "scripts/recipes.py"), *arguments], capture_output=True, text=True,
                          timeout=120)


def applied(tmp_path: Path, recipe: str) -> Path:
    copy = tmp_path / f"my_{recipe}.py"
    result = tool("apply", recipe, str(copy))
    assert result.returncode == 0, result.stdout + result.stderr
    return copy


def module_of(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_there_are_recipes_of_each_kind():
    assert len(RECIPES) >= 8, RECIPES
    kinds = {recipe: (REPO / "recipes" / f"{recipe}.patch").read_text().partition("Kind: ")[2].split(".")[0]
             for recipe in RECIPES}
    for kind in ("loss", "advantage estimator", "network", "module", "optimizer of its own over shared parameters",
                 "across iterations", "intrinsic reward"):
        assert any(kind in text for text in kinds.values()), (kind, kinds)


def test_every_recipe_applies_to_todays_trainer_by_patch_as_by_the_tool(tmp_path):
    result = tool("check")
    assert result.returncode == 0 and result.stdout.count(": applies") == len(RECIPES), result.stdout + result.stderr
    copies = [str(applied(tmp_path, recipe)) for recipe in RECIPES]
    linted = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(REPO / "ruff.toml"),
                             *copies], capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout  # each copy keeps the project's lines, as ppo.py does
    if shutil.which("patch") is None:
        pytest.skip("no patch(1) here: the tool's copies alone were checked")
    for recipe in RECIPES:
        copy = tmp_path / f"by_patch_{recipe}.py"
        shutil.copy(REPO / "ppo.py", copy)
        patched = subprocess.run(["patch", "-s", str(copy), str(REPO / "recipes" / f"{recipe}.patch")],
                                 capture_output=True, text=True)
        assert patched.returncode == 0, patched.stdout + patched.stderr
        assert copy.read_text() == (tmp_path / f"my_{recipe}.py").read_text(), recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_keeps_the_contract(tmp_path, recipe, verify_cache):
    pytest.importorskip("onnxruntime")
    copy = applied(tmp_path, recipe)
    flags = ["--flags", VERIFY_FLAGS[recipe]] if recipe in VERIFY_FLAGS else []
    result = run_python([str(REPO / "scripts/verify_copy.py"), str(copy), *flags, "--cache", str(verify_cache)],
                        tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    found = rows(result.stdout)
    assert set(found) == {"trains", "same_seed", "resume", "seeds", "population", "evaluates", "exports"}, result.stdout
    assert all(verdict == "holds" for verdict, _ in found.values()), result.stdout


def test_each_recipe_learns_point_mass(tmp_path):
    copies = [applied(tmp_path, recipe) for recipe in RECIPES]
    results = run_scripts([(str(copy), [*POINT_MASS, "--exp_name", copy.stem, *LEARN_FLAGS.get(recipe, [])])
                           for copy, recipe in zip(copies, RECIPES)], tmp_path)
    finals = {}
    for recipe, result in zip(RECIPES, results):
        assert result.returncode == 0, (recipe, result.stderr[-3000:])
        finals[recipe] = scalars(tmp_path / "runs" / f"my_{recipe}")["eval/return"][-1][1]
    assert all(final > PROMISED for final in finals.values()), finals
    # PPG's replay after 16 iterations of ppg_n_pi 4: each slot a rollout of its own
    replay = load(tmp_path / "runs/my_ppg/final_ckpt.pt")["model"]["replay_obs"]
    assert replay.shape[0] == 4 and all(slot.abs().sum() > 0 for slot in replay)
    assert all(not torch.equal(replay[i], replay[j]) for i in range(4) for j in range(i))


def test_n_step_advantages_against_a_loop_over_each_env_and_step(tmp_path):
    nstep = module_of(applied(tmp_path, "nstep"))
    generator = torch.Generator().manual_seed(0)
    num_steps, num_envs, gamma = 9, 3, 0.9
    rewards, values, bootstrap_values = (torch.randn(num_steps, num_envs, generator=generator) for _ in range(3))
    next_value = torch.randn(num_envs, generator=generator)
    dones = (torch.rand(num_steps, num_envs, generator=generator) < 0.25).float()
    bootstrap_values *= dones * (torch.rand(num_steps, num_envs, generator=generator) < 0.5)  # some truncated
    for n in (1, 3, num_steps + 5):
        expected = torch.zeros(num_steps, num_envs)
        for env in range(num_envs):
            for t in range(num_steps):
                discounted, discount = 0.0, 1.0
                for s in range(t, min(t + n, num_steps)):
                    discounted += discount * rewards[s, env]
                    discount *= gamma
                    if dones[s, env]:  # the episode ended: its final observation's value where it bootstraps, else 0
                        discounted += discount * bootstrap_values[s, env]
                        break
                    if s == num_steps - 1 or s == t + n - 1:
                        discounted += discount * (next_value[env] if s == num_steps - 1 else values[s + 1, env])
                expected[t, env] = discounted - values[t, env]
        got = nstep.compute_advantages(rewards, values, dones, bootstrap_values, next_value, gamma, n)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_dual_clip_caps_the_loss_of_negative_advantages_alone(tmp_path):
    dual_clip = module_of(applied(tmp_path, "dual_clip"))
    args = dual_clip.Args(norm_adv=False, clip_coef=0.2, dual_clip_coef=3.0)
    advantages = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0])
    ratios = torch.tensor([0.5, 2.0, 5.0, 5.0, 0.5])

    class Policy(torch.nn.Module):  # log-probabilities that give these ratios against old log-probabilities of 0
        value_normalizer = None

        def get_action_and_value(self, obs, actions, action_mask=None):
            return None, ratios.log(), torch.zeros(5), torch.zeros(5)
    (pg_loss, _, _), _, _ = dual_clip.ppo_loss(Policy(), args, None, None, torch.zeros(5), advantages,
                                               torch.zeros(5), torch.zeros(5))
    # PPO's clipped surrogate per row: 0.8, 2.0, 5.0, -1.2, -0.5; the dual clip caps the negative advantages' at 3
    assert torch.isclose(pg_loss, torch.tensor([0.8, 2.0, 3.0, -1.2, -0.5]).mean()), pg_loss


def fresh(module, **flags):
    """A fresh Agent of the copy, its optimizer and Args, and a rollout of 8 steps of 4 envs of random observations
    (3 dims) with the policy's actions (2 dims) and random advantages."""
    torch.manual_seed(0)
    args = module.Args(num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1, target_kl=None, **flags)
    envs = types.SimpleNamespace(batch_shape=(4,), obs_dim=3, critic_dim=0, action_mask=None,
                                 single_action_space=gym.spaces.Box(-1.0, 1.0, (2,)))
    agent = module.make_agent(args, envs)
    buf = module.RolloutBuffer(8, envs, torch.device("cpu"))
    buf.obs.normal_()
    with torch.no_grad():
        buf.actions[:], buf.logprobs[:], _, buf.values[:] = agent.get_action_and_value(buf.obs)
    advantages = torch.randn(8, 4)
    return agent, module.make_optimizer(agent, args), args, buf, advantages, advantages + buf.values


def one_update(module, **flags):
    agent, optimizer, args, buf, advantages, returns = fresh(module, **flags)
    module.update(agent, optimizer, buf, advantages, returns, functools.partial(module.ppo_loss, agent, args), args)
    return agent


def test_the_learned_entropy_coefficient_grows_below_its_target_and_shrinks_above(tmp_path):
    learned_entropy = module_of(applied(tmp_path, "learned_entropy"))
    start = fresh(learned_entropy)[0].log_ent_coef.item()  # the policy's entropy: 1.84 (2 dims at log-std -0.5)
    assert one_update(learned_entropy, target_entropy=10.0).log_ent_coef.item() > start
    assert one_update(learned_entropy, target_entropy=-10.0).log_ent_coef.item() < start


def test_rpo_scores_the_rollouts_actions_under_a_mean_shifted_by_uniform_noise(tmp_path):
    rpo = module_of(applied(tmp_path, "rpo"))
    agent, _, args, buf, advantages, returns = fresh(rpo, rpo_alpha=0.5)
    obs, actions, logprobs = buf.rows(buf.obs), buf.rows(buf.actions), buf.rows(buf.logprobs)
    rows = (obs, actions, logprobs, buf.rows(advantages), buf.rows(returns), buf.rows(buf.values))
    torch.manual_seed(1)
    _, logratio, _ = rpo.ppo_loss(agent, args, *rows)
    torch.manual_seed(1)  # the same draw, made here: the mean shifted by it scores the actions
    mean = agent.actor(obs)
    shifted = torch.distributions.Normal(mean + torch.empty_like(mean).uniform_(-0.5, 0.5),
                                         agent.actor_logstd.exp())
    torch.testing.assert_close(logratio, shifted.log_prob(actions).sum(-1) - logprobs, rtol=1e-5, atol=1e-5)
    _, unshifted, _ = rpo.ppo_loss(agent, rpo.Args(rpo_alpha=0.0), *rows)  # the rollout's own policy
    assert unshifted.abs().max() == 0


def test_rnd_intrinsic_advantages_against_a_loop_over_steps_that_runs_on_across_episodes(tmp_path):
    rnd = module_of(applied(tmp_path, "rnd"))
    agent, _, args, buf, _, _ = fresh(rnd, int_gamma=0.9, gae_lambda=0.8)
    buf.dones.bernoulli_(0.3)  # episode ends, which intrinsic returns run on across
    with torch.no_grad():
        for _ in range(2):  # the running return and its statistics carry over to the next rollout
            next_obs = torch.randn(4, 3)
            returns_before, rms = agent.int_return.clone(), copy.deepcopy(agent.int_return_rms)
            got = rnd.intrinsic_advantages(agent, buf, next_obs, args)
            novelty = [((agent.rnd_predictor(o.clamp(-5, 5)) - agent.rnd_target(o.clamp(-5, 5))) ** 2).mean(-1)
                       for o in [*buf.obs[1:], next_obs]]
            discounted, seen = returns_before, []
            for reward in novelty:
                discounted = 0.9 * discounted + reward
                seen.append(discounted)
            seen = torch.stack(seen).reshape(-1).double()  # a two-pass variance merged with the running one
            count, total = rms.count, rms.count + seen.numel()
            delta = seen.mean() - rms.mean
            variance = (rms.var * count + seen.var(unbiased=False) * seen.numel() + delta**2 * count * seen.numel()
                        / total) / total
            rewards = torch.stack(novelty) / torch.sqrt(variance + 1e-8).float()
            values = torch.stack([agent.get_int_value(o) for o in buf.obs])
            next_values = torch.cat([values[1:], agent.get_int_value(next_obs)[None]])
            expected, running = torch.zeros(8, 4), torch.zeros(4)
            for t in reversed(range(8)):
                running = rewards[t] + 0.9 * next_values[t] - values[t] + 0.9 * 0.8 * running
                expected[t] = running
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(buf.int_returns, expected + values, rtol=1e-5, atol=1e-5)


def test_ppgs_auxiliary_phase_holds_the_policy_by_the_kl_from_the_old_policy(tmp_path):
    ppg = module_of(applied(tmp_path, "ppg"))
    agent, optimizer, args, buf, _, returns = fresh(ppg, ppg_n_pi=2, ppg_aux_epochs=1)
    agent.replay_obs.normal_()
    agent.replay_returns.normal_()
    before = {name: p.clone() for name, p in agent.named_parameters()}
    with mock.patch.object(torch.distributions, "kl_divergence", wraps=torch.distributions.kl_divergence) as kl:
        losses = ppg.auxiliary_phase(agent, optimizer, args)
    old, new = kl.call_args_list[0].args
    assert not old.base_dist.loc.requires_grad and new.base_dist.loc.requires_grad  # KL(old || new), PPG's
    assert kl.call_count == 4 and losses["losses/aux_kl"] >= 0  # 2 rollouts of 32 rows, minibatches of 16
    assert all(not torch.equal(p, before[name]) for name, p in agent.named_parameters())  # the aux head's too


def test_the_reward_head_trains_with_the_actors_hidden_layers(tmp_path):
    aux_head = module_of(applied(tmp_path, "aux_head"))
    agent = fresh(aux_head)[0]
    stepped = {id(p) for group in agent.aux_optimizer.param_groups for p in group["params"]}
    assert stepped == {id(p) for p in (*agent.actor[:-1].parameters(), *agent.reward_head.parameters())}
    head = agent.reward_head.weight.clone()
    assert not torch.equal(one_update(aux_head).reward_head.weight, head)  # PPO's loss leaves it out


def test_a_change_inside_a_recipes_lines_is_named_and_refresh_merges_the_recipe(tmp_path):
    for path in ("ppo.py", "scripts/recipes.py", "recipes/dual_clip.patch"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    # the recipe written against this checkout's ppo.py, whose blob `write` keeps in its objects
    written = tmp_path / "written.py"
    assert tool("apply", "dual_clip", str(written), cwd=tmp_path).returncode == 0
    assert tool("write", "dual_clip", str(written), cwd=tmp_path).returncode == 0
    written.unlink()
    # a line of the hunk's context, two lines from the recipe's own (git merge-file calls a change next to them a
    # conflict)
    old = '    """normalize advantages per minibatch"""\n'
    new = '    """normalize the advantages of each minibatch"""\n'
    trainer = (tmp_path / "ppo.py").read_text()
    assert trainer.count(old) == 1
    (tmp_path / "ppo.py").write_text(trainer.replace(old, new))

    checked = tool("check", cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "dual_clip.patch: hunk 1 (line " in checked.stdout and "normalize advantages" in checked.stdout
    assert "recipes.py refresh dual_clip" in checked.stdout
    refreshed = tool("refresh", cwd=tmp_path)
    assert refreshed.returncode == 0 and "dual_clip: refreshed" in refreshed.stdout, refreshed.stdout + refreshed.stderr
    copy = tmp_path / "my_dual_clip.py"
    assert tool("apply", "dual_clip", str(copy), cwd=tmp_path).returncode == 0
    (tmp_path / "stock").mkdir()
    expected = applied(tmp_path / "stock", "dual_clip").read_text().replace(old, new)
    assert copy.read_text() == expected
    assert tool("refresh", cwd=tmp_path).stdout == "dual_clip: unchanged\n"  # its index names today's ppo.py now
    text = (tmp_path / "recipes/dual_clip.patch").read_text()
    assert text.split("diff --git")[0] == (REPO / "recipes/dual_clip.patch").read_text().split("diff --git")[0]

    # a change of the line the recipe replaces: a conflict, left to the author in one line, the recipe as it was
    subprocess.run([*git, "hash-object", "-w", "ppo.py"], check=True, capture_output=True)
    line = "    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean(-1)\n"
    (tmp_path / "ppo.py").write_text((tmp_path / "ppo.py").read_text().replace(line, line.replace("max", "maximum")))
    conflicted = tool("refresh", cwd=tmp_path)
    assert conflicted.returncode == 1 and conflicted.stdout.count("\n") == 1, conflicted.stdout + conflicted.stderr
    assert "conflicts with today's ppo.py in 1 place(s)" in conflicted.stdout
    assert (tmp_path / "recipes/dual_clip.patch").read_text() == text


def test_the_docs_table_gives_each_recipes_size_as_its_patch_has_it():
    table = (REPO / "docs/recipes.md").read_text()
    for recipe in RECIPES:
        text = (REPO / "recipes" / f"{recipe}.patch").read_text().split("\n--- a/")[1]
        added = sum(line.startswith("+") for line in text.splitlines()[2:])
        removed = sum(line.startswith("-") for line in text.splitlines()[2:])
        row = next((line for line in table.splitlines() if line.startswith(f"| [`{recipe}`]")), None)
        assert row is not None, recipe
        assert f"+{added} -{removed}" in row, (recipe, added, removed, row)
