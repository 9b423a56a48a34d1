"""Torch-native vector envs (Gymnasium's vector_entry_point convention): tests/envs.py's reference versions step
the same episodes as their Gymnasium versions, bit for bit."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.envs
from tests.util import HostSyncs


@pytest.mark.parametrize("torch_id, gym_id", [("PointMassTorch-v0", "PointMass-v0"),
                                              ("PointMassEndsTorch-v0", "PointMassEnds-v0")])
def test_a_torch_env_steps_the_episodes_of_its_gymnasium_version(torch_id, gym_id):
    num_envs = 3
    torch_envs = gym.make_vec(f"tests.envs:{torch_id}", num_envs=num_envs, vectorization_mode="vector_entry_point")
    gym_envs = gym.vector.SyncVectorEnv([lambda: gym.make(f"tests.envs:{gym_id}")] * num_envs,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert torch_envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    torch_obs, _ = torch_envs.reset(seed=1)
    gym_obs, _ = gym_envs.reset(seed=1)
    assert isinstance(torch_obs, torch.Tensor) and np.array_equal(torch_obs.numpy(), gym_obs)
    actions = np.random.default_rng(0).uniform(-1.5, 1.5, size=(100, num_envs, 1)).astype(np.float32)
    terminations = truncations = 0
    for action in actions:
        *torch_out, torch_info = torch_envs.step(torch.as_tensor(action))
        *gym_out, gym_info = gym_envs.step(action)
        for torch_value, gym_value in zip(torch_out, gym_out):  # observation, reward, terminated, truncated
            assert np.array_equal(torch_value.numpy(), gym_value)
        ended = gym_info.get("_final_obs", np.zeros(num_envs, dtype=bool))
        assert np.array_equal(torch_info["_final_obs"].numpy(), ended)
        if ended.any():
            assert np.array_equal(torch_info["final_obs"].numpy()[ended], np.stack(gym_info["final_obs"][ended]))
        terminations += int(gym_out[2].sum())
        truncations += int(gym_out[3].sum())
    assert truncations > 0 and (terminations > 0) == ("Ends" in gym_id)  # each kind of end was compared


def test_host_syncs_are_counted_and_a_torch_env_step_makes_none():
    x, mask = torch.randn(5), torch.tensor([True, False, True, False, True])
    with HostSyncs() as syncs:  # each of these would wait for a CUDA device
        x[0].item(), x.tolist(), x.cpu(), x.to("cpu"), bool(mask.any()), x[mask], torch.nonzero(mask), torch.where(mask)
        x[mask] = 0.0
    assert syncs.calls == ["item", "tolist", "cpu", "to", "__bool__", "__getitem__", "nonzero", "where",
                           "__setitem__"]
    with HostSyncs() as syncs:  # and these would not
        torch.where(mask, x, 0.0), x[1:], x[torch.tensor([0, 2])], mask.any(), (x * 2).sum()
    assert syncs.calls == []
    envs = gym.make_vec("tests.envs:PointMassEndsTorch-v0", num_envs=4, vectorization_mode="vector_entry_point")
    envs.reset(seed=1)
    with HostSyncs() as syncs:
        for _ in range(3 * tests.envs.EPISODE_STEPS):  # terminations, truncations and resets among them
            envs.step(torch.ones(4, 1))
    assert syncs.calls == []
