"""Small PettingZoo Parallel envs for ippo.py's tests: `--env_id pz:tests.pz_envs:meet`."""

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

MEET_STEPS = 8


class Meet(ParallelEnv):
    """Two agents on a line, at cells -3..3, each moving one cell left, none or right a step; both earn minus their
    distance over 6. An episode is truncated after MEET_STEPS steps. Each observes its cell, the other's and the time.
    wide_b: agent b observes a fourth entry (agents of different spaces). b_leaves: b's episode terminates after 3
    steps while a's goes on (an agent that leaves early)."""

    metadata = {"name": "meet_v0"}

    def __init__(self, wide_b: bool = False, b_leaves: bool = False):
        self.possible_agents = ["a", "b"]
        self.wide_b, self.b_leaves = wide_b, b_leaves
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (4 if self.wide_b and agent == "b" else 3,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def observations(self) -> dict:
        cells = {agent: self.cell[agent] / 3 for agent in self.agents}
        obs = {agent: [cells[agent], cells["b" if agent == "a" else "a"], self.t / MEET_STEPS] for agent in self.agents}
        if self.wide_b and "b" in obs:
            obs["b"].append(0.0)
        return {agent: np.array(o, dtype=np.float32) for agent, o in obs.items()}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        self.cell = {agent: int(self.rng.integers(-3, 4)) for agent in self.agents}
        return self.observations(), {agent: {} for agent in self.agents}

    def step(self, actions):
        for agent, action in actions.items():
            self.cell[agent] = int(np.clip(self.cell[agent] + int(action) - 1, -3, 3))
        self.t += 1
        reward = -abs(self.cell["a"] - self.cell["b"]) / 6
        obs = self.observations()
        truncated = {agent: self.t == MEET_STEPS for agent in self.agents}
        terminated = {agent: self.b_leaves and agent == "b" and self.t == 3 for agent in self.agents}
        rewards = {agent: reward for agent in self.agents}
        self.agents = [agent for agent in self.agents if not (terminated[agent] or truncated[agent])]
        return obs, rewards, terminated, truncated, {agent: {} for agent in obs}


def meet(**kwargs) -> Meet:
    return Meet(**kwargs)
