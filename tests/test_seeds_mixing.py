"""Under --num_seeds, code written the usual way for one seed that would make a seed part from its run alone stops
the run at its start or in its first iteration with one error line naming where and the rule (ppo.py's
first_call_checked() and refuse_unregistered_state()): whole-tensor reductions, draws from Python's, numpy's or torch's
global generator, state outside the Agent's parameters, buffers and registered modules. The unchanged trainer passes
the same check (test_seeds.py)."""

import pytest

from tests.test_copy_state import ENV, edited, import_copy
from tests.util import fast_args, refused_in_one_line, run_script

RETURN = "    return {**stats, **optimizer.stats()}\n"
NORMALIZED = ("        advantages = (advantages - advantages.mean(-1, keepdim=True)) / "
              "(advantages.std(-1, keepdim=True) + 1e-8)\n")
ACTOR_OBS = "        actor_obs = obs[..., :self.obs_dim]\n"
INIT = "        self.obs_dim = obs_dim\n"
MIXING = {
    # CleanRL's idiom: one mean and std over the whole tensor, which holds every seed's rows
    "whole_tensor_advantages": (
        ((NORMALIZED, "        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)\n"),),
        "update() differs from that seed's alone in its result losses/"),
    "numpy_in_update": (
        ((RETURN, "    stats['noise'] = torch.tensor(np.random.rand())\n" + RETURN),),
        "update() draws from numpy's global random generator"),
    "python_random_in_policy": (
        ((ACTOR_OBS, ACTOR_OBS + "        actor_obs = actor_obs * (1 + 1e-3 * random.random())\n"),),
        "the policy step (Agent.get_action_and_value()) draws from Python's global random generator"),
    "numpy_generator_on_the_agent": (
        ((INIT, INIT + "        self.rng = np.random.default_rng(0)\n"),
         (ACTOR_OBS, ACTOR_OBS + "        actor_obs = actor_obs + torch.as_tensor("
                                 "self.rng.normal(size=actor_obs.shape) * 1e-2, dtype=actor_obs.dtype)\n")),
        "differs from that seed's alone in its result"),
    "unregistered_tensor": (
        ((INIT, INIT + "        self.projection = torch.randn(obs_dim, obs_dim)\n"),
         (ACTOR_OBS, ACTOR_OBS + "        actor_obs = actor_obs @ self.projection\n")),
        "Agent.projection"),
    "one_statistic_for_all_seeds": (
        ((RETURN, "    stats['mean_return'] = b_returns.mean()\n" + RETURN),),
        "its result mean_return (shape (), not one value per seed)"),
    "linear_in_a_list": (
        ((INIT, INIT + "        self.extra = [nn.Linear(obs_dim, obs_dim)]\n"),
         (ACTOR_OBS, ACTOR_OBS + "        actor_obs = self.extra[0](actor_obs)\n")),
        "Agent.extra"),
}


@pytest.mark.parametrize("kind", MIXING)
def test_what_mixes_seeds_stops_the_first_iteration_in_one_line(tmp_path, capfd, kind):
    edits, says = MIXING[kind]
    module = import_copy(edited(edits, f"my_{kind}", tmp_path))
    line = refused_in_one_line(module, fast_args(ENV, "r", num_seeds=2, total_timesteps=64 * 4, checkpoint_freq=1),
                               tmp_path, capfd, whole_process=False)
    assert says in line, line
    assert not list(tmp_path.rglob("ckpt_*.pt"))  # ckpt_1.pt ends the first iteration


def test_an_update_whose_rounding_grows_over_many_epochs_is_not_taken_for_mixed_seeds(tmp_path):
    """30 epochs at a high learning rate: float rounding, chaotic over so many steps, parted a seed's update from its
    run alone by 2% in the KL (the same on Ant-v5 at iteration 211, resumed, with the settings of benchmarks/pbt.sh);
    the check compares the first update's first epoch, the run trains on."""
    result = run_script("ppo.py", fast_args("Pendulum-v1", "long", num_seeds=2, num_steps=256, num_minibatches=8,
                                            update_epochs=30, learning_rate=0.003, target_kl=None,
                                            total_timesteps=1024), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
