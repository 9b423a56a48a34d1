"""Population-based training (--pbt_interval) on the members of --num_seeds: a searched setting gives each member's
part of a batch its member's number; exploit copies a donor's whole learner state along the seed dimension and
explore perturbs after the copy; lineage.csv, the members' logs and checkpoints; resume exact; bad input in one line."""

import csv
import importlib.util
import signal
import sys

import pytest
import torch

import ppo
from tests.test_copy_state import LEARNED_ENT_COEF, edited
from tests.util import REPO, fast_args, load, refused_in_one_line, run_script, scalars, sigterm_beside_full_run

ENV = "tests.envs:PointMass-v0"
SPACE = ("learning_rate=1e-4:1e-2:log", "clip_coef=0.1:0.3", "gamma=0.9:0.999", "gae_lambda=0.8:0.99",
         "max_grad_norm=0.1:1")


def members(numbers: list[float], num_steps: int = 5) -> ppo.MemberValues:
    return ppo.member_values(torch.tensor(numbers, dtype=torch.float64), list(numbers), numbers[0], num_steps,
                             "clip_coef")


@pytest.mark.parametrize("finite_horizon", [False, True])
def test_a_searched_setting_gives_each_members_part_its_own_number(finite_horizon):
    """Advantages of a rollout (num_steps, members, envs), a clipped ratio of rows (members, rows) and a loss of
    statistics (members,) computed with settings of one value per member equal each member's alone with its number."""
    generator = torch.Generator().manual_seed(0)
    steps, n, envs = 5, 3, 4
    rewards, values, bootstrap = (torch.randn(steps, n, envs, generator=generator) for _ in range(3))
    dones = (torch.rand(steps, n, envs, generator=generator) < 0.3).float()
    next_value = torch.randn(n, envs, generator=generator)
    gamma, gae_lambda = [0.9, 0.99, 0.95], [0.8, 0.95, 1.0]
    together = ppo.compute_advantages(rewards, values, dones, bootstrap, next_value, members(gamma),
                                      members(gae_lambda), finite_horizon)
    ratio, entropy = torch.rand(n, 7, generator=generator) * 2, torch.rand(n, generator=generator)
    clip, ent_coef = members([0.1, 0.2, 0.3]), members([0.0, 0.01, 0.5])
    clipped, bonus = torch.clamp(ratio, 1 - clip, 1 + clip), ent_coef * entropy
    later = rewards[1:] * members(gamma)  # a rollout's slice (num_steps - 1, members, envs), as n-step returns take
    for i in range(n):
        alone = ppo.compute_advantages(rewards[:, i], values[:, i], dones[:, i], bootstrap[:, i], next_value[i],
                                       gamma[i], gae_lambda[i], finite_horizon)
        torch.testing.assert_close(together[:, i], alone, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(clipped[i], torch.clamp(ratio[i], 1 - clip.numbers[i], 1 + clip.numbers[i]))
        torch.testing.assert_close(bonus[i], ent_coef.numbers[i] * entropy[i])
        torch.testing.assert_close(later[:, i], rewards[1:, i] * gamma[i])
    assert together.dtype == clipped.dtype == bonus.dtype == torch.float32  # the tensor's, as a number leaves it


def test_a_searched_setting_keeps_a_python_numbers_dtype_and_a_comparisons_bool():
    gamma = members([0.99, 0.9, 0.5])
    doubles = torch.where(torch.ones(3, 2, dtype=torch.bool), gamma, torch.zeros(3, 2, dtype=torch.float64))
    assert doubles.dtype == torch.float64 and doubles[:, 0].tolist() == [0.99, 0.9, 0.5]
    assert torch.where(gamma > 0.6, torch.ones(3, 2), 0.0)[:, 0].tolist() == [1.0, 1.0, 0.0]
    assert torch.stack([gamma, gamma]).shape == (2, 3)


@pytest.mark.parametrize("misuse", ["float", "if", "no_seed_dimension"])
def test_a_searched_setting_used_as_one_number_is_one_rule(misuse):
    clip = members([0.1, 0.2, 0.3, 0.4])
    named = {"float": r"reads args\.clip_coef as a Python number \(__float__\)",
             "if": r"reads args\.clip_coef \(or a value computed from it\) as a Python number \(__bool__\)"}
    with pytest.raises(ppo.UserError, match=named.get(misuse, "holds one value per member")):
        if misuse == "float":
            float(clip)
        elif misuse == "if":
            if clip > 0.2:
                pass
        else:
            torch.ones(7, 2) * clip


def test_exploit_copies_the_whole_learner_state_then_explore_perturbs_the_copy(tmp_path, monkeypatch):
    """A copy with an optimizer of its own (tests/test_copy_state.py's learned entropy coefficient), observation,
    value and reward statistics: at each ranking the worst member's parameters, buffers, both optimizers' moments,
    step counts and learning rates, reward statistics and settings become its donor's, every other member's stay
    as they were, its own random stream and its envs' returns in progress stay its own; explore then multiplies each
    setting by 0.8 or 1.2 (gamma and gae_lambda: 1 - x), and the optimizer steps with the new learning rate."""
    path = edited(LEARNED_ENT_COEF, "own_adam", tmp_path)
    spec = importlib.util.spec_from_file_location("own_adam", path)
    module = sys.modules["own_adam"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen = []

    def snapshot(population) -> dict:
        optimizers = {"ppo": population.optimizer, **module.own_optimizers(population.agent)}
        return {"model": {key: value.clone() for key, value in population.agent.state_dict().items()},
                "rewards": {key: value.clone() for key, value in population.reward_normalizer.state_dict().items()},
                "returns": population.reward_normalizer.discounted_return.clone(),
                "streams": [generator.get_state() for generator in population.agent.generators],
                "settings": {name: list(values.numbers) for name, values in population.settings.items()},
                "optimizers": {name: [(group["lr"], [{key: value.clone() for key, value in
                                                      optimizer.state[p].items()} for p in group["params"]])
                                      for group in optimizer.param_groups]
                               for name, optimizer in optimizers.items()}}

    exploit, explore = module.Population.exploit, module.Population.explore

    def spied_exploit(population, member, donor):
        before = snapshot(population)
        exploit(population, member, donor)
        seen.append((member, donor, before, snapshot(population)))

    def spied_explore(population, member):
        explore(population, member)
        seen[-1] += (snapshot(population),)
    monkeypatch.setattr(module.Population, "exploit", spied_exploit)
    monkeypatch.setattr(module.Population, "explore", spied_explore)
    argv = fast_args(ENV, "pbt", num_seeds=4, pbt_interval=2, total_timesteps=32 * 6, norm_obs=True, norm_value=True,
                     norm_reward=True, pbt_resample=0.0, checkpoint_freq=6)
    monkeypatch.chdir(tmp_path)
    assert module.cli([*argv, "--pbt_space", *SPACE]) == 0
    assert len(seen) == 2  # iterations 2 and 4; the last ranks without exploiting
    for member, donor, before, after, explored in seen:
        for key, value in before["model"].items():
            assert torch.equal(after["model"][key][member], value[donor]), key
            others = [i for i in range(4) if i != member]
            assert torch.equal(after["model"][key][others], value[others]), key
        for key, value in before["rewards"].items():
            assert torch.equal(after["rewards"][key][member], value[donor]), key
        assert torch.equal(after["returns"], before["returns"])
        assert all(torch.equal(a, b) for a, b in zip(after["streams"], before["streams"]))
        assert after["settings"] == {name: [numbers[donor] if i == member else number for i, number in
                                            enumerate(numbers)] for name, numbers in before["settings"].items()}
        for name, groups in before["optimizers"].items():
            per = len(groups) // 4
            for to, of in zip(after["optimizers"][name][member * per:(member + 1) * per],
                              groups[donor * per:(donor + 1) * per]):
                assert to[0] == of[0] and len(to[1]) == len(of[1]) > 0, name
                for copied, original in zip(to[1], of[1]):
                    assert copied.keys() == original.keys() and all(
                        torch.equal(copied[key], original[key]) for key in original), name
        for name, numbers in explored["settings"].items():
            low, high, _ = ppo.pbt_space(ppo.Args(pbt_space=SPACE))[name]
            taken = after["settings"][name][member]
            perturbed = [1 - (1 - taken) * f if name in ppo.PBT_DISCOUNTS else taken * f for f in (0.8, 1.2)]
            assert any(numbers[member] == pytest.approx(min(max(x, low), high)) for x in perturbed), name
        assert explored["optimizers"]["ppo"][member][0] == explored["settings"]["learning_rate"][member]
    with open(tmp_path / "runs/pbt/lineage.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["iteration"]) for row in rows] == [2] * 4 + [4] * 4 + [6] * 4
    donors = [(int(row["member"]), int(row["donor"])) for row in rows if row["donor"]]
    assert donors == [(member + 1, donor + 1) for member, donor, *_ in seen]
    final = load(tmp_path / "runs/pbt/final_ckpt.pt")
    for i, row in enumerate(rows[-4:]):  # each member's checkpoint holds its settings, as a run alone of them
        member = load(tmp_path / f"runs/pbt/pbt__seed{i + 1}/final_ckpt.pt")["args"]
        assert member["num_seeds"] == 1 and member["pbt_interval"] is None
        assert all(member[name] == float(row[name]) == final["pbt"]["values"][name][i]
                   for name in final["pbt"]["values"])
        assert [value for _, value in scalars(tmp_path / f"runs/pbt/pbt__seed{i + 1}")["pbt/gamma"]][-1] == \
            pytest.approx(float(row["gamma"]))
    assert final["args"]["learning_rate"] == 3e-4  # the run's own: the flags


def test_a_member_without_a_finished_episode_neither_takes_nor_gives_state(tmp_path):
    """Rollouts of 5 steps, shorter than PointMass's episodes: a member whose episodes have not ended has no score
    (NaN) and takes no part in a ranking, and one whose have not ended since the last ranking keeps its score."""
    result = run_script("ppo.py", fast_args(ENV, "short", num_seeds=4, pbt_interval=1, num_steps=5, num_minibatches=1,
                                            total_timesteps=5 * 2 * 16), tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "runs/short/lineage.csv") as f:
        rows = list(csv.DictReader(f))
    scores = {(row["iteration"], row["member"]): float(row["score"]) for row in rows}
    assert any(score != score for score in scores.values()) and any(score == score for score in scores.values())
    for row in rows:
        if row["donor"]:
            assert scores[row["iteration"], row["member"]] == scores[row["iteration"], row["member"]]
            assert scores[row["iteration"], row["donor"]] == scores[row["iteration"], row["donor"]]
    assert "best member: seed " in result.stdout and "(score nan)" not in result.stdout
    assert "the lineage: runs/short/lineage.csv (scripts/plot.py runs/short --lineage)" in result.stdout
    # ent_coef starts at 0 for every member (the flag's default): perturbing cannot move it, and the run says so
    assert "note: --ent_coef=0.0 for every member: a perturbation multiplies it" in result.stdout


def test_an_evaluation_objective_scores_every_member_on_the_same_seeds(tmp_path, monkeypatch):
    """--pbt_objective=eval: at each ranking every member is evaluated with its eval envs reset with the run's seed,
    and its score is that evaluation's mean return."""
    evaluations, evaluate = [], ppo.evaluate

    def recorded(agent, eval_envs, num_eval_steps, seed, *rest, **keywords):
        metrics = evaluate(agent, eval_envs, num_eval_steps, seed, *rest, **keywords)
        evaluations.append((seed, metrics["return"].double().mean().item()))
        return metrics
    monkeypatch.setattr(ppo, "evaluate", recorded)
    monkeypatch.chdir(tmp_path)
    assert ppo.cli(fast_args(ENV, "ev", num_seeds=4, pbt_interval=2, pbt_objective="eval", total_timesteps=32 * 4,
                             eval_freq=100)) == 0
    with open(tmp_path / "runs/ev/lineage.csv") as f:
        rows = list(csv.DictReader(f))
    ranked = [evaluation for evaluation in evaluations if evaluation[0] == 1]  # the run's seed, every member's
    assert len(ranked) == 2 * 4 and len(rows) == 2 * 4
    assert [float(row["score"]) for row in rows] == pytest.approx([score for _, score in ranked])


def test_sigterm_then_resume_of_a_population_equals_the_uninterrupted_run(tmp_path):
    """Stopped after iteration 9's checkpoint and resumed from it (the lineage's later rows done again): the same
    lineage and each member's final weights, bit for bit."""
    argv = dict(num_seeds=4, pbt_interval=3, total_timesteps=32 * 24, eval_freq=3, norm_obs=True, norm_reward=True,
                pbt_start="space")
    full, cut = sigterm_beside_full_run("ppo.py", fast_args(ENV, "full", **argv) + ["--pbt_space", *SPACE],
                                        fast_args(ENV, "cut", **argv) + ["--pbt_space", *SPACE],
                                        tmp_path / "runs/cut/ckpt_9.pt", tmp_path)
    assert full.returncode == 0 and cut.returncode == 128 + signal.SIGTERM, full.stderr + cut.stderr
    resumed = run_script("ppo.py", ["--resume", "runs/cut/ckpt_9.pt"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "best member: seed " in resumed.stdout
    lineage = (tmp_path / "runs/full/lineage.csv").read_text()
    assert lineage == (tmp_path / "runs/cut/lineage.csv").read_text() and lineage.count("\n") == 1 + 8 * 4
    assert lineage.splitlines()[1].split(",")[5] != "0.0003"  # drawn from the space
    best = resumed.stdout.split("best member: seed ")[1].split(" ")[0]
    named = run_script("ppo_eval.py", ["runs/cut"], tmp_path)  # the run's directory names the best member's
    assert named.returncode == 2 and f"the population's best at its last ranking: cut__seed{best}" in named.stderr
    evaluated = run_script("ppo_eval.py", [f"runs/cut/cut__seed{best}", "--num_episodes", "2"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    for seed in range(1, 5):
        a = load(tmp_path / f"runs/full/full__seed{seed}/final_ckpt.pt")
        b = load(tmp_path / f"runs/cut/cut__seed{seed}/final_ckpt.pt")
        assert all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]


def test_a_copy_that_reads_a_searched_setting_as_a_number_is_told_the_rule(tmp_path, capfd):
    path = edited([("        loss = pg_loss - args.ent_coef * entropy_loss",
                    "        loss = pg_loss - float(args.ent_coef) * entropy_loss")], "as_number", tmp_path)
    spec = importlib.util.spec_from_file_location("as_number", path)
    module = sys.modules["as_number"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = fast_args(ENV, "n", num_seeds=4, pbt_interval=1, pbt_space="ent_coef=0:0.1")
    line = refused_in_one_line(module, argv, tmp_path, capfd, False)
    number = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "float(args.ent_coef)" in text)
    assert f"as_number.py:{number} reads args.ent_coef as a Python number (__float__)" in line
    assert "holds one value per member" in line and "torch.where(torch.as_tensor(args.x > c), y, z)" in line


@pytest.mark.parametrize("flags, mentions", [
    (dict(num_seeds=2, pbt_interval=1), "at least 4 members"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="num_envs=1:8"), "--num_envs cannot vary per member; a population "
                                                                   "searches learning_rate, ent_coef"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="lr=1e-5:1e-2"), "--lr is no flag of the trainer; a population"),
    (dict(num_seeds=4, pbt_interval=4), "comes at or after the run's last iteration (4)"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="clip_coef=-1:0.5"), "leaves --clip_coef's range"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="gamma=0.9:inf"), "finite, LOW below HIGH"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="learning_rate=fast"), "write NAME=LOW:HIGH"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="gamma=0.995:0.999"), "--gamma=0.99 lies outside"),
    (dict(num_seeds=4, pbt_interval=1, pbt_space="target_kl=0.01:0.1", target_kl=None), "--target_kl=None"),
    (dict(num_seeds=4, pbt_interval=1, lr_schedule="adaptive"), "--lr_schedule=adaptive sets itself"),
    (dict(num_seeds=16, pbt_interval=1), "--num_steps other than --num_seeds"),
    (dict(num_seeds=4, pbt_interval=1, pbt_fraction=0.75), "--pbt_fraction must be in (0, 0.5]"),
])
def test_bad_population_input_is_one_line(tmp_path, capfd, flags, mentions):
    line = refused_in_one_line(ppo, fast_args(ENV, "bad", **flags), tmp_path, capfd, False)
    assert mentions in line
    assert not (tmp_path / "runs/bad").exists()


