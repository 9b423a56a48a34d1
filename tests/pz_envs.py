"""Small PettingZoo Parallel envs for ippo.py's tests: `--env_id pz:tests.pz_envs:meet`."""

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

MEET_STEPS = 8
B_LEAVES_AFTER = 3
A_LEAVES_AFTER = 3


class Meet(ParallelEnv):
    """Two agents on a line, at cells -3..3, each moving one cell left, none or right a step; both earn minus their
    distance over 6. An episode is truncated after MEET_STEPS steps. Each observes its cell, the other's and the time.

    Options: wide_b: agent b observes a fourth entry (agents of different observation spaces). fast_b: b also moves
    two cells (Discrete(5), or a second action entry when continuous: agents of different action spaces).
    continuous: actions are Boxes in [-1, 1] (the first entry, rounded, is the move); box_b: b's alone.
    multi="MultiDiscrete": actions are MultiDiscrete([3, 2]) (the move: the first entry - 1); multi="MultiBinary":
    MultiBinary(2), b's MultiBinary(3) with fast_b (the move: first - second entry). b_leaves: b's episode terminates
    after B_LEAVES_AFTER steps while a's goes on (an agent that leaves early); a_leaves: a's after A_LEAVES_AFTER
    (the agent whose row carries the critic's state). b_every_other: b takes part in the env's 1st, 3rd, ... episodes
    only (an episode that starts without one of possible_agents). with_state: state() gives both cells, the time and
    a constant 1 (a state that is not the observations). fixed_start: a starts at -3 and b at 3, whatever the seed.
    render_mode="rgb_array": render() draws the line, 16 pixels a cell, a red and b blue. masked: each agent observes
    a Dict {"observation": ..., "action_mask": ...} (PettingZoo's convention) whose mask forbids the moves away from
    the other agent (the MultiDiscrete's second dimension: nothing), and a forbidden action raises; forbid_all_at:
    at this step of an episode a's mask forbids everything (to test the error)."""

    metadata = {"name": "meet_v0"}

    def __init__(self, wide_b: bool = False, fast_b: bool = False, continuous: bool = False, b_leaves: bool = False,
                 with_state: bool = False, fixed_start: bool = False, render_mode=None, box_b: bool = False,
                 multi: str = "", a_leaves: bool = False, b_every_other: bool = False, masked: bool = False,
                 forbid_all_at: int = -1):
        self.possible_agents = ["a", "b"]
        self.wide_b, self.fast_b, self.continuous, self.b_leaves = wide_b, fast_b, continuous, b_leaves
        self.fixed_start, self.render_mode, self.box_b = fixed_start, render_mode, box_b
        self.multi, self.a_leaves, self.b_every_other, self.episodes = multi, a_leaves, b_every_other, 0
        self.masked, self.forbid_all_at = masked, forbid_all_at
        if with_state:
            self.state_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.rng = np.random.default_rng()

    def observation_space(self, agent):
        space = gym.spaces.Box(-1.0, 1.0, (4 if self.wide_b and agent == "b" else 3,), np.float32)
        if not self.masked:
            return space
        return gym.spaces.Dict({"observation": space, "action_mask": gym.spaces.MultiBinary(len(self.moves(agent)))})

    def moves(self, agent) -> list[tuple]:
        """Each of the agent's actions (a Discrete's, or each entry of a MultiDiscrete's), in the order of its mask,
        with the move it makes (None: the MultiDiscrete's second dimension, which does not move)."""
        if self.multi == "MultiDiscrete":
            return [(0, move) for move in (-1, 0, 1)] + [(1, None), (1, None)]
        return [(0, move) for move in ((-2, -1, 0, 1, 2) if self.fast_b and agent == "b" else (-1, 0, 1))]

    def action_mask(self, agent) -> np.ndarray:
        toward = np.sign(self.cell["b" if agent == "a" else "a"] - self.cell[agent])
        forbid_all = agent == "a" and self.t == self.forbid_all_at
        allowed = [(move is None or move * toward > 0 or move == 0) and not forbid_all for _, move in self.moves(agent)]
        return np.array(allowed, np.int8)

    def action_space(self, agent):
        fast = self.fast_b and agent == "b"
        if self.multi == "MultiDiscrete":
            return gym.spaces.MultiDiscrete([3, 2])
        if self.multi == "MultiBinary":
            return gym.spaces.MultiBinary(3 if fast else 2)
        if self.continuous or (self.box_b and agent == "b"):
            return gym.spaces.Box(-1.0, 1.0, (2 if fast else 1,), np.float32)
        return gym.spaces.Discrete(5 if fast else 3)

    def move(self, agent, action) -> int:
        if self.multi:
            return int(action[0]) - (1 if self.multi == "MultiDiscrete" else int(action[1]))
        if self.continuous or (self.box_b and agent == "b"):
            return int(np.rint(action[0])) + (int(np.rint(action[1])) if len(action) > 1 else 0)
        return int(action) - (2 if self.fast_b and agent == "b" else 1)

    def observations(self) -> dict:
        cells = {agent: self.cell[agent] / 3 for agent in self.possible_agents}
        obs = {agent: [cells[agent], cells["b" if agent == "a" else "a"], self.t / MEET_STEPS] for agent in self.agents}
        if self.wide_b and "b" in obs:
            obs["b"].append(0.5)
        obs = {agent: np.array(o, dtype=np.float32) for agent, o in obs.items()}
        if self.masked:
            return {agent: {"observation": o, "action_mask": self.action_mask(agent)} for agent, o in obs.items()}
        return obs

    def render(self) -> np.ndarray:
        assert self.render_mode == "rgb_array"
        frame = np.full((64, 7 * 16, 3), 255, dtype=np.uint8)
        for agent, rows, color in (("a", slice(0, 32), (255, 0, 0)), ("b", slice(32, 64), (0, 0, 255))):
            frame[rows, (self.cell[agent] + 3) * 16:(self.cell[agent] + 4) * 16] = color
        return frame

    def state(self) -> np.ndarray:
        return np.array([self.cell["a"] / 3, self.cell["b"] / 3, self.t / MEET_STEPS, 1.0], dtype=np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            assert type(seed) is int, f"PettingZoo's seeding takes Python integers, got {type(seed)}"  # as MPE's does
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        if self.b_every_other and self.episodes % 2:
            self.agents = ["a"]
        self.episodes += 1
        self.cell = ({"a": -3, "b": 3} if self.fixed_start
                     else {agent: int(self.rng.integers(-3, 4)) for agent in self.possible_agents})
        return self.observations(), {agent: {} for agent in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        if self.masked:
            for agent, action in actions.items():
                mask, move = self.action_mask(agent), self.move(agent, action)
                if not mask[[m for _, m in self.moves(agent)].index(move)]:
                    raise ValueError(f"agent {agent}'s move {move} is forbidden: its mask is {mask}")
        for agent, action in actions.items():
            self.cell[agent] = int(np.clip(self.cell[agent] + self.move(agent, action), -3, 3))
        self.t += 1
        reward = -abs(self.cell["a"] - self.cell["b"]) / 6
        obs = self.observations()
        truncated = {agent: self.t == MEET_STEPS for agent in self.agents}
        terminated = {agent: (self.b_leaves and agent == "b" and self.t == B_LEAVES_AFTER)
                      or (self.a_leaves and agent == "a" and self.t == A_LEAVES_AFTER) for agent in self.agents}
        rewards = {agent: reward for agent in self.agents}
        self.agents = [agent for agent in self.agents if not (terminated[agent] or truncated[agent])]
        return obs, rewards, terminated, truncated, {agent: {} for agent in obs}


def meet(**kwargs) -> Meet:
    return Meet(**kwargs)
