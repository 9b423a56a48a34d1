"""Small deterministic Gymnasium envs for the trainers' tests, registered on import: "tests.envs:PointMass-v0"."""

import os
import random

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.pendulum import PendulumEnv

EPISODE_STEPS = 16


class PointMass(gym.Env):
    """A point on a line starts at x=1 and is pushed by the action; reward -x^2.

    Reset ignores the seed, so a re-created env continues exactly where a finished episode left off:
    runs whose rollouts end on episode boundaries can be resumed bit for bit.
    nan_reward_after: from this many steps of this env on, rewards are NaN (to test the non-finite guard);
    nan_only_on_rank: only in the process of this torchrun rank.
    nan_reward_seed: only in an env last reset with this seed (the seeds of ppo.py --num_seeds reset theirs with
    seeds of their own).
    terminate_odd_episodes: the 1st, 3rd, ... episodes terminate after half the time limit; the others are truncated.
    terminate_halfway: every episode terminates after half the time limit (a rollout of the time limit's steps then
    holds two whole episodes of each env: scripts/verify_copy.py's env, whose copies may count terminations).
    critic: info["critic"] holds x^2 and the step count, a privileged critic's vector (--critic_obs).
    actions: a key of ACTION_KINDS, the push in another action space.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, nan_reward_after=None, render_mode=None, terminate_odd_episodes=False, nan_only_on_rank=None,
                 critic=False, actions=None, nan_reward_seed=None, terminate_halfway=False):
        self.nan_reward_seed, self.nan_this_episode = nan_reward_seed, nan_reward_seed is None
        on_this_rank = nan_only_on_rank is None or int(os.environ.get("RANK", "0")) == nan_only_on_rank
        self.nan_reward_after = nan_reward_after if on_this_rank else None
        self.render_mode = render_mode
        self.terminate_odd_episodes, self.terminate_halfway = terminate_odd_episodes, terminate_halfway
        self.critic = critic
        if actions is not None:
            self.action_space = ACTION_KINDS[actions]
        self.total_steps = 0
        self.episodes = 0

    def _obs(self):
        return np.array([self.x, self.t / EPISODE_STEPS], dtype=np.float32)

    def _info(self):
        return {"critic": np.array([self.x**2, self.t], dtype=np.float32)} if self.critic else {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None and self.nan_reward_seed is not None:
            self.nan_this_episode = seed == self.nan_reward_seed
        self.x, self.t = 1.0, 0
        self.episodes += 1
        return self._obs(), self._info()

    def render(self):
        """A 64x64 frame with a white bar at the point's position: enough for video tests, no pygame needed."""
        frame = np.zeros((64, 64, 3), dtype=np.uint8)
        column = int(np.clip((self.x + 2.0) / 4.0 * 63, 0, 63))
        frame[:, column] = 255
        return frame

    def step(self, action):
        action = np.asarray(action)
        if isinstance(self.action_space, gym.spaces.MultiBinary):
            action = action[:1] - action[1:2]
        self.x += 0.1 * float(np.clip(action.reshape(-1)[0], -1.0, 1.0))
        self.t += 1
        self.total_steps += 1
        reward = -self.x**2
        if self.nan_reward_after is not None and self.nan_this_episode and self.total_steps > self.nan_reward_after:
            reward = float("nan")
        terminated = ((self.terminate_halfway or self.terminate_odd_episodes and self.episodes % 2 == 1)
                      and self.t == EPISODE_STEPS // 2)
        return self._obs(), reward, terminated, False, self._info()


gym.register("PointMass-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS)
gym.register("PointMassCritic-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS, kwargs={"critic": True})
gym.register("PointMassEnds-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS,
             kwargs={"terminate_odd_episodes": True})
gym.register("PointMassNaN-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS,
             kwargs={"nan_reward_after": 200})
gym.register("PointMassNaNSeed3-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS,
             kwargs={"nan_reward_after": 200, "nan_reward_seed": 3})
gym.register("PointMassNaNOnRank1-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS,
             kwargs={"nan_reward_after": 200, "nan_only_on_rank": 1})


# PointMass's push in the other action kinds: the first entry (Discrete's only one), MultiBinary's b0 - b1
ACTION_KINDS = {"Discrete": gym.spaces.Discrete(3, start=-1),
                "MultiDiscrete": gym.spaces.MultiDiscrete([3, 2], start=[-1, 0]),
                "MultiBinary": gym.spaces.MultiBinary(2)}
for kind in ACTION_KINDS:
    gym.register(f"PointMass{kind}-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS,
                 kwargs={"actions": kind})
for kind in ("", *ACTION_KINDS):
    gym.register(f"PointMassHalves{kind}-v0", entry_point=PointMass, max_episode_steps=EPISODE_STEPS,
                 kwargs={"terminate_halfway": True, **({"actions": kind} if kind else {})})


class PointMassButtons(PointMass):
    """PointMass with a two-dimensional MultiBinary action space, which the trainers do not support."""

    action_space = gym.spaces.MultiBinary([2, 2])


gym.register("PointMassButtons-v0", entry_point=PointMassButtons, max_episode_steps=EPISODE_STEPS)


class PointMassPixels(PointMass):
    """PointMass observed as a Dict of its 64x64 frame and its state: an image env whose resets ignore the seed, for
    ppo_rgb.py's exact-resume tests."""

    observation_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
                                         "state": PointMass.observation_space})

    def _obs(self):
        return {"image": self.render(), "state": super()._obs()}


gym.register("PointMassPixels-v0", entry_point=PointMassPixels, max_episode_steps=EPISODE_STEPS)
gym.register("PointMassPixelsCritic-v0", entry_point=PointMassPixels, max_episode_steps=EPISODE_STEPS,
             kwargs={"critic": True})
for kind in ACTION_KINDS:
    gym.register(f"PointMassPixels{kind}-v0", entry_point=PointMassPixels, max_episode_steps=EPISODE_STEPS,
                 kwargs={"actions": kind})
for kind in ("", *ACTION_KINDS):
    gym.register(f"PointMassPixelsHalves{kind}-v0", entry_point=PointMassPixels, max_episode_steps=EPISODE_STEPS,
                 kwargs={"terminate_halfway": True, **({"actions": kind} if kind else {})})


class PointMassGlobalDraws(PointMass):
    """Starts each episode at a point drawn from a global random generator (Python's, numpy's or torch's), as
    hand-written envs often do, instead of from its own self.np_random."""

    DRAWS = {"python": lambda: random.uniform(0.5, 1.5), "numpy": lambda: np.random.uniform(0.5, 1.5),
             "torch": lambda: float(torch.rand(())) + 0.5}

    def __init__(self, draws: str, **kwargs):
        super().__init__(**kwargs)
        self.draw = self.DRAWS[draws]

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.x = self.draw()
        return self._obs(), info


for generator in PointMassGlobalDraws.DRAWS:
    gym.register(f"PointMassGlobal{generator.capitalize()}-v0", entry_point=PointMassGlobalDraws,
                 max_episode_steps=EPISODE_STEPS, kwargs={"draws": generator})


class PointMassNoVideo(PointMass):
    """PointMass whose rendering needs a package that is missing, as classic control's needs pygame."""

    def render(self):
        raise gym.error.DependencyNotInstalled("pretend_renderer is not installed: pip install pretend_renderer")


gym.register("PointMassNoVideo-v0", entry_point=PointMassNoVideo, max_episode_steps=EPISODE_STEPS)


class Choice(gym.Env):
    """Three actions numbered -1, 0, 1 (Discrete with start=-1); reward 1 for action 1. Its constructor takes no
    render_mode, as many third-party envs' do not. A step with an action outside the space raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(3, start=-1)

    def __init__(self):
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action} is outside {self.action_space}")
        self.t += 1
        return np.zeros(1, dtype=np.float32), float(action == 1), False, False, {}


gym.register("Choice-v0", entry_point=Choice, max_episode_steps=EPISODE_STEPS)


class EpisodeIds(gym.Env):
    """Every episode says which it is: reset(seed=s) names the env s, and its k-th episode from then on (k = 0, 1, ...)
    terminates after 1 + (s + k) % 4 steps with return s * 100 + k, all of it on its first step. Envs of one vector
    env thus end their episodes at different times, and an evaluation's returns name the episodes it counted."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self.name, self.episode = 0, -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.name, self.episode = seed, -1
        self.episode += 1
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float(self.name * 100 + self.episode) if self.t == 1 else 0.0
        terminated = self.t == 1 + (self.name + self.episode) % 4
        return np.zeros(1, dtype=np.float32), reward, terminated, False, {}


gym.register("EpisodeIds-v0", entry_point=EpisodeIds, max_episode_steps=EPISODE_STEPS)


class Targets(gym.Env):
    """Each step shows a target for each dimension of the action (one-hot) and pays 1 for each dimension that hits
    it: MultiDiscrete([3, 2, 4]) counting from start=[-1, 0, 2], or MultiBinary(3). Random play earns about 1.4
    (MultiDiscrete) or 1.5 (MultiBinary) per step, a policy that reads its targets 3. A step with an action outside
    the space raises."""

    def __init__(self, binary: bool = False):
        self.sizes = [2, 2, 2] if binary else [3, 2, 4]
        self.start = np.zeros(3, dtype=np.int64) if binary else np.array([-1, 0, 2])
        self.action_space = (gym.spaces.MultiBinary(3) if binary
                             else gym.spaces.MultiDiscrete(self.sizes, start=self.start))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (sum(self.sizes),), np.float32)

    def _obs(self):
        self.targets = [int(self.np_random.integers(n)) for n in self.sizes]
        return np.concatenate([np.eye(n, dtype=np.float32)[t] for n, t in zip(self.sizes, self.targets)])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action)):
            raise ValueError(f"action {action} is outside {self.action_space}")
        hits = sum(int(a) - start == target for a, start, target in zip(action, self.start, self.targets))
        return self._obs(), float(hits), False, False, {}


