"""A small deterministic VMAS scenario for ippo.py's tests: "vmas:tests.vmas_scenarios:Clock"."""

import os

import torch
from vmas.simulator.core import Agent, Sphere, World
from vmas.simulator.scenario import BaseScenario
from vmas.simulator.utils import ScenarioUtils


class Clock(BaseScenario):
    """Agents that move freely; every agent observes [its x, its y, steps elapsed / time_scale, its index].

    Agent i starts at (i, 0) whatever the random stream, so a run resumed on an episode boundary continues exactly.
    Its reward is -(its x)^2 (each agent's differs). Options: n_agents (2); terminate_after: the episodes of every
    env terminate after this many steps (None: only the time limit ends them); time_scale (8); nan_reward_after:
    from this many steps on, rewards are NaN; nan_only_on_rank: only in the process of this torchrun rank.
    """

    def make_world(self, batch_dim: int, device: torch.device, **kwargs):
        self.n_agents = kwargs.pop("n_agents", 2)
        self.terminate_after = kwargs.pop("terminate_after", None)
        self.time_scale = kwargs.pop("time_scale", 8)
        self.nan_reward_after = kwargs.pop("nan_reward_after", None)
        if kwargs.pop("nan_only_on_rank", int(os.environ.get("RANK", "0"))) != int(os.environ.get("RANK", "0")):
            self.nan_reward_after = None
        ScenarioUtils.check_kwargs_consumed(kwargs)
        world = World(batch_dim, device)
        for i in range(self.n_agents):
            world.add_agent(Agent(name=f"agent_{i}", collide=False, shape=Sphere(radius=0.05)))
        self.elapsed = torch.zeros(batch_dim, device=device)
        self.total_steps = 0
        return world

    def reset_world_at(self, env_index: int = None):
        for i, agent in enumerate(self.world.agents):
            position = torch.tensor([float(i), 0.0], device=self.world.device)
            if env_index is None:
                agent.set_pos(position.expand(self.world.batch_dim, 2), batch_index=None)
                agent.set_vel(torch.zeros(self.world.batch_dim, 2, device=self.world.device), batch_index=None)
            else:
                agent.set_pos(position, batch_index=env_index)
                agent.set_vel(torch.zeros(2, device=self.world.device), batch_index=env_index)
        if env_index is None:
            self.elapsed.zero_()
        else:
            self.elapsed[env_index] = 0

    def post_step(self):
        self.elapsed += 1
        self.total_steps += 1

    def observation(self, agent: Agent):
        index = self.world.agents.index(agent)
        return torch.cat([agent.state.pos, (self.elapsed / self.time_scale)[:, None],
                          torch.full_like(self.elapsed, float(index))[:, None]], dim=1)

    def reward(self, agent: Agent):
        reward = -agent.state.pos[:, 0] ** 2
        if self.nan_reward_after is not None and self.total_steps >= self.nan_reward_after:
            reward = torch.full_like(reward, float("nan"))
        return reward

    def done(self):
        if self.terminate_after is None:
            return torch.zeros_like(self.elapsed, dtype=torch.bool)
        return self.elapsed >= self.terminate_after
