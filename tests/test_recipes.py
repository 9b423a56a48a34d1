"""recipes/ (docs/recipes.md): each recipe applies to today's ppo.py, by patch(1) as by scripts/recipes.py; its copy
keeps the contract (scripts/verify_copy.py, every check) and learns PointMass; the estimators and losses they change
compute what their papers write, against references written here; a change to ppo.py inside a recipe's lines fails
`recipes.py check` by name and `recipes.py refresh` merges the recipe onto it; docs/recipes.md's table gives each
recipe's size as its patch has it."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_verify_copy import rows
from tests.util import REPO, run_python, run_scripts, scalars

RECIPES = sorted(path.stem for path in (REPO / "recipes").glob("*.patch"))
TOOL = REPO / "scripts/recipes.py"
# Each recipe's own flags in verify_copy's runs of 8 iterations and in the learning run: PPG's auxiliary phase every
# 2 (4) iterations, so that the runs hold several
VERIFY_FLAGS = {"ppg": "--ppg_n_pi 2"}
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
    kinds = {recipe: (REPO / "recipes" / f"{recipe}.patch").read_text().split("Kind: ")[1].split(".")[0]
             for recipe in RECIPES}
    for kind in ("loss", "advantage estimator", "network", "module", "optimizer of its own over shared parameters",
                 "across iterations", "intrinsic reward"):
        assert any(kind in text for text in kinds.values()), (kind, kinds)


def test_every_recipe_applies_to_todays_trainer_by_patch_as_by_the_tool(tmp_path):
    result = tool("check")
    assert result.returncode == 0 and result.stdout.count(": applies") == len(RECIPES), result.stdout + result.stderr
    if shutil.which("patch") is None:
        pytest.skip("no patch(1) here: the tool's copies alone were checked")
    for recipe in RECIPES:
        copy = tmp_path / f"by_patch_{recipe}.py"
        shutil.copy(REPO / "ppo.py", copy)
        patched = subprocess.run(["patch", "-s", str(copy), str(REPO / "recipes" / f"{recipe}.patch")],
                                 capture_output=True, text=True)
        assert patched.returncode == 0, patched.stdout + patched.stderr
        assert copy.read_text() == applied(tmp_path, recipe).read_text(), recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_keeps_the_contract(tmp_path, recipe):
    pytest.importorskip("onnxruntime")
    copy = applied(tmp_path, recipe)
    flags = ["--flags", VERIFY_FLAGS[recipe]] if recipe in VERIFY_FLAGS else []
    result = run_python([str(REPO / "scripts/verify_copy.py"), str(copy), *flags], tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    found = rows(result.stdout)
    assert set(found) == {"trains", "same_seed", "resume", "seeds", "evaluates", "exports"}, result.stdout
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


def test_a_change_inside_a_recipes_lines_is_named_and_refresh_merges_the_recipe(tmp_path):
    for path in ("ppo.py", "scripts/recipes.py", "recipes/dual_clip.patch"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    # the blob of the ppo.py the recipe was written against, as the project's history holds it
    base = subprocess.run(["git", "-C", str(REPO), "cat-file", "blob",
                           re.search(r"index ([0-9a-f]{40})", (REPO / "recipes/dual_clip.patch").read_text())[1]],
                          capture_output=True, text=True, check=True).stdout
    subprocess.run([*git, "hash-object", "-w", "--stdin"], input=base, text=True, check=True, capture_output=True)
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
