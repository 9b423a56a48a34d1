"""--num_seeds (ppo.py, ppo_rnn.py, ppo_rgb.py, ippo.py): each seed of a batch trains as a run of that seed alone would,
writes a run of its own that ppo_eval.py and the scripts take, and the batch stops and resumes as one run."""

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import ippo
import ppo
import ppo_rgb
import ppo_rnn
from tests.util import (REPO, assert_refused_as_in_use, fast_args, load, run_python, run_script, run_scripts, running,
                        scalars, sigterm_beside_full_run)

# Every quantity a seed must own: observation, reward and value statistics, advantage normalization, the adaptive
# learning rate, the KL early stop, gradient clipping, and the random streams of weights, actions and minibatches.
PER_SEED = dict(norm_obs=True, norm_reward=True, norm_value=True, lr_schedule="adaptive", target_kl=0.02,
                max_grad_norm=0.5, clip_vloss=True, total_timesteps=32 * 8, eval_freq=4, max_episode_steps=24)
ENVS = {"box": ("Pendulum-v1", PER_SEED), "discrete": ("CartPole-v1", {**PER_SEED, "lr_schedule": "linear"}),
        "multidiscrete": ("tests.envs:MultiDiscreteTargets-v0", {}),
        "multibinary": ("tests.envs:MultiBinaryTargets-v0", {}),
        "masked": ("tests.envs:MaskedTargets-v0", {})}  # each seed's action masks (its env's own draws)
# ppo_rnn.py's: sequences of 8 steps with episode starts inside them (24-step episodes), replayed from stored states
RECURRENT = {"rnn_box": ("Pendulum-v1", {**PER_SEED, "seq_len": 8, "rnn_hidden_size": 16}),
             "rnn_discrete": ("CartPole-v1", {**PER_SEED, "lr_schedule": "linear", "seq_len": 8, "rnn_type": "gru",
                                              "rnn_hidden_size": 16})}
# ppo_rgb.py's: images, the state and the critic's vector; shifted images (each seed's shifts its own); Box and Discrete
# actions; a torch-native env of images, each seed's block an env of its own. Tanh heads: a ReLU unit at its kink
# switches under float rounding, and the seeds' weights then part by more than rounding (scripts/verify_copy.py)
PIXELS = {**PER_SEED, "activation": "tanh"}
IMAGES = {"rgb_box": ("tests.envs:PointMassPixelsCritic-v0", {**PIXELS, "aug_shift": 4, "critic_obs": True}),
          "rgb_discrete": ("tests.envs:PixelSideCue-v0", {**PIXELS, "lr_schedule": "linear", "aug_shift": 4}),
          "rgb_torch": ("tests.envs:PointMassPixelsTorch-v0", PIXELS)}
# ippo.py's: every agent's networks, statistics and advantages; VMAS's batch, seeded with one seed (each seed's block an
# env of its own; navigation's random starts tell the seeds apart); PettingZoo agents that leave their episodes early,
# a centralized critic; one network shared by the agents; each agent's action masks
AGENTS = {"ippo_vmas": ("vmas:tests.vmas_scenarios:Clock", PER_SEED),
          "ippo_pz": ("pz:tests.pz_envs:meet", {**PER_SEED, "lr_schedule": "linear", "env_kwargs": "b_leaves=True",
                                                "centralized_critic": True}),
          "ippo_shared": ("vmas:navigation", {**PER_SEED, "share_parameters": True}),
          "ippo_masked": ("pz:tests.pz_envs:meet", {**PER_SEED, "env_kwargs": "masked=True fast_b=True"})}
# each trainer's env for what all of them do alike
TRAINERS = {"ppo.py": ("tests.envs:PointMass-v0", {}),
            "ppo_rnn.py": ("tests.envs:PointMass-v0", {"rnn_hidden_size": 16}),
            "ppo_rgb.py": ("tests.envs:PointMassPixels-v0", {"hidden_sizes": "64"}),
            "ippo.py": ("vmas:tests.vmas_scenarios:Clock", {"hidden_sizes": "64", "max_episode_steps": 16})}


