"""A copy's own state (ppo.py's docstring, 'A copy's contract'): what a copy adds to the Agent (parameters, a counter
buffer, an optimizer of its own) is saved, resumed bit for bit and given to each seed of --num_seeds as a run of that
seed alone has it; what is not state (the flags, a module variable, a Python attribute) is refused when an update
changes it; a flag a copy removed is one error line."""

import contextlib
import dataclasses
import importlib.util
import random
import re
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

import ppo
from tests.util import REPO, fast_args, load, refused_in_one_line, run_scripts, scalars

# The docstring's learned entropy coefficient with its own Adam (a large learning rate, so that losing Adam's moments
# would show within 4 iterations), and a counter of updates in an integer buffer.
LEARNED_ENT_COEF = (
    ("        self.obs_dim = obs_dim\n",
     "        self.obs_dim = obs_dim\n"
     "        self.log_ent_coef = nn.Parameter(torch.tensor(-4.6))\n"
     "        self.ent_coef_optimizer = torch.optim.Adam([self.log_ent_coef], lr=1e-1)\n"
     "        self.register_buffer(\"updates\", torch.tensor(0))\n"),
    ("        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef\n",
     "        loss = pg_loss - agent.log_ent_coef.exp().detach() * entropy_loss + v_loss * args.vf_coef\n"),
    ("        optimizer.step(loss, args.max_grad_norm)\n",
     "        optimizer.step(loss, args.max_grad_norm)\n"
     "        for group in agent.ent_coef_optimizer.param_groups:  # the scheduler's advice: lr from a counter\n"
     "            group['lr'] = 1e-1 / (1 + agent.updates)\n"
     "        agent.ent_coef_optimizer.zero_grad()\n"
     "        (agent.log_ent_coef.exp() * (entropy_loss.detach() - 2.0)).sum().backward()\n"
     "        agent.ent_coef_optimizer.step()\n"),
    ("    return {**stats, **optimizer.stats()}\n",
     "    agent.updates += 1\n    return {**stats, **optimizer.stats()}\n"),
)
ENV = "tests.envs:PointMass-v0"


def edited(edits, name: str, folder: Path) -> Path:
    source = (REPO / "ppo.py").read_text()
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def same(a: dict, b: dict, exact: bool = True) -> list[str]:
    """Where two checkpoints' model and optimizer states differ."""
    found = [key for key in a["model"] if not (torch.equal(a["model"][key], b["model"][key]) if exact else
                                               torch.allclose(a["model"][key].double(), b["model"][key].double(),
                                                              rtol=1e-5, atol=1e-6))]
    if exact and str(a["optimizer"]) != str(b["optimizer"]):
        found.append("optimizer")
    return found