gym.register("MultiDiscreteTargets-v0", entry_point=Targets, max_episode_steps=EPISODE_STEPS)
gym.register("MultiBinaryTargets-v0", entry_point=Targets, max_episode_steps=EPISODE_STEPS, kwargs={"binary": True})


class PixelSide(gym.Env):
    """A 36x36 RGB image with a white 8x8 square in its left or right half, at a random height; action 0 or 1 names the
    half and earns 1 where it is right. Only the image tells the side: random play earns 8 of 16 per episode, a
    policy that sees it 16. cue=True: a Dict observation {"image", "cue"} whose cue (-1 or +1) says whether the
    paying action is the square's side or the other, so that both keys are needed."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    SIDE = 36

    def __init__(self, cue: bool = False, render_mode=None):
        self.cue, self.render_mode = cue, render_mode
        image = gym.spaces.Box(0, 255, (self.SIDE, self.SIDE, 3), np.uint8)
        self.observation_space = (gym.spaces.Dict({"image": image, "cue": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)})
                                  if cue else image)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        self.side, self.flip = int(self.np_random.integers(2)), int(self.cue and self.np_random.integers(2))
        self.image = np.zeros((self.SIDE, self.SIDE, 3), dtype=np.uint8)
        row, column = int(self.np_random.integers(2, 26)), 4 if self.side == 0 else 24
        self.image[row:row + 8, column:column + 8] = 255
        if not self.cue:
            return self.image
        return {"image": self.image, "cue": np.array([1.0 if self.flip else -1.0], dtype=np.float32)}

    def render(self):
        return self.image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.side ^ self.flip)
        return self._obs(), reward, False, False, {}


gym.register("PixelSide-v0", entry_point=PixelSide, max_episode_steps=EPISODE_STEPS)
gym.register("PixelSideCue-v0", entry_point=PixelSide, max_episode_steps=EPISODE_STEPS, kwargs={"cue": True})


class LoudPendulum(PendulumEnv):
    """Gymnasium's Pendulum-v1 with 100 times its rewards: -1,600 to 0 a step, returns in the tens of thousands."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, 100.0 * reward, terminated, truncated, info