@pytest.mark.parametrize("kind", [*ENVS, *RECURRENT, *IMAGES, *AGENTS])
def test_each_seed_trains_as_a_run_of_that_seed_alone(tmp_path, kind):
    """Seeds 5, 6 and 7 in one process against seeds 5 and 7 alone: the same weights (to float rounding: a batch's
    layers multiply in one batched matmul), statistics, learning rates, KL stops and random draws. Any quantity
    shared between seeds, or a seed's random stream drawn on by another, would set them apart."""
    trainer = {**dict.fromkeys(RECURRENT, "ppo_rnn.py"), **dict.fromkeys(IMAGES, "ppo_rgb.py"),
               **dict.fromkeys(AGENTS, "ippo.py")}.get(kind, "ppo.py")
    env_id, flags = {**ENVS, **RECURRENT, **IMAGES, **AGENTS}[kind]
    results = run_scripts([(trainer, fast_args(env_id, "batch", seed=5, num_seeds=3, **flags))] +
                          [(trainer, fast_args(env_id, f"alone{seed}", seed=seed, **flags)) for seed in (5, 7)],
                          tmp_path)
    assert all(result.returncode == 0 for result in results), [result.stderr[-2000:] for result in results]
    for seed in (5, 7):
        batch_run, alone_run = tmp_path / f"runs/batch/batch__seed{seed}", tmp_path / f"runs/alone{seed}"
        in_batch, alone = load(batch_run / "final_ckpt.pt"), load(alone_run / "final_ckpt.pt")
        assert in_batch["args"]["seed"] == seed and in_batch["args"]["num_seeds"] == 1
        for key in alone["model"]:
            torch.testing.assert_close(in_batch["model"][key], alone["model"][key], rtol=1e-4, atol=1e-5, msg=key)
        # the same number of random draws: the same minibatches drawn, the same KL stops
        assert torch.equal(in_batch["rng"]["torch"], alone["rng"]["torch"])
        assert in_batch["optimizer"]["param_groups"][0]["lr"] == alone["optimizer"]["param_groups"][0]["lr"]
        assert in_batch["optimizer"]["state"].keys() == alone["optimizer"]["state"].keys()
        for key, state in alone["optimizer"]["state"].items():  # each parameter's Adam state, in the same order
            assert in_batch["optimizer"]["state"][key]["step"] == state["step"]
            torch.testing.assert_close(in_batch["optimizer"]["state"][key]["exp_avg_sq"], state["exp_avg_sq"],
                                       rtol=1e-3, atol=1e-9)
        if alone["reward_normalizer"] is not None:
            for key, value in alone["reward_normalizer"].items():
                torch.testing.assert_close(in_batch["reward_normalizer"][key], value, rtol=1e-4, atol=0, msg=key)
        logged_in_batch, logged_alone = scalars(batch_run), scalars(alone_run)
        assert logged_in_batch["losses/minibatch_steps"] == logged_alone["losses/minibatch_steps"]
        per_agent = [tag for tag in logged_alone if tag.count("/") == 2]  # ippo.py's losses/<agent>/... and returns
        assert kind not in AGENTS or per_agent
        for tag in ("losses/approx_kl", "charts/learning_rate", "eval/return", "train/return", *per_agent):
            assert [step for step, _ in logged_in_batch[tag]] == [step for step, _ in logged_alone[tag]], tag
            torch.testing.assert_close(torch.tensor([value for _, value in logged_in_batch[tag]]),
                                       torch.tensor([value for _, value in logged_alone[tag]]), rtol=1e-3, atol=1e-5)
    # the batch's, which --resume continues, holds no tensor of its seeds' (each stored once, in its own checkpoint)
    batch = load(tmp_path / "runs/batch/final_ckpt.pt")
    assert batch["args"]["num_seeds"] == 3 and batch["model"] == {} and batch["seed_rngs"] == []
    assert len(batch["optimizer"]["param_groups"]) == 3 and batch["optimizer"]["state"] == {}
    seed_size = (tmp_path / "runs/batch/batch__seed5/final_ckpt.pt").stat().st_size
    assert (tmp_path / "runs/batch/final_ckpt.pt").stat().st_size < seed_size / 4


