"""scripts/verify_copy.py: copies of the stock trainers keep the copy contract; a copy that breaks one of its rules is
caught by the check of that rule, which says what to change."""

import dataclasses
import importlib.util
import types

import pytest

from tests.util import REPO, run_python

LOGSTD = "            self.actor_logstd = nn.Parameter(torch.ones(1, action_dim) * log_std_init)\n"
END_ITERATION = ("            run.end_iteration(stats, episodes)  # TRY NOT TO MODIFY: checks, logs, evaluation, "
                 "checkpoints, signals\n")
INIT = "        self.obs_dim = obs_dim\n"
ACTOR_OBS = "        actor_obs = obs[..., :self.obs_dim]\n"
# name: (the check that catches it, ppo.py's lines replaced, the words of the failure)
SABOTAGES = {
    "a module variable that resume would lose": ("trains", [  # the run itself refuses it
        ("def ppo_loss(", "PENALTY = [1.0]  # a KL-penalty-like coefficient that update() adapts\n\n\ndef ppo_loss("),
        ("clipped_ratio).mean(-1)\n", "clipped_ratio).mean(-1) * PENALTY[0]\n"),
        ("    return {**stats, **optimizer.stats()}\n",
         "    PENALTY[0] *= 1.5\n    return {**stats, **optimizer.stats()}\n"),
    ], "the module variable PENALTY changed during training"),
    "a flag that update() adapts": ("trains", [
        ("    return {**stats, **optimizer.stats()}\n",
         "    args.clip_coef = max(0.05, args.clip_coef * 0.9)\n    return {**stats, **optimizer.stats()}\n"),
    ], "args.clip_coef changed during training"),
    "an Adam of train() whose moments resume loses": ("resume", [  # the learned entropy coefficient outside the Agent
        ("        self.obs_dim = obs_dim\n",
         "        self.obs_dim = obs_dim\n        self.log_ent_coef = nn.Parameter(torch.tensor(-4.6))\n"),
        ("    optimizer = make_optimizer(agent, args)\n",
         "    optimizer = make_optimizer(agent, args)\n"
         "    optimizer.ent_coef_optimizer = torch.optim.Adam([agent.log_ent_coef], lr=1e-3)\n"),
        ("        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
         "        loss = pg_loss - agent.log_ent_coef.exp().detach() * entropy_loss + v_loss * args.vf_coef\n"),
        ("        optimizer.step(loss, args.max_grad_norm)\n",
         "        optimizer.step(loss, args.max_grad_norm)\n        optimizer.ent_coef_optimizer.zero_grad()\n"
         "        (agent.log_ent_coef.exp() * (entropy_loss.detach() - 2.0)).sum().backward()\n"
         "        optimizer.ent_coef_optimizer.step()\n"),
    ], "the optimizer created at line"),
    "a squash that export misses": ("exports", [
        ("        action = env_action(self, action)\n",
         "        action = 0.5 * torch.tanh(env_action(self, action))\n"),
    ], "the exported policy gives"),
    "an action scale that evaluation alone applies": ("exports", [  # a replay of get_action() would pass it
        ("            action = agent.get_action(agent.normalize_obs(obs), deterministic, "
         "action_mask=eval_envs.action_mask)\n",
         "            action = 0.5 * agent.get_action(agent.normalize_obs(obs), deterministic,\n"
         "                                            action_mask=eval_envs.action_mask)\n"),
    ], "the exported policy gives"),
    "a draw from an unseeded generator": ("same_seed", [
        ("        buf.rewards[step] = reward * args.reward_scale\n",
         "        buf.rewards[step] = reward * args.reward_scale + 0.01 * float(np.random.default_rng().normal())\n"),
    ], "unseeded generator"),
    "a buffer that breaks --num_seeds": ("seeds", [
        ("        self.obs_dim = obs_dim\n",
         "        self.obs_dim = obs_dim\n        self.register_buffer(\"obs_scale\", torch.ones(obs_dim))\n"),
        ("        actor_obs = obs[..., :self.obs_dim]\n",
         "        actor_obs = obs[..., :self.obs_dim] * self.obs_scale\n"),
    ], "leading seed dimension"),
    "a draw of update() from torch's default generator": ("seeds", [  # its error line, not the Shapes rule
        ("        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
         "        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + 0.0 * torch.randn(())\n"),
    ], "inside optimizer.draws()"),
    "an action of the wrong width": ("trains", [  # evaluation acts with it: the run's evaluation stops it
        ("        return self.discrete_actions.mode(logits_or_mean, action_mask) if self.discrete else "
         "logits_or_mean\n",
         "        return self.discrete_actions.mode(logits_or_mean, action_mask) if self.discrete else "
         "logits_or_mean.repeat(1, 2)\n"),
    ], "takes (1,)"),
    # PPG's auxiliary phase every 4 iterations, its Adam in a variable of train(): a stop after iteration 2 would
    # pass it; the check stops after the auxiliary phase first changed the Agent
    "an auxiliary phase's Adam in train()": ("resume", [
        (LOGSTD, LOGSTD + "        self.aux_value = nn.Linear(action_dim, 1)\n"),
        ("    optimizer = make_optimizer(agent, args)\n",
         "    optimizer = make_optimizer(agent, args)\n"
         "    aux_optimizer = torch.optim.Adam([*agent.actor.parameters(), *agent.aux_value.parameters()], lr=1e-3)\n"),
        (END_ITERATION, "            if iteration % 4 == 0:\n"
                        "                aux_optimizer.zero_grad()\n"
                        "                aux = agent.aux_value(agent.actor(buf.rows(buf.obs)[..., :agent.obs_dim]))\n"
                        "                ((aux.squeeze(-1) - buf.rows(returns)) ** 2).mean().backward()\n"
                        "                aux_optimizer.step()\n" + END_ITERATION),
    ], "the optimizer created at line"),
    # the policy loss detached from the policy: finite numbers, a policy that never changes
    "a policy loss that does not reach the policy": ("trains", [
        ("    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean(-1)\n",
         "    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean(-1).detach()\n"),
    ], "losses/approx_kl is 0 (below 1e-8) in every update"),
    # a curriculum on the last evaluation's return, kept on the evaluation envs: lost by a resume after an evaluation
    "state that evaluation changes on its envs": ("resume", [
        ('    metrics["episodes"] = counted.sum(dtype=torch.float32).reshape(1)\n',
         '    metrics["episodes"] = counted.sum(dtype=torch.float32).reshape(1)\n'
         '    eval_envs.evaluated = True\n'),
        ("                stats = update_step(agent, optimizer, buf, advantages, returns, update_losses, args)\n",
         "                if getattr(eval_envs, 'evaluated', False):\n"
         "                    returns = returns * 0.5\n"
         "                stats = update_step(agent, optimizer, buf, advantages, returns, update_losses, args)\n"),
    ], "stopped after iteration"),
    # a bonus for each termination so far, counted in a Gymnasium wrapper that a resumed run builds anew
    "a termination count in a wrapper": ("resume", [
        ("def build_gym_env(", "class TerminationBonus(gym.Wrapper):\n    terminations = 0\n\n"
                               "    def step(self, action):\n"
                               "        obs, reward, terminated, truncated, info = self.env.step(action)\n"
                               "        self.terminations += int(terminated)\n"
                               "        return obs, reward + 0.01 * self.terminations, terminated, truncated, info\n"
                               "\n\ndef build_gym_env("),
        ("        return observed(gym.make(env_id, max_episode_steps=max_episode_steps), critic_obs)\n",
         "        return TerminationBonus(observed(gym.make(env_id, max_episode_steps=max_episode_steps), "
         "critic_obs))\n"),
    ], "stopped after iteration"),
    # a coupling of the seeds that starts once their log-stds part (after the first update, which the run checks):
    # 3e-5 at the end, within the old tolerance (rtol 1e-4, atol 1e-5), 500 times the stock trainer's rounding
    "a slight coupling of the seeds": ("seeds", [
        ("    return (pg_loss, v_loss, entropy.mean(-1)), logratio.detach(), ratio.detach()\n",
         "    v_loss = v_loss + 3.0 * (agent.actor_logstd.mean() + 0.5) ** 2\n"
         "    return (pg_loss, v_loss, entropy.mean(-1)), logratio.detach(), ratio.detach()\n"),
    ], "/actor_logstd (by"),
    # the advice of each names the real cause: the run's own error line
    "a random tensor outside the Agent's state": ("trains", [
        (INIT, INIT + "        self.projection = torch.randn(obs_dim, obs_dim)\n"),
        (ACTOR_OBS, ACTOR_OBS + "        actor_obs = actor_obs @ self.projection\n"),
    ], "Agent.projection differs between the Agents of two seeds"),
    # a population's setting (--pbt_interval) as one number: the population's first update names the rule
    "a searched setting read as a number": ("population", [
        ("        loss = pg_loss - args.ent_coef * entropy_loss", "        loss = pg_loss - float(args.ent_coef) * "
                                                                    "entropy_loss"),
    ], "holds one value per member"),
    "a counter in a buffer made persistent=False": ("trains", [
        (INIT, INIT + "        self.register_buffer('updates', torch.tensor(0), persistent=False)\n"),
        ("    return {**stats, **optimizer.stats()}\n",
         "    agent.updates += 1\n    return {**stats, **optimizer.stats()}\n"),
    ], "Agent.updates (a buffer made persistent=False) changed"),
}