gym.register("LoudPendulum-v0", entry_point=LoudPendulum, max_episode_steps=200)


class PointMassVector(gym.vector.VectorEnv):
    """PointMass as a torch-native vector env: a batch stepped as tensors on its device, in Gymnasium's convention
    for native vector envs (registered with vector_entry_point, same-step autoreset, the final observations in
    info["final_obs"] with the mask info["_final_obs"], every step, so that nothing waits for the device). Its
    episodes are those of PointMass's SyncVectorEnv bit for bit (x in float64, observations cast to float32).
    final_obs_where_ended: info holds them on the steps where an episode ended alone, as Gymnasium's SyncVectorEnv
    gives them (its envs step in lockstep, so it knows which steps those are without reading the device).
    longer_for_odd_seeds: reset(seed=s) with s odd makes the time limit 3 steps longer, so that the blocks of
    --num_seeds end their episodes on different steps."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = EPISODE_STEPS, device: str = "cpu",
                 terminate_odd_episodes: bool = False, final_obs_where_ended: bool = False,
                 longer_for_odd_seeds: bool = False):
        self.num_envs, self.max_episode_steps, self.device = num_envs, max_episode_steps, torch.device(device)
        self.time_limit, self.longer_for_odd_seeds = max_episode_steps, longer_for_odd_seeds
        self.terminate_odd_episodes, self.final_obs_where_ended = terminate_odd_episodes, final_obs_where_ended
        self.lockstep_t, self.lockstep_episodes = 0, 0  # every env's, on the host
        self.single_observation_space, self.single_action_space = PointMass.observation_space, PointMass.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.x = torch.ones(num_envs, dtype=torch.float64, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.episodes = torch.zeros(num_envs, dtype=torch.long, device=self.device)

    def _obs(self) -> torch.Tensor:
        return torch.stack([self.x, self.t / EPISODE_STEPS], dim=1).float()

    def reset(self, *, seed=None, options=None):
        if self.longer_for_odd_seeds and seed is not None:
            self.max_episode_steps = self.time_limit + 3 * (seed % 2)
        self.x.fill_(1.0)
        self.t.zero_()
        self.episodes += 1
        self.lockstep_t, self.lockstep_episodes = 0, self.lockstep_episodes + 1
        return self._obs(), {}

    def step(self, action: torch.Tensor):
        self.x += 0.1 * action.reshape(self.num_envs, -1)[:, 0].clamp(-1.0, 1.0).double()
        self.t += 1
        reward = -self.x**2
        odd = self.episodes % 2 == 1
        terminated = odd & (self.t == EPISODE_STEPS // 2) if self.terminate_odd_episodes else torch.zeros_like(odd)
        truncated = self.t >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self._obs()
        self.x = torch.where(done, 1.0, self.x)
        self.t = torch.where(done, 0, self.t)
        self.episodes += done
        self.lockstep_t += 1
        ended = self.lockstep_t >= self.max_episode_steps or (
            self.terminate_odd_episodes and self.lockstep_episodes % 2 == 1 and self.lockstep_t == EPISODE_STEPS // 2)
        if ended:
            self.lockstep_t, self.lockstep_episodes = 0, self.lockstep_episodes + 1
        info = {"final_obs": final_obs, "_final_obs": done} if ended or not self.final_obs_where_ended else {}
        return self._obs(), reward, terminated, truncated, info


gym.register("PointMassTorch-v0", vector_entry_point=PointMassVector, max_episode_steps=EPISODE_STEPS)
gym.register("PointMassEndsTorch-v0", vector_entry_point=PointMassVector, max_episode_steps=EPISODE_STEPS,
             kwargs={"terminate_odd_episodes": True})
gym.register("PointMassEndsWhereEndedTorch-v0", vector_entry_point=PointMassVector, max_episode_steps=EPISODE_STEPS,
             kwargs={"terminate_odd_episodes": True, "final_obs_where_ended": True})
for where_ended in (False, True):
    gym.register(f"PointMassEndsBySeed{'WhereEnded' * where_ended}Torch-v0", vector_entry_point=PointMassVector,
                 max_episode_steps=EPISODE_STEPS, kwargs={"terminate_odd_episodes": True, "longer_for_odd_seeds": True,
                                                          "final_obs_where_ended": where_ended})


class PointMassPixelsVector(PointMassVector):
    """PointMassPixels as a torch-native vector env: PointMassVector observed as a dict of tensors, each env's 64x64
    frame and its state, the frames those of PointMassPixels."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.single_observation_space = PointMassPixels.observation_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    def _obs(self) -> dict[str, torch.Tensor]:
        column = ((self.x + 2.0) / 4.0 * 63).clamp(0, 63).long()
        lit = torch.arange(64, device=self.device) == column[:, None]  # (num_envs, 64): each env's white column
        image = (lit[:, None, :, None] * 255).to(torch.uint8).expand(self.num_envs, 64, 64, 3)
        return {"image": image, "state": super()._obs()}