def test_a_learned_entropy_coefficient_with_its_own_adam_resumes_and_runs_per_seed(tmp_path):
    copy = str(edited(LEARNED_ENT_COEF, "my_ent", tmp_path))
    example = ppo.__doc__.split("A learned entropy coefficient:\n")[1].split("\n- Refused")[0]
    for line in example.splitlines():  # the docstring's example, as this copy has it
        code = line.split("  #")[0].strip().replace("lr=1e-3", "lr=1e-1").replace("target_entropy", "2.0")
        assert code.removesuffix(" + ...") in Path(copy).read_text(), code

    def argv(name, iterations, **flags):
        return fast_args(ENV, name, total_timesteps=32 * iterations, target_kl=0.0005, **flags)
    results = run_scripts([(copy, argv("whole", 4)), (copy, argv("part", 2)), (copy, argv("batch", 4, num_seeds=2)),
                           (copy, argv("alone2", 4, seed=2)), (copy, argv("bpart", 2, num_seeds=2))], tmp_path)
    results += run_scripts([(copy, ["--resume", "runs/part", "--total_timesteps", "128"]),
                            (copy, ["--resume", "runs/bpart", "--total_timesteps", "128"]),
                            ("ppo_eval.py", ["runs/batch/batch__seed2", "--num_episodes", "2", "--trainer", copy])],
                           tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    runs = tmp_path / "runs"
    whole = load(runs / "whole/final_ckpt.pt")
    own = whole["optimizer"]["own_optimizers"]["ent_coef_optimizer"]
    assert whole["model"]["log_ent_coef"] != -4.6 and whole["model"]["updates"] == 4 and own["state"][0]["step"] > 0
    # PPO's Adam holds the Agent's parameters (no buffer: updates), and never stepped log_ent_coef, which its loss
    # detaches: no state for it
    assert len(whole["optimizer"]["param_groups"][0]["params"]) == len(whole["model"]) - 1
    assert 0 not in whole["optimizer"]["state"] and len(whole["optimizer"]["state"]) == len(whole["model"]) - 2
    assert same(whole, load(runs / "part/final_ckpt.pt")) == []  # resumed bit for bit, Adam's moments included

    steps = []
    for seed, alone in ((1, whole), (2, load(runs / "alone2/final_ckpt.pt"))):
        in_batch = load(runs / f"batch/batch__seed{seed}/final_ckpt.pt")
        assert same(alone, in_batch, exact=False) == [], seed
        assert in_batch["model"]["updates"] == 4
        alone_own, batch_own = (ckpt["optimizer"]["own_optimizers"]["ent_coef_optimizer"] for ckpt in
                                (alone, in_batch))
        assert [{**group, "lr": float(group["lr"])} for group in alone_own["param_groups"]] == batch_own["param_groups"]
        assert batch_own["param_groups"][0]["lr"] == pytest.approx(1e-1 / 4)  # after 3 updates: each seed its own
        steps.append(batch_own["state"][0]["step"])
        assert steps[-1] == alone_own["state"][0]["step"]  # a seed whose update stopped took no step of its own
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(batch_own["state"][0][key], alone_own["state"][0][key])
        assert same(in_batch, load(runs / f"bpart/bpart__seed{seed}/final_ckpt.pt")) == []
    assert steps[0] != steps[1]  # the seeds' updates stopped at different minibatches: the test can tell
    assert "return" in results[-1].stdout


# What is not state, changed by an update: each refused in one line that names it.
RETURN = "    return {**stats, **optimizer.stats()}\n"
INIT = "        self.obs_dim = obs_dim\n"
ACTOR_OBS = "        actor_obs = obs[..., :self.obs_dim]\n"
NORMALIZE = "    def normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:\n"
CONSTANT = "CHECKPOINT_FORMAT = 2\n"
NOT_STATE = {
    "args": ((("    return {**stats, **optimizer.stats()}\n",
               "    args.clip_coef = args.clip_coef * 0.9\n    return {**stats, **optimizer.stats()}\n"),),
             "args.clip_coef changed during training"),
    "global": ((("CHECKPOINT_FORMAT = 2\n", "CHECKPOINT_FORMAT = 2\nKL_SEEN = 0.0\n"),
                ("    return {**stats, **optimizer.stats()}\n",
                 "    global KL_SEEN\n    KL_SEEN = float(stats['losses/approx_kl'])\n"
                 "    return {**stats, **optimizer.stats()}\n")),
               "the module variable KL_SEEN changed during training"),
    "attribute": ((("        self.obs_dim = obs_dim\n", "        self.obs_dim = obs_dim\n        self.kl_seen = 0.0\n"),
                   ("    return {**stats, **optimizer.stats()}\n",
                    "    agent.kl_seen = float(stats['losses/approx_kl'])\n"
                    "    return {**stats, **optimizer.stats()}\n")),
                  "Agent.kl_seen changed during training"),
    "numpy_scalar": (((INIT, INIT + "        self.updates_seen = 0\n"),
                      (RETURN, "    agent.updates_seen = np.int64(agent.updates_seen + 1)\n" + RETURN)),
                     "Agent.updates_seen changed during training"),
    "class_attribute": (((NORMALIZE, "    updates_seen = 0\n\n" + NORMALIZE),
                         (RETURN, "    Agent.updates_seen += 1\n" + RETURN)),
                        "the class attribute Agent.updates_seen changed during training"),
    "closure": (((CONSTANT, CONSTANT + "\n\ndef make_counter():\n    count = [0]\n\n    def counter():\n"
                  "        count[0] += 1\n    return counter\n\n\ncount_updates = make_counter()\n"),
                 (RETURN, "    count_updates()\n" + RETURN)),
                "the default arguments and closure of count_updates() changed during training"),
    "mutable_default": (((CONSTANT, CONSTANT + "\n\ndef remember(kl, seen=[]):\n    seen.append(kl)\n"),
                         (RETURN, "    remember(float(stats['losses/approx_kl']))\n" + RETURN)),
                        "the default arguments and closure of remember() changed during training"),
    "optimizer_attribute": ((("        super().__init__(self.parameter_groups(agent), lr=lr, eps=1e-5, fused=True)\n",
                              "        super().__init__(self.parameter_groups(agent), lr=lr, eps=1e-5, fused=True)\n"
                              "        self.lr_scale = 1.0\n"),
                             (RETURN, "    optimizer.lr_scale *= 0.99\n" + RETURN)),
                            "the PPO optimizer's lr_scale changed during training"),
    "random_random_on_the_agent": (((INIT, INIT + "        self.rng = random.Random(0)\n"),
                                    (ACTOR_OBS, ACTOR_OBS + "        actor_obs = actor_obs * (1 + 1e-3 * "
                                                            "self.rng.random())\n")),
                                   "Agent.rng changed during training"),
    "plain_object": (((CONSTANT, CONSTANT + "\n\nclass Tally:\n    def __init__(self):\n        self.updates = 0\n"),
                      (INIT, INIT + "        self.tally = Tally()\n"),
                      (RETURN, "    agent.tally.updates += 1\n" + RETURN)),
                     "Agent.tally changed during training"),
    "non_persistent_buffer": (((INIT, INIT + "        self.register_buffer('updates', torch.tensor(0.0), "
                                             "persistent=False)\n"),
                               (RETURN, "    agent.updates += 1\n" + RETURN)),
                              "Agent.updates (a buffer made persistent=False) changed during training"),
    "optimizer_in_a_module_variable": (((CONSTANT, CONSTANT + "AUX_OPTIMIZER = None\n"),
                                        (RETURN, "    global AUX_OPTIMIZER\n    if AUX_OPTIMIZER is None:\n"
                                                 "        AUX_OPTIMIZER = torch.optim.Adam(agent.critic.parameters())\n"
                                         + RETURN)),
                                       "the module variable AUX_OPTIMIZER changed during training"),
    # another library's objects: by their attributes (an intrinsic reward's running std), or their state_dict()
    "library_object": (((INIT, INIT + "        self.bonus_std = gym.wrappers.utils.RunningMeanStd(shape=())\n"),
                        (RETURN, "    agent.bonus_std.update(b_returns.detach().cpu().numpy().reshape(-1))\n"
                                 + RETURN)),
                       "Agent.bonus_std changed during training"),
    "plateau_scheduler": (((INIT, INIT + "        self.ent_coef = nn.Parameter(torch.tensor(0.0))\n"
                                         "        self.ent_coef_optimizer = torch.optim.SGD([self.ent_coef], lr=1e-3)\n"
                                         "        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau("
                                         "self.ent_coef_optimizer)\n"),
                           (RETURN, "    agent.plateau.step(float(stats['losses/value_loss'].mean()))\n" + RETURN)),
                          "Agent.plateau changed during training"),
    "scheduler_in_train": ((("    optimizer = make_optimizer(agent, args)\n",
                             "    optimizer = make_optimizer(agent, args)\n"
                             "    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)  # noqa: F841\n"),),
                           "a learning-rate scheduler steps the PPO optimizer"),
}


def import_copy(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind", NOT_STATE)
def test_state_outside_the_agent_is_refused(tmp_path, capfd, kind):
    edits, says = NOT_STATE[kind]
    module = import_copy(edited(edits, f"my_{kind}", tmp_path))
    line = refused_in_one_line(module, fast_args(ENV, "r", total_timesteps=64), tmp_path, capfd,
                               whole_process=False)
    assert says in line and ("keep state that changes in the Agent" in line or "schedule_learning_rate" in line), line


def test_a_copy_without_a_flag_runs_or_names_the_line_that_reads_it(tmp_path, capfd):
    """Each flag of Args removed in turn from a copy (and from its command line): the copy runs, or stops with one
    error line that names the flag and the line of the copy that reads it."""
    source = (REPO / "ppo.py").read_text()
    flags = dict(env_id=ENV, num_envs=2, num_steps=16, num_minibatches=2, update_epochs=1, total_timesteps=32,
                 eval_freq=1, num_eval_envs=1, capture_video=False)
    ran = []
    for field in dataclasses.fields(ppo.Args):
        declaration = re.compile(rf"^    {field.name}: .*\n    \"\"\"(?:.|\n)*?\"\"\"\n", re.M)
        assert len(declaration.findall(source)) == 1, field.name
        path = tmp_path / f"no_{field.name}.py"
        path.write_text(declaration.sub("", source))
        module = import_copy(path)
        argv = [word for key, value in {**flags, "exp_name": field.name}.items() if key != field.name
                for word in ([f"--no_{key}"] if value is False else [f"--{key}", str(value)])]
        with contextlib.chdir(tmp_path):
            status = module.cli(argv)
        stderr = capfd.readouterr().err
        assert "Traceback" not in stderr, (field.name, stderr)
        if status == 0:
            ran.append(field.name)
            continue
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert status == 2 and len(errors) == 1, (field.name, stderr)
        lineno = int(re.search(rf"Args has no {field.name}, which line (\d+) ", errors[0]).group(1))
        assert f"args.{field.name}" in path.read_text().splitlines()[lineno - 1], (field.name, errors[0])
    assert {"wandb_project_name", "kl_target"} <= set(ran)  # flags read only where they are given


def test_after_an_update_every_seed_steps_again():
    """An optimizer of the Agent's own stepped after update() steps every seed, also those whose update stopped
    early (SeedSteps reads SeedOptimizer.going, which holds while the update's minibatches are drawn)."""
    agent = ppo.stack_seeds([torch.nn.Linear(2, 1) for _ in range(2)])
    agent.generators = [torch.Generator().manual_seed(seed) for seed in range(2)]
    optimizer = ppo.SeedOptimizer(agent, 1e-3)
    for _ in optimizer.minibatches(4, 2, 2):
        if optimizer.stop(torch.tensor([True, False])):
            break
        assert optimizer.going == [False, True]
        break  # an update cut short by its caller
    assert optimizer.going == [True, True] and bool(optimizer.stepping.all())


def test_own_optimizers_are_refused_under_torchrun(monkeypatch):
    """Their gradients are not averaged over the ranks: one error line, not ranks that part."""
    agent = torch.nn.Linear(2, 1)
    agent.extra_optimizer = torch.optim.Adam(agent.parameters())
    monkeypatch.setattr(ppo, "world_size", lambda: 2)
    with pytest.raises(ppo.UserError, match=r"own optimizers \(extra_optimizer\) do not work under torchrun"):
        ppo.make_optimizer(agent, ppo.Args())


class WithOwnOptimizer(torch.nn.Module):
    """A network with a parameter of its own optimizer's, as a copy's Agent has one."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.coef = torch.nn.Parameter(torch.zeros(()))
        self.coef_optimizer = torch.optim.Adam([self.coef], lr=0.1)


def test_an_own_optimizers_parameters_are_stepped_by_ppo_where_its_loss_reaches_them():
    """PPO's optimizer holds the own optimizer's parameter too, with one seed or many, and steps it only where PPO's
    loss gave it a gradient; the same optimizer under two names is one; a tensor that is no parameter of the Agent is
    refused under --num_seeds."""
    for num_seeds in (1, 2):
        agent = ppo.stack_seeds([WithOwnOptimizer() for _ in range(num_seeds)])
        agent.alias = agent.coef_optimizer
        if num_seeds > 1:
            agent.generators = [torch.Generator().manual_seed(seed) for seed in range(num_seeds)]
        optimizer = ppo.make_optimizer(agent, ppo.Args())
        assert list(ppo.own_optimizers(agent)) == ["coef_optimizer"]
        optimizer.zero_grad()
        optimizer.step(torch.zeros(num_seeds) if num_seeds > 1 else torch.tensor(0.0), 0.5)  # no gradient: no step
        assert bool((agent.coef == 0).all()), num_seeds
        agent.coef.grad = torch.ones_like(agent.coef)
        agent.coef_optimizer.step()
        assert bool((agent.coef != 0).all()), num_seeds
        moved = agent.coef.detach().clone()
        agent.coef.grad = torch.ones_like(agent.coef)
        optimizer.step(torch.zeros(num_seeds) if num_seeds > 1 else torch.tensor(0.0), 0.5)  # PPO's gradient: a step
        assert bool((agent.coef != moved).all()), num_seeds
    loose = WithOwnOptimizer()
    loose.coef_optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    with pytest.raises(ppo.UserError, match="steps a tensor that is none of the Agent's parameters"):
        ppo.stack_seeds([loose, WithOwnOptimizer()])


def test_what_unsaved_state_compares():
    """Constant values (NaN included) are unchanged; containers are compared by content; a learning-rate scheduler
    on the Agent, whose state checkpoints do not save, is refused; an optimizer made after PPO's too."""
    assert ppo.same_data(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    assert ppo.same_data(np.array([np.nan]), np.array([np.nan])) and not ppo.same_data(torch.zeros(1), np.zeros(1))
    assert ppo.same_data(ppo.fingerprint(deque([1.0, torch.ones(1)])), [1.0, torch.ones(1)])
    assert ppo.fingerprint(np.int64(3)) == 3 and ppo.fingerprint([object()]) == ["<object>"]
    assert not ppo.same_data(ppo.fingerprint(random.Random(1)), ppo.fingerprint(random.Random(2)))
    assert not ppo.same_data(deque([1, 2]), deque([1, 3])) and ppo.same_data({1, 2}, {2, 1})
    agent = WithOwnOptimizer()
    optimizer = ppo.make_optimizer(agent, ppo.Args())
    unsaved = ppo.UnsavedState(agent, ppo.Args(), optimizer)
    unsaved.refuse_changes()
    agent.coef_optimizer = torch.optim.Adam([agent.coef])  # remade: PPO's optimizer knew the first
    with pytest.raises(ppo.UserError, match="own optimizers are not those it had when the PPO optimizer was made"):
        unsaved.refuse_changes()
    agent = WithOwnOptimizer()
    unsaved = ppo.UnsavedState(agent, ppo.Args(), ppo.make_optimizer(agent, ppo.Args()))
    torch.optim.lr_scheduler.LinearLR(agent.coef_optimizer)  # made in train(), say: it wraps the optimizer's step()
    with pytest.raises(ppo.UserError, match="a learning-rate scheduler steps coef_optimizer"):
        unsaved.refuse_changes()


def test_frozen_and_unused_parameters_under_num_seeds():
    """A frozen network (RND's target: requires_grad_(False)) stays frozen in the stack, and PPO's optimizer leaves
    it out; a parameter the loss does not reach (an idle head) gets no step and no crash; a stacked network takes
    inputs of any leading shape after the seeds' dimension."""
    class Network(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
            self.target = torch.nn.Linear(2, 1).requires_grad_(False)
            self.idle = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.net(x)
    agent = ppo.stack_seeds([Network() for _ in range(2)])
    agent.generators = [torch.Generator().manual_seed(seed) for seed in range(2)]
    assert not agent.target.weight.requires_grad and agent.idle.weight.requires_grad
    optimizer = ppo.make_optimizer(agent, ppo.Args())
    assert not any(p is agent.target.weight for group in optimizer.param_groups for p in group["params"])
    idle, target = agent.idle.weight.detach().clone(), agent.target.weight.detach().clone()
    x = torch.randn(2, 4, 5, 2)
    assert agent(x).shape == (2, 4, 5, 1)
    with pytest.raises(ppo.UserError, match=r"takes \(seeds, \.\.\., in\), not \(3, 2, 2\)"):
        agent(torch.randn(3, 2, 2))  # a rollout tensor, its steps first
    alone = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    alone.load_state_dict({key[4:]: value[1] for key, value in agent.state_dict().items() if key.startswith("net.")})
    torch.testing.assert_close(agent(x)[1], alone(x[1]))
    loss = (agent(x) - agent.target(x)).pow(2).mean((-3, -2, -1))
    optimizer.zero_grad()
    loss.sum().backward()
    optimizer.step(loss, 0.5)
    assert torch.equal(agent.idle.weight, idle) and torch.equal(agent.target.weight, target)


# Phasic Policy Gradient's auxiliary phase, as the contract says to write it: an auxiliary value head on the actor and
# an Adam of the Agent's own over the actor and the head, stepped after each update.
LOGSTD = "            self.actor_logstd = nn.Parameter(torch.ones(1, action_dim) * log_std_init)\n"
PPG = ((LOGSTD, LOGSTD + "        self.aux_value = nn.Linear(action_dim, 1)\n"
                         "        self.aux_parameters = [*self.actor.parameters(), *self.aux_value.parameters()]\n"
                         "        self.aux_optimizer = torch.optim.Adam(self.aux_parameters, lr=1e-3)\n"),
       (RETURN, "    agent.aux_optimizer.zero_grad()\n"
                "    aux_values = agent.aux_value(agent.actor(b_obs[..., :agent.obs_dim])).squeeze(-1)\n"
                "    ((aux_values - b_returns) ** 2).mean(-1).sum().backward()\n"
                "    assert all(p.grad is not None for p in agent.aux_parameters)  # the Agent's, stacked too\n"
                "    agent.aux_optimizer.step()\n" + RETURN))


def test_an_own_optimizer_over_the_actor_leaves_ppo_training_it(tmp_path):
    """PPG's auxiliary Adam over the actor: PPO still trains the actor (PPO's Adam holds moments of the actor's every
    parameter; the policy loss and KL are non-zero in every update), and the auxiliary phase steps it once an update,
    each seed of --num_seeds as its run alone. A list of the Agent's own parameters (aux_parameters) is state
    checkpoints save, not refused, and under --num_seeds holds the stacked parameters the seeds train."""
    copy = str(edited(PPG, "my_ppg", tmp_path))
    results = run_scripts([(copy, fast_args(ENV, name, total_timesteps=32 * 3, **flags))
                           for name, flags in (("one", {}), ("two", {"num_seeds": 2}))], tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    for run in ("one", "two/two__seed1", "two/two__seed2"):
        logged = scalars(tmp_path / "runs" / run)
        assert all(kl > 0 for _, kl in logged["losses/approx_kl"]), run
        assert all(loss != 0 for _, loss in logged["losses/policy_loss"]), run
        checkpoint = load(tmp_path / "runs" / run / "final_ckpt.pt")
        aux = checkpoint["optimizer"]["own_optimizers"]["aux_optimizer"]
        assert {float(state["step"]) for state in aux["state"].values()} == {3.0}, run
        ppo_state = checkpoint["optimizer"]["state"].values()  # aux_value alone is out of PPO's loss
        trained = [key for key in checkpoint["model"] if key.startswith(("critic.", "actor.", "actor_logstd"))]
        assert len(ppo_state) == len(trained) and all(state["exp_avg"].abs().sum() > 0 for state in ppo_state), run


# What is state or no state at all, and must not be refused: a function's cache filled on first call, an update that
# writes into the rollout's tensors it is given (per seed)
NOT_REFUSED = (
    (CONSTANT, CONSTANT + "\n\ndef make_lazy_tanh():\n    made = None\n\n    def lazy_tanh(x):\n"
               "        nonlocal made\n        if made is None:\n            made = torch.tanh\n"
               "        return made(x)\n    return lazy_tanh\n\n\nlazy_tanh = make_lazy_tanh()\n"),
    ("    b_action_masks = None if buf.action_masks is None else buf.rows(buf.action_masks)\n",
     "    b_action_masks = None if buf.action_masks is None else buf.rows(buf.action_masks)\n"
     "    returns.mul_(lazy_tanh(torch.tensor(1.0)))  # in place, into train()'s tensor\n"),
)


def test_a_cache_and_an_update_writing_its_inputs_are_not_refused(tmp_path):
    copy = str(edited(NOT_REFUSED, "my_lazy", tmp_path))
    results = run_scripts([(copy, fast_args(ENV, name, total_timesteps=32 * 2, **flags))
                           for name, flags in (("one", {}), ("two", {"num_seeds": 2}))], tmp_path)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]


def test_an_optimizer_state_that_does_not_fit_is_one_error_line(monkeypatch):
    """A copy's checkpoint from before PPO's optimizer held the own optimizers' parameters: its PPO group is one
    parameter short, which torch refuses with a ValueError; --resume says so in one line."""
    agent = WithOwnOptimizer()
    optimizer = ppo.make_optimizer(agent, ppo.Args())
    older = optimizer.state_dict()
    older["param_groups"][0]["params"] = older["param_groups"][0]["params"][:-1]
    monkeypatch.setattr(ppo, "load_weights", lambda *args: None)
    with pytest.raises(ppo.UserError, match="optimizer state does not fit"):
        ppo.load_states(agent, optimizer, None, None, {"optimizer": older, "global_step": 0, "iteration": 0},
                        ppo.Args(), None)