# ippo.py's Agent written for one seed as it was before --num_seeds: the first iteration names the rule it breaks
ONE_SEED_AGENT = {
    "agent_ids": ("        x = torch.cat([x, self.agent_ids[..., None, :, :].expand(*x.shape[:-1], -1)], dim=-1)\n",
                  "        x = torch.cat([x, self.agent_ids.expand(x.shape[0], -1, -1)], dim=-1)\n"),
    "actor_logstd": ("        std = self.actor_logstd[..., None, :, :].expand_as(mean).exp()\n",
                     "        std = self.actor_logstd.expand_as(mean).exp()\n"),
}


@pytest.mark.parametrize("indexed", ONE_SEED_AGENT)
def test_an_ippo_copy_written_for_one_seed_is_told_the_rule(tmp_path, indexed, verify_cache):
    pytest.importorskip("vmas")
    old, new = ONE_SEED_AGENT[indexed]
    source = (REPO / "ippo.py").read_text()
    assert source.count(old) == 1, old
    result = verify(tmp_path, source.replace(old, new), "my_ippo", ["seeds"], verify_cache)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    found = rows(result.stdout)
    assert found["trains"][0] == "holds" and found["seeds"][0] == "fails", result.stdout
    assert "leading seed dimension" in found["seeds"][1], result.stdout