@pytest.mark.parametrize("trainer", TRAINERS)
def test_sigterm_then_resume_of_seeds_equals_uninterrupted_run(tmp_path, trainer):
    """SIGTERM saves every seed; --resume RUN continues them all, exactly, each seed's logs on one step axis."""
    iterations, signal_after = 60, 15
    env_id, flags = TRAINERS[trainer]
    argv = dict(total_timesteps=32 * iterations, eval_freq=signal_after, num_seeds=2, norm_obs=True, norm_reward=True,
                norm_value=True, lr_schedule="adaptive", **flags)
    run = tmp_path / "runs/cut"
    full, cut = sigterm_beside_full_run(trainer, fast_args(env_id, "full", **argv), fast_args(env_id, "cut", **argv),
                                        run / f"ckpt_{signal_after}.pt", tmp_path)
    assert full.returncode == 0, full.stderr
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr
    assert "resume with: python " + str(REPO / trainer) + " --resume runs/cut" in cut.stderr
    saved = max(int(p.stem.split("_")[1]) for p in run.glob("ckpt_*.pt"))
    assert signal_after <= saved < iterations
    for seed in (1, 2):  # each seed's checkpoint of the same iteration, written before the batch's
        assert load(run / f"cut__seed{seed}/ckpt_{saved}.pt")["iteration"] == saved

    resumed = run_script(trainer, ["--resume", "runs/cut"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    for seed in (1, 2):
        a = load(tmp_path / f"runs/full/full__seed{seed}/final_ckpt.pt")
        b = load(run / f"cut__seed{seed}/final_ckpt.pt")
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), key
        for key, state in a["optimizer"]["state"].items():
            assert all(torch.equal(value, b["optimizer"]["state"][key][name]) for name, value in state.items()), key
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
        steps = [step for step, _ in scalars(run / f"cut__seed{seed}")["losses/minibatch_steps"]]
        assert steps == list(range(32, 32 * (iterations + 1), 32))


@pytest.mark.parametrize("killed_after", ["ckpt_2.pt", "ckpt_4.pt"])
def test_a_kill_among_an_iterations_checkpoints_leaves_none_missing(tmp_path, killed_after):
    """A kill right after the first checkpoint file of an iteration (the run's and its seeds' are several files):
    every checkpoint the run holds, each seed holds too; the same command starts afresh (at the run's first) or
    --resume continues (at its last), and each seed ends as in an uninterrupted run."""
    argv = fast_args("tests.envs:PointMass-v0", "cut", num_seeds=2, norm_obs=True)
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side, one per core
        whole = pool.submit(run_script, "ppo.py", fast_args("tests.envs:PointMass-v0", "whole", num_seeds=2,
                                                            norm_obs=True), tmp_path)
        killed = run_python(["-m", "tests.harness", "kill_after", "ppo", killed_after, *argv], tmp_path)
        whole = whole.result()
    assert killed.returncode == -signal.SIGKILL and whole.returncode == 0, killed.stderr + whole.stderr
    run = tmp_path / "runs/cut"
    for checkpoint in run.glob("*.pt"):
        assert all((run / f"cut__seed{seed}" / checkpoint.name).is_file() for seed in (1, 2)), checkpoint
    again = run_script("ppo.py", argv if killed_after == "ckpt_2.pt" else ["--resume", "runs/cut"], tmp_path)
    assert again.returncode == 0, again.stderr
    for seed in (1, 2):
        a = load(tmp_path / f"runs/whole/whole__seed{seed}/final_ckpt.pt")
        b = load(run / f"cut__seed{seed}/final_ckpt.pt")
        assert b["iteration"] == 4 and all(torch.equal(a["model"][key], b["model"][key]) for key in a["model"])


def test_a_non_finite_seed_is_named_and_the_others_continue_alone(tmp_path):
    """Seed 2's envs (reset with env seeds 2 and 3; seed 1's with 1 and 2) give NaN rewards from their 200th step: the
    run stops with one error line naming seed 2 and the command that continues seed 1 alone, which then ends as a
    run of seed 1 alone does."""
    flags = dict(num_seeds=2, total_timesteps=32 * 16, eval_freq=4)
    argv = fast_args("tests.envs:PointMassNaNSeed3-v0", "nan", **flags)
    stopped, alone = run_scripts([("ppo.py", argv), ("ppo.py", fast_args("tests.envs:PointMassNaNSeed3-v0", "alone",
                                                                          total_timesteps=32 * 16, eval_freq=4))],
                                 tmp_path)
    assert stopped.returncode == 1 and alone.returncode == 0, stopped.stderr + alone.stderr
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-finite loss in seed 2 at iteration" in errors[0], stopped.stderr
    command = errors[0].split("from its own run directory: python ")[1]
    assert command == f"{REPO / 'ppo.py'} --resume runs/nan/nan__seed1", errors[0]
    continued = run_script("ppo.py", command.split()[1:], tmp_path)
    assert continued.returncode == 0, continued.stderr
    a, b = load(tmp_path / "runs/alone/final_ckpt.pt"), load(tmp_path / "runs/nan/nan__seed1/final_ckpt.pt")
    assert b["iteration"] == 16
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("generator", ["Python", "Numpy", "Torch"])
def test_an_env_drawing_from_a_global_generator_is_named(tmp_path, generator):
    """Envs that draw their starts from a global generator, which the seeds of a batch share: a warning names it, and
    seed 1 trains otherwise than alone (its later episodes start where the batch's draws left the stream). Envs
    that draw from their own self.np_random (PointMass) draw no warning."""
    env_id = f"tests.envs:PointMassGlobal{generator}-v0"
    batch, alone, own = run_scripts([("ppo.py", fast_args(env_id, "batch", num_seeds=2)),
                                     ("ppo.py", fast_args(env_id, "alone")),
                                     ("ppo.py", fast_args("tests.envs:PointMass-v0", "own", num_seeds=2))], tmp_path)
    assert batch.returncode == alone.returncode == own.returncode == 0, batch.stderr + alone.stderr + own.stderr
    warnings = [line for line in batch.stderr.splitlines() if line.startswith("warning:")]
    name = {"Python": "Python's", "Numpy": "numpy's", "Torch": "torch's"}[generator]
    assert len(warnings) == 1 and f"draws from {name} global random generator" in warnings[0], batch.stderr
    assert "warning:" not in alone.stderr and "warning:" not in own.stderr
    a, b = load(tmp_path / "runs/alone/final_ckpt.pt"), load(tmp_path / "runs/batch/batch__seed1/final_ckpt.pt")
    assert not torch.allclose(a["model"]["critic.0.weight"], b["model"]["critic.0.weight"], rtol=1e-3, atol=1e-4)


def test_a_seeds_run_directory_has_one_writer(tmp_path):
    """While the run of all seeds goes on, a seed's run cannot be resumed alone beside it."""
    with running("ppo.py", fast_args("tests.envs:PointMass-v0", "busy", num_seeds=2, total_timesteps=32 * 100_000,
                                     eval_freq=1), tmp_path, tmp_path / "runs/busy/busy__seed2/ckpt_1.pt") as proc:
        assert_refused_as_in_use(run_script("ppo.py", ["--resume", "runs/busy/busy__seed2"], tmp_path), proc.pid)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_seeds_run_evaluates_and_summarizes_as_a_run_alone(tmp_path, trainer):
    env_id, flags = TRAINERS[trainer]
    trained = run_script(trainer, fast_args(env_id, "batch", num_seeds=2, **flags), tmp_path)
    assert trained.returncode == 0, trained.stderr
    # one line for the run, one for its seeds' runs
    announced = [line for line in trained.stdout.splitlines() if line.startswith(("run ", "its "))]
    assert len(announced) == 2 and announced[0].startswith("run batch: runs/batch "), trained.stdout
    assert announced[1] == "its 2 seeds' runs: runs/batch/batch__seed1 to runs/batch/batch__seed2"
    weightless = run_script(trainer, fast_args(env_id, "again", checkpoint="runs/batch/final_ckpt.pt", **flags),
                            tmp_path)
    assert weightless.returncode == 2 and weightless.stderr.count("\n") == 1, weightless.stderr
    assert "run batch's checkpoint holds no weights: each of its 2 seeds (--num_seeds) has its own" in weightless.stderr
    # where a run of many seeds is given for weights, the advice names a seed's checkpoint
    directory = run_script(trainer, fast_args(env_id, "again", checkpoint="runs/batch", **flags), tmp_path)
    assert directory.returncode == 2 and "e.g. runs/batch/batch__seed1/final_ckpt.pt" in directory.stderr
    changed = run_script(trainer, ["--resume", "runs/batch", "--gamma", "0.5"], tmp_path)
    assert changed.returncode == 2 and "with --checkpoint (a seed's: batch__seed<S>/final_ckpt.pt)" in changed.stderr
    evaluated = run_script("ppo_eval.py", ["runs/batch/batch__seed2/final_ckpt.pt", "--num_episodes", "2"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "return" in evaluated.stdout
    refused = run_script("ppo_eval.py", ["runs/batch/final_ckpt.pt", "--num_episodes", "2"], tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "evaluate a seed's run, runs/batch/batch__seed1 to runs/batch/batch__seed2" in refused.stderr
    summary = run_script("scripts/summarize.py", ["runs/batch/batch__seed1", "runs/batch/batch__seed2"], tmp_path)
    assert summary.returncode == 0, summary.stderr
    assert "| batch | 2 |" in summary.stdout  # the seeds are one group, as runs of their own named __seed{N} are
    plotted = run_script("scripts/plot.py", ["runs/batch", "--out", "plots"], tmp_path)
    assert plotted.returncode == 0 and (tmp_path / "plots/eval_return.png").stat().st_size > 0, plotted.stderr
    alone = run_script(trainer, ["--resume", "runs/batch/batch__seed2", "--total_timesteps", str(32 * 6)], tmp_path)
    assert alone.returncode == 0, alone.stderr  # a seed's run continues alone too
    assert load(tmp_path / "runs/batch/batch__seed2/final_ckpt.pt")["iteration"] == 6


@pytest.mark.parametrize("trainer", ["ppo.py", "ppo_rgb.py", "ippo.py"])
def test_seeds_on_maniskill_cpu_workers(tmp_path, trainer):
    """PushCube's CPU simulation (ippo.py's: TwoRobotPickCube's): 2 seeds' envs in 2 worker processes, each seed's
    episodes logged in its own run (ppo_rgb.py's: the camera's images and the state, a dict of each seed's block)."""
    env_id = "TwoRobotPickCube-v1" if trainer == "ippo.py" else "PushCube-v1"
    result = run_script(trainer, fast_args(env_id, "cube", num_seeds=2, num_envs=1, num_minibatches=1,
                                            num_steps=10, total_timesteps=20, eval_freq=1, max_episode_steps=5),
                        tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in (1, 2):
        logged = scalars(tmp_path / f"runs/cube/cube__seed{seed}")
        assert [value for _, value in logged["train/episode_len"]] == [5.0, 5.0]  # two 5-step episodes a rollout
        assert [value for _, value in logged["eval/episodes"]] == [1.0, 1.0]


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ppo_rgb, ippo])
@pytest.mark.parametrize("flag, given", [("torchrun", dict()), ("--compile", dict(compile=True))])
def test_num_seeds_refuses_what_it_does_not_do_yet(flag, given, trainer):
    args = trainer.Args(env_id="CartPole-v1", num_seeds=2, num_envs=2, num_steps=16, num_minibatches=2, **given)
    with pytest.raises(trainer.UserError, match=f"--num_seeds does not work with {flag} yet"):
        trainer.validate(args, maniskill=False, time_limit=500, num_ranks=2 if flag == "torchrun" else 1)


def test_num_seeds_beyond_numpys_seeds_is_refused_by_name():
    args = ppo.Args(env_id="CartPole-v1", num_seeds=2**32, num_envs=2, num_steps=16, num_minibatches=2)
    with pytest.raises(ppo.UserError, match=r"^--num_seeds must be at most \d+ for this run's length"):
        ppo.validate(args, maniskill=False, time_limit=500)


def test_seeds_start_from_a_checkpoint_as_each_seed_alone_does(tmp_path):
    """--checkpoint under --num_seeds: every seed starts from its weights and statistics, as a run alone with it."""
    flags = dict(norm_obs=True, norm_reward=True)
    start = run_script("ppo.py", fast_args("Pendulum-v1", "start", **flags), tmp_path)
    assert start.returncode == 0, start.stderr
    checkpoint = dict(checkpoint="runs/start/final_ckpt.pt", **flags)
    results = run_scripts([("ppo.py", fast_args("Pendulum-v1", "batch", seed=5, num_seeds=2, **checkpoint)),
                           ("ppo.py", fast_args("Pendulum-v1", "alone", seed=6, **checkpoint))], tmp_path)
    assert all(result.returncode == 0 for result in results), [result.stderr[-2000:] for result in results]
    in_batch = load(tmp_path / "runs/batch/batch__seed6/final_ckpt.pt")
    alone = load(tmp_path / "runs/alone/final_ckpt.pt")
    for key in alone["model"]:
        torch.testing.assert_close(in_batch["model"][key], alone["model"][key], rtol=1e-4, atol=1e-5, msg=key)
    for key, value in alone["reward_normalizer"].items():
        torch.testing.assert_close(in_batch["reward_normalizer"][key], value, rtol=1e-4, atol=0, msg=key)


def test_each_seed_draws_from_its_own_generator_inside_per_seed_draws():
    """The draws a copy's policy may make, on a stacked batch of 3 seeds: each seed's part equals what its own
    generator draws for it alone, as a run of that seed alone draws it; a draw that cannot be split is refused."""
    from torch.distributions import Bernoulli, Categorical, Normal

    mean, std, logits = torch.randn(3, 4, 2), torch.rand(3, 4, 2) + 0.1, torch.randn(3, 4, 5)
    draws = {"normal": lambda m, s, lg: torch.normal(m, s), "rsample": lambda m, s, lg: Normal(m, s).rsample(),
             "categorical": lambda m, s, lg: Categorical(logits=lg).sample(),
             "bernoulli": lambda m, s, lg: Bernoulli(logits=m).sample()}
    for name, draw in draws.items():
        generators = [torch.Generator().manual_seed(seed) for seed in (5, 6, 7)]
        with ppo.PerSeedDraws(generators):
            batch = draw(mean, std, logits)
        for i, seed in enumerate((5, 6, 7)):
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                alone = draw(mean[i], std[i], logits[i])
            assert torch.equal(batch[i], alone), name
    class Noisy(torch.nn.Module):  # a stacked agent whose policy draws what PerSeedDraws cannot split
        generators = [torch.Generator()] * 3

        def get_action_and_value(self, obs):
            return torch.distributions.Gamma(obs.exp(), 1.0).sample()

    with pytest.raises(ppo.UserError, match="draws from torch's global random generator"):
        ppo.policy_step_of(Noisy(), ppo.Args(num_seeds=3), None)(mean)  # refused before it is compared


def test_a_seed_whose_update_stopped_draws_no_more_from_its_generator():
    """update()'s draws (optimizer.draws()) after seed 6's KL stop: seeds 5 and 7 draw their parts from their own
    generators, as alone; seed 6's generator stays where a run of it alone stops drawing."""
    agent = ppo.stack_seeds([torch.nn.Linear(2, 1) for _ in range(3)])
    agent.generators = [torch.Generator().manual_seed(seed) for seed in (5, 6, 7)]
    optimizer = ppo.SeedOptimizer(agent, 1e-3)
    minibatches = optimizer.minibatches(8, 4, 2)
    next(minibatches)
    optimizer.stop(torch.tensor([False, True, False]))
    stopped_state = agent.generators[1].get_state()
    with optimizer.draws():
        drawn = torch.empty(3, 4).uniform_()
    assert torch.equal(agent.generators[1].get_state(), stopped_state)
    for i, seed in ((0, 5), (2, 7)):
        alone = torch.Generator().manual_seed(seed)
        torch.randperm(8, generator=alone)  # its first epoch's minibatches
        assert torch.equal(drawn[i], torch.empty(4).uniform_(generator=alone))


def test_an_update_drawing_from_torchs_default_generator_is_refused(tmp_path):
    """A copy of ppo_rgb.py whose image shifts draw outside optimizer.draws(): under --num_seeds the first update
    stops the run with one line; alone it trains."""
    source = (REPO / "ppo_rgb.py").read_text()
    assert source.count("with optimizer.draws():") == 1
    (tmp_path / "my_shifts.py").write_text(source.replace("with optimizer.draws():", "with contextlib.nullcontext():"))
    seeds, alone = run_scripts([(str(tmp_path / "my_shifts.py"), fast_args("tests.envs:PointMassPixels-v0", name,
                                                                           aug_shift=4, hidden_sizes="64", **flags))
                                for name, flags in (("seeds", {"num_seeds": 2}), ("alone", {}))], tmp_path)
    assert seeds.returncode == 2 and "Traceback" not in seeds.stderr, seeds.stderr[-2000:]
    assert seeds.stderr.splitlines()[-1].startswith("error: update() draws from torch's global random generator, "
                                                    "which the seeds of --num_seeds share")
    assert "inside optimizer.draws()" in seeds.stderr.splitlines()[-1]
    assert alone.returncode == 0, alone.stderr[-2000:]


@pytest.mark.parametrize("layer", ["lstm", "gru", "conv", "layer_norm"])
def test_torch_layers_of_stacked_seeds_compute_each_seeds_own(layer):
    """stack_seeds() on torch.nn layers other than nn.Linear: each seed's part of the output, the recurrent state and
    the gradient is what that seed's own layer computes and receives: bit for bit where each seed's part goes through
    the layer in turn (SeedEach), to float rounding where the equations run on the stacked weights (SeedRNN)."""
    torch.manual_seed(0)
    make = {"lstm": lambda: torch.nn.LSTM(3, 4, 2, batch_first=True),
            "gru": lambda: torch.nn.GRU(3, 4, batch_first=True),
            "conv": lambda: torch.nn.Conv2d(3, 4, 3), "layer_norm": lambda: torch.nn.LayerNorm(3)}[layer]
    layers = [make() for _ in range(3)]
    for one in layers:  # seeds apart in every parameter, LayerNorm's ones and zeros too
        with torch.no_grad():
            for parameter in one.parameters():
                parameter.add_(torch.randn_like(parameter))
    stacked = ppo_rnn.stack_seeds([torch.nn.Sequential(one) for one in layers])[0]
    assert isinstance(stacked, ppo_rnn.SeedRNN if layer in ("lstm", "gru") else ppo_rnn.SeedEach)
    same = torch.equal if layer in ("conv", "layer_norm") else \
        lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6) and not torch.equal(a, torch.zeros_like(a))
    x = torch.randn(3, 2, 5, 3, 6, 6) if layer == "conv" else torch.randn(3, 2, 5, 3)
    inputs = (x[:, 0],) if layer == "conv" else (x,)
    if layer in ("lstm", "gru"):
        state = torch.randn(3, 2 if layer == "lstm" else 1, 2, 4)
        inputs += ((state, state + 1),) if layer == "lstm" else (state,)
    output = stacked(*inputs)
    output[0].sum().backward() if isinstance(output, tuple) else output.sum().backward()
    for i, one in enumerate(layers):
        alone = one(*ppo.seed_part(inputs, i))
        assert all(same(a, b) for a, b in zip(tensors(alone), tensors(ppo.seed_part(output, i))))
        (alone[0] if isinstance(alone, tuple) else alone).sum().backward()
        for (name, parameter), stacked_parameter in zip(one.named_parameters(), stacked.parameters()):
            assert same(parameter.grad, stacked_parameter.grad[i]), name


def tensors(nested) -> list[torch.Tensor]:
    return [nested] if isinstance(nested, torch.Tensor) else [t for part in nested for t in tensors(part)]