gym.register("PointMassPixelsTorch-v0", vector_entry_point=PointMassPixelsVector, max_episode_steps=EPISODE_STEPS)
gym.register("PointMassPixelsEndsTorch-v0", vector_entry_point=PointMassPixelsVector, max_episode_steps=EPISODE_STEPS,
             kwargs={"terminate_odd_episodes": True})
gym.register("PointMassPixelsEndsWhereEndedTorch-v0", vector_entry_point=PointMassPixelsVector,
             max_episode_steps=EPISODE_STEPS, kwargs={"terminate_odd_episodes": True, "final_obs_where_ended": True})
gym.register("PointMassPixelsEnds-v0", entry_point=PointMassPixels, max_episode_steps=EPISODE_STEPS,
             kwargs={"terminate_odd_episodes": True})


class CartPoleVector(gym.vector.VectorEnv):
    """Gymnasium's CartPole-v1 as a torch-native vector env: its dynamics, terminations and 500-step time limit on a
    batch of float64 states (equal to CartPoleEnv's to float rounding: torch's sin and cos are not numpy's). Starts
    are drawn from a torch generator of its own, which reset(seed=s) seeds."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold, x_threshold = 12 * 2 * np.pi / 360, 2.4

    def __init__(self, num_envs: int = 1, max_episode_steps: int = 500, device: str = "cpu"):
        self.num_envs, self.max_episode_steps, self.device = num_envs, max_episode_steps, torch.device(device)
        reference = gym.make("CartPole-v1")
        self.single_observation_space, self.single_action_space = reference.observation_space, reference.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.generator = torch.Generator(self.device)
        self.state = torch.zeros(num_envs, 4, dtype=torch.float64, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=self.device)

    def starts(self) -> torch.Tensor:
        uniform = torch.rand(self.num_envs, 4, generator=self.generator, dtype=torch.float64, device=self.device)
        return uniform * 0.1 - 0.05

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.generator.manual_seed(seed)
        self.state, self.t = self.starts(), torch.zeros_like(self.t)
        return self.state.float(), {}

    def dynamics(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x, x_dot, theta, theta_dot = state.unbind(1)
        force = torch.where(action == 1, self.force_mag, -self.force_mag)
        total_mass, polemass_length = self.masspole + self.masscart, self.masspole * self.length
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / total_mass))
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        return torch.stack([x + self.tau * x_dot, x_dot + self.tau * xacc, theta + self.tau * theta_dot,
                            theta_dot + self.tau * thetaacc], dim=1)

    def step(self, action: torch.Tensor):
        self.state, self.t = self.dynamics(self.state, action.reshape(self.num_envs)), self.t + 1
        x, theta = self.state[:, 0], self.state[:, 2]
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold)
        truncated = self.t >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self.state.float()
        self.state = torch.where(done[:, None], self.starts(), self.state)
        self.t = torch.where(done, 0, self.t)
        reward = torch.ones(self.num_envs, device=self.device)
        return self.state.float(), reward, terminated, truncated, {"final_obs": final_obs, "_final_obs": done}


gym.register("CartPoleTorch-v1", vector_entry_point=CartPoleVector, max_episode_steps=500)


class MaskedChoice(gym.Env):
    """Four actions numbered -1..2 (Discrete with start=-1), of which the step t of an episode allows two: its target
    (t % 4, counted from 0), which pays 1, and the next. The observation shows the target (one-hot); the mask comes
    in info["action_mask"] (Gymnasium's convention), or with dict_obs in a Dict observation's "action_mask"
    (PettingZoo's). A step with a forbidden action raises, as a game engine's does. Random play among the allowed
    actions earns 8 of 16 per episode, a policy that reads its target 16. Reset ignores the seed (PointMass's
    reason). forbid_all_after: from this step of an episode on, the mask allows nothing (to test the error).
    pixels: the target shown as the lit quadrant of a 36x36 RGB image (ppo_rgb.py's)."""

    action_space = gym.spaces.Discrete(4, start=-1)

    def __init__(self, dict_obs: bool = False, forbid_all_after: int | None = None, pixels: bool = False):
        self.dict_obs, self.forbid_all_after, self.pixels = dict_obs, forbid_all_after, pixels
        shown = (gym.spaces.Box(0, 255, (36, 36, 3), np.uint8) if pixels
                 else gym.spaces.Box(0.0, 1.0, (4,), np.float32))
        self.observation_space = (gym.spaces.Dict({"observation": shown, "action_mask": gym.spaces.MultiBinary(4)})
                                  if dict_obs else shown)

    def mask(self) -> np.ndarray:
        mask = np.zeros(4, dtype=np.int8)
        if self.forbid_all_after is None or self.t < self.forbid_all_after:
            mask[[self.t % 4, (self.t + 1) % 4]] = 1
        return mask

    def _obs_info(self):
        obs = np.eye(4, dtype=np.float32)[self.t % 4]
        if self.pixels:
            row, column = divmod(self.t % 4, 2)
            obs = np.zeros((36, 36, 3), dtype=np.uint8)
            obs[row * 18:(row + 1) * 18, column * 18:(column + 1) * 18] = 255
        if self.dict_obs:
            return {"observation": obs, "action_mask": self.mask()}, {}
        return obs, {"action_mask": self.mask()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs_info()

    def step(self, action):
        index = int(action) - self.action_space.start
        if not self.mask()[index]:
            raise ValueError(f"action {action} is forbidden at step {self.t}: its mask is {self.mask()}")
        reward = float(index == self.t % 4)
        self.t += 1
        return *self._obs_info()[:1], reward, False, False, self._obs_info()[1]


gym.register("MaskedChoice-v0", entry_point=MaskedChoice, max_episode_steps=EPISODE_STEPS)
gym.register("MaskedChoiceDict-v0", entry_point=MaskedChoice, max_episode_steps=EPISODE_STEPS,
             kwargs={"dict_obs": True})
gym.register("MaskedChoicePixels-v0", entry_point=MaskedChoice, max_episode_steps=EPISODE_STEPS,
             kwargs={"pixels": True})
gym.register("MaskedChoicePixelsDict-v0", entry_point=MaskedChoice, max_episode_steps=EPISODE_STEPS,
             kwargs={"pixels": True, "dict_obs": True})
gym.register("MaskedChoiceForbidsAll-v0", entry_point=MaskedChoice, max_episode_steps=EPISODE_STEPS,
             kwargs={"forbid_all_after": 5})


class MaskedTargets(Targets):
    """Targets' MultiDiscrete([3, 2, 4]) with a mask per dimension that forbids one value other than its target (the
    dimension of two values: none); a step with a forbidden value raises. The mask comes in info["action_mask"] as a
    tuple of one array per dimension (Gymnasium's MultiDiscrete.sample(mask=...)), or with flat as their
    concatenation."""

    def __init__(self, flat: bool = False):
        super().__init__()
        self.flat = flat

    def _obs(self):
        obs = super()._obs()
        self.masks = []
        for n, target in zip(self.sizes, self.targets):
            mask = np.ones(n, dtype=np.int8)
            if n > 2:
                mask[(target + 1 + int(self.np_random.integers(n - 1))) % n] = 0
            self.masks.append(mask)
        return obs

    def info(self) -> dict:
        return {"action_mask": np.concatenate(self.masks) if self.flat else tuple(self.masks)}

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed)
        return obs, self.info()

    def step(self, action):
        for a, start, mask in zip(action, self.start, self.masks):
            if not mask[int(a) - start]:
                raise ValueError(f"action {action} is forbidden: its masks are {self.masks}")
        obs, reward, terminated, truncated, _ = super().step(action)
        return obs, reward, terminated, truncated, self.info()


gym.register("MaskedTargets-v0", entry_point=MaskedTargets, max_episode_steps=EPISODE_STEPS)
gym.register("MaskedTargetsFlat-v0", entry_point=MaskedTargets, max_episode_steps=EPISODE_STEPS,
             kwargs={"flat": True})


class MaskedChoiceVector(gym.vector.VectorEnv):
    """MaskedChoice as a torch-native vector env, its masks in info["action_mask"] as a tensor (num_envs, 4): the
    episodes of MaskedChoice's SyncVectorEnv; a forbidden action raises."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, max_episode_steps: int = EPISODE_STEPS, device: str = "cpu"):
        self.num_envs, self.max_episode_steps, self.device = num_envs, max_episode_steps, torch.device(device)
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        self.single_action_space = MaskedChoice.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=self.device)

    def _obs_info(self, info: dict) -> tuple:
        targets = self.t % 4
        mask = torch.zeros(self.num_envs, 4, dtype=torch.bool, device=self.device)
        mask[torch.arange(self.num_envs), targets] = True
        mask[torch.arange(self.num_envs), (targets + 1) % 4] = True
        self.allowed = mask
        return torch.eye(4, device=self.device)[targets], {**info, "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        self.t.zero_()
        return self._obs_info({})

    def step(self, action: torch.Tensor):
        index = action.long() + 1
        if not self.allowed[torch.arange(self.num_envs), index].all():
            raise ValueError(f"actions {action.tolist()} include a forbidden one: the masks are {self.allowed}")
        reward = (index == self.t % 4).double()
        self.t += 1
        truncated = self.t >= self.max_episode_steps
        terminated = torch.zeros_like(truncated)
        final_obs = torch.eye(4, device=self.device)[self.t % 4]
        self.t = torch.where(truncated, 0, self.t)
        obs, info = self._obs_info({"final_obs": final_obs, "_final_obs": truncated})
        return obs, reward, terminated, truncated, info


gym.register("MaskedChoiceTorch-v0", vector_entry_point=MaskedChoiceVector, max_episode_steps=EPISODE_STEPS)


class SequenceObs(gym.Env):
    """Observations of varying length (a Sequence space), which no flattening makes a Box."""

    observation_space = gym.spaces.Sequence(gym.spaces.Box(0.0, 1.0, (1,), np.float32))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return (np.zeros(1, np.float32),), {}

    def step(self, action):
        return (np.zeros(1, np.float32),), 0.0, False, False, {}


gym.register("SequenceObs-v0", entry_point=SequenceObs, max_episode_steps=EPISODE_STEPS)