def verify(tmp_path, source: str, name: str, checks: list[str], cache=None):
    copy = tmp_path / f"{name}.py"
    copy.write_text(source)
    return run_python([str(REPO / "scripts/verify_copy.py"), str(copy), "--checks", *checks,
                       *([] if cache is None else ["--cache", str(cache)])], tmp_path, timeout=600)


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    cells = [line.strip("|").split(" | ") for line in stdout.splitlines() if line.startswith("| ")][1:]
    return {cells[0].strip(): (cells[1].strip(), cells[2].strip()) for cells in cells}


@pytest.mark.parametrize("sabotage", SABOTAGES)
def test_a_copy_that_breaks_a_rule_is_caught_and_told_what_to_change(tmp_path, sabotage, verify_cache):
    check, replacements, words = SABOTAGES[sabotage]
    if check == "exports":
        pytest.importorskip("onnxruntime")
    source = (REPO / "ppo.py").read_text()
    for old, new in replacements:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = verify(tmp_path, source, "my_idea", [check], verify_cache)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    found = rows(result.stdout)
    assert found[check][0] == "fails" and words in found[check][1], result.stdout
    assert check == "trains" or found["trains"][0] == "holds", result.stdout
    assert "failed:" not in found[check][1] or "follow 'Shapes'" not in found[check][1]  # a rule for numbers alone


@pytest.mark.parametrize("trainer", ["ppo_rnn", "ppo_rgb", "ippo"])
def test_the_stock_trainers_copies_keep_the_contract(tmp_path, trainer, verify_cache):
    """The checks that concern what a copy changes (the rest are shared code). ppo.py's copies pass every check in
    tests/test_recipes.py, each with a recipe applied."""
    if trainer == "ippo":
        pytest.importorskip("vmas")
    pytest.importorskip("onnxruntime")
    checks = ["resume", "seeds", "population", "exports"]
    result = verify(tmp_path, (REPO / f"{trainer}.py").read_text(), f"my_{trainer}", checks, verify_cache)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    found = rows(result.stdout)
    assert all(found[check][0] == "holds" for check in checks if check in found), result.stdout
    assert set(found) == {"trains", *checks} and f"my_{trainer}.py ({trainer}.py's copy)" in result.stdout


# PPG's auxiliary phase as the contract says to write it, every 32 iterations (PPG's default): in the check's runs of
# 8 iterations it runs in the first alone, so its head moves then alone
RARE_PHASE = [
    (LOGSTD, LOGSTD + "        self.aux_value = nn.Linear(action_dim, 1)\n"
                      "        self.aux_optimizer = torch.optim.Adam([*self.actor.parameters(), "
                      "*self.aux_value.parameters()], lr=1e-3)\n"
                      "        self.register_buffer('updates', torch.tensor(0))\n"),
    ("    return {**stats, **optimizer.stats()}\n",
     "    if int(agent.updates) % 32 == 0:\n"
     "        agent.aux_optimizer.zero_grad()\n"
     "        aux_values = agent.aux_value(agent.actor(b_obs[..., :agent.obs_dim])).squeeze(-1)\n"
     "        ((aux_values - b_returns) ** 2).mean(-1).sum().backward()\n"
     "        agent.aux_optimizer.step()\n"
     "    agent.updates += 1\n"
     "    return {**stats, **optimizer.stats()}\n"),
]