def test_plot_draws_the_lineage_of_the_final_best_member(tmp_path):
    """A hand-written lineage: seed 3 ends best; it took seed 1's state at iteration 4, which had taken seed 2's at
    iteration 2. Its ancestry: seed 1's row at 2 with seed 2's score, its own at 4 with seed 1's, its own at 6."""
    sys.path.insert(0, str(REPO / "scripts"))
    import plot
    rows = ["iteration,global_step,member,score,donor,learning_rate",
            "2,64,1,1.0,2,0.001", "2,64,2,5.0,,0.002", "2,64,3,3.0,,0.003",
            "4,128,1,7.0,,0.001", "4,128,2,2.0,,0.002", "4,128,3,nan,1,0.0012",
            "6,192,1,4.0,,0.001", "6,192,2,1.0,,0.002", "6,192,3,9.0,,0.0012"]
    run = tmp_path / "runs/r"
    run.mkdir(parents=True)
    (run / "lineage.csv").write_text("\n".join(rows) + "\n")
    with open(run / "lineage.csv", newline="") as f:
        line = plot.ancestry(list(csv.DictReader(f)))
    assert [(row["iteration"], row["member"], row["score"]) for row in line] == [
        ("2", "1", "5.0"), ("4", "3", "7.0"), ("6", "3", "9.0")]
    assert plot.main([str(run), "--lineage", "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots/r_lineage.png").stat().st_size > 10_000


SIBLINGS = {"ppo_rnn.py": ("tests.envs:PointMass-v0", {"rnn_hidden_size": 16, "seq_len": 8}),
            "ppo_rgb.py": ("tests.envs:PointMassPixels-v0", {"hidden_sizes": "64", "activation": "tanh"}),
            "ippo.py": ("vmas:tests.vmas_scenarios:Clock", {"hidden_sizes": "64", "max_episode_steps": 16})}


@pytest.mark.parametrize("trainer", SIBLINGS)
def test_every_trainer_trains_a_population_and_resumes_it_exactly(tmp_path, trainer):
    """Members drawn from the space (the first update also runs each member alone with its own numbers, so that a
    setting that met a tensor along the wrong dimension would stop the run), ranked every 2 iterations; resumed from
    iteration 3's checkpoint, the run ends with the same lineage and each member's weights."""
    env_id, flags = SIBLINGS[trainer]
    argv = fast_args(env_id, "pop", num_seeds=4, pbt_interval=2, pbt_start="space", total_timesteps=32 * 6,
                     checkpoint_freq=3, norm_obs=True, **flags) + ["--pbt_space", *SPACE, "ent_coef=0:0.02"]
    first = run_script(trainer, argv, tmp_path)
    assert first.returncode == 0, first.stderr
    run = tmp_path / "runs/pop"
    lineage = (run / "lineage.csv").read_text()
    finals = [load(run / f"pop__seed{seed}/final_ckpt.pt") for seed in range(1, 5)]
    assert lineage.count("\n") == 1 + 3 * 4 and len({row.split(",")[5] for row in lineage.splitlines()[1:5]}) == 4
    resumed = run_script(trainer, ["--resume", str(run / "ckpt_3.pt")], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "lineage.csv").read_text() == lineage
    for seed, final in enumerate(finals, 1):
        again = load(run / f"pop__seed{seed}/final_ckpt.pt")
        assert all(torch.equal(final["model"][key], again["model"][key]) for key in final["model"])
        assert again["args"]["learning_rate"] == final["args"]["learning_rate"] != 3e-4
