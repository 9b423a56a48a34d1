"""Partially observed Gymnasium tasks, registered on import: `--env_id pomdp:CartPoleNoVel-v1`.

- CartPoleNoVel-v1: CartPole-v1 with the cart and pole velocities (observation dims 1 and 3) zeroed, as
  rl-baselines3-zoo's CartPoleNoVel-v1. A policy must infer the velocities from successive positions.
- PendulumNoVel-v1: Pendulum-v1 with the angular velocity (dim 2) zeroed.
- CueRecall-v0: a cue of -1 or +1 is shown at the first step only; at the last of CUE_RECALL_STEPS steps the
  action that matches the cue (0 for -1, 1 for +1) earns reward 1, anything else 0. The return is the success.
  Without memory the best policy is right half of the time.

Each puts its full state in info["critic"], the vector that a privileged critic (--critic_obs) sees: the unmasked
observation; CueRecall's cue and the fraction of the episode gone.
"""

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv, PendulumEnv

CUE_RECALL_STEPS = 8


class MaskObservation(gym.ObservationWrapper):
    """Zero some observation dims: what a sensor does not see. The unmasked observation goes to info["critic"]."""

    def __init__(self, env: gym.Env, hidden_dims: tuple[int, ...]):
        super().__init__(env)
        self.visible = np.ones(env.observation_space.shape, dtype=env.observation_space.dtype)
        self.visible[list(hidden_dims)] = 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self.observation(obs), {**info, "critic": obs}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.observation(obs), reward, terminated, truncated, {**info, "critic": obs}

    def observation(self, observation):
        return observation * self.visible


def cartpole_no_vel(**kwargs) -> gym.Env:
    return MaskObservation(CartPoleEnv(**kwargs), hidden_dims=(1, 3))


def pendulum_no_vel(**kwargs) -> gym.Env:
    return MaskObservation(PendulumEnv(**kwargs), hidden_dims=(2,))


class CueRecall(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.cue, self.t = 1.0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = float(self.np_random.choice([-1.0, 1.0])), 0
        return np.array([self.cue], dtype=np.float32), self.info()

    def step(self, action):
        self.t += 1
        last = self.t == CUE_RECALL_STEPS
        reward = float(last and int(action) == int(self.cue > 0))
        return np.zeros(1, dtype=np.float32), reward, last, False, self.info()

    def info(self) -> dict:
        return {"critic": np.array([self.cue, self.t / CUE_RECALL_STEPS], dtype=np.float32)}

    def render(self):
        """The cue as a white (+1) or grey (-1) square while it is shown, black afterwards."""
        shade = 0 if self.t > 0 else (255 if self.cue > 0 else 128)
        return np.full((32, 32, 3), shade, dtype=np.uint8)


gym.register("CartPoleNoVel-v1", entry_point=cartpole_no_vel, max_episode_steps=500, reward_threshold=475.0)
gym.register("PendulumNoVel-v1", entry_point=pendulum_no_vel, max_episode_steps=200)
gym.register("CueRecall-v0", entry_point=CueRecall, max_episode_steps=CUE_RECALL_STEPS)