def test_an_own_phase_rarer_than_the_runs_is_no_false_verdict(tmp_path):
    source = (REPO / "ppo.py").read_text()
    for old, new in RARE_PHASE:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = verify(tmp_path, source, "my_ppg", ["trains"])
    assert result.returncode == 0 and rows(result.stdout)["trains"][0] == "holds", result.stdout + result.stderr[-3000:]


def test_a_file_that_is_no_module_is_refused_in_one_line(tmp_path):
    result = run_python([str(REPO / "scripts/verify_copy.py"), str(tmp_path / "my-idea.py")], tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("error:") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_no_false_verdict_on_an_env_whose_episodes_do_not_resume_alike(tmp_path, env_id):
    """A Gymnasium env starts other episodes after a resume (and float rounding may flip a discrete action): an
    unchanged copy passes, each row saying where it was checked (on the env, or on the test env of the same action
    space where the stock ppo.py's runs fail the check on the env too)."""
    copy = tmp_path / "my_stock.py"  # with a flag of its own, which the stock ppo.py's runs are not given
    copy.write_text((REPO / "ppo.py").read_text().replace(
        '    seed: int = 1\n', '    seed: int = 1\n    my_coef: float = 0.0\n    """a flag of the copy\'s"""\n'))
    result = run_python([str(REPO / "scripts/verify_copy.py"), str(copy), "--env_id", env_id, "--checks", "resume",
                         "seeds", "--flags", "--my_coef 0.1"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    found = rows(result.stdout)
    assert found["resume"][0] == found["seeds"][0] == "holds", result.stdout
    test_env = "tests.envs:PointMassHalves-v0" if env_id == "Pendulum-v1" else "tests.envs:PointMassHalvesDiscrete-v0"
    for check in ("resume", "seeds"):  # where: the env itself, or the test env after the stock failed there too
        how = found[check][1]
        assert how.endswith((f"on {env_id}", f"on {env_id} (the stock ppo.py holds there)",
                             f"on {test_env}: on {env_id} the stock ppo.py's runs fail it too")), how


def test_flags_with_or_without_values_and_bad_ones_in_one_line(tmp_path):
    copy = tmp_path / "my_idea.py"
    copy.write_text((REPO / "ppo.py").read_text())
    script = str(REPO / "scripts/verify_copy.py")
    taken = run_python([script, str(copy), "--flags", "--norm_obs", "--checks", "trains"], tmp_path)
    assert taken.returncode == 0 and rows(taken.stdout)["trains"][0] == "holds", taken.stdout + taken.stderr
    for argv, says in ((["--flags", "--bogus 1"], "error: --flags '--bogus 1': Unrecognized options: --bogus, 1"),
                       (["--flags=--hidden_sizes x"], "error: --flags '--hidden_sizes x': "),
                       ([], "error: pomdp.py is not a copy of a trainer"),
                       (["--checks", "speed"], "error: argument --checks: invalid choice: 'speed'")):
        target = str(REPO / "pomdp.py") if not argv else str(copy)
        result = run_python([script, target, *argv], tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(says), result.stderr


def test_no_false_verdict_on_a_recurrent_copy_on_pendulum(tmp_path):
    """The same for ppo_rnn.py's copies (ppo_rgb.py refuses a vector env, ippo.py needs agents)."""
    copy = tmp_path / "my_rnn.py"
    copy.write_text((REPO / "ppo_rnn.py").read_text())
    result = run_python([str(REPO / "scripts/verify_copy.py"), str(copy), "--env_id", "Pendulum-v1", "--checks",
                         "resume", "seeds"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert rows(result.stdout)["resume"][0] == rows(result.stdout)["seeds"][0] == "holds", result.stdout


def test_the_runs_leave_out_the_flags_a_copy_removed_and_take_its_changed_defaults():
    """own_flags(): a flag the copy's Args lacks (n-step advantages have no --gae_lambda) goes with its values;
    changed_defaults(): the stock trainer's runs that measure the seeds' rounding take the copy's own defaults."""
    spec = importlib.util.spec_from_file_location("verify_copy", REPO / "scripts/verify_copy.py")
    verify_copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verify_copy)

    @dataclasses.dataclass
    class Args:
        gamma: float = 0.99
        norm_adv: bool = False
        activation: str = "relu"
        hidden_sizes: tuple[int, ...] = (64, 64)
        n_step: int = 5
    copy = types.SimpleNamespace(Args=Args)
    argv = ["--gamma", "0.9", "--gae_lambda", "0.95", "--no_norm_adv", "--finite_horizon_gae", "--n_step", "3"]
    assert verify_copy.own_flags(argv, copy) == ["--gamma", "0.9", "--no_norm_adv", "--n_step", "3"]
    assert verify_copy.changed_defaults(copy, "ppo") == ["--gamma", "0.99", "--no_norm_adv", "--activation", "relu",
                                                         "--hidden_sizes", "64", "64"]
