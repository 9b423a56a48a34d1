"""Independent PPO (IPPO) for multi-agent ManiSkill tasks, VMAS scenarios and PettingZoo Parallel envs, in one file.

    python ippo.py --env_id=TwoRobotPickCube-v1                          # ManiSkill, GPU sim when CUDA is there
    python ippo.py --env_id=TwoRobotStackCube-v1 --num_envs=4 --num_eval_envs=2 --num_minibatches=4   # CPU sim, workers
    python ippo.py --env_id=vmas:navigation --num_envs=60 --num_minibatches=15  # VMAS: pip install vmas
    python ippo.py --env_id=vmas:navigation --num_envs=60 --num_minibatches=15 --share_parameters  # pip install vmas
    python ippo.py --env_id=vmas:navigation --num_envs=60 --num_minibatches=15 --num_seeds=5  # pip install vmas
    python ippo.py --env_id=pz:mpe2.simple_spread_v3 --num_envs=8 --num_minibatches=4  # pip install pettingzoo mpe2
    python ippo.py --resume runs/RUN_NAME                                # continue an interrupted run
    torchrun --standalone --nproc_per_node=4 ippo.py --env_id=TwoRobotPickCube-v1   # data parallel: 4 GPUs

Every agent has its own actor, critic and observation normalizer, acts on its own observation and learns from its own
advantages with PPO's clipped objective. The agents' networks are stacked (one weight tensor per layer, an agent per
slice) and run for all agents in one batched matmul; no agent's loss reaches another agent's slice. The file reads top
to bottom: Args; the Agent; ALGO LOGIC (rollout(), compute_advantages(), ppo_loss(), update(), PPOOptimizer with both
learning-rate schedules); train(), the loop that runs them inside a Run (below the divider: logs, evaluation,
checkpoints, signals); the run's settings (settings(), seed_process(), the envs' kwargs, env_action(), what each agent
observes). Above the "Plumbing" divider stands what an idea changes; below it stand many seeds in one process
(--num_seeds), env adapters, run directories, checkpoints and resume, collectives, signals and validation, which
decide numbers too (what the envs return, dtypes, time limits, what a resume restores): a change there is a refactor,
checked to the bit by benchmarks/same_numbers.py.
A copy (cp ippo.py my_idea.py) is a trainer of its own: runs/ENV__my_idea__SEED__TIME, its own resume and evaluation.
Docs: docs/multi_agent.md (flags, what each agent observes, examples), docs/bootstrap.md, docs/checkpoints.md.

A copy's contract (python scripts/verify_copy.py my_idea.py checks it in short runs), ppo.py's with agents:
- Where to change what: the loss, ppo_loss(); advantages and returns, compute_advantages() (bootstrapping at episode
  ends: rollout()); the networks and the distribution, Agent (get_action_and_value() samples and scores every agent's
  actions, get_action(deterministic=True) is what evaluation and export act with); what the envs receive,
  env_action(); the optimizer's step, the early stop and the learning rate, PPOOptimizer (each network's gradient
  clipped on its own, clip_grad_norm_per_net()); what is logged, the statistics update() returns.
- Shapes: rollout tensors are (num_steps, num_envs, num_agents, ...), alive marking the agents that acted, the
  action masks each agent observed (buf.action_masks, booleans (..., logits), or None, docs/ppo.md); update()
  takes rows (num_steps * num_envs, num_agents, ...) and minibatches of them; ppo_loss() reduces each term over the
  rows an agent was alive in (masked_mean(), the second-to-last dimension), one value per agent, and update() sums the
  agents' into one loss. Under --num_seeds N everything carries a leading seed dimension: rollout tensors
  (num_steps, N, num_envs, num_agents, ...), rows and minibatches (N, rows, num_agents, ...), the Agent's parameters
  and buffers (N, ...) (stack_seeds), one value per seed (and agent) of each statistic. Code written for one seed
  batches where it reduces over the rows counted from the end, indexes parameters and buffers from the end
  (self.agent_ids[..., None, :, :]) and compares statistics elementwise (torch.where); where it does not, the first
  iteration stops with one error line naming the rule.
  Under --pbt_interval the settings a population searches (args.learning_rate, args.gamma, ...: --pbt_space) hold
  one value per member, each meeting its member's part of what it multiplies: use them in tensor arithmetic, never as
  Python numbers (float(), if).
- Random draws: the policy draws with torch.normal, torch.randn_like, torch.bernoulli, torch.multinomial or a Normal,
  Categorical or Bernoulli's sample(); update() draws its own inside optimizer.draws(), in place (random_(), uniform_(),
  normal_()) on a tensor with the seed dimension first. Under --num_seeds each seed's from its own generator
  (PerSeedDraws), any other refused.
- State: a copy's own state lives in the Agent, in one place, __init__: modules, parameters, buffers and optimizers
  of its own, each stepping in its own phase after PPO's step (ppo.py's docstring shows one; PPOOptimizer steps
  whatever PPO's loss reaches). Checkpoints save all of it with the PPO optimizer's state, the reward normalizer and
  the random streams; --resume restores it, --num_seeds gives each seed its own, ppo_eval.py loads it. Nothing else
  is state: what else an update or evaluation changes stops the run with one error line (ppo.py's docstring).
- What an exported policy computes (ppo_eval.py --export, one file per agent): agent i's own entries of row i of
  env_action(get_action(normalize_obs(obs), deterministic=True, action_mask=action_mask)), obs (batch, num_agents,
  obs_dim) holding agent i's observation (padded) in every row, and action_mask (where the env gives masks) agent i's
  mask, a second input; env_action() may read the envs' action_spaces, action_low, action_high, action_start.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import datetime
import errno
import fcntl
import functools
import hashlib
import importlib.util
import inspect
import io
import json
import math
import multiprocessing
import os
import pickle
import random
import re
import secrets
import shlex
import signal
import sys
import threading
import time
import traceback
import types
import warnings
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from torch.distributions import Bernoulli, Categorical, Independent
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

CHECKPOINT_FORMAT = 3
# The file's own name: a copy (cp ippo.py my_idea.py) names its runs after itself, and its checkpoints say which file
# wrote them, so that neither this file nor ppo_eval.py mistakes a copy's runs for this file's.
TRAINER = Path(__file__).stem
# The file's text as it was imported: each run directory keeps it (keep_source) and each checkpoint names it by hash,
# so that a run can be told from, and evaluated with, the code that trained it.
SOURCE = Path(__file__).read_bytes()
SOURCE_SHA256 = hashlib.sha256(SOURCE).hexdigest()
CPU_WORKERS_PER_CORE = 4
GLOBAL_DRAW_WATCH_STEPS = 1000  # --num_seeds: the first resets and steps of in-process envs watched (SeedBlocks)
# The flags that shape the network: a checkpoint's weights fit only a network built with the same.
NETWORK_FIELDS = ("norm_obs", "norm_value", "hidden_sizes", "activation", "share_parameters", "centralized_critic",
                  "agent_obs")
# Copied from ppo.py
LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
NORMAL_ENTROPY_AT_UNIT_STD = 0.5 + 0.5 * math.log(2 * math.pi)
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
# A forbidden action's logit (DiscreteActions): sb3-contrib's. Unlike -inf, it keeps a mask that forbids every action
# of a dimension, and the entropy's gradient, finite.
MASKED_LOGIT = -1e8


@dataclass
class Args:
    exp_name: Optional[str] = None
    """name of the run; runs/{exp_name} (default: {env_id}__ippo__{seed}__{unix time}, ":" in env_id as "_")"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the environments)"""
    num_seeds: int = 1
    """train seeds seed, seed+1, ..., seed+num_seeds-1 in this one process, each a run of its own in
    runs/{run_name}/{run_name}__seed{seed}, as a run of that seed alone would train (docs/multi_agent.md)"""
    pbt_interval: Optional[int] = None
    """population-based training of the --num_seeds members (at least 4): every this many iterations they are ranked,
    and the worst take the whole learner state of better ones, then perturb its settings (docs/pbt.md; None: off)"""
    pbt_space: tuple[str, ...] = ("learning_rate=1e-5:1e-2:log", "ent_coef=0:0.02")
    """the settings each member holds, NAME=LOW:HIGH[:log] as scripts/tune.py's --space, of learning_rate, ent_coef,
    clip_coef, vf_coef, max_grad_norm, gamma, gae_lambda, target_kl"""
    pbt_start: Literal["flags", "space"] = "flags"
    """members start from the flags' values, or drawn from --pbt_space"""
    pbt_objective: Literal["episodes", "eval"] = "episodes"
    """the ranking's score: the mean return (success_once where the env reports it) of the training episodes that
    ended since the last ranking; eval: of an evaluation of each member on the same seeds"""
    pbt_warmup: Optional[int] = None
    """iterations before the first ranking (None: one --pbt_interval)"""
    pbt_fraction: float = 0.25
    """the worst this fraction take the state of a random member of the best this fraction"""
    pbt_rule: Literal["truncation", "dexpbt"] = "truncation"
    """truncation: every member of the worst fraction takes a donor's state; dexpbt (Petrenko et al. 2023): only where
    the donor leads by more than --pbt_margin of the scores' range, the others perturb their own settings"""
    pbt_margin: float = 0.1
    """dexpbt: the lead, as a fraction of the range of the members' scores, that makes a member take a donor's state"""
    pbt_perturb: float = 0.2
    """explore: multiply a setting by 1 - this or 1 + this (gamma and gae_lambda: 1 - x), clamped to --pbt_space"""
    pbt_resample: float = 0.25
    """explore: the probability that a setting is drawn from --pbt_space afresh instead"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, the learner runs on CUDA when it is available"""
    compile: bool = False
    """torch.compile the policy step and the losses (numbers change slightly; eager, with a warning, where it fails)"""
    torch_threads: int = 1
    """CPU threads for torch (0: torch's default); more gain little for small networks and compete with env workers"""
    track: bool = False
    """if toggled, also log to Weights and Biases, with the videos (needs `pip install wandb`); under --num_seeds, a
    wandb run for each seed"""
    wandb_project_name: Optional[str] = None
    """the wandb project name (default: "ManiSkill" for ManiSkill's tasks, else "ppo-baselines")"""
    wandb_entity: Optional[str] = None
    """the wandb entity (team) name"""
    wandb_group: Optional[str] = None
    """the wandb group of the run (default: under --num_seeds, the run's name, grouping its seeds)"""
    wandb_tags: tuple[str, ...] = ()
    """the wandb tags of the run"""
    capture_video: bool = True
    """if toggled, record videos of evaluation episodes under runs/{run_name}/videos"""
    save_model: bool = True
    """if toggled, save checkpoints under runs/{run_name} every checkpoint_freq iterations and at the end"""
    checkpoint_freq: Optional[int] = None
    """write ckpt_{iteration}.pt every this many iterations (None: at every evaluation, eval_freq), and at the end"""
    keep_checkpoints: Optional[int] = None
    """keep only the newest this many ckpt_{iteration}.pt (None: all); final_ckpt.pt is kept besides"""
    checkpoint: Optional[str] = None
    """start training from the weights (and observation statistics) of this checkpoint; a new run"""
    resume: Optional[str] = None
    """continue a run exactly from a checkpoint file or a run directory (its newest checkpoint)"""

    env_id: str = "TwoRobotPickCube-v1"
    """ManiSkill multi-agent task id (a Dict action space keyed by agent; "module:EnvId" imports module first),
    vmas:<scenario>, vmas:<module>:<ScenarioClass>, or a PettingZoo Parallel env: pz:<module> (its parallel_env, e.g.
    pz:mpe2.simple_spread_v3) or pz:<module>:<function>"""
    env_kwargs: tuple[str, ...] = ()
    """KEY=VALUE env options, values as Python literals: VMAS scenario and make_env options (n_agents=3,
    continuous_actions=False); ManiSkill gym.make options (robot_init_qpos_noise=0.05)"""
    agent_obs: Optional[str] = None
    """ManiSkill: what each agent observes, full (the whole state; the default) or local (its own robot's entries
    and the task's shared ones). VMAS agents observe what the scenario gives them"""
    max_episode_steps: Optional[int] = None
    """the episodes' time limit (None: the ManiSkill task's own; 100 for VMAS)"""
    sim_backend: Literal["auto", "gpu", "cpu"] = "auto"
    """ManiSkill simulation backend; auto = gpu when CUDA is available. VMAS runs on the learner's device"""
    control_mode: Optional[str] = "pd_joint_delta_pos"
    """ManiSkill control mode (None: the task's default)"""
    num_envs: int = 512
    """number of parallel training environments (of each torchrun process)"""
    async_envs: bool = False
    """PettingZoo envs: step the training envs in worker processes, one per core (ManiSkill's CPU envs always are)"""
    num_eval_envs: int = 8
    """number of parallel evaluation environments (of rank 0, which alone evaluates)"""
    partial_reset: bool = True
    """ManiSkill: reset an env as soon as its episode terminates (else episodes run to the time limit)"""
    eval_partial_reset: bool = False
    """ManiSkill: partial_reset for the evaluation environments"""
    num_steps: int = 50
    """steps per environment per rollout"""
    num_eval_steps: Optional[int] = None
    """steps per evaluation (default: the task's max episode steps, so every eval env finishes an episode)"""
    reconfiguration_freq: Optional[int] = None
    """ManiSkill: reconfigure the training scenes every this many resets (None: the task's default)"""
    eval_reconfiguration_freq: Optional[int] = 1
    """ManiSkill: reconfigure the evaluation scenes every this many resets"""
    norm_obs: bool = False
    """normalize each agent's observations with its own running mean/std (float64 statistics, saved in checkpoints)"""
    norm_reward: bool = False
    """divide each agent's rewards by a running std of its discounted return, clip to +-10 (SB3's VecNormalize, one
    per agent)"""
    norm_value: bool = False
    """each agent's critic predicts standardized returns (running mean/std of the agent's value targets, float64, saved
    in checkpoints, updated before each update); its values are de-standardized for GAE and bootstrapping"""
    hidden_sizes: tuple[int, ...] = (256, 256, 256)
    """widths of the hidden layers of every actor and critic"""
    activation: Literal["tanh", "relu"] = "tanh"
    """the hidden layers' nonlinearity"""
    log_std_init: float = -0.5
    """the Gaussian policy's initial log-std (CleanRL: 0; zoo's MuJoCo: -2); a loaded checkpoint's trained one wins"""
    share_parameters: bool = False
    """one actor and one critic for all agents, each agent's inputs tagged with a one-hot agent id"""
    centralized_critic: bool = False
    """each agent's critic sees the global state (ManiSkill's full state, a PettingZoo env's state() where it has one,
    else every agent's observation): MAPPO"""
    bootstrap_at_done: Literal["auto", "always", "truncated", "never"] = "auto"
    """finished episodes that bootstrap from V(final obs): always, truncated (terminations are terminal), never;
    auto: always for ManiSkill tasks, truncated otherwise"""

    total_timesteps: int = 10_000_000
    """total environment steps of the run (of all torchrun processes together; under --num_seeds, each seed's)"""
    learning_rate: float = 3e-4
    """the (initial) learning rate of the optimizer"""
    lr_schedule: Literal["constant", "linear", "adaptive"] = "constant"
    """constant; linear (decay to 0); adaptive (multiply or divide by lr_factor to keep the KL near kl_target)"""
    anneal_lr: bool = False
    """ManiSkill/CleanRL's name for --lr_schedule=linear"""
    kl_target: float = 0.01
    """adaptive schedule: the KL divergence the learning rate steers towards"""
    lr_factor: float = 1.5
    """adaptive schedule: factor by which the learning rate moves"""
    min_learning_rate: float = 1e-5
    """adaptive schedule: lower bound of the learning rate"""
    max_learning_rate: float = 1e-2
    """adaptive schedule: upper bound of the learning rate"""
    gamma: float = 0.8
    """the discount factor"""
    gae_lambda: float = 0.9
    """the lambda of generalized advantage estimation"""
    finite_horizon_gae: bool = False
    """use ManiSkill's finite-horizon GAE (lambda-weights renormalized over the steps left in the rollout)"""
    num_minibatches: int = 32
    """number of minibatches per epoch (each torchrun process splits its own rollout into this many)"""
    update_epochs: int = 4
    """number of epochs over each rollout"""
    norm_adv: bool = True
    """normalize each agent's advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = False
    """clip the value loss like the policy ratio"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for gradient clipping, of each network's gradient (each agent's; the one shared network's)"""
    target_kl: Optional[float] = 0.1
    """stop the update of a rollout once a minibatch's approximate KL exceeds this for any agent (None: never)"""
    reward_scale: float = 1.0
    """multiply rewards by this before computing advantages"""
    eval_freq: int = 25
    """evaluate every this many iterations, and at the end"""
    save_train_video_freq: Optional[int] = None
    """with capture_video, record a ManiSkill training video every this many iterations"""


# --resume continues one experiment: only the flags that say how long it runs and how it is run, watched and stored
# may change. Any other difference (the task, the algorithm, the evaluation) is another experiment: start it from the
# run's weights with --checkpoint.
RESUME_CHANGEABLE_FIELDS = ("total_timesteps", "eval_freq", "checkpoint_freq", "keep_checkpoints", "capture_video",
                            "save_train_video_freq", "save_model", "track", "wandb_project_name", "wandb_entity",
                            "wandb_group", "wandb_tags", "torch_threads", "cuda", "torch_deterministic",
                            "async_envs")


# ---------------------------------------------------------------------------------------------
# Agent: actor and critic, running normalization
# ---------------------------------------------------------------------------------------------

class AgentLinear(nn.Module):
    """One linear layer per network, run for every agent in one batched matmul: (num_agents, B, in) ->
    (num_agents, B, out); under --num_seeds with the seed dimension first, of the weights as of x.

    With num_nets = num_agents, agent i's outputs depend on slice i of the weights alone; with num_nets = 1 (shared
    parameters) the one slice serves every agent.
    """

    def __init__(self, num_nets: int, in_dim: int, out_dim: int, std: float = np.sqrt(2)):
        super().__init__()
        weight = torch.empty(num_nets, out_dim, in_dim)
        for net_weight in weight:
            torch.nn.init.orthogonal_(net_weight, std)
        self.weight = nn.Parameter(weight.transpose(1, 2).contiguous())
        self.bias = nn.Parameter(torch.zeros(num_nets, 1, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + self.bias


def mlp(num_nets: int, in_dim: int, hidden_sizes: tuple[int, ...], activation: str, out_dim: int,
        out_std: float) -> nn.Sequential:
    layers, width = [], in_dim
    for size in hidden_sizes:
        layers += [AgentLinear(num_nets, width, size), ACTIVATIONS[activation]()]
        width = size
    return nn.Sequential(*layers, AgentLinear(num_nets, width, out_dim, std=out_std))


class RunningMeanStd(nn.Module):
    """Running mean and variance in float64 (parallel-variance merge) over the batch dimension, one statistic per
    entry of shape (num_agents, ...) and a count per agent; buffers, so checkpoints carry them. The batch dimension
    stands right before the statistic's dimensions: where the buffers have a leading dimension (one statistic per
    network of a stack), x has the same one before its batch."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0):
        super().__init__()
        self.clip = clip
        self.batch_dim = -len(shape) - 1  # counted from the end, as a stack's leading dimension comes first
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.full(shape[:1] + (1,) * (len(shape) - 1), 1e-4, dtype=torch.float64))

    def update(self, x: torch.Tensor, alive: Optional[torch.Tensor] = None):
        """x (..., batch, num_agents, ...); alive (..., batch, num_agents): the entries to count (all by default), so
        that each agent's statistics count only the steps it took part in."""
        x = x.double()
        agents_shape = x.shape[:x.dim() + self.batch_dim + 2]
        weight = (torch.ones(agents_shape, device=x.device) if alive is None else alive).double()
        weight = weight.reshape(agents_shape + (1,) * (-self.batch_dim - 2))
        batch_count = weight.sum(self.batch_dim)
        batch_mean = (weight * x).sum(self.batch_dim) / batch_count.clamp(min=1)
        batch_var = ((weight * (x - batch_mean.unsqueeze(self.batch_dim)) ** 2).sum(self.batch_dim)
                     / batch_count.clamp(min=1))
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean += delta * batch_count / total
        self.var.copy_((self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total)
                       / total)
        self.count.copy_(total)

    # Copied from ppo.py
    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + 1e-8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.unsqueeze(self.batch_dim), self.std().unsqueeze(self.batch_dim)
        return torch.clamp((x.double() - mean) / std, -self.clip, self.clip).float()

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() * self.std().unsqueeze(self.batch_dim) + self.mean.unsqueeze(self.batch_dim)).float()


class RewardNormalizer(nn.Module):
    """Divides rewards by the running std of each env's discounted return (SB3's VecNormalize): the critic then
    learns values of about unit scale whatever the task's reward scale. The return restarts when an episode ends.

    One statistic per agent, over that agent's returns in every env (one VecNormalize per agent's reward stream):
    each agent's critic learns its own rewards, whose scales may differ (a ManiSkill team reward is the same for
    every agent, and so are then their statistics)."""

    def __init__(self, num_envs: int, num_agents: int, gamma: float, clip: float = 10.0):
        super().__init__()
        self.gamma, self.clip = gamma, clip
        self.return_rms = RunningMeanStd((num_agents,))
        # Not saved: a resumed run resets its envs, so their returns start again from 0.
        self.register_buffer("discounted_return", torch.zeros(num_envs, num_agents, dtype=torch.float64),
                             persistent=False)

    def forward(self, reward: torch.Tensor, done: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """reward, done (each agent's episode ended) and alive (the agents that acted): (num_envs, num_agents)."""
        self.discounted_return.mul_(self.gamma).add_(reward)
        # every rank's, so that every rank scales alike
        self.return_rms.update(gather_rows(self.discounted_return), gather_rows(alive))
        self.discounted_return.masked_fill_(done, 0.0)
        scale = torch.sqrt(self.return_rms.var.unsqueeze(-2) + 1e-8)
        return torch.clamp(reward / scale, -self.clip, self.clip).float()


# Copied from ppo.py
class DiscreteActions(nn.Module):
    """The policy's distribution over Discrete, MultiDiscrete and MultiBinary actions, from the actor's logits: a
    Categorical; a Categorical per dimension (each dimension's logits a row of a grid, padded with -inf); a Bernoulli
    per dimension. Log-probabilities and entropies are summed over the dimensions; the mode is each dimension's.
    An action mask (True where the env allows an action; a MultiDiscrete's dimensions one after another, as the
    logits) gives the actions it forbids the logit MASKED_LOGIT, as sb3-contrib's MaskableCategorical: their
    probability is exactly 0, so they are never drawn nor the mode, and add nothing to the entropy."""

    def __init__(self, action_space: dict):
        super().__init__()
        self.kind = action_space["type"]
        nvec = action_space.get("nvec", [])
        self.grid_shape = (len(nvec), max(nvec, default=0))
        # the grid cell of each logit; not in checkpoints, as the action space rebuilds them
        rows = torch.repeat_interleave(torch.arange(len(nvec)), torch.tensor(nvec, dtype=torch.long))
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", torch.tensor([i for n in nvec for i in range(n)], dtype=torch.long),
                             persistent=False)

    @staticmethod
    def num_logits(action_space: dict) -> int:
        if action_space["type"] == "Discrete":
            return action_space["n"]
        if action_space["type"] == "MultiDiscrete":
            return sum(action_space["nvec"])
        return action_space["shape"][0]  # MultiBinary

    def grid(self, logits: torch.Tensor) -> torch.Tensor:
        grid = logits.new_full((*logits.shape[:-1], *self.grid_shape), float("-inf"))
        grid[..., self.rows, self.cols] = logits
        return grid

    def distribution(self, logits: torch.Tensor, action_mask: Optional[torch.Tensor] = None
                     ) -> torch.distributions.Distribution:
        logits = self.masked(logits, action_mask)
        if self.kind == "Discrete":
            return Categorical(logits=logits, validate_args=False)  # validation syncs with the GPU
        if self.kind == "MultiBinary":
            return Independent(Bernoulli(logits=logits, validate_args=False), 1, validate_args=False)
        return Independent(Categorical(logits=self.grid(logits), validate_args=False), 1, validate_args=False)

    def mode(self, logits: torch.Tensor, action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.kind == "MultiBinary":
            return (logits > 0).float()
        logits = self.masked(logits, action_mask)
        return (logits if self.kind == "Discrete" else self.grid(logits)).argmax(-1)

    @staticmethod
    def masked(logits: torch.Tensor, action_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return logits if action_mask is None else logits.masked_fill(~action_mask, MASKED_LOGIT)


def action_width(space: dict) -> int:
    """The actor's outputs for an action space: logits of the discrete kinds, the Box's means."""
    return DiscreteActions.num_logits(space) if space["type"] != "Box" else space["shape"][0]


def joint_action_space(spaces: list[dict]) -> dict:
    """The action space of the stacked actors: the agents' own where all are alike, else the widest (of the one kind
    they share, and one MultiDiscrete space), each agent using the first entries of its actions and logits."""
    if all(space == spaces[0] for space in spaces):
        return spaces[0]
    widest = max(spaces, key=action_width)
    return {"type": widest["type"], "n": widest["n"]} if widest["type"] == "Discrete" else {
        "type": widest["type"], "shape": widest["shape"]}


class Agent(nn.Module):
    """Every agent's actor and critic. Inputs and outputs are (batch, num_agents, ...) (under --num_seeds with the
    seed dimension first, as the parameters and buffers have it: indexed from the end).

    The actor reads the first actor_dim entries of an agent's observation; the critic the whole, or with
    state_index (a centralized critic) the global state out of all agents' observations laid end to end; it is a
    buffer, so a checkpoint rebuilds the critic's inputs. Agents of different spaces share the joint action space
    (joint_action_space): own_entries marks each agent's own logits (of the discrete kinds: the others are never
    drawn) or action entries (of a Box: the others count in no log-probability or entropy). action_mask: the env's
    (batch, num_agents, logits), what each agent may do (None where the env gives none).
    """

    def __init__(self, num_agents: int, obs_dim: int, action_spaces: list[dict], norm_obs: bool, norm_value: bool,
                 hidden_sizes: tuple[int, ...], activation: str, log_std_init: float, share_parameters: bool,
                 state_index: Optional[torch.Tensor], actor_dim: Optional[int] = None):
        super().__init__()
        self.num_agents = num_agents
        self.actor_dim = obs_dim if actor_dim is None else actor_dim
        num_nets = 1 if share_parameters else num_agents
        action_space = joint_action_space(action_spaces)
        self.discrete = action_space["type"] != "Box"
        width = action_width(action_space)
        own = torch.arange(width) < torch.tensor([action_width(space) for space in action_spaces])[:, None]
        self.register_buffer("own_entries", None if own.all() else own, persistent=False)
        self.obs_normalizer = RunningMeanStd((num_agents, obs_dim)) if norm_obs else None
        self.value_normalizer = RunningMeanStd((num_agents,)) if norm_value else None
        # One network for all agents tells them apart by a one-hot id appended to its inputs.
        self.register_buffer("agent_ids", torch.eye(num_agents) if share_parameters else torch.zeros(num_agents, 0))
        self.register_buffer("state_index", state_index)
        id_dim = self.agent_ids.shape[1]
        critic_in = obs_dim if state_index is None else len(state_index)
        self.critic = mlp(num_nets, critic_in + id_dim, hidden_sizes, activation, 1, out_std=1.0)
        self.actor = mlp(num_nets, self.actor_dim + id_dim, hidden_sizes, activation, width,
                         out_std=0.01 if self.discrete else 0.01 * np.sqrt(2))
        if self.discrete:
            self.discrete_actions = DiscreteActions(action_space)
        else:
            self.actor_logstd = nn.Parameter(torch.ones(num_nets, width) * log_std_init)

    # Copied from ppo.py
    def normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.obs_normalizer is None else self.obs_normalizer(obs)

    def run(self, net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, self.agent_ids[..., None, :, :].expand(*x.shape[:-1], -1)], dim=-1)
        return net(x.transpose(-3, -2)).transpose(-3, -2)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.state_index is not None:
            state = obs.flatten(-2).gather(-1, self.state_index[..., None, :].expand(*obs.shape[:-2], -1))
            obs = state.unsqueeze(-2).expand(*obs.shape[:-1], -1)
        value = self.run(self.critic, obs).squeeze(-1)
        return value if self.value_normalizer is None else self.value_normalizer.denormalize(value)

    def actor_output(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits (those an agent lacks at the lowest float: never drawn, nothing to its log-probabilities or
        entropy) or the Normal's means."""
        out = self.run(self.actor, obs[..., :self.actor_dim])
        if self.discrete and self.own_entries is not None:
            out = out.masked_fill(~self.own_entries, torch.finfo(out.dtype).min)
        return out

    def get_action(self, obs: torch.Tensor, deterministic: bool = False,
                   action_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not deterministic:
            return self.get_action_and_value(obs, action_mask=action_mask)[0]
        logits_or_mean = self.actor_output(obs)
        return self.discrete_actions.mode(logits_or_mean, action_mask) if self.discrete else logits_or_mean

    def get_action_and_value(self, obs: torch.Tensor, action: Optional[torch.Tensor] = None,
                             action_mask: Optional[torch.Tensor] = None):
        if self.discrete:
            pi = self.discrete_actions.distribution(self.actor_output(obs), action_mask)
            if action is None:
                action = pi.sample()
            return action, pi.log_prob(action), pi.entropy(), self.get_value(obs)
        # torch.distributions.Normal's sample, log_prob and entropy, written out: building its object costs more than
        # the arithmetic at a rollout step's batch size (12% of the training time of one CPU env at CleanRL's
        # settings). The same operations, so the same numbers (tests/test_ippo.py).
        mean = self.actor_output(obs)
        std = self.actor_logstd[..., None, :, :].expand_as(mean).exp()
        if action is None:
            with torch.no_grad():
                # torch.normal(mean, std)'s numbers (in a new tensor's order) without its check that std >= 0,
                # which waits for a GPU
                action = mean + std * torch.randn_like(mean, memory_format=torch.contiguous_format)
        # Two logs of std, as Normal takes: one shared log would add the entropy's gradient to the log-probability's
        # before dividing by std, which rounds otherwise (with ent_coef > 0).
        logprob = -((action - mean) ** 2) / (2 * std**2) - std.log() - LOG_SQRT_2PI
        entropy = NORMAL_ENTROPY_AT_UNIT_STD + std.log()
        if self.own_entries is not None:
            logprob, entropy = torch.where(self.own_entries, logprob, 0.0), torch.where(self.own_entries, entropy, 0.0)
        return action, logprob.sum(-1), entropy.sum(-1), self.get_value(obs)


def make_agent(args: Args, envs: TorchVecEnv) -> Agent:
    action_spaces = [space_to_dict(space) for space in envs.action_spaces]
    if args.share_parameters and (len(set(envs.agent_obs_dims)) > 1
                                  or any(space != action_spaces[0] for space in action_spaces)):
        raise UserError(f"--share_parameters runs one network for all agents and needs them alike; {args.env_id}'s "
                        f"agents observe {envs.agent_obs_dims} entries and act in {envs.action_spaces}")
    return Agent(envs.num_agents, envs.obs_dim, action_spaces, args.norm_obs, args.norm_value, args.hidden_sizes,
                 args.activation, args.log_std_init, args.share_parameters,
                 envs.state_index if args.centralized_critic else None, envs.actor_dim)


# ---------------------------------------------------------------------------------------------
# ALGO LOGIC: rollout with final-value bootstrapping, advantages, the clipped-surrogate update
# ---------------------------------------------------------------------------------------------

class RolloutBuffer:
    """One rollout's tensors, (num_steps, num_envs, num_agents, ...), on the learner's device (a vector env of seed
    blocks': (num_steps, num_seeds, num_envs, num_agents, ...)). alive[t] marks the agents that acted in step t (a
    PettingZoo agent whose episode ended before its env's does not, until the env's next episode): the others'
    entries count nowhere. dones[t] marks the agents' episodes that ended with step t; bootstrap_values[t] is V(final
    obs) for those of them that bootstrap, 0 elsewhere; action_masks[t], the actions that obs[t] allowed each agent
    (None where the envs give no action mask)."""

    def __init__(self, num_steps: int, envs: TorchVecEnv, device: torch.device):
        self.env_dims = len(envs.batch_shape)
        shape = (num_steps, *envs.batch_shape, envs.num_agents)
        self.obs = torch.zeros((*shape, envs.obs_dim), device=device)
        action_space = envs.joint_action_space
        integer = action_space["type"] in ("Discrete", "MultiDiscrete")  # MultiBinary's are Bernoulli's floats
        self.actions = torch.zeros((*shape, *action_space.get("shape", [])),
                                   dtype=torch.long if integer else torch.float32, device=device)
        self.logprobs, self.rewards, self.dones, self.values, self.bootstrap_values = (
            torch.zeros(shape, device=device) for _ in range(5))
        self.alive = torch.ones(shape, dtype=torch.bool, device=device)
        self.action_masks = None if envs.action_mask is None else torch.zeros(
            (num_steps, *envs.action_mask.shape), dtype=torch.bool, device=device)

    # Copied from ppo.py
    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """A rollout tensor as the batch's rows, (num_steps * num_envs, ...); seed blocks' as each seed's rows,
        (num_seeds, num_steps * num_envs, ...)."""
        return x.flatten(0, 1) if self.env_dims == 1 else x.transpose(0, 1).flatten(1, 2)


def rollout(agent: Agent, envs: TorchVecEnv, buf: RolloutBuffer, next_obs: torch.Tensor, policy_step,
            reward_normalizer: Optional[RewardNormalizer], args: Args, bootstrap_rule: str):
    """Step the envs num_steps times with the policy (policy_step: get_action_and_value, compiled under
    --compile), filling buf. Returns the observation after the last step and the finished episodes' metrics (key
    -> one value per episode)."""
    episodes = defaultdict(list)
    buf.bootstrap_values.zero_()
    for step in range(args.num_steps):
        # inference_mode, not no_grad: it skips autograd's version and view tracking, a large share of the cost of a
        # rollout step's small ops. Its tensors never reach the update's autograd: they are copied into buf, and the
        # env gets a clamped or shifted copy of the action.
        alive = envs.alive
        with torch.inference_mode():
            if agent.obs_normalizer is not None:  # every rank's, so that every rank normalizes alike
                agent.obs_normalizer.update(gather_rows(next_obs), gather_rows(alive))
            obs = agent.normalize_obs(next_obs)
            action, logprob, _, value = policy_step(obs, action_mask=envs.action_mask)
        buf.obs[step], buf.actions[step], buf.logprobs[step], buf.values[step] = obs, action, logprob, value
        buf.alive[step] = alive
        if buf.action_masks is not None:
            buf.action_masks[step] = envs.action_mask
        next_obs, reward, terminated, truncated, final_obs, finished = envs.step(action)
        done = terminated | truncated
        if reward_normalizer is not None:
            reward = reward_normalizer(reward, done, alive)
        buf.rewards[step] = reward * args.reward_scale
        buf.dones[step] = done
        if final_obs is not None and bootstrap_rule != "never":
            with torch.inference_mode():
                final_values = agent.get_value(agent.normalize_obs(final_obs))
            bootstrap = bootstrap_mask(bootstrap_rule, terminated, truncated)
            buf.bootstrap_values[step] = torch.where(bootstrap, final_values, 0.0)
        if finished is not None:
            for key, values in finished.items():
                episodes[key].append(values)
    return next_obs, {key: torch.cat(values) for key, values in episodes.items()}


# Copied from ppo.py
def bootstrap_mask(rule: str, terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Which finished episodes take V(final obs) as the value after their last step."""
    if rule == "always":
        return terminated | truncated
    if rule == "truncated":
        return truncated & ~terminated
    return torch.zeros_like(terminated)


# Copied from ppo.py
def compute_advantages(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, bootstrap_values: torch.Tensor,
                       next_value: torch.Tensor, gamma: float, gae_lambda: float, finite_horizon: bool) -> torch.Tensor:
    """GAE over a rollout's (num_steps, ...) tensors, each env (each index after the first) on its own; next_value =
    V(obs after the last step). Nothing crosses an episode end. finite_horizon: ManiSkill's variant, whose
    lambda-weights are renormalized over the steps left before the rollout or episode ends, so a short tail is not
    dominated by its last value."""
    # Whatever does not depend on the next step's result is computed for all steps at once, outside the loop.
    not_dones = 1.0 - dones
    real_next_values = not_dones * torch.cat([values[1:], next_value[None]]) + bootstrap_values
    advantages = torch.zeros_like(rewards)
    if finite_horizon:
        lam_decay, decay = gae_lambda * not_dones, gae_lambda * gamma * not_dones
        discounted_next_values = gamma * real_next_values
        lam_coef_sum = reward_term_sum = value_term_sum = torch.zeros_like(next_value)
        for t in reversed(range(rewards.shape[0])):
            lam_coef_sum = 1.0 + lam_decay[t] * lam_coef_sum
            reward_term_sum = decay[t] * reward_term_sum + lam_coef_sum * rewards[t]
            value_term_sum = decay[t] * value_term_sum + discounted_next_values[t]
            advantages[t] = (reward_term_sum + value_term_sum) / lam_coef_sum - values[t]
        return advantages
    deltas = rewards + gamma * real_next_values - values
    decay = gamma * gae_lambda * not_dones
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        last_gae = deltas[t] + decay[t] * last_gae
        advantages[t] = last_gae
    return advantages


def masked_mean(x: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """Each agent's mean over the rows (the second-to-last dimension) of the entries where it was alive."""
    return torch.where(alive, x, 0.0).sum(-2) / alive.sum(-2).clamp(min=1)


def masked_var(x: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """Each agent's unbiased variance over the rows of the entries where it was alive."""
    squares = torch.where(alive, (x - masked_mean(x, alive).unsqueeze(-2)) ** 2, 0.0)
    return squares.sum(-2) / (alive.sum(-2) - 1).clamp(min=1)


def ppo_loss(agent: Agent, args: Args, obs, actions, old_logprobs, advantages, returns, old_values, alive,
             action_masks=None):
    """Each agent's clipped surrogate, value and entropy terms of one minibatch of rows (rows, num_agents), each
    reduced over the rows it was alive in (masked_mean); the log-ratios and ratios, detached."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions, action_mask=action_masks)
    logratio = newlogprob - old_logprobs
    ratio = logratio.exp()
    if args.norm_adv:
        advantages = ((advantages - masked_mean(advantages, alive).unsqueeze(-2))
                      / (masked_var(advantages, alive).sqrt().unsqueeze(-2) + 1e-8))
    clipped_ratio = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = masked_mean(torch.max(-advantages * ratio, -advantages * clipped_ratio), alive)
    if agent.value_normalizer is not None:  # the loss of standardized values; each term is a difference of values
        value_std = agent.value_normalizer.std().float().unsqueeze(-2)
        newvalue, returns, old_values = newvalue / value_std, returns / value_std, old_values / value_std
    if args.clip_vloss:
        v_clipped = old_values + torch.clamp(newvalue - old_values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * masked_mean(torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2), alive)
    else:
        v_loss = 0.5 * masked_mean((newvalue - returns) ** 2, alive)
    return (pg_loss, v_loss, masked_mean(entropy, alive)), logratio.detach(), ratio.detach()


# The statistics that update() logs for each agent (losses/<agent>/...)
PER_AGENT_STATISTICS = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/clipfrac",
                        "losses/old_approx_kl", "losses/approx_kl", "losses/explained_variance")


def update(agent: Agent, optimizer: PPOOptimizer, buf: RolloutBuffer, advantages: torch.Tensor,
           returns: torch.Tensor, update_losses, args: Args, agents: list[str]) -> dict:
    """update_epochs epochs of minibatch steps over the rollout, stopped before the step of the first minibatch whose
    approximate KL exceeds target_kl for any agent. Every agent's loss on the same minibatch of env steps, summed, so
    that one optimizer step moves every agent, each by its own gradient. update_losses is ppo_loss with agent and args
    bound (compiled under --compile). Returns the statistics to log: the losses of the last minibatch that stepped,
    the KL of the last minibatch (the one that stopped the update if one did); per agent under losses/<agent>/, and
    what the update decided on jointly under losses/. Under --num_seeds each holds one value per seed."""
    b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values, b_alive = (
        buf.rows(x) for x in (buf.obs, buf.actions, buf.logprobs, advantages, returns, buf.values, buf.alive))
    b_action_masks = None if buf.action_masks is None else buf.rows(buf.action_masks)
    batch_size = b_returns.shape[-2]
    stats, clipfracs = {}, []
    for mb in optimizer.minibatches(batch_size, batch_size // args.num_minibatches, args.update_epochs):
        alive = b_alive[mb]
        mb_action_masks = None if b_action_masks is None else b_action_masks[mb]
        (pg_loss, v_loss, entropy_loss), logratio, ratio = update_losses(
            b_obs[mb], b_actions[mb], b_logprobs[mb], b_advantages[mb], b_returns[mb], b_values[mb], alive,
            mb_action_masks)
        with torch.no_grad():
            old_approx_kl, approx_kl = mean_over_ranks(
                torch.stack([masked_mean(-logratio, alive), masked_mean((ratio - 1) - logratio, alive)]))
            if "losses/first_minibatch_ratio_error" not in stats:
                stats["losses/first_minibatch_ratio_error"] = torch.where(alive, ratio - 1.0, 0.0).abs().amax((-2, -1))
            for key, value in (("losses/old_approx_kl", old_approx_kl), ("losses/approx_kl", approx_kl)):
                stats[key] = optimizer.stepping_or(value, stats.get(key, torch.nan))
        # Joint: stopping one agent alone would need an optimizer of its own, as Adam's momentum keeps moving weights
        # whose gradient is zero.
        if args.target_kl is not None and optimizer.stop(approx_kl.amax(-1) > args.target_kl):
            break
        clipfracs.append(optimizer.stepping_or(masked_mean(((ratio - 1.0).abs() > args.clip_coef).float(), alive),
                                               torch.nan))
        loss = (pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef).sum(-1)

        optimizer.zero_grad()
        loss.sum().backward()  # seeds' losses are independent: each seed's parameters get its own loss's gradient
        optimizer.step(loss, args.max_grad_norm)
        if args.lr_schedule == "adaptive":
            optimizer.adapt_learning_rates(approx_kl.amax(-1), args)
        for key, value in (("losses/policy_loss", pg_loss), ("losses/value_loss", v_loss),
                           ("losses/entropy", entropy_loss)):
            stats[key] = optimizer.stepping_or(value.detach(), stats.get(key, torch.nan))
    if clipfracs:  # empty when the first minibatch already exceeded target_kl
        stats["losses/clipfrac"] = torch.stack(clipfracs).nanmean(0)
    var_y = masked_var(b_returns, b_alive)
    stats["losses/explained_variance"] = torch.where(var_y == 0, float("nan"),
                                                     1 - masked_var(b_returns - b_values, b_alive) / var_y)
    # Each agent's statistics under losses/<agent>/; losses/approx_kl is the largest agent's, which the early stop and
    # the adaptive schedule go by.
    logged = {"losses/approx_kl": stats["losses/approx_kl"].amax(-1)}
    for tag, value in {**stats, **optimizer.stats()}.items():
        if tag in PER_AGENT_STATISTICS:
            logged.update({tag.replace("losses/", f"losses/{name}/"): value[..., i] for i, name in enumerate(agents)})
        else:
            logged[tag] = value
    return logged


# Copied from ppo.py with nn.utils.clip_grad_norm_->clip_grad_norm_per_net
class PPOOptimizer(torch.optim.Adam):
    """Adam as update() uses it: the rollout's minibatches, drawn as needed (an update stopped early draws no further
    permutations from the random stream); the early stop; a step of gradients averaged over torchrun's ranks, clipped
    and checked finite. SeedOptimizer does each per seed (in one process: --num_seeds runs without torchrun).
    It steps every trainable parameter of the Agent that PPO's loss reaches, those of the Agent's own optimizers
    (own_optimizers()) too, which step them again in their own phase; its state dict carries theirs, so that
    checkpoints save, and --resume restores, every optimizer of the run."""

    def __init__(self, agent: nn.Module, lr: float):
        self.agent, self.own = agent, list(own_optimizers(agent).values())
        # fused: one kernel per parameter for the whole Adam step, on the CPU as on the GPU; it rounds differently
        # from torch's default by about one float32 ulp per step, and takes a third of its time for small networks.
        super().__init__(self.parameter_groups(agent), lr=lr, eps=1e-5, fused=True)
        self.minibatch_steps = 0

    def parameter_groups(self, agent: nn.Module) -> list[dict]:
        return [{"params": ppo_parameters(agent)}]

    def state_dict(self) -> dict:
        own = {name: optimizer.state_dict() for name, optimizer in own_optimizers(self.agent).items()}
        return {**super().state_dict(), **({"own_optimizers": own} if own else {})}

    def load_state_dict(self, state_dict: dict):
        own = state_dict.get("own_optimizers", {})  # checkpoints older than own optimizers hold none
        if own.keys() != own_optimizers(self.agent).keys():
            raise UserError(f"the checkpoint holds the optimizers {sorted(own)} of the Agent and {TRAINER}.py's Agent "
                            f"has {sorted(own_optimizers(self.agent))}: continue the run with the file that wrote it")
        super().load_state_dict({key: value for key, value in state_dict.items() if key != "own_optimizers"})
        for name, optimizer in own_optimizers(self.agent).items():
            optimizer.load_state_dict(own[name])

    def minibatches(self, batch_size: int, minibatch_size: int, epochs: int):
        """Each epoch a new permutation of the batch, cut into minibatches."""
        self.minibatch_steps = 0
        for _ in range(epochs):
            permutation = torch.randperm(batch_size, device=self.param_groups[0]["params"][0].device)
            for start in range(0, batch_size, minibatch_size):
                yield permutation[start:start + minibatch_size]

    def stop(self, over: torch.Tensor) -> bool:
        """Whether the update stops here (over: the KL exceeds its target)."""
        return bool(over)

    def draws(self) -> contextlib.AbstractContextManager:
        """Where update() draws random numbers of its own (ppo_rgb.py's image shifts): under --num_seeds each seed's
        from its own generator (SeedOptimizer)."""
        return contextlib.nullcontext()

    def stepping_or(self, value: torch.Tensor, otherwise) -> torch.Tensor:
        """value (under --num_seeds, of the seeds first: where a seed still steps, otherwise where it stopped)."""
        return value

    def step(self, loss: torch.Tensor, max_grad_norm: float):
        loss_finite = torch.isfinite(loss)
        if world_size() > 1:
            loss_finite = average_gradients(self.agent, loss_finite)
        grad_norm = clip_grad_norm_per_net(self.param_groups[0]["params"], max_grad_norm)
        if not (loss_finite & torch.isfinite(grad_norm).all()):  # one wait for the GPU, not two
            raise NonFiniteError("gradient" if loss_finite else "loss", [0])
        super().step()
        self.minibatch_steps += 1

    def schedule_learning_rate(self, iteration: int, num_iterations: int, args: Args):
        """--lr_schedule=linear, at the start of each iteration: from learning_rate down to 0 after the last."""
        if args.lr_schedule == "linear":
            self.set_learning_rate((1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate)

    def set_learning_rate(self, lr: float):
        for group in self.param_groups:
            group["lr"] = lr

    def adapt_learning_rates(self, approx_kl: torch.Tensor, args: Args):
        """--lr_schedule=adaptive, after each minibatch step (update())."""
        self.param_groups[0]["lr"] = adapt_learning_rate(self.param_groups[0]["lr"], approx_kl.item(), args)

    def stats(self) -> dict:
        return {"losses/minibatch_steps": torch.tensor(self.minibatch_steps),
                "charts/learning_rate": torch.tensor(self.param_groups[0]["lr"], dtype=torch.float64)}


# Copied from ppo.py
def own_optimizers(agent: nn.Module) -> dict[str, torch.optim.Optimizer]:
    """The optimizers that the Agent and its modules hold as attributes (a copy's own, self.ent_coef_optimizer =
    torch.optim.Adam([self.log_ent_coef])), by name."""
    found = {}
    for name, module in agent.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, torch.optim.Optimizer) and all(value is not other for other in found.values()):
                found[f"{name}.{key}".lstrip(".")] = value  # one optimizer under two names is one, by its first
    return found


# Copied from ppo.py
def ppo_parameters(agent: nn.Module) -> list[nn.Parameter]:
    """The parameters that PPOOptimizer steps: the Agent's trainable ones (requires_grad), each where PPO's loss reaches
    it (Adam skips a parameter without a gradient)."""
    return [p for p in agent.parameters() if p.requires_grad]


# Copied from ppo.py
def adapt_learning_rate(lr: float, approx_kl: float, args: Args) -> float:
    """rsl_rl's adaptive schedule: steer the KL of each minibatch step towards kl_target."""
    if approx_kl > 2.0 * args.kl_target:
        return max(args.min_learning_rate, lr / args.lr_factor)
    if approx_kl < 0.5 * args.kl_target:
        return min(args.max_learning_rate, lr * args.lr_factor)
    return lr


def clip_grad_norm_per_net(parameters: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """nn.utils.clip_grad_norm_ of each network on its own (every parameter's first dimension is the network): one
    norm over all agents would let one agent's large gradient shrink the others' steps. Returns each network's norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norms = torch.stack([g.reshape(g.shape[0], -1).square().sum(1) for g in grads]).sum(0).sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.reshape((-1,) + (1,) * (g.dim() - 1)))
    return norms


# ---------------------------------------------------------------------------------------------
# The training loop and evaluation
# ---------------------------------------------------------------------------------------------

@dataclass
class Setup:
    """What main() resolved for train(): the run, this process's device and rank, the derived settings."""
    run_name: str
    run_dir: Path
    device: torch.device
    rank: int
    bootstrap_rule: str
    num_eval_steps: int
    num_iterations: int
    time_limit_from: Optional[str]  # where a PettingZoo env's default max_episode_steps came from
    critic_input: str  # what the critics read: own_observation, or a centralized critic's global state
    checkpoint_trainer: Optional[str]  # the file that wrote --checkpoint
    run_id: str  # the run's, kept by its checkpoints so that --resume continues its wandb runs (wandb_run_id())


def train(args: Args, setup: Setup, envs: TorchVecEnv, eval_envs: Optional[TorchVecEnv],
          resume_state: Optional[dict], init_state: Optional[dict]) -> int:
    """The loop of the algorithm: rollout, advantages, update. Run (below the divider) does the run's own steps
    around it: it starts the learner from a checkpoint (--resume, --checkpoint) and the envs from their seeds; after
    each update it checks the numbers, logs, evaluates (rank 0 alone, in eval_envs; None on the other ranks), saves
    and stops on a signal; it reports what stopped the run in one line. Returns the process's exit status."""
    resume_state, init_state = seeds_parts(args, setup.run_dir, resume_state, init_state)
    agent = make_agents(args, envs, setup.device, resume_state)  # --num_seeds: each seed's network, stacked
    optimizer = make_optimizer(agent, args)
    reward_normalizer = (stack_seeds([RewardNormalizer(args.num_envs, envs.num_agents, args.gamma)
                                      for _ in range(args.num_seeds)]).to(setup.device) if args.norm_reward else None)
    policy_step = compile_unless_unavailable(policy_step_of(agent, args, envs), args.compile)
    update_losses = compile_unless_unavailable(functools.partial(ppo_loss, agent, args), args.compile)
    update_step = update_step_of(agent, args, envs)  # update(); --num_seeds: its first call checked (plumbing)
    with Run(args, setup, envs, eval_envs, agent, optimizer, reward_normalizer, resume_state, init_state) as run:
        buf = RolloutBuffer(args.num_steps, envs, setup.device)  # after the reset, which gives the first action masks
        next_obs = run.next_obs
        for iteration in run.iterations():
            optimizer.schedule_learning_rate(iteration, setup.num_iterations, args)
            with run.timed("time/rollout_time"):
                agent.eval()
                next_obs, episodes = rollout(agent, envs, buf, next_obs, policy_step, reward_normalizer, args,
                                             setup.bootstrap_rule)
                with torch.no_grad():
                    next_value = agent.get_value(agent.normalize_obs(next_obs))
                    advantages = compute_advantages(buf.rewards, buf.values, buf.dones, buf.bootstrap_values,
                                                    next_value, args.gamma, args.gae_lambda, args.finite_horizon_gae)
                    returns = advantages + buf.values
                    if agent.value_normalizer is not None:  # standardize the critics' targets by every rank's
                        agent.value_normalizer.update(gather_rows(buf.rows(returns)), gather_rows(buf.rows(buf.alive)))
            with run.timed("time/update_time"):
                agent.train()
                stats = update_step(agent, optimizer, buf, advantages, returns, update_losses, args, envs.agents)
            run.end_iteration(stats, episodes)  # TRY NOT TO MODIFY: checks, logs, evaluation, checkpoints, signals
    return run.status


def evaluate(agent: Agent, eval_envs: TorchVecEnv, num_eval_steps: int, seed: Optional[int],
             episodes_per_env: Optional[torch.Tensor] = None, deterministic: bool = True) -> dict[str, torch.Tensor]:
    """Env i contributes its first episodes_per_env[i] episodes (default: one each) that finish within num_eval_steps
    steps; actions are the policy's mode unless deterministic=False. One value per counted episode, in the order
    they finished, and "episodes", their number.

    Counting every finished episode would weigh envs that fail early many times over those that last.
    """
    finished_metrics = defaultdict(list)
    if episodes_per_env is None:
        episodes_per_env = torch.ones(eval_envs.num_envs, dtype=torch.long)
    quota = episodes_per_env.to(eval_envs.device)
    counted = torch.zeros_like(quota)
    obs = eval_envs.reset(seed=seed)
    for _ in range(num_eval_steps):
        with torch.no_grad():
            action = agent.get_action(agent.normalize_obs(obs), deterministic, action_mask=eval_envs.action_mask)
        obs, _, _, _, _, finished = eval_envs.step(action)
        done = eval_envs.ended
        if finished is not None:
            wanted = counted < quota
            for key, value in finished.items():
                finished_metrics[key].append(value[wanted[done]])
            counted += done & wanted
            if (counted == quota).all():
                break
    eval_envs.flush_video()
    metrics = {key: torch.cat(values) for key, values in finished_metrics.items()}
    metrics["episodes"] = counted.sum(dtype=torch.float32).reshape(1)
    return metrics


def episode_means(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    # NaN: an agent absent from an episode (TorchVecEnv.step)
    return {key: values.float().nanmean().item() for key, values in metrics.items() if not values.isnan().all()}


# Copied from ppo.py
def progress_items(prefix: str, means: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}_{key}": round(value, 3) for key, value in means.items() if key in ("return", "success_once")}


# ---------------------------------------------------------------------------------------------
# The run's settings: what the flags leave open, seeds and devices, what the envs are made with and receive, what
# the critic sees, evaluation's random stream
# ---------------------------------------------------------------------------------------------

def settings(args: Args, maniskill: bool, time_limit: Optional[int], num_ranks: int) -> tuple[Args, dict]:
    """What the flags leave to the task, settled once (validate() calls it and checks the result): the run's Args,
    with the episodes' time limit (the task's own unless --max_episode_steps) and --anneal_lr as the linear
    schedule, and a ManiSkill task's agents observing its full state unless --agent_obs=local; and what follows from
    them (Setup's fields): the bootstrap rule (auto: always for ManiSkill tasks, whose defaults are tuned with it,
    truncated otherwise; docs/bootstrap.md), the evaluation's length (the time limit unless --num_eval_steps) and the
    iterations of num_ranks processes."""
    args = dataclasses.replace(
        args, max_episode_steps=time_limit if args.max_episode_steps is None else args.max_episode_steps,
        lr_schedule="linear" if args.anneal_lr else args.lr_schedule,
        agent_obs=(args.agent_obs or "full") if maniskill else args.agent_obs)
    bootstrap_rule = args.bootstrap_at_done
    if bootstrap_rule == "auto":
        bootstrap_rule = "always" if maniskill else "truncated"
    return args, dict(bootstrap_rule=bootstrap_rule, num_eval_steps=args.num_eval_steps or args.max_episode_steps,
                      num_iterations=args.total_timesteps // (args.num_envs * args.num_steps * num_ranks))


# Copied from ppo.py
def seed_process(args: Args, rank: int, local_rank: int, num_ranks: int) -> torch.device:
    """Seed this process (rank r with seed + r), make cuDNN, torch's CPU threads and --compile's random draws
    deterministic, and return its device."""
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    if args.compile:  # the policy's samples come from torch's own generator, as in eager mode
        torch._inductor.config.fallback_random = True  # torch imports _inductor on first use
    if torch.cuda.is_available() and args.cuda:
        return torch.device("cuda", local_rank) if num_ranks > 1 else torch.device("cuda")
    return torch.device("cpu")


# Copied from ppo.py
def resolve_sim_backend(sim_backend: str) -> str:
    if sim_backend == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if sim_backend == "gpu" and not torch.cuda.is_available():
        raise UserError("--sim_backend=gpu needs CUDA, which this machine does not have; use --sim_backend=cpu")
    return sim_backend


def maniskill_env_kwargs(args: Args, num_envs: int, device: torch.device, evaluation: bool,
                         user_env_kwargs: dict) -> tuple[dict, bool]:
    """gym.make's kwargs for a ManiSkill task (--env_kwargs first, observations as a state_dict that AgentViews
    splits), and ignore_terminations (--no_partial_reset: episodes run to the time limit). The simulation runs on the
    learner's GPU (each torchrun rank's own) or on the CPU; CPU envs beyond one are worker processes, whose unseeded
    resets (every autoreset) would draw on an unseeded torch stream: enhanced_determinism draws their seeds from the
    env's own, seeded, stream instead."""
    gpu = resolve_sim_backend(args.sim_backend) == "gpu"
    on_device = "" if device.index is None else f":{device.index}"
    env_kwargs = dict(user_env_kwargs, obs_mode="state_dict",
                      sim_backend=f"physx_cuda{on_device}" if gpu else "physx_cpu",
                      # the default render backend falls back to the CPU with one warning per env; --no_cuda with
                      # the CPU simulation keeps rendering off the GPU too
                      render_backend=f"gpu{on_device}" if torch.cuda.is_available() and (gpu or args.cuda) else "cpu",
                      reconfiguration_freq=args.eval_reconfiguration_freq if evaluation else args.reconfiguration_freq,
                      max_episode_steps=args.max_episode_steps)
    if args.control_mode is not None:
        env_kwargs["control_mode"] = args.control_mode
    if not gpu and num_envs > 1:  # make_maniskill_envs runs these envs in worker processes
        env_kwargs["enhanced_determinism"] = True
    return env_kwargs, not (args.eval_partial_reset if evaluation else args.partial_reset)


# Copied from ppo.py with single_action_space->action_spaces[0]
def env_action(envs: TorchVecEnv, action: torch.Tensor) -> torch.Tensor:
    """The action the envs receive: a Box action clamped to the space's bounds (its log-prob stays the sampled
    one's); a discrete one shifted from the agent's count from 0 to the space's start."""
    if isinstance(envs.action_spaces[0], gym.spaces.Box):
        return torch.clamp(action, envs.action_low, envs.action_high)
    return action.long() + envs.action_start


class AgentViews(gym.ObservationWrapper):
    """A ManiSkill multi-agent task's state_dict observation, flattened as obs_mode="state" flattens it, and which
    of its entries each agent observes (agent_views; docs/multi_agent.md, "What each agent observes").

    full: every agent observes the whole state. local: agent i observes obs["agent"][<its uid>] and the obs["extra"]
    entries that belong to no other agent. An extra entry belongs to the agent whose uid its name contains; in a
    two-agent task, one named left_* to agent 0 and right_* to agent 1 (the two-robot tasks' left_agent and
    right_agent). The other extra entries (the objects, the goal) are shared.
    """

    SIDES = ("left", "right")

    def __init__(self, env: gym.Env, env_id: str, agent_obs: str):
        super().__init__(env)
        from mani_skill.utils import common

        self.flatten_state_dict = functools.partial(common.flatten_state_dict, use_torch=True)
        base = env.unwrapped
        if not isinstance(base.single_action_space, gym.spaces.Dict):
            raise UserError(f"{env_id} is a single-agent task (its action space is not a Dict keyed by agent); "
                            "train it with ppo.py")
        agents, action_spaces = list(base.single_action_space.keys()), list(base.single_action_space.values())
        if any(space != action_spaces[0] for space in action_spaces):
            raise UserError(f"{env_id}'s agents have different action spaces ({action_spaces}); {TRAINER}.py stacks "
                            "the agents' networks and needs one action space")

        def owner(path: tuple[str, ...]) -> Optional[int]:
            if path[0] == "agent" and path[1] in agents:
                return agents.index(path[1])
            for i, uid in enumerate(agents):
                # The Dict's keys are sorted; a uid's suffix "-<k>" is its place in the task's agents (left is 0).
                place = int(uid.rpartition("-")[2]) if uid.rpartition("-")[2].isdigit() else i
                if uid in path[-1] or (len(agents) == len(self.SIDES) and path[-1].startswith(self.SIDES[place] + "_")):
                    return i
            return None

        entries, width = [], 0  # (path, flat columns) in flatten order
        for path, value in state_dict_leaves(base._init_raw_obs):
            size = int(np.prod(value.shape[1:]))
            entries.append((path, range(width, width + size)))
            width += size
        flat = self.observation(base._init_raw_obs)
        assert flat.shape[1] == width, f"the flattened state has {flat.shape[1]} entries, its parts {width}"
        base.update_obs_space(flat)
        obs_index = [[column for path, columns in entries if agent_obs == "full" or owner(path) in (None, i)
                      for column in columns] for i in range(len(agents))]
        if len({len(index) for index in obs_index}) > 1:
            raise UserError(f"{env_id}'s agents observe {[len(index) for index in obs_index]} entries with "
                            f"--agent_obs={agent_obs}; {TRAINER}.py stacks the agents' networks and needs equal sizes")
        # The global state out of all agents' observations laid end to end: each entry from the first agent that has it.
        position = {}
        for i, index in enumerate(obs_index):
            for j, column in enumerate(index):
                position.setdefault(column, i * len(index) + j)
        self.agent_views = {"agents": agents, "obs_index": obs_index,
                            "state_index": [position[c] for c in range(width)],
                            "action_spaces": action_spaces}

    def observation(self, observation: dict) -> torch.Tensor:
        return self.flatten_state_dict(observation)


# Copied from ppo.py
@contextlib.contextmanager
def own_random_stream(envs: TorchVecEnv):
    """ManiSkill draws the starts of unseeded episodes from torch's global generator of the sim's device, which
    also samples training's actions: evaluation swaps in a generator state of its own, carried from one
    evaluation to the next, so that how often a run evaluates does not change what it trains on."""
    gpus = [envs.sim_device] if envs.sim_device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus):
        if envs.random_states is not None:
            torch.set_rng_state(envs.random_states[0])
            for gpu, state in zip(gpus, envs.random_states[1:]):
                torch.cuda.set_rng_state(state, gpu)
        yield
        envs.random_states = [torch.get_rng_state(), *(torch.cuda.get_rng_state(gpu) for gpu in gpus)]


# Copied from ppo.py
def load_states(agent: Agent, optimizer: torch.optim.Optimizer, reward_normalizer: Optional[RewardNormalizer],
                init_state: Optional[dict], resume_state: Optional[dict], args: Args,
                envs: TorchVecEnv) -> tuple[int, int]:
    """What a run starts from: --checkpoint gives it the weights and the observation, value and reward statistics (the
    optimizer starts afresh), --resume those and the optimizer's state; every rank then holds rank 0's. Returns the
    global step and iteration the run continues from."""
    for state in (init_state, resume_state):
        if state is not None:
            load_weights(agent, state, args, envs)
            if reward_normalizer is not None and state.get("reward_normalizer") is not None:
                reward_normalizer.load_state_dict(state["reward_normalizer"])
    if world_size() > 1:
        for tensor in agent.state_dict().values():  # each rank drew its own initial weights
            dist.broadcast(tensor, 0)
    if resume_state is None:
        return 0, 0
    try:
        optimizer.load_state_dict(resume_state["optimizer"])
    except ValueError as e:  # torch's: a group of another size
        raise UserError(f"the checkpoint's optimizer state does not fit {TRAINER}.py's optimizer ({e}); a copy's "
                        "checkpoint from before PPO's optimizer held its own optimizers' parameters too (2026-12-03) "
                        "cannot be resumed: start a new run from its weights with --checkpoint") from e
    return resume_state["global_step"], resume_state["iteration"]


# =============================================================================================
# Plumbing: what an idea changes stands above. Below: many seeds in one process, startup and validation, env
# adapters, run directories, checkpoints and resume, data parallel, signals. They decide numbers too (what the envs
# return, dtypes, time limits, what a resume restores): change them as refactors, which benchmarks/same_numbers.py
# compares to the bit.
# =============================================================================================

# ---------------------------------------------------------------------------------------------
# Many seeds in one process (--num_seeds): each seed's networks, random streams and envs, as a run of its own has them
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
class SeedLinear(nn.Linear):
    """The nn.Linear layers of --num_seeds networks as one: weight (seeds, out, in), bias (seeds, out), applied to
    x of shape (seeds, ..., in), each seed's rows to its own weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[0] != self.weight.shape[0]:
            raise UserError(f"a stacked nn.Linear of {self.weight.shape[0]} seeds takes (seeds, ..., in), not "
                            f"{tuple(x.shape)}: give a network of the copy's rows (buf.rows(x), a minibatch), seed "
                            f"first ({TRAINER}.py's docstring, 'A copy's contract')")
        rows = x.reshape(x.shape[0], -1, x.shape[-1])  # (seeds, rows, in) itself: a view, the same numbers
        if self.bias is None:
            return torch.bmm(rows, self.weight.transpose(-1, -2)).view(*x.shape[:-1], -1)
        return torch.baddbmm(self.bias.unsqueeze(-2), rows, self.weight.transpose(-1, -2)).view(*x.shape[:-1], -1)


# Copied from ppo.py
class SeedEach:
    """A layer of torch.nn other than nn.Linear (nn.Conv2d, nn.LayerNorm, ...) of --num_seeds networks, its parameters
    and buffers stacked: each seed's part of the inputs (the first dimension of each tensor, and of each tensor in a
    tuple) through the layer with that seed's parameters, in turn, the outputs stacked. Mixed in before the layer's
    class (stack_seeds())."""

    def flatten_parameters(self):  # an RNN's: cuDNN's one block of weights cannot hold stacked ones
        pass

    def forward(self, *inputs):
        if self.one_seed:  # functional_call's call below
            return super().forward(*inputs)
        tensors = {**dict(self.named_parameters()), **dict(self.named_buffers())}
        outputs = []
        self.one_seed = True
        try:
            for i in range(next(iter(tensors.values())).shape[0]):
                outputs.append(torch.func.functional_call(self, {name: t[i] for name, t in tensors.items()},
                                                          tuple(seed_part(x, i) for x in inputs)))
        finally:
            self.one_seed = False
        return stacked_parts(outputs)


# Copied from ppo.py
class SeedRNN:
    """An nn.LSTM or nn.GRU (batch_first, with biases, one direction) of --num_seeds networks, its weights stacked: its
    equations step by step over the seeds' weights at once (torch.baddbmm), as SeedLinear batches nn.Linear, where a
    call for each seed (SeedEach) would make as many calls as seeds. Inputs (seeds, batch, time, in) and the state
    (seeds, num_layers, batch, hidden), an LSTM's as (h, c), zeros if none; each seed's numbers as its layer's, to
    float rounding. Mixed in before the layer's class (stack_seeds()), whose parameters it reads."""

    def flatten_parameters(self):  # cuDNN's one block of weights cannot hold stacked ones; the equations need none
        pass

    def forward(self, inputs: torch.Tensor, state=None):
        lstm = isinstance(self, nn.LSTM)
        if state is None:
            zeros = inputs.new_zeros(inputs.shape[0], self.num_layers, inputs.shape[1], self.hidden_size)
            state = (zeros, zeros) if lstm else zeros
        h, c = state if lstm else (state, state)  # a GRU has no cell state: c is carried unused
        layer_inputs, last_h, last_c = inputs, [], []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(self, f"{name}_l{layer}")
                                      for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            seeds, batch, steps, _ = layer_inputs.shape
            gates_x = torch.baddbmm(b_ih[:, None], layer_inputs.flatten(1, 2), w_ih.transpose(1, 2))
            gates_x = gates_x.view(seeds, batch, steps, -1)
            h_t, c_t, outputs = h[:, layer], c[:, layer], []
            for t in range(steps):
                gates_h = torch.baddbmm(b_hh[:, None], h_t, w_hh.transpose(1, 2))
                if lstm:  # nn.LSTM's gates: input, forget, cell, output
                    i, f, g, o = (gates_x[:, :, t] + gates_h).chunk(4, -1)
                    c_t = torch.sigmoid(f) * c_t + torch.sigmoid(i) * torch.tanh(g)
                    h_t = torch.sigmoid(o) * torch.tanh(c_t)
                else:  # nn.GRU's: reset, update, new
                    (r_x, z_x, n_x), (r_h, z_h, n_h) = gates_x[:, :, t].chunk(3, -1), gates_h.chunk(3, -1)
                    r, z = torch.sigmoid(r_x + r_h), torch.sigmoid(z_x + z_h)
                    h_t = (1 - z) * torch.tanh(n_x + r * n_h) + z * h_t
                outputs.append(h_t)
            layer_inputs = torch.stack(outputs, 2)
            last_h.append(h_t)
            last_c.append(c_t)
        h = torch.stack(last_h, 1)
        return layer_inputs, ((h, torch.stack(last_c, 1)) if lstm else h)


# Copied from ppo.py
def seed_part(x, i: int):
    if isinstance(x, dict):
        return {key: seed_part(value, i) for key, value in x.items()}
    return x[i] if isinstance(x, torch.Tensor) else type(x)(seed_part(y, i) for y in x) if isinstance(x, tuple) else x


# Copied from ppo.py
def stacked_parts(parts: list):
    return torch.stack(parts) if isinstance(parts[0], torch.Tensor) else type(parts[0])(map(stacked_parts, zip(*parts)))


# Copied from ppo.py
def stack_seeds(modules: list[nn.Module]) -> nn.Module:
    """--num_seeds: one module of the seeds' modules (alike but for their values), each parameter and buffer (but
    integer buffers left out of the state dict, which describe the structure) stacked on a new first dimension, seed
    i's at index i: seed i's state dict is every tensor's [i]. Its nn.Linear layers become SeedLinear, its nn.LSTM
    and nn.GRU layers SeedRNN, torch.nn's other layers with tensors of their own SeedEach; inputs and outputs carry
    the seed dimension first. The optimizers a module holds (own_optimizers()) step the stacked parameters. One
    module is returned as it is."""
    if len(modules) == 1:
        return modules[0]
    stacked, stacked_of, replaced = copy.deepcopy(modules[0]), {}, []
    for name, module in stacked.named_modules():
        seeds = [m.get_submodule(name) for m in modules]
        for key, parameter in module._parameters.items():
            if parameter is None:  # a layer built without it (nn.LayerNorm(elementwise_affine=False))
                continue
            module._parameters[key] = nn.Parameter(torch.stack([seed._parameters[key].detach() for seed in seeds]),
                                                   requires_grad=parameter.requires_grad)
            stacked_of[id(parameter)] = module._parameters[key]
            replaced.append(parameter)  # alive until the end: no other object takes its id
        for key, buffer in module._buffers.items():
            if buffer is not None and (buffer.is_floating_point() or key not in module._non_persistent_buffers_set):
                module._buffers[key] = torch.stack([seed._buffers[key] for seed in seeds])
        if type(module) is nn.Linear:
            module.__class__ = SeedLinear  # the same parameters, stacked above
        elif type(module) in (nn.LSTM, nn.GRU) and module.batch_first and module.bias and not module.bidirectional \
                and not module.dropout and not getattr(module, "proj_size", 0):
            module.__class__ = type(f"Seed{type(module).__name__}", (SeedRNN, type(module)), {})
        elif type(module).__module__.startswith("torch.nn.") and any(  # tensors of its own: a BatchNorm's statistics
                map(torch.is_tensor, [*module._parameters.values(), *module._buffers.values()])):
            module.__class__ = type(f"Seed{type(module).__name__}", (SeedEach, type(module)), {})
            module.one_seed = False
    for module in stacked.modules():  # lists of parameters (an own phase's) hold the stacked ones, as optimizers do
        for key, value in vars(module).items():
            if key.startswith("_"):
                continue
            if isinstance(value, (list, tuple)) and any(id(item) in stacked_of for item in value):
                setattr(module, key, type(value)(stacked_of.get(id(item), item) for item in value))
            elif isinstance(value, dict) and any(id(item) in stacked_of for item in value.values()):
                setattr(module, key, {k: stacked_of.get(id(item), item) for k, item in value.items()})
    for name, own in own_optimizers(stacked).items():  # fresh ones: no state yet, which would refer to parameters
        for group in own.param_groups:
            if any(id(p) not in stacked_of for p in group["params"]):
                raise UserError(f"the Agent's optimizer {name} steps a tensor that is none of the Agent's parameters, "
                                "which --num_seeds cannot give each seed: make it one (nn.Parameter in Agent.__init__)")
            group["params"] = [stacked_of[id(p)] for p in group["params"]]
    return stacked


# Copied from ppo.py
def make_agents(args: Args, envs: TorchVecEnv, device: torch.device, resume_state: Optional[dict]) -> Agent:
    """The run's agent, which draws from torch's default generator. Under --num_seeds, the seeds' agents stacked
    (stack_seeds), with agent.generators: seed + i draws its initial weights, then its actions and minibatches, from a
    generator of its own, seeded and used as torch's default generator is by a run of that seed alone (and shared
    with nothing else, such as ManiSkill's resets), and continued where a resumed run left it. What differs between
    seeds' Agents outside their parameters, buffers and modules is refused (one seed's: against another seed's)."""
    if args.num_seeds == 1:
        agent, random_states = make_agent(args, envs), rng_states(torch.device("cpu"))
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):  # the run's streams stay as they are
            torch.manual_seed(args.seed + 1)
            refuse_unregistered_state([agent, make_agent(args, envs)])
        set_rng_states(random_states, torch.device("cpu"))  # numpy's and Python's, which a copy's Agent may draw from
        return agent.to(device)
    agents, generators = [], []
    for seed in range(args.seed, args.seed + args.num_seeds):
        generator = torch.Generator(device).manual_seed(seed)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            agents.append(make_agent(args, envs))  # drawn on the CPU, as a run alone draws them
            if device.type == "cpu":  # the CPU's stream goes on from there to the actions
                generator.set_state(torch.get_rng_state())
        generators.append(generator)
    for generator, state in zip(generators, resume_state["seed_rngs"] if resume_state is not None else []):
        # a run moved between the CPU and a GPU (--cuda) draws on from its seeds, as a run alone does on a GPU
        if state.numel() == generator.get_state().numel():
            generator.set_state(state)
    refuse_unregistered_state(agents)
    agent = stack_seeds(agents).to(device)
    agent.generators = generators
    return agent


# Copied from ppo.py
def refuse_unregistered_state(agents: list[nn.Module]):
    """The Agents of different seeds may differ in their parameters, buffers and registered modules alone, which
    checkpoints save and stack_seeds() gives each seed: one error line names an attribute that differs besides."""
    first, first_known = dict(agents[0].named_modules(prefix=type(agents[0]).__name__)), registered(agents[0])
    for other in agents[1:]:
        other_known = registered(other)
        for name, module in other.named_modules(prefix=type(other).__name__):
            if name not in first:
                raise UserError(f"the Agents of two seeds hold different modules ({name} in one alone): build the "
                                "same network for every seed")
            for key, value in vars(module).items():
                if not key.startswith("_") and not same_data(fingerprint(value, other_known), fingerprint(
                        getattr(first[name], key, None), first_known)):
                    raise UserError(
                        f"{name}.{key} differs between the Agents of two seeds and is none of the Agent's parameters, "
                        "buffers or registered modules: checkpoints leave it out (--resume and ppo_eval.py would make "
                        "another) and --num_seeds would give every seed the first seed's; make it one "
                        "(self.register_buffer, nn.Parameter, nn.ModuleList) "
                        f"({TRAINER}.py's docstring, 'A copy's contract')")


# Copied from ppo.py
def make_optimizer(agent: Agent, args: Args) -> PPOOptimizer:
    if own_optimizers(agent) and world_size() > 1:  # their gradients would need averaging over the ranks too
        raise UserError(f"the Agent's own optimizers ({', '.join(own_optimizers(agent))}) do not work under torchrun "
                        "yet: train with one process (--num_seeds for many seeds)")
    if not hasattr(agent, "generators"):
        for own in own_optimizers(agent).values():
            own.__class__ = type(f"Own{type(own).__name__}", (NumberLearningRates, type(own)), {})
        return PPOOptimizer(agent, args.learning_rate)
    optimizer = SeedOptimizer(agent, args.learning_rate)
    for own in own_optimizers(agent).values():
        split_by_seed(own, optimizer)
    return optimizer


# Copied from ppo.py
class NumberLearningRates:
    """An optimizer of the Agent's own whose groups' lr a copy sets from a buffer of the Agent (a tensor): each group
    steps with a number, under --num_seeds its seed's value (its groups are each seed's in turn), since torch's Adam
    takes no tensor lr on a GPU. Mixed in before the optimizer's class (make_optimizer(), split_by_seed())."""

    def step(self, closure=None):
        values = {}  # one wait for the device per tensor
        for k, group in enumerate(self.param_groups):
            lr = group["lr"]
            if isinstance(lr, torch.Tensor):
                values.setdefault(id(lr), lr.flatten().tolist())
                group["lr"] = values[id(lr)][k * len(values[id(lr)]) // len(self.param_groups)]
        return super().step(closure)


# Copied from ppo.py with nn.utils.clip_grad_norm_->clip_grad_norm_per_net, (.mean(-1))->(masked_mean())
class SeedOptimizer(PPOOptimizer):
    """--num_seeds: one Adam parameter group per seed, each seed's slices of the stacked parameters as parameters of
    their own (views of the same memory), so that each seed has its own Adam state, step count and learning rate,
    and a seed given no gradient takes no step. Each seed draws its minibatches from its own generator (a minibatch
    indexes (seeds, minibatch_size) rows, each seed's of its own rollout), stops at its own KL and clips its own
    gradients; the update ends when every seed has stopped."""

    def __init__(self, agent: Agent, lr: float):
        self.generators, self.stacked = agent.generators, ppo_parameters(agent)
        super().__init__(agent, member_numbers(lr, 1)[0])
        self.set_learning_rate(lr)
        self.going = [True] * len(self.generators)  # stepping, read without waiting for the GPU
        self.stepping = torch.ones(len(self.generators), dtype=torch.bool, device=self.stacked[0].device)
        self.scratch = torch.Generator(self.stepping.device)  # the draws of seeds that stopped, which a run alone skips

    def parameter_groups(self, agent: Agent) -> list[dict]:
        return [{"params": [nn.Parameter(p.detach()[i]) for p in self.stacked]} for i in range(len(self.generators))]

    def set_learning_rate(self, lr: float):  # a population's members each their own (MemberValues)
        for group, rate in zip(self.param_groups, member_numbers(lr, len(self.param_groups))):
            group["lr"] = rate

    def minibatches(self, batch_size: int, minibatch_size: int, epochs: int):
        device = self.stepping.device
        self.going = [True] * len(self.generators)
        self.stepping = torch.ones_like(self.stepping)
        self.minibatch_steps = torch.zeros(len(self.generators), dtype=torch.long, device=device)
        seeds = torch.arange(len(self.generators), device=device)[:, None]
        permutations = [None] * len(self.generators)
        try:
            for _ in range(epochs):  # a seed that stopped draws no further permutations
                permutations = [torch.randperm(batch_size, generator=generator, device=device) if go else permutation
                                for generator, go, permutation in zip(self.generators, self.going, permutations)]
                permutation = torch.stack(permutations)
                for start in range(0, batch_size, minibatch_size):
                    yield seeds, permutation[:, start:start + minibatch_size]
        finally:  # after the update every seed steps again: the Agent's own optimizers, stepped after it (SeedSteps)
            self.going = [True] * len(self.generators)
            self.stepping = torch.ones_like(self.stepping)

    def stop(self, over: torch.Tensor) -> bool:
        over = over.tolist()
        if any(go and seed_over for go, seed_over in zip(self.going, over)):
            self.going = [go and not seed_over for go, seed_over in zip(self.going, over)]
            self.stepping = torch.tensor(self.going, device=self.stepping.device)
        return not any(self.going)

    def stepping_or(self, value: torch.Tensor, otherwise) -> torch.Tensor:
        return torch.where(self.stepping.reshape(-1, *(1,) * (value.dim() - 1)), value, otherwise)

    def draws(self) -> PerSeedDraws:
        return PerSeedDraws([generator if go else self.scratch for generator, go in zip(self.generators, self.going)])

    def zero_grad(self, set_to_none: bool = True):  # the stacked parameters: their views hold no gradient
        for p in self.stacked:
            p.grad = None

    def step(self, loss: torch.Tensor, max_grad_norm: float):
        if loss.shape != self.stepping.shape:  # a loss reduced over the seeds too would train each on all
            raise UserError(f"the loss has shape {tuple(loss.shape)}, not one value per seed "
                            f"{tuple(self.stepping.shape)}: under --num_seeds ppo_loss() reduces each term over its "
                            f"rows alone (masked_mean()) ({TRAINER}.py's docstring, 'A copy's contract')")
        give_seeds_gradients([group["params"] for group in self.param_groups], self.stacked, self.going)
        grad_norms = torch.stack([clip_grad_norm_per_net(group["params"], max_norm) for group, go, max_norm in
                                  zip(self.param_groups, self.going, member_numbers(max_grad_norm, len(self.going)))
                                  if go])
        loss_finite = (torch.isfinite(loss) | ~self.stepping).all()  # a stopped seed's loss its run alone skips
        if not (loss_finite & torch.isfinite(grad_norms).all()):  # one wait for the GPU, not two
            raise NonFiniteError("gradient" if loss_finite else "loss",
                                 nonfinite_seeds([loss, *(p.grad for p in self.stacked)], len(self.generators)))
        torch.optim.Adam.step(self)
        self.minibatch_steps += self.stepping

    def adapt_learning_rates(self, approx_kl: torch.Tensor, args: Args):
        for group, kl, go in zip(self.param_groups, approx_kl.tolist(), self.going):
            if go:
                group["lr"] = adapt_learning_rate(group["lr"], kl, args)

    def stats(self) -> dict:
        return {"losses/minibatch_steps": self.minibatch_steps,
                "charts/learning_rate": torch.tensor([group["lr"] for group in self.param_groups], dtype=torch.float64)}


# Copied from ppo.py
class SeedSteps(NumberLearningRates):
    """--num_seeds: an optimizer of the Agent's own (own_optimizers()) over its stacked parameters as one per seed,
    as SeedOptimizer is PPO's: each seed's slices of them as parameters of their own (views of the same memory), in
    groups seed by seed, so that each seed has its own state, and a seed whose update stopped (SeedOptimizer) takes no
    step until the update ends. Its state dict is then every seed's in turn, as seed_checkpoint() splits it."""

    def zero_grad(self, set_to_none: bool = True):
        for p in self.stacked:
            p.grad = None
        super().zero_grad(set_to_none)

    def step(self, closure=None):
        give_seeds_gradients(self.views, self.stacked, self.seed_optimizer.going)
        return super().step(closure)


# Copied from ppo.py
def split_by_seed(optimizer: torch.optim.Optimizer, seed_optimizer: SeedOptimizer):
    """Make a fresh optimizer over stacked parameters a SeedSteps of itself, in place."""
    groups = optimizer.param_groups
    seeds_groups = [[{**group, "params": [nn.Parameter(p.detach()[i]) for p in group["params"]]} for group in groups]
                    for i in range(len(seed_optimizer.generators))]
    optimizer.stacked = [p for group in groups for p in group["params"]]
    optimizer.views = [[view for group in seed_groups for view in group["params"]] for seed_groups in seeds_groups]
    optimizer.param_groups = [group for seed_groups in seeds_groups for group in seed_groups]
    optimizer.seed_optimizer = seed_optimizer
    optimizer.__class__ = type(f"Seed{type(optimizer).__name__}", (SeedSteps, type(optimizer)), {})


# Copied from ppo.py
def give_seeds_gradients(views: list[list[nn.Parameter]], stacked: list[nn.Parameter], going: list[bool]):
    """Seed i's views (views[i], of the stacked parameters in their order) get seed i's part of their gradients; a
    seed that stopped, and a part the loss left out, none (so no step)."""
    for i, go in enumerate(going):
        for view, p in zip(views[i], stacked):
            view.grad = p.grad[i] if go and p.grad is not None else None


# Copied from ppo.py
def policy_step_of(agent: Agent, args: Args, envs: TorchVecEnv):
    """The rollout's policy step: agent.get_action_and_value; under --num_seeds with each seed's draws from its own
    generator (PerSeedDraws), its first call checked against each seed's policy alone (first_call_checked)."""
    if not hasattr(agent, "generators"):
        return agent.get_action_and_value

    def policy_step(seed_agent: Agent, generators: list[torch.Generator], *inputs, **keywords):
        with PerSeedDraws(generators):
            return seed_agent.get_action_and_value(*inputs, **keywords)
    return first_call_checked("the policy step (Agent.get_action_and_value())", policy_step, seed_part, agent, args,
                              envs)


# Copied from ppo.py
def update_step_of(agent: Agent, args: Args, envs: TorchVecEnv):
    """update(); under --num_seeds its first call checked against each seed's update alone (first_call_checked)."""
    if not hasattr(agent, "generators"):
        return update

    def update_step(seed_agent: Agent, generators: list[torch.Generator], *inputs):
        if seed_agent is agent:  # the seeds' own generators, through SeedOptimizer
            return update(*inputs)
        # a run alone draws its minibatches and the update's own draws from torch's default generator
        device = generators[0].device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if device.type == "cuda":
                torch.cuda.set_rng_state(generators[0].get_state(), device)
            else:
                torch.set_rng_state(generators[0].get_state())
            return update(*inputs)
    def one_epoch(given: tuple) -> tuple:  # compared on one epoch: float rounding grows over an update's many steps
        inputs, keywords = given
        return [dataclasses.replace(x, update_epochs=1) if isinstance(x, Args) else x for x in inputs], keywords
    return first_call_checked("update()", update_step, rollout_part, agent, args, envs, one_epoch)


# Copied from ppo.py
def first_call_checked(where: str, step, part, agent: Agent, args: Args, envs: TorchVecEnv, shortened=None):
    """--num_seeds: step(agent, agent.generators, *inputs) for the seeds together, whose first call is also run for
    each seed alone, as a run of that seed alone makes it: its Agent and optimizer (in inputs) from its part of their
    states before the call, its part (part(x, i)) of the inputs and of a RolloutBuffer, its generator. Where a seed's
    results or Agent after the call differ from its own alone beyond float rounding, or the call drew from a global
    random generator that the seeds share, one error line names where and the rule that code for one seed breaks.
    shortened((inputs, keywords)): those of a shorter call that the check compares instead, before the run's own
    call from the same states: the rounding of a long chaotic one (an update of many epochs at a high learning rate)
    would part a seed from its run alone as far as code that mixes the seeds does."""
    checked = []

    def call(*inputs, **keywords):
        if checked:
            return step(agent, agent.generators, *inputs, **keywords)
        checked.append(True)
        device = agent.generators[0].device
        model = {key: value.clone() for key, value in agent.state_dict().items()}
        optimizer = next((x for x in inputs if isinstance(x, PPOOptimizer)), None)
        optimizer_state = None if optimizer is None else copy.deepcopy(optimizer.state_dict())
        generator_states = [generator.get_state() for generator in agent.generators]
        given = cloned((inputs, keywords))  # as they came: the call may write into the rollout's tensors
        if shortened is not None:
            given = shortened(given)
            restored = copy.deepcopy(optimizer_state)  # the seeds' optimizers alone step optimizer_state's tensors
        rng_before = rng_states(device)
        checked_inputs, checked_keywords = (inputs, keywords) if shortened is None else cloned(given)
        result = step(agent, agent.generators, *checked_inputs, **checked_keywords)
        drawn = [GLOBAL_GENERATORS[key] for key in moved_generators(rng_before, rng_states(device))]
        if drawn:
            raise UserError(f"{where} draws from {' and '.join(drawn)} global random generator, which the seeds of "
                            "--num_seeds share: draw from torch with the seed dimension first (torch.normal, "
                            "torch.randn_like, torch.bernoulli, torch.multinomial, a Normal, Categorical or "
                            f"Bernoulli's sample(); in update(), inside optimizer.draws()) ({TRAINER}.py's docstring, "
                            "'A copy's contract')")
        rng_after = rng_states(device)
        try:
            for i, seed_agent in enumerate(agents_of_seeds(agent, args, envs, model)):
                generator = torch.Generator(device)
                generator.set_state(generator_states[i])
                seed_inputs = [alone(x, i, part, agent, seed_agent, args, optimizer_state) for x in given[0]]
                seed_keywords = {key: alone(x, i, part, agent, seed_agent, args, optimizer_state)
                                 for key, x in given[1].items()}
                seed_agent.train(agent.training)
                seed_result = step(seed_agent, [generator], *seed_inputs, **seed_keywords)
                differs = (differing(result, seed_result, i, "its result")
                           or differing(agent.state_dict(), seed_agent.state_dict(), i, "the Agent's", model))
                if differs:
                    raise UserError(
                        f"under --num_seeds, seed {args.seed + i}'s {where} differs from that seed's alone in "
                        f"{differs}: code written for one seed must reduce over rows alone (.mean(-1), never a whole "
                        "tensor), draw with the seed dimension first, and keep what it uses in the Agent's "
                        f"parameters, buffers and modules ({TRAINER}.py's docstring, 'A copy's contract')")
        finally:
            set_rng_states(rng_after, device)
        if shortened is None:
            return result
        agent.load_state_dict(model)  # the run's own call from the states that the check's began from
        if optimizer is not None:
            optimizer.load_state_dict(restored)
        for generator, state in zip(agent.generators, generator_states):
            generator.set_state(state)
        return step(agent, agent.generators, *inputs, **keywords)
    return call


# Copied from ppo.py
GLOBAL_GENERATORS = {"python": "Python's", "numpy": "numpy's", "torch": "torch's", "cuda": "torch's CUDA"}
# first_call_checked(): a seed's statistics may part from its own alone by ALONE_RTOL of their size and ALONE_ATOL
# (the first minibatch's ratio error is rounding itself: 6e-6 seen); each tensor of its Agent by ALONE_CHANGE_RTOL of
# the norm of its change. Float rounding parted them by 2.3e-5 (tanh networks) and 1e-2 (ppo_rgb.py's ReLU NatureCNN,
# whose units rounding flips); a whole-tensor advantage normalization by 0.67 (benchmarks/results/seeds_alone).
ALONE_RTOL, ALONE_ATOL, ALONE_CHANGE_RTOL = 1e-3, 1e-4, 0.1


# Copied from ppo.py
def cloned(x):
    """x with every tensor in it cloned: in tuples, lists, dicts and a RolloutBuffer's attributes."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(cloned(item) for item in x)
    if isinstance(x, dict):
        return {key: cloned(value) for key, value in x.items()}
    if isinstance(x, RolloutBuffer):
        buffer = copy.copy(x)
        vars(buffer).update({key: cloned(value) for key, value in vars(x).items()})
        return buffer
    return x


# Copied from ppo.py
def alone(x, i: int, part, agent: Agent, seed_agent: Agent, args: Args, optimizer_state: Optional[dict]):
    """Seed i's part of an input of a stacked call, as a run of that seed alone has it (first_call_checked())."""
    if x is agent:
        return seed_agent
    if isinstance(x, PPOOptimizer):
        optimizer = make_optimizer(seed_agent, member_args(args, i))
        optimizer.load_state_dict(seed_optimizer_state(optimizer_state, i, args.num_seeds))
        return optimizer
    if isinstance(x, Args):
        return member_args(x, i)
    if isinstance(x, functools.partial):  # update_losses: ppo_loss bound to the Agent
        return functools.partial(x.func, *(alone(y, i, part, agent, seed_agent, args, optimizer_state)
                                           for y in x.args), **x.keywords)
    if isinstance(x, RolloutBuffer):  # its tensors (num_steps, seeds, ...)
        buffer = copy.copy(x)
        for key, value in vars(x).items():
            setattr(buffer, key, rollout_part(value, i))
        buffer.env_dims = 1
        return buffer
    return part(x, i)


# Copied from ppo.py
def rollout_part(x, i: int):
    """Seed i's part of a rollout tensor (num_steps, seeds, ...), of each in a dict; anything else as it is."""
    if isinstance(x, dict):
        return {key: rollout_part(value, i) for key, value in x.items()}
    return x[:, i] if isinstance(x, torch.Tensor) and x.dim() > 1 else x


# Copied from ppo.py
def differing(together, single, i: int, what: str, before=None) -> Optional[str]:
    """Where seed i's numbers among the seeds (together, the seed dimension first) differ from its own alone (single)
    beyond float rounding: a name and both numbers; None where they agree. before: the seeds' state before, so that a
    change is compared to its size."""
    if isinstance(together, dict):
        for key in together:
            if key not in single:  # a statistic of the steps that the seed's run alone, stopped before any, never took
                if isinstance(together[key], torch.Tensor) and together[key].dim() and together[key][i].isnan().all():
                    continue
                return f"{what} {key} (alone: none)"
            found = differing(together[key], single[key], i, f"{what} {key}", None if before is None else before[key])
            if found:
                return found
        return None
    if isinstance(together, (tuple, list)):
        found = (differing(a, b, i, f"{what}[{k}]") for k, (a, b) in enumerate(zip(together, single)))
        return next(filter(None, found), None)
    if not isinstance(together, torch.Tensor):
        return None
    if together.dim() == 0 or not isinstance(single, (torch.Tensor, int, float)):  # one value for all seeds
        return f"{what} (shape {tuple(together.shape)}, not one value per seed)"
    a, b = together[i].detach().double().cpu(), torch.as_tensor(single).detach().double().cpu()
    if a.numel() != b.numel():
        return f"{what} (shape {tuple(together.shape)}, alone {tuple(b.shape)})"
    if b.numel() == 0:
        return None
    a = a.reshape(b.shape)
    gap = torch.where(a.isnan() & b.isnan(), 0.0, (a - b).abs()).nan_to_num(nan=float("inf"))
    if before is None and gap.amax() <= ALONE_RTOL * b.abs().nan_to_num().amax() + ALONE_ATOL:
        return None
    # a tensor of the Agent: the norm of its change (a ReLU unit that rounding flips moves a few numbers far)
    change = b - before[i].double().cpu().reshape(b.shape) if before is not None else None
    unchanged = 1e-6 * b.abs().amax()  # a tensor the update left alone may part by rounding of its size
    if change is not None and gap.norm() <= ALONE_CHANGE_RTOL * change.nan_to_num().norm() + unchanged:
        return None
    k = int(gap.flatten().argmax())
    return f"{what} ({a.flatten()[k].item():.6g} against {b.flatten()[k].item():.6g} alone)"


# Copied from ppo.py
def moved_generators(before: dict, after: dict) -> list[str]:
    """The generators (keys of rng_states()) whose state differs between the two."""
    def same(a, b) -> bool:
        if isinstance(a, dict):
            return all(same(a[key], b[key]) for key in a)
        return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    return [key for key in before if not same(before[key], after[key])]


# Copied from ppo.py
class PerSeedDraws(torch.overrides.TorchFunctionMode):
    """Inside it, a stacked agent's random draws of SPLIT (torch.normal, torch.randn_like, torch.bernoulli,
    torch.multinomial, and the in-place draws that torch.distributions' Normal, Categorical and Bernoulli sample with,
    and update()'s) draw each seed's part, their tensors' first dimension cut in as many equal parts as seeds, from
    that seed's generator, in the order a run of that seed alone draws it."""

    IN_PLACE = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.Tensor.exponential_,
                torch.Tensor.random_}
    SPLIT = {torch.normal, torch.randn_like, torch.bernoulli, torch.multinomial, torch.Tensor.bernoulli,
             torch.Tensor.multinomial, *IN_PLACE}

    def __init__(self, generators: list[torch.Generator]):
        super().__init__()
        self.generators = generators

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in self.SPLIT or (kwargs or {}).get("generator") is not None:  # every torch call passes here
            return func(*args, **(kwargs or {}))
        kwargs = {key: value for key, value in (kwargs or {}).items() if key != "generator"}
        n = len(self.generators)
        tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
        if not tensors or any(x.dim() == 0 or x.shape[0] % n for x in tensors):
            raise UserError(f"a draw of {func.__name__} on no tensor whose first dimension holds the "
                            f"{n} seeds' parts ({TRAINER}.py's docstring, 'A copy's contract')")

        def part(x, i: int):
            return x.chunk(n)[i] if isinstance(x, torch.Tensor) else x
        draws = [func(*(part(x, i) for x in args), **{key: part(x, i) for key, x in kwargs.items()}, generator=g)
                 for i, g in enumerate(self.generators)]
        return args[0] if func in self.IN_PLACE else torch.cat(draws)


# Copied from ppo.py
def seed_state(stacked_state: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Seed i's state dict from that of a module stack_seeds() made (clones: a slice saves all of the stack)."""
    return {key: value[i].clone() for key, value in stacked_state.items()}


# Copied from ppo.py
def stack_states(seed_states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The state dict of stack_seeds()'s module from its seeds' (the inverse of seed_state())."""
    return {key: torch.stack([state[key] for state in seed_states]) for key in seed_states[0]}


# Copied from ppo.py
class EachSeed(list):
    """--num_seeds: each seed's evaluation envs, which it steps alone: a vector env of all seeds would step a seed's
    envs on, and draw their next starts, until every seed's episodes had finished."""

    def close(self):
        for envs in self:
            envs.close()


# Copied from ppo.py
class SeedBlocks:
    """--num_seeds N: the seeds' envs as one vector env (TorchVecEnv) of N blocks of num_envs, seed i's the i-th;
    tensors in and out are (N, num_envs, ...), and each finished episode's "seed_index" says whose it is. reset(seed=s)
    seeds block i's envs as reset(seed=s + i) seeds a run's (ManiSkill's GPU simulation, though, draws the initial
    states of every block from one torch stream: docs/ppo.md).

    Envs stepped in this process share its global random generators (Python's, numpy's, torch's), so an env that
    draws from them makes a seed's episodes depend on the others': watch_steps of the first resets and steps are
    watched, and a warning names the generator (swapping each seed's states around each env's step would cost more
    than the step: about 0.5 ms)."""

    def __init__(self, envs: TorchVecEnv, num_seeds: int, env_id: str, watch_steps: int = 0):
        self.envs, self.num_seeds, self.env_id, self.watch_steps = envs, num_seeds, env_id, watch_steps
        self.block = envs.num_envs // num_seeds
        self.batch_shape = (num_seeds, self.block)
        self.seed_index = torch.arange(num_seeds, device=envs.device)[:, None].expand(self.batch_shape)

    def __getattr__(self, name: str):  # spaces, devices, video: the vector env's
        return getattr(self.envs, name)

    @property
    def action_mask(self) -> Optional[torch.Tensor]:
        return None if self.envs.action_mask is None else self.blocks(self.envs.action_mask)

    def blocks(self, x: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        if isinstance(x, dict):  # an observation of ppo_rgb.py's
            return {key: self.blocks(value) for key, value in x.items()}
        return x.reshape(self.num_seeds, self.block, *x.shape[1:])

    def reset(self, seed: Optional[int] = None) -> torch.Tensor:
        seeds = None if seed is None else [s for i in range(self.num_seeds) for s in self.block_seeds(seed + i)]
        return self.blocks(self.watched(self.envs.reset, seed=seeds))

    def block_seeds(self, seed: int) -> list[int]:
        """The env seeds that reset(seed=seed) gives a run's envs: Gymnasium's seed + k; ManiSkill's GPU simulation's
        seed, then draws from RandomState(seed)."""
        if self.envs.torch_native:
            return [seed, *np.random.RandomState(seed).randint(2**31, size=self.block - 1).tolist()]
        return [seed + k for k in range(self.block)]

    def step(self, action: torch.Tensor):
        stepped = self.watched(self.envs.step, action.flatten(0, 1))
        next_obs, reward, terminated, truncated, final_obs, finished = stepped
        if finished is not None:
            finished = {key: self.blocks(values) for key, values in finished.items()}
            finished["seed_index"] = self.seed_index
        return (*(self.blocks(x) for x in (next_obs, reward, terminated, truncated, final_obs)), finished)

    def watched(self, call, *args, **kwargs):
        if self.watch_steps <= 0:
            return call(*args, **kwargs)
        self.watch_steps -= 1
        before = rng_states(self.envs.sim_device)  # a torch-native env's own device's too
        result = call(*args, **kwargs)
        moved = moved_generators(before, rng_states(self.envs.sim_device))
        drawn = [GLOBAL_GENERATORS[key] for key in moved]
        if drawn:
            print(f"warning: {self.env_id} draws from {' and '.join(drawn)} global random "
                  f"generator{'s' if len(drawn) > 1 else ''}, which the seeds of --num_seeds share: each seed's "
                  f"episodes depend on the others' (a run alone's do not); draw from the env's own self.np_random "
                  f"(a torch-native env: a torch.Generator of its own) instead (docs/ppo.md)", file=sys.stderr)
            self.watch_steps = 0
        return result


class AgentSeedBlocks(SeedBlocks):
    """SeedBlocks of a vector env of agents: its alive agents as blocks too, and its finished episodes (one value per
    env whose episode ended, TorchVecEnv) each with the seed whose block it finished in."""

    @property
    def alive(self) -> torch.Tensor:
        return self.blocks(self.envs.alive)

    def step(self, action: torch.Tensor):
        stepped = self.watched(self.envs.step, action.flatten(0, 1))
        next_obs, reward, terminated, truncated, final_obs, finished = stepped
        if finished is not None:
            finished["seed_index"] = self.seed_index.flatten()[self.envs.ended]
        final_obs = None if final_obs is None else self.blocks(final_obs)
        return (*(self.blocks(x) for x in (next_obs, reward, terminated, truncated)), final_obs, finished)


# Copied from ppo.py
def episodes_by_seed(episodes: dict[str, torch.Tensor], num_seeds: int) -> list[dict[str, torch.Tensor]]:
    """Each seed's share of the rollout's finished episodes (metric -> values), by the block of envs each finished in
    (SeedBlocks' "seed_index")."""
    if num_seeds == 1:
        return [episodes]
    seed_index = episodes.get("seed_index")
    return [{key: values[seed_index == i] for key, values in episodes.items() if key != "seed_index"}
            for i in range(num_seeds)]


# Copied from ppo.py
def agents_of_seeds(agent: Agent, args: Args, envs: TorchVecEnv, stacked_state: Optional[dict] = None) -> list[Agent]:
    """Each seed's Agent as a run of that seed alone holds it (--num_seeds: a copy of its slices of the stacked one, or
    of stacked_state)."""
    if args.num_seeds == 1:
        return [agent]
    seed_agents, stacked_state = [], agent.state_dict() if stacked_state is None else stacked_state
    for i in range(args.num_seeds):
        with torch.random.fork_rng(devices=[]):  # the initial weights it draws are replaced at once
            seed_agent = make_agent(dataclasses.replace(args, num_seeds=1), envs)
        seed_agent.load_state_dict(seed_state(stacked_state, i))
        seed_agents.append(seed_agent.to(next(agent.parameters()).device))
    return seed_agents


# Copied from ppo.py
def evaluate_seeds(agent: Agent, args: Args, envs: TorchVecEnv, eval_envs, num_eval_steps: int,
                   seed: Optional[int], same_seed: bool = False) -> list[dict[str, torch.Tensor]]:
    """Each seed's evaluation, as a run of that seed alone evaluates: its agent in its own eval envs (EachSeed), with
    their own random stream (own_random_stream); seed i's envs seeded seed + i, or seed (same_seed)."""
    each_eval_envs = eval_envs if isinstance(eval_envs, EachSeed) else [eval_envs]
    results = []
    for i, (seed_agent, seed_eval_envs) in enumerate(zip(agents_of_seeds(agent, args, envs), each_eval_envs)):
        seed_agent.eval()
        with own_random_stream(seed_eval_envs):
            results.append(evaluate(seed_agent, seed_eval_envs, num_eval_steps,
                                    None if seed is None else seed + (0 if same_seed else i)))
    return results


# Copied from ppo.py
PER_SEED_STATISTICS = ("the update's statistics hold one value per seed: compare them elementwise (torch.where), "
                       "and keep state that follows them in a float buffer of the Agent")
INDEX_FROM_THE_END = ("the Agent's parameters and buffers have a leading seed dimension (stack_seeds): index them "
                      "against a batch from the end, as RunningMeanStd does")
SEED_RULES = {  # words of torch's error -> the rule of the copy contract (the docstring's) that --num_seeds needs
    "must match the size of tensor": INDEX_FROM_THE_END,
    "must match the existing size": INDEX_FROM_THE_END,  # expand()
    "must have same number of dimensions": INDEX_FROM_THE_END,  # torch.cat()
    "Boolean value of Tensor with more than one value": PER_SEED_STATISTICS,
    "cannot be converted to Scalar": PER_SEED_STATISTICS,
    "only one element tensors can be converted": PER_SEED_STATISTICS,
}


# Copied from ppo.py
def seed_rule_broken(e: Exception, args: Args) -> Optional[str]:
    """The rule of the copy contract that an error under --num_seeds says was broken, as one line."""
    rule = next((rule for words, rule in SEED_RULES.items() if words in str(e)), None)
    if args.num_seeds == 1 or rule is None:
        return None
    return (f"under --num_seeds {rule} ({TRAINER}.py's docstring, 'A copy's contract'); torch said: "
            f"{str(e).strip().splitlines()[0]}")


# Copied from ppo.py
def nonfinite_seeds(tensors, num_seeds: int) -> list[int]:
    """The seeds (indices) whose part of tensors (each with the seed dimension first) holds a non-finite number."""
    if num_seeds == 1:
        return [0]
    bad = torch.zeros(num_seeds, dtype=torch.bool)
    for tensor in tensors:
        if tensor is not None:
            bad |= ~torch.isfinite(tensor.detach().reshape(num_seeds, -1)).all(-1).cpu()
    return bad.nonzero().flatten().tolist()


# Copied from ppo.py
def continue_other_seeds(args: Args, run_dir: Path, bad: list[int]) -> str:
    """How the seeds that stayed finite go on: each alone, from its own run directory's checkpoint."""
    others = [seed_dir for i, (_, seed_dir) in enumerate(seed_dirs(args, run_dir)) if i not in bad]
    if not others:
        return ""
    more = f", and so on to {others[-1].name}" if len(others) > 1 else ""
    return (f"; the other seeds continue each alone from its own run directory: python {shlex.quote(sys.argv[0])} "
            f"--resume {shlex.quote(str(others[0]))}{more}")


# Copied from ppo.py
def mean_over_seeds(means: list[dict[str, float]]) -> dict[str, float]:
    """The progress bar's: each metric's mean over the seeds that have it."""
    if len(means) == 1:
        return means[0]
    keys = dict.fromkeys(key for seed_means in means for key in seed_means)
    return {key: float(np.mean([seed_means[key] for seed_means in means if key in seed_means])) for key in keys}


# ---------------------------------------------------------------------------------------------
# Population-based training (--pbt_interval): the seeds of --num_seeds as a population that exploits and explores
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
PBT_SETTINGS = ("learning_rate", "ent_coef", "clip_coef", "vf_coef", "max_grad_norm", "gamma", "gae_lambda",
                "target_kl")
PBT_DISCOUNTS = ("gamma", "gae_lambda")  # perturbed as 1 - x: the horizon 1 / (1 - x) is what scales
SETTING_RULE = ("a setting that --pbt_space searches holds one value per member: use it in tensor arithmetic, where "
                "it meets each member's part of the other tensor, never as a Python number (float(), if)")


# Copied from ppo.py
class MemberValues(torch.Tensor):
    """--pbt_interval: a searched setting as the algorithm reads it from args, one value per member (float64 on the
    learner's device; numbers: the same as Python floats; flag: the flag's value). Where it meets tensors it lines up
    with the seed dimension of the first: its first where that holds the N members (a statistic (N,), rows (N, rows,
    ...), a step's (N, num_envs, ...)), else its second (a rollout's (num_steps, N, num_envs, ...), which is why
    num_steps may not be N), in their floating dtype as a Python number would be: code written for one seed and one
    number computes each member's with its member's number."""

    SCALAR = {torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
              torch.Tensor.__index__}

    def __deepcopy__(self, memo):  # one object wherever args is copied: explore() sets it in place
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        given = torch.utils._pytree.tree_leaves((args, kwargs))  # inside lists too (torch.stack)
        members = next(x for x in given if isinstance(x, MemberValues))
        if func in cls.SCALAR:
            line = next((f"{Path(frame.filename).name}:{frame.lineno} " for frame in
                         reversed(traceback.extract_stack()[:-1]) if frame.filename == __file__), "")
            computed = "" if members.numbers else " (or a value computed from it)"
            raise UserError(f"{line}reads args.{members.setting}{computed} as a Python number ({func.__name__}): "
                            f"{SETTING_RULE}; for a condition, (args.x > c) * y "
                            f"or torch.where(torch.as_tensor(args.x > c), y, z), which a plain number takes too "
                            f"({TRAINER}.py's docstring, 'A copy's contract')")
        tensors = [x for x in given if isinstance(x, torch.Tensor) and not isinstance(x, MemberValues)]
        reference = next((x for x in tensors if x.dim() > 0), None)
        with torch._C.DisableTorchFunctionSubclass():
            if reference is None:  # settings and numbers alone (1 - args.clip_coef): a setting again
                result = func(*args, **kwargs)
                return (member_values(result, None, None, members.num_steps, members.setting)
                        if isinstance(result, torch.Tensor) and result.shape == members.shape else result)
            floats = [x.dtype for x in tensors if x.is_floating_point()]
            dtype = functools.reduce(torch.promote_types, floats) if floats else torch.get_default_dtype()
            shape = members.seed_shape(reference)

            def lined_up(x):
                if not isinstance(x, MemberValues):
                    return x
                x = x.as_subclass(torch.Tensor)  # a comparison's stays bool
                return (x.to(dtype) if x.is_floating_point() else x).view(shape)
            args, kwargs = torch.utils._pytree.tree_map(lined_up, (args, kwargs))
            return func(*args, **kwargs)

    def seed_shape(self, reference: torch.Tensor) -> tuple[int, ...]:
        n, shape = self.shape[0], reference.shape
        at = next((d for d in (0, 1) if len(shape) > d and shape[d] == n), None)
        if at is None:
            raise UserError(f"{SETTING_RULE}; it met a tensor of shape {tuple(shape)}, which holds no seed dimension "
                            f"of {n} first or second ({TRAINER}.py's docstring, 'A copy's contract')")
        return (*(1,) * at, n, *(1,) * (len(shape) - at - 1))

    def set(self, numbers: list[float]):
        with torch._C.DisableTorchFunctionSubclass():
            self.copy_(torch.tensor(numbers, dtype=torch.float64))
        self.numbers = list(numbers)


# Copied from ppo.py
def member_values(values, numbers: Optional[list[float]], flag, num_steps: int, setting: str) -> MemberValues:
    with torch._C.DisableTorchFunctionSubclass():
        values = values.as_subclass(MemberValues)
    values.numbers, values.flag, values.num_steps, values.setting = numbers, flag, num_steps, setting
    return values


# Copied from ppo.py
def member_numbers(value, n: int) -> list[float]:
    """A setting's number for each of n members: a MemberValues' own, else the one number."""
    if not isinstance(value, MemberValues):
        return [value] * n
    if value.numbers is None:  # a setting computed from settings (2 * args.max_grad_norm)
        with torch._C.DisableTorchFunctionSubclass():
            return value.as_subclass(torch.Tensor).tolist()
    return value.numbers


# Copied from ppo.py
def pbt_space(args: Args) -> dict[str, tuple[float, float, bool]]:
    """--pbt_space as NAME -> (LOW, HIGH, log), each checked against the flag's own range (FLAG_RULES)."""
    space = {}
    for text in args.pbt_space:
        name, _, spec = text.partition("=")
        low, _, rest = spec.partition(":")
        high, _, scale = rest.partition(":")
        if name not in PBT_SETTINGS:
            what = "cannot vary per member" if name in Args.__dataclass_fields__ else "is no flag of the trainer"
            raise UserError(f"--pbt_space {text!r}: {'--' + name if name else 'its flag'} {what}; a population "
                            f"searches {', '.join(PBT_SETTINGS)}")
        try:
            low, high = float(low), float(high)
        except ValueError:
            raise UserError(f"--pbt_space {text!r}: write NAME=LOW:HIGH or NAME=LOW:HIGH:log") from None
        ok, rule = next((ok, rule) for flags, ok, rule in FLAG_RULES if name in flags)
        if scale not in ("", "log") or not (finite(low) and finite(high) and low < high) or (scale and low <= 0):
            raise UserError(f"--pbt_space {text!r}: write NAME=LOW:HIGH or NAME=LOW:HIGH:log, finite, LOW below HIGH "
                            "(and above 0 on a log scale)")
        if not (ok(low) and ok(high)):
            raise UserError(f"--pbt_space {text!r} leaves --{name}'s range: --{name} must be {rule}")
        if name in space:
            raise UserError(f"--pbt_space names --{name} twice")
        space[name] = (low, high, scale == "log")
    return space


# Copied from ppo.py
def drawn(space: tuple[float, float, bool], generator: torch.Generator) -> float:
    low, high, log = space
    u = torch.rand((), generator=generator, dtype=torch.float64).item()
    return math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if log else low + u * (high - low)


# Copied from ppo.py
def population_args(args: Args, resume_state: Optional[dict], device: torch.device) -> Args:
    """The Args that train() runs with: under --pbt_interval each searched setting a MemberValues, from the flags'
    values, --pbt_start=space's draws, or a resumed run's."""
    if args.pbt_interval is None:
        return args
    saved, generator = (resume_state or {}).get("pbt"), torch.Generator().manual_seed(args.seed)
    settings = {}
    for name, space in pbt_space(args).items():
        numbers = ([drawn(space, generator) for _ in range(args.num_seeds)] if args.pbt_start == "space" else
                   [getattr(args, name)] * args.num_seeds) if saved is None else saved["values"][name]
        settings[name] = member_values(torch.tensor(numbers, dtype=torch.float64, device=device), list(numbers),
                                       getattr(args, name), args.num_steps, name)
        if saved is None and args.pbt_start == "flags" and getattr(args, name) == (1 if name in PBT_DISCOUNTS else 0):
            print(f"note: --{name}={getattr(args, name)} for every member: a perturbation multiplies "
                  f"{'1 - ' if name in PBT_DISCOUNTS else ''}it, so it moves only where redrawn (--pbt_resample); "
                  "another start, or --pbt_start=space, lets it move", flush=True)
    return dataclasses.replace(args, **settings)


# Copied from ppo.py
def flags_of(args: Args) -> Args:
    """The run's Args as the flags gave them (a population's settings: their flags' values)."""
    return dataclasses.replace(args, **{key: value.flag for key, value in vars(args).items()
                                        if isinstance(value, MemberValues)})


# Copied from ppo.py
def member_args(args: Args, i: int) -> Args:
    """Member (seed) i's Args as a run of that seed alone with its settings has them."""
    return dataclasses.replace(args, num_seeds=1, pbt_interval=None, **{
        key: member_numbers(value, args.num_seeds)[i] for key, value in vars(args).items()
        if isinstance(value, MemberValues)})


# Copied from ppo.py
class Population:
    """--pbt_interval: the members of --num_seeds as a population (Jaderberg et al. 2017) in one process. Every
    pbt_interval iterations after the warm-up, end_iteration() ranks them by their score; each of the worst
    pbt_fraction takes (exploit) the whole learner state of a random member of the best pbt_fraction, a copy along
    the seed dimension: the Agent's parameters and buffers (observation and value statistics, a copy's own state),
    every optimizer's state and learning rate (an adaptive schedule's position), the reward statistics, the searched
    settings; then it perturbs (explore) the settings it took, after the copy. A member keeps its own envs,
    their episodes in progress (and the reward normalizer's returns of them) and its own random streams, as a run
    goes on. The last iteration ranks without exploiting, to name the best. lineage.csv: a row per member per
    ranking (seeds name members and donors); checkpoints hold the rest (state())."""

    def __init__(self, args: Args, setup: Setup, agent: Agent, optimizer: PPOOptimizer,
                 reward_normalizer: Optional[RewardNormalizer], resume_state: Optional[dict]):
        self.args, self.setup, self.agent, self.optimizer = args, setup, agent, optimizer
        self.reward_normalizer, self.space = reward_normalizer, pbt_space(args)
        self.settings = {name: getattr(args, name) for name in self.space}
        self.generator = torch.Generator().manual_seed(args.seed + 1)
        self.window = torch.zeros(2, args.num_seeds, dtype=torch.float64)  # the scores' sums and counts
        self.scores = torch.full((args.num_seeds,), math.nan, dtype=torch.float64)
        self.lineage, self.rows = setup.run_dir / "lineage.csv", []
        if resume_state is not None:
            saved = resume_state["pbt"]
            self.generator.set_state(saved["generator"])
            self.window, self.scores = saved["window"].clone(), saved["scores"].clone()
            if self.lineage.is_file():  # the rows of rankings after the checkpoint are done again
                self.rows = [row for row in self.lineage.read_text().splitlines()[1:]
                             if int(row.split(",")[0]) <= resume_state["iteration"]]
                self.write_lineage()

    def state(self) -> dict:
        return {"values": {name: list(values.numbers) for name, values in self.settings.items()},
                "generator": self.generator.get_state(), "window": self.window.clone(), "scores": self.scores.clone()}

    def end_iteration(self, run: Run, episodes: dict[str, torch.Tensor]):
        args, iteration = self.args, run.iteration
        for i, member_episodes in enumerate(episodes_by_seed(episodes, args.num_seeds)):
            values = member_episodes.get("success_once", member_episodes.get("return"))
            if values is not None and values.numel() > 0:
                self.window[:, i] += torch.tensor([values.double().sum().item(), values.numel()])
        run.log.scalars({f"pbt/{name}": torch.tensor(values.numbers) for name, values in self.settings.items()},
                        run.global_step)
        warmup, last = args.pbt_warmup or args.pbt_interval, iteration == self.setup.num_iterations
        if not last and (iteration < warmup or (iteration - warmup) % args.pbt_interval):
            return
        # a member none of whose episodes ended since the last ranking keeps its score and its window (NaN: none yet)
        fresh = self.evaluated(run) if args.pbt_objective == "eval" else self.window[0] / self.window[1]
        self.scores = torch.where(fresh.isnan(), self.scores, fresh)
        self.window[:, ~fresh.isnan()] = 0.0
        ranked = self.scores.clone()  # the rows' scores: before a copy gives a member its donor's
        scored = sorted((i for i in range(args.num_seeds) if not ranked[i].isnan()), key=lambda i: (-ranked[i], i))
        k = max(1, int(args.num_seeds * args.pbt_fraction))
        donors, spread = {}, float(ranked.nan_to_num(-math.inf).max() - ranked.nan_to_num(math.inf).min())
        for member in [] if last or len(scored) < 2 * k else scored[-k:]:  # members without a score take no part
            donor = scored[torch.randint(k, (), generator=self.generator).item()]
            if args.pbt_rule == "truncation" or ranked[donor] - ranked[member] > args.pbt_margin * spread:
                self.exploit(member, donor)
                self.scores[member] = ranked[donor]
                donors[member] = donor
            self.explore(member)
        run.log.scalars({"pbt/score": ranked.float()}, run.global_step)
        self.rows += [",".join(map(str, [iteration, run.global_step, args.seed + i, ranked[i].item(),
                                         "" if i not in donors else args.seed + donors[i],
                                         *(values.numbers[i] for values in self.settings.values())]))
                      for i in range(args.num_seeds)]
        self.write_lineage()

    def evaluated(self, run: Run) -> torch.Tensor:
        """--pbt_objective=eval: each member's mean over an evaluation on the same seeds (the run's first)."""
        scores = []
        for metrics in evaluate_seeds(self.agent, self.args, run.envs, run.eval_envs, self.setup.num_eval_steps,
                                      self.args.seed, same_seed=True):
            values = metrics.get("success_once", metrics.get("return"))
            scores.append(values.double().mean().item() if values is not None and values.numel() else math.nan)
        return torch.tensor(scores, dtype=torch.float64)

    def exploit(self, member: int, donor: int):
        for values in self.settings.values():
            values.set([values.numbers[donor] if i == member else number for i, number in enumerate(values.numbers)])
        self.window[:, member] = 0.0  # its episodes since the ranking are its new state's
        with torch.no_grad():
            for module in (self.agent, self.reward_normalizer):
                for tensor in (module.state_dict() if module is not None else {}).values():
                    tensor[member] = tensor[donor]
        for optimizer in (self.optimizer, *own_optimizers(self.agent).values()):
            per = len(optimizer.param_groups) // self.args.num_seeds  # groups seed by seed (SeedOptimizer, SeedSteps)
            for to, of in zip(optimizer.param_groups[member * per:(member + 1) * per],
                              optimizer.param_groups[donor * per:(donor + 1) * per]):
                to["lr"] = of["lr"]
                for p, q in zip(to["params"], of["params"]):
                    optimizer.state.pop(p, None)
                    if q in optimizer.state:
                        optimizer.state[p] = {key: value.clone() if torch.is_tensor(value) else value
                                              for key, value in optimizer.state[q].items()}

    def explore(self, member: int):
        for name, space in self.space.items():
            numbers, factor = list(self.settings[name].numbers), 1.0 + self.args.pbt_perturb
            if torch.rand((), generator=self.generator).item() < self.args.pbt_resample:
                number = drawn(space, self.generator)
            else:
                factor = 1.0 - self.args.pbt_perturb if torch.rand((), generator=self.generator) < 0.5 else factor
                number = numbers[member]
                number = 1.0 - (1.0 - number) * factor if name in PBT_DISCOUNTS else number * factor
            numbers[member] = min(max(number, space[0]), space[1])
            self.settings[name].set(numbers)
        if "learning_rate" in self.space and self.args.lr_schedule == "constant":  # linear: at the next iteration
            self.optimizer.param_groups[member]["lr"] = self.settings["learning_rate"].numbers[member]

    def best(self) -> int:
        return int(self.scores.nan_to_num(-math.inf).argmax())

    def write_lineage(self):
        header = ",".join(["iteration", "global_step", "member", "score", "donor", *self.settings])
        write_file(self.lineage, "\n".join([header, *self.rows, ""]).encode())


# ---------------------------------------------------------------------------------------------
# The run around train()'s loop: its start, logs, evaluation, checkpoints, signals, what stops it
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
class Run:
    """train()'s run, a context manager around its loop. Entering it starts the learner from --checkpoint's or
    --resume's state (load_states()), resets the envs with the run's seeds (next_obs), continues a resumed run's random
    streams, opens the logs (RunLog) and takes SIGINT and SIGTERM (StopSignal). iterations() counts the iterations
    left; end_iteration() does an iteration's own steps after the update; leaving it reports what stopped the run (in
    one line) and closes what it opened; status is then the process's exit status."""

    def __init__(self, args: Args, setup: Setup, envs: TorchVecEnv, eval_envs: Optional[TorchVecEnv], agent: Agent,
                 optimizer: PPOOptimizer, reward_normalizer: Optional[RewardNormalizer], resume_state: Optional[dict],
                 init_state: Optional[dict]):
        self.args, self.setup, self.envs, self.eval_envs = args, setup, envs, eval_envs
        self.agent, self.optimizer, self.reward_normalizer = agent, optimizer, reward_normalizer
        self.resume_state, self.init_state = resume_state, init_state
        self.status: Optional[int] = None
        self.last_checkpoint: Optional[Path] = None
        self.times: dict[str, float] = {}

    def __enter__(self) -> Run:
        args, setup, rank = self.args, self.setup, self.setup.rank
        self.global_step, self.start_iteration = load_states(self.agent, self.optimizer, self.reward_normalizer,
                                                             self.init_state, self.resume_state, args, self.envs)
        self.iteration = self.start_iteration
        # Gymnasium seeds env i with seed + i (ManiSkill env 0 with seed, the others with draws from
        # RandomState(seed)): training and evaluation envs, and each rank, get disjoint blocks of seeds, and a resumed
        # run new ones rather than a replay of its first iteration's starts.
        train_seed = args.seed + (self.start_iteration * world_size() + rank) * (args.num_envs + args.num_eval_envs)
        self.next_obs = self.envs.reset(seed=train_seed)
        self.eval_seed = train_seed + args.num_envs  # seeds the next evaluation; later ones continue the envs' streams
        if self.resume_state is not None:
            # After the envs are built and reset, so that each rank's random stream continues where it stopped.
            set_rng_states(self.resume_state["rng"] if rank == 0 else self.resume_state["other_ranks_rng"][rank - 1],
                           setup.device)
        self.unsaved = UnsavedState(self.agent, args, self.optimizer)
        self.log = RunLog(args, setup, self.resume_state)
        self.population = None if args.pbt_interval is None else Population(
            args, setup, self.agent, self.optimizer, self.reward_normalizer, self.resume_state)
        self.progress = tqdm(total=setup.num_iterations, initial=self.start_iteration, desc=setup.run_name,
                             dynamic_ncols=True, mininterval=1.0, disable=rank != 0)
        self.start_time, self.start_step = time.perf_counter(), self.global_step
        self.stop = StopSignal()
        return self

    def iterations(self):
        """The iterations left, counted from 1. A signal ends them."""
        for self.iteration in range(self.start_iteration + 1, self.setup.num_iterations + 1):
            yield self.iteration
            if self.status is not None:
                return

    @contextlib.contextmanager
    def timed(self, tag: str):
        """Times its block as tag; the rollout's block also counts its steps (the global step)."""
        start = time.perf_counter()
        yield
        self.times[tag] = time.perf_counter() - start
        if tag == "time/rollout_time":
            self.global_step += self.args.num_steps * self.args.num_envs * world_size()

    def end_iteration(self, stats: dict, episodes: dict[str, torch.Tensor]):
        """After the update: its numbers checked (finite, the same on every rank, no unsaved state changed); the
        statistics and the rollout's finished episodes logged (rank 0, with every rank's episodes); an evaluation,
        a checkpoint where due; a signal saves and stops the run."""
        args, setup, iteration, global_step = self.args, self.setup, self.iteration, self.global_step
        if not parameters_finite(self.agent, iteration):
            raise NonFiniteError("parameters", nonfinite_seeds(self.agent.state_dict().values(), args.num_seeds))
        sps = int((global_step - self.start_step) / (time.perf_counter() - self.start_time))
        rollout_fps = args.num_envs * world_size() * args.num_steps / self.times["time/rollout_time"]
        self.log.scalars({**stats, "charts/SPS": sps, **self.times, "time/rollout_fps": rollout_fps}, global_step)
        postfix = {"step": global_step, "SPS": sps,
                   **self.log.episodes("train", gather_episodes(episodes), global_step)}
        last = iteration == setup.num_iterations
        if setup.rank == 0 and (iteration % args.eval_freq == 0 or last):
            eval_episodes = evaluate_seeds(self.agent, args, self.envs, self.eval_envs, setup.num_eval_steps,
                                           self.eval_seed)
            self.eval_seed = None
            postfix.update(self.log.episodes("eval", eval_episodes, global_step))
            if any(seed_episodes["episodes"].sum() == 0 for seed_episodes in eval_episodes):
                print(f"\nevaluation at iteration {iteration}: no episode finished within {setup.num_eval_steps} "
                      "steps", file=sys.stderr)
            self.log.flush()
        self.log.videos(global_step)
        if self.population:
            self.population.end_iteration(self, episodes)
        self.unsaved.refuse_changes()  # the evaluation's changes too, before a checkpoint leaves them out
        self.progress.set_postfix(postfix, refresh=False)
        self.progress.update(1)
        checkpoint_due = args.save_model and (iteration % (args.checkpoint_freq or args.eval_freq) == 0 or last)
        if checkpoint_due:
            self.last_checkpoint = self.save(final=last)
            self.log.flush()
        signum = agree_on_signal(self.stop.signum, setup.device)
        if signum is not None and not last:
            if not checkpoint_due:
                self.last_checkpoint = self.save()
            self.progress.close()
            self.log.flush()
            if setup.rank == 0:
                print_how_to_resume(signum, self.last_checkpoint, iteration, setup.run_dir)
            self.status = 128 + signum

    def save(self, final: bool = False) -> Optional[Path]:
        return write_checkpoint(self.args, self.setup, self.envs, self.agent, self.optimizer, self.reward_normalizer,
                                self.global_step, self.iteration, final,
                                None if self.population is None else self.population.state())

    def __exit__(self, exc_type, e, tb) -> bool:
        rank = self.setup.rank
        try:
            self.progress.close()  # before the error line of whatever stopped the run
            if isinstance(e, (NonFiniteError, OSError)):
                # non-finite numbers stop every rank at the same point: the checks run on numbers all ranks share
                if rank == 0:
                    print(stop_message(e, self.args, self.setup, self.iteration, self.global_step,
                                       self.last_checkpoint), file=sys.stderr)
                self.status = 1
                return True
            if isinstance(e, (RuntimeError, ValueError)) and (rule := seed_rule_broken(e, self.args)):
                raise UserError(rule) from e  # a copy's code written for one seed, which --num_seeds cannot batch
        finally:
            self.stop.restore()
            self.log.close(exit_code=1 if e is not None else self.status or 0)
        if e is None and self.status is None:
            self.status = 0
            if rank == 0:
                print(f"done: {self.setup.num_iterations} iterations, {self.global_step} steps; run in "
                      f"{self.setup.run_dir}", flush=True)
                if self.population:
                    best = self.population.best()
                    print(f"best member: seed {self.args.seed + best} (score {self.population.scores[best]:.4g}), "
                          f"{seed_dirs(self.args, self.setup.run_dir)[best][1]}; the lineage: "
                          f"{self.setup.run_dir / 'lineage.csv'} (scripts/plot.py {self.setup.run_dir} --lineage)",
                          flush=True)
        return False


# ---------------------------------------------------------------------------------------------
# Startup: errors, arguments, the run
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
class UserError(Exception):
    """A mistake the user can fix: reported as one line and exit status 2."""


# Copied from ppo.py
class NonFiniteError(Exception):
    """A non-finite loss, gradient or parameter: the run stops before anything is saved. Its arguments: what, and
    (ppo.py) the indices of the seeds it is in."""


def main(args: Args) -> int:
    rank, local_rank, num_ranks, local_ranks = torchrun_ranks()
    maniskill, time_limit = find_env(args.env_id)
    time_limit_from = None  # where the default came from, for the run's first line; None: given, or none at all
    if args.max_episode_steps is None and args.env_id.startswith(PZ_PREFIX):
        time_limit, time_limit_from = pettingzoo_time_limit(args.env_id, parse_env_kwargs(args.env_kwargs, False))
    args, derived = validate(args, maniskill, time_limit, num_ranks, local_ranks)
    num_iterations, num_eval_steps = derived["num_iterations"], derived["num_eval_steps"]

    resume_state = None
    if args.resume is not None:
        resume_path = find_resume_checkpoint(args.resume)
        resume_state = load_checkpoint(resume_path)
        run_dir = resume_path.parent
        run_name = resume_state["run_name"]
        if resume_state["iteration"] >= num_iterations:
            raise UserError(f"the run's checkpoint is at iteration {resume_state['iteration']} and "
                            f"--total_timesteps={args.total_timesteps} ends the run at iteration {num_iterations}: "
                            "raise --total_timesteps to continue it")
        if rank == 0:
            note_changed_source(resume_state, resume_path)
        if resume_state.get("world_size", 1) != num_ranks:
            raise UserError(f"the run was trained by {resume_state.get('world_size', 1)} processes and this is "
                            f"{num_ranks}: resume it with as many (torchrun --nnodes x --nproc_per_node), or start a "
                            "new run from its weights with --checkpoint")
    else:
        env_name = re.sub("[:/]", "_", args.env_id)  # ALE/Pong-v5 and module:EnvId name one directory
        run_name = args.exp_name or f"{env_name}__{TRAINER}__{args.seed}__{int(time.time())}"
        run_dir = Path("runs") / run_name
    init_state = load_checkpoint(args.checkpoint, any_trainer=True) if args.checkpoint is not None else None

    lock = RunDirLock(run_dir) if rank == 0 else None  # rank 0 alone writes the run directory
    try:
        if rank == 0 and resume_state is None:
            if any(run_dir.glob("*.pt")):  # the run's own: subdirectories' (ppo.py's seeds') are set aside below
                raise UserError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, or pick "
                                "another --exp_name")
            lock.moved_aside = set_aside_unfinished_start(run_dir)
        device = seed_process(args, rank, local_rank, num_ranks)
        if num_ranks > 1:
            if device.type == "cuda":
                if local_rank >= torch.cuda.device_count():
                    raise UserError(f"rank {rank} is process {local_rank} of its node, which lets it see "
                                    f"{torch.cuda.device_count()} GPUs: start one process per GPU (--nproc_per_node), "
                                    "each seeing all of the node's GPUs")
                torch.cuda.set_device(device)
            # Rank 0 evaluates and writes checkpoints while the others wait in a collective: allow it an hour.
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=1))
            resume_iterations = gather_objects(None if resume_state is None else resume_state["iteration"])
            if len(set(resume_iterations)) > 1:
                raise UserError(f"the ranks found different checkpoints to resume from (iterations "
                                f"{resume_iterations}); give --resume the checkpoint file")

        env_args = args if rank == 0 else dataclasses.replace(args, capture_video=False)
        envs = make_envs(env_args, maniskill, device, evaluation=False, run_dir=run_dir, num_eval_steps=num_eval_steps)
        eval_envs = None
        try:
            if rank == 0:
                eval_envs = make_envs(args, maniskill, device, evaluation=True, run_dir=run_dir,
                                      num_eval_steps=num_eval_steps)
            critic_input = envs.critic_input if args.centralized_critic else "own_observation"
            setup = Setup(run_name, run_dir, device, rank, **derived, time_limit_from=time_limit_from,
                          critic_input=critic_input, checkpoint_trainer=init_state and init_state.get("trainer"),
                          run_id=(resume_state or {}).get("run_id") or secrets.token_hex(8))
            status = train(population_args(args, resume_state, device), setup, envs, eval_envs, resume_state,
                           init_state)
            if num_ranks > 1:
                dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)  # rank 0's last writes
            return status
        finally:
            envs.close()
            if eval_envs is not None:
                eval_envs.close()
    except BaseException:
        # Nothing but the lock file and empty directories goes, so this is safe at any point of the run too.
        if lock is not None:
            lock.undo()
        raise
    finally:
        if lock is not None:
            lock.release()
        if dist.is_initialized():
            dist.destroy_process_group()


# Copied from ppo.py
def torchrun_ranks() -> tuple[int, int, int, int]:
    """(rank, local rank, number of ranks, ranks on this node), as torchrun sets them; a plain run is 0 of 1."""
    return tuple(int(os.environ.get(name, default)) for name, default in
                 (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1)))


# Copied from ppo.py
def finite(value) -> bool:
    return value is not None and math.isfinite(value)


# Copied from ppo.py
def plain_name(name: Optional[str]) -> bool:
    return name is None or (name not in ("", ".", "..") and "/" not in name and os.sep not in name and "\0" not in name)


# (flags, check, what the flags must be): validate() refuses the first value that fails its check.
# Copied from ppo.py
FLAG_RULES = (
    (("exp_name",), plain_name, "a plain directory name under runs/ (no '/', not '..')"),
    (("env_id",), bool, "a task id"),
    (("num_envs", "num_eval_envs", "num_steps", "num_minibatches", "update_epochs", "eval_freq", "total_timesteps",
      "num_seeds"), lambda value: value >= 1, "positive"),
    (("num_eval_steps", "save_train_video_freq", "max_episode_steps", "checkpoint_freq", "keep_checkpoints"),
     lambda value: value is None or value >= 1, "positive (or None)"),
    (("reconfiguration_freq", "eval_reconfiguration_freq"), lambda value: value is None or value >= 0,
     "0 (never) or positive (or None)"),
    (("learning_rate", "kl_target", "min_learning_rate", "max_learning_rate", "clip_coef", "vf_coef", "reward_scale"),
     lambda value: finite(value) and value > 0, "a positive finite number"),
    (("lr_factor",), lambda value: finite(value) and value > 1, "a finite number above 1"),
    (("ent_coef",), lambda value: finite(value) and value >= 0, "0 or a positive finite number"),
    (("max_grad_norm",), lambda value: value > 0, "positive (inf: no clipping)"),  # nan fails the comparison
    (("target_kl",), lambda value: value is None or value > 0, "positive (or None: never stop early)"),
    (("gamma",), lambda value: finite(value) and 0.0 < value <= 1.0, "in (0, 1]"),
    (("gae_lambda",), lambda value: finite(value) and 0.0 <= value <= 1.0, "in [0, 1]"),
    (("log_std_init",), finite, "a finite number"),
    (("hidden_sizes",), lambda sizes: all(size >= 1 for size in sizes), "positive widths"),
    (("wandb_project_name", "wandb_entity", "wandb_group"), lambda name: name is None or name.strip() != "",
     "a name (or None: the default)"),
    (("wandb_tags",), lambda tags: all(1 <= len(tag) <= 64 for tag in tags), "tags of 1 to 64 characters (wandb's)"),
    (("pbt_interval", "pbt_warmup"), lambda value: value is None or value >= 1, "positive (or None)"),
    (("pbt_fraction",), lambda value: 0.0 < value <= 0.5, "in (0, 0.5]"),
    (("pbt_perturb",), lambda value: 0.0 < value < 1.0, "in (0, 1)"),
    (("pbt_resample",), lambda value: 0.0 <= value <= 1.0, "in [0, 1]"),
    (("pbt_margin",), lambda value: finite(value) and value >= 0.0, "0 or a positive finite number"),
)


def validate(args: Args, maniskill: bool, time_limit: Optional[int], num_ranks: int = 1,
             local_ranks: int = 1) -> tuple[Args, dict]:
    """Check every flag's range and what settings() makes of them; return settings() of the num_ranks processes
    (local_ranks of them on this machine): the run's Args and Setup's fields."""
    for flags, ok, rule in FLAG_RULES:
        for flag in flags:
            if hasattr(args, flag) and not ok(getattr(args, flag)):  # a copy may have removed the flag
                raise UserError(f"--{flag} must be {rule}, got {getattr(args, flag)}")
    if maniskill:
        if args.agent_obs not in (None, "full", "local"):
            raise UserError(f"--agent_obs must be full or local, got {args.agent_obs}")
    elif args.agent_obs is not None:
        raise UserError("--agent_obs chooses between a ManiSkill task's full and local state; a VMAS agent observes "
                        "what its scenario gives it: drop --agent_obs")
    elif args.save_train_video_freq is not None:
        raise UserError("--save_train_video_freq records ManiSkill training videos; VMAS runs record evaluation "
                        "videos only")
    if args.async_envs and not args.env_id.startswith(PZ_PREFIX):
        raise UserError("--async_envs steps PettingZoo envs in worker processes; ManiSkill's CPU envs always run in "
                        "workers and VMAS on the learner's device: drop --async_envs")
    parse_env_kwargs(args.env_kwargs, maniskill)
    cores = max(1, usable_cores() // local_ranks)
    if not 0 <= args.torch_threads <= cores:
        raise UserError(f"--torch_threads must be 0 (torch's default) to {cores}, the cores of a process, "
                        f"got {args.torch_threads}")
    if args.min_learning_rate > args.max_learning_rate:
        raise UserError(f"--min_learning_rate ({args.min_learning_rate}) is above --max_learning_rate "
                        f"({args.max_learning_rate})")
    if args.anneal_lr and args.lr_schedule not in ("constant", "linear"):
        raise UserError(f"--anneal_lr means --lr_schedule=linear and conflicts with --lr_schedule={args.lr_schedule}")
    if args.num_seeds > 1:
        for given, flag in ((num_ranks > 1, "torchrun"), (args.compile, "--compile")):
            if given:
                raise UserError(f"--num_seeds does not work with {flag} yet; start a run of each seed instead "
                                "(scripts/sweep.sh)")
    args, derived = settings(args, maniskill, time_limit, num_ranks)
    if args.pbt_interval is not None:
        refuse_bad_population(args, derived["num_iterations"])
    if args.track and importlib.util.find_spec("wandb") is None:
        raise UserError("--track logs to Weights and Biases, which is not installed: pip install wandb")
    if args.checkpoint is not None and args.resume is not None:
        raise UserError("--checkpoint starts a new run from saved weights and --resume continues a run; give one")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise UserError(f"batch size num_envs*num_steps = {batch_size} does not split into "
                        f"--num_minibatches={args.num_minibatches} equal minibatches; pick num_minibatches dividing it")
    if args.norm_adv and batch_size // args.num_minibatches < 2:
        raise UserError("--norm_adv needs minibatches of at least 2 samples; lower --num_minibatches or pass "
                        "--no_norm_adv")
    num_iterations = derived["num_iterations"]
    if num_iterations < 1:
        raise UserError(f"--total_timesteps={args.total_timesteps} is smaller than one batch of all processes "
                        f"(num_envs*num_steps*processes = {batch_size * num_ranks})")
    # Every env seed the run will use (env i of a block gets seed + i; each rank and each resume takes a new block)
    # must be a valid numpy seed: 0 <= seed < 2**32.
    seeds_per_run = (num_iterations + 1) * num_ranks * (args.num_envs + args.num_eval_envs)
    if seeds_per_run >= 2**32:
        raise UserError(f"--total_timesteps={args.total_timesteps} would need more env seeds than numpy has (2**32)")
    room = 2**32 - seeds_per_run  # the first seeds of runs this long that numpy's env seeds can follow
    if args.num_seeds > room - max(args.seed, 0):
        raise UserError(f"--num_seeds must be at most {room - max(args.seed, 0)} for this run's length and --seed "
                        f"(numpy's env seeds end at 2**32), got {args.num_seeds}")
    if not 0 <= args.seed <= room - args.num_seeds:
        raise UserError(f"--seed must be in [0, {room - args.num_seeds}] for this run's length and --num_seeds, got "
                        f"{args.seed}")
    if derived["num_eval_steps"] is None:
        raise UserError(f"{args.env_id} has no time limit; give --max_episode_steps or --num_eval_steps")
    sim_backend = resolve_sim_backend(args.sim_backend) if maniskill else None
    if sim_backend == "gpu":
        for prefix, num_envs, partial_reset, reconfiguration_freq in (
                ("", args.num_envs * args.num_seeds, args.partial_reset, args.reconfiguration_freq),
                ("eval_", args.num_eval_envs, args.eval_partial_reset, args.eval_reconfiguration_freq)):
            if num_envs > 1 and partial_reset and reconfiguration_freq:
                raise UserError(f"--{prefix}partial_reset with --{prefix}reconfiguration_freq={reconfiguration_freq}: "
                                "ManiSkill cannot reconfigure a GPU simulation while it resets only some of its envs; "
                                f"pass --{prefix}reconfiguration_freq=0 or --no_{prefix}partial_reset")
    if sim_backend == "cpu":
        # Each CPU env beyond one is a simulator process of ~0.5 GB that steps on a core of its own: past a few per
        # core they only cost memory (the defaults, sized for a GPU, would start 520 of them).
        # the seeds' training envs are one vector env, their evaluation envs one each
        workers = sum(n * count for n, count in ((args.num_envs * args.num_seeds, 1),
                                                 (args.num_eval_envs, args.num_seeds)) if n > 1)
        if workers > CPU_WORKERS_PER_CORE * cores:
            # each of --num_seeds seeds has its own envs
            num_envs = max(1, 2 * cores // args.num_seeds)
            num_eval_envs = max(1, min(args.num_eval_envs, cores) // args.num_seeds)
            minibatches = max(d for d in range(1, args.num_minibatches + 1) if num_envs * args.num_steps % d == 0)
            raise UserError(f"--num_envs={args.num_envs} and --num_eval_envs={args.num_eval_envs} would start "
                            f"{workers} CPU simulator processes on {cores} cores (at most {CPU_WORKERS_PER_CORE} per "
                            "core); try "
                            f"--num_envs={num_envs} --num_eval_envs={num_eval_envs} --num_minibatches={minibatches} "
                            "(with --resume: a new run with --checkpoint), or a machine with CUDA for the GPU "
                            "simulation")
    return args, derived


# Copied from ppo.py
def refuse_bad_population(args: Args, num_iterations: int):
    if args.num_seeds < 4:
        raise UserError(f"--pbt_interval ranks a population of at least 4 members (--num_seeds), got {args.num_seeds}")
    first = args.pbt_warmup or args.pbt_interval
    if first >= num_iterations:
        raise UserError(f"the first ranking (--pbt_warmup, else --pbt_interval: iteration {first}) comes at or after "
                        f"the run's last iteration ({num_iterations}): lower it or raise --total_timesteps")
    if args.num_steps == args.num_seeds:  # MemberValues finds a tensor's seed dimension by its size
        raise UserError(f"--pbt_interval needs --num_steps other than --num_seeds ({args.num_seeds}), which a "
                        "rollout's first dimensions would not tell apart")
    for name, (low, high, _) in pbt_space(args).items():
        if name == "target_kl" and args.target_kl is None:
            raise UserError("--pbt_space searches target_kl, which --target_kl=None turns off: give it a value")
        if name == "learning_rate" and args.lr_schedule == "adaptive":
            raise UserError("--pbt_space searches learning_rate, which --lr_schedule=adaptive sets itself: use "
                            "--lr_schedule=constant or linear")
        if args.pbt_start == "flags" and not low <= getattr(args, name) <= high:
            raise UserError(f"--{name}={getattr(args, name)} lies outside --pbt_space's {low}:{high}, where members "
                            "start (--pbt_start=flags): give a value inside, or --pbt_start=space")


# Copied from ppo.py
def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------
# Environments: one torch interface, a row per agent, over ManiSkill's GPU/CPU vector envs, VMAS and PettingZoo
# ---------------------------------------------------------------------------------------------

VMAS_PREFIX = "vmas:"
PZ_PREFIX = "pz:"
# Env options that ippo.py sets from flags of its own.
RESERVED_ENV_KWARGS = {
    True: ("num_envs", "obs_mode", "sim_backend", "render_backend", "render_mode", "control_mode",
           "reconfiguration_freq", "human_render_camera_configs", "max_episode_steps"),
    False: ("scenario", "num_envs", "device", "seed", "max_steps", "terminated_truncated", "dict_spaces", "wrapper",
            "wrapper_kwargs", "grad_enabled"),
}


def find_env(env_id: str) -> tuple[bool, Optional[int]]:
    """Whether env_id is a ManiSkill task (else a VMAS scenario), and its time limit, before any env is built.

    "module:EnvId" imports module first, so a task that module registers with ManiSkill's @register_env is
    ManiSkill's. Whether a ManiSkill task is multi-agent shows only once it is built (AgentViews).
    """
    if env_id.startswith(VMAS_PREFIX):
        vmas_scenario(env_id)
        return False, VMAS_MAX_STEPS
    if env_id.startswith(PZ_PREFIX):
        pettingzoo_env_fn(env_id)
        return False, None  # the env's own (pettingzoo_time_limit, which builds one), or --max_episode_steps
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(f"cannot import module {module!r} of env id {env_id!r}: {e}") from e
    try:
        import mani_skill.envs  # noqa: F401  (registers the ManiSkill tasks)
        from mani_skill.utils.registration import REGISTERED_ENVS
    except ImportError as e:
        raise UserError(f"ManiSkill is not importable ({e}); pip install mani_skill") from e
    if name in REGISTERED_ENVS:
        return True, REGISTERED_ENVS[name].max_episode_steps
    if name in gym.registry:
        raise UserError(f"{env_id} is a single-agent Gymnasium env; train it with ppo.py. {TRAINER}.py trains "
                        f"ManiSkill multi-agent tasks and VMAS scenarios ({VMAS_PREFIX}<scenario>)")
    raise UserError(f"unknown env id {env_id!r}: neither a ManiSkill task, {VMAS_PREFIX}<scenario> nor "
                    f"{PZ_PREFIX}<module>")


def vmas_scenario(env_id: str):
    """A new scenario object for vmas:<scenario> (a file of vmas/scenarios) or vmas:<module>:<ScenarioClass>."""
    if importlib.util.find_spec("vmas") is None:
        raise UserError(f"{env_id} is a VMAS scenario and VMAS is not installed: pip install vmas")
    import vmas

    module, _, name = env_id[len(VMAS_PREFIX):].rpartition(":")
    if module:
        try:
            return getattr(importlib.import_module(module), name)()
        except (ImportError, AttributeError) as e:
            raise UserError(f"cannot load scenario class {name!r} from module {module!r}: {e}") from e
    available = vmas.scenarios + vmas.mpe_scenarios + vmas.debug_scenarios
    if name not in available:
        raise UserError(f"unknown VMAS scenario {name!r}; VMAS has {', '.join(available)}")
    # vmas.scenarios is a list of names; the module of that name loads them
    return importlib.import_module("vmas.scenarios").load(name + ".py").Scenario()


def pettingzoo_env_fn(env_id: str):
    """The constructor of a PettingZoo Parallel env: pz:<module> (its parallel_env, as PettingZoo's and mpe2's
    environments have) or pz:<module>:<function>."""
    if importlib.util.find_spec("pettingzoo") is None:
        raise UserError(f"{env_id} is a PettingZoo env and PettingZoo is not installed: pip install pettingzoo")
    module, _, name = env_id[len(PZ_PREFIX):].partition(":")
    try:
        return getattr(importlib.import_module(module), name or "parallel_env")
    except (ImportError, AttributeError) as e:
        raise UserError(f"cannot load {name or 'parallel_env'!r} from module {module!r} of {env_id}: {e}") from e


def parse_env_kwargs(pairs: tuple[str, ...], maniskill: bool) -> dict:
    """--env_kwargs KEY=VALUE ...: values are Python literals (3, 0.5, False, "x"); any other text is a string."""
    kwargs = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"--env_kwargs takes KEY=VALUE pairs, got {pair!r}")
        if key in RESERVED_ENV_KWARGS[maniskill]:
            raise UserError(f"--env_kwargs {pair}: {key} is set by {TRAINER}.py's own flags (--help lists them)")
        try:
            kwargs[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kwargs[key] = text
    return kwargs


# Copied from ppo.py
def refuse_asset_download(env_id: str):
    """ManiSkill asks with input() to download missing assets; a training run must never block or download."""
    from mani_skill.utils import download_asset

    def refuse(message: str):
        raise UserError(
            f"{env_id} needs ManiSkill assets that are not on this machine ({message.strip()}); "
            f"download them first: python -m mani_skill.utils.download_asset {env_id}"
        )

    download_asset.prompt_yes_no = refuse


# Copied from ppo.py
def in_recorded_rollout(elapsed_steps: int, num_steps: int, freq: int) -> bool:
    """ManiSkill RecordEpisode's trigger: record every step of every freq-th rollout."""
    return (elapsed_steps // num_steps) % freq == 0


def build_maniskill_env(env_id: str, num_envs: int, env_kwargs: dict, agent_obs: str, video_dir: Optional[str],
                        video_trigger, max_steps_per_video: Optional[int],
                        trajectory_path: Optional[Path] = None) -> gym.Env:
    import mani_skill.envs  # noqa: F401
    from mani_skill.utils.wrappers.flatten import FlattenActionSpaceWrapper
    from mani_skill.utils.wrappers.record import RecordEpisode

    refuse_asset_download(env_id)
    env = gym.make(env_id, num_envs=num_envs, **env_kwargs)
    env = AgentViews(env, env_id, agent_obs)
    # One Box: the agents' actions end to end, in the order of the Dict's keys (agent_views["agents"]).
    env = FlattenActionSpaceWrapper(env)
    if video_dir is not None or trajectory_path is not None:
        # RecordEpisode writes {output_dir}/{trajectory_name}.h5 and .json: an absolute name puts them anywhere.
        env = RecordEpisode(env, output_dir=video_dir or str(trajectory_path.parent), save_video=video_dir is not None,
                            save_trajectory=trajectory_path is not None,
                            trajectory_name=None if trajectory_path is None else str(trajectory_path.absolute()),
                            source_type="RL", source_desc=f"{TRAINER}.py policy",
                            save_video_trigger=video_trigger, max_steps_per_video=max_steps_per_video, video_fps=30,
                            info_on_video=False,  # crashes under numpy 2
                            avoid_overwriting_video=True)  # a resumed run numbers its videos from 0 again
    return env


def build_maniskill_cpu_worker_env(env_id: str, env_kwargs: dict, agent_obs: str, ignore_terminations: bool,
                                   video_dir: Optional[str], video_trigger,
                                   max_steps_per_video: Optional[int]) -> gym.Env:
    """Module-level so that AsyncVectorEnv can pickle it into forkserver workers."""
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    if multiprocessing.parent_process() is not None:
        # Ctrl-C, and SIGTERM from a scheduler, go to the whole process group; the learner saves a checkpoint,
        # so the workers must keep stepping (they exit when the learner closes their pipes).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # One env per worker: more torch threads only fight the other workers for the cores.
        torch.set_num_threads(1)
    env = build_maniskill_env(env_id, 1, env_kwargs, agent_obs, video_dir, video_trigger, max_steps_per_video)
    cpu_env = CPUGymWrapper(env, ignore_terminations=ignore_terminations, record_metrics=True)
    # CPUGymWrapper announces the task's Dict action space; it is handed the flattened actions.
    cpu_env.action_space = env.get_wrapper_attr("single_action_space")
    return cpu_env


class FirstEpisodeVideo:
    """VMAS's and PettingZoo's evaluation videos: the first episode of env 0 after each start() (its env's reset),
    a frame after each step, saved as video_dir/eval-episode-<k>.mp4 when it ends or at flush() (an evaluation that
    ends first). A resumed run numbers its videos on from those already there."""

    def __init__(self, video_dir: str, render, env_id: str):
        self.video_dir, self.render, self.frames = video_dir, render, None
        self.videos_written = len(list(Path(video_dir).glob("eval-episode-*.mp4")))
        try:  # rendering may need a GL context, which fails only at the first frame: find out now, not mid-run
            render()
        except Exception as e:
            raise UserError(f"{env_id} cannot render videos here ({type(e).__name__}: {e}); "
                            "pass --no_capture_video") from e

    def start(self):
        self.frames = [self.render()]

    def add(self, episode_ended: bool):
        if self.frames is not None:
            self.frames.append(self.render())
            if episode_ended:
                self.flush()

    def flush(self):
        if self.frames:
            from gymnasium.utils.save_video import save_video

            save_video(self.frames, self.video_dir, episode_trigger=lambda _: True, name_prefix="eval",
                       episode_index=self.videos_written, fps=30)
            self.videos_written += 1
        self.frames = None


def pettingzoo_worker(pipe, env_id: str, num_envs: int, max_steps: Optional[int], env_kwargs: dict, state: bool,
                      first_index: int):
    """A worker process's loop: its block of PettingZooEnvs, run by (method, arguments) from the pipe, each answered
    with (True, result) or (False, the error)."""
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group; the learner saves a checkpoint, then closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    envs = None
    try:
        envs = PettingZooEnvs(env_id, num_envs, max_steps, env_kwargs, state, first_index)
        pipe.send((True, None))
        while (message := pipe.recv())[0] != "close":
            method, arguments = message
            pipe.send((True, getattr(envs, method)(*arguments)))
    except UserError as e:
        pipe.send((False, e))
    except EOFError:  # the learner is gone
        pass
    except Exception as e:
        pipe.send((False, UserError(f"{env_id} failed in a worker process: {type(e).__name__}: {e}")))
    finally:
        if envs is not None:
            envs.close()


class PettingZooVectorEnv:
    """num_envs copies of a PettingZoo Parallel env (PettingZooEnvs: its flat observations, episode ends and seeds)
    as one torch vector env with VmasVectorEnv's conventions, but each agent's terminated and truncated its own; in
    this process, or split over num_workers worker processes stepping at once."""

    def __init__(self, env_id: str, num_envs: int, max_steps: Optional[int], env_kwargs: dict, state: bool,
                 num_workers: int = 0, video_dir: Optional[str] = None):
        self.num_envs, self.device, self.pipes, self.workers = num_envs, torch.device("cpu"), [], []
        self.local = PettingZooEnvs(env_id, num_envs if num_workers == 0 else 1, max_steps, env_kwargs, state,
                                    video_dir=video_dir)
        self.agent_views = self.local.agent_views
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (self.local.flat_dim,), np.float32)
        if num_workers == 0:
            return
        self.local.close()  # it only told the spaces (and showed the env builds): the workers step the envs
        context = multiprocessing.get_context("forkserver")
        self.blocks = np.array_split(np.arange(num_envs), num_workers)
        for block in self.blocks:
            pipe, worker_pipe = context.Pipe()
            # int(): PettingZoo envs (MPE's) refuse numpy integers as seeds
            worker = context.Process(target=pettingzoo_worker, daemon=True, args=(
                worker_pipe, env_id, len(block), max_steps, env_kwargs, state, int(block[0])))
            worker.start()
            worker_pipe.close()
            self.pipes.append(pipe)
            self.workers.append(worker)
        self.in_workers(None)  # each says it built its envs, or why not

    def in_workers(self, method: Optional[str], arguments: Optional[list[tuple]] = None) -> list:
        """Every worker's result of method (None: its first message), each called with its own arguments."""
        for pipe, worker_arguments in zip(self.pipes, arguments or []):
            pipe.send((method, worker_arguments))
        replies = [pipe.recv() for pipe in self.pipes]
        for ok, result in replies:
            if not ok:
                raise result
        return [result for _, result in replies]

    def reset(self, seed: Optional[int] = None):
        if not self.pipes:
            obs, alive, masks = self.local.reset(seed)
        else:
            obs, alive, masks = (np.concatenate(part)
                                 for part in zip(*self.in_workers("reset", [(seed,)] * len(self.pipes))))
        return torch.from_numpy(obs), self.info(alive, masks)

    def info(self, alive: np.ndarray, masks: np.ndarray) -> dict:
        return {"alive": torch.from_numpy(alive), **({"action_mask": torch.from_numpy(masks)} if masks.size else {})}

    def step(self, action: torch.Tensor):
        actions = action.reshape(self.num_envs, len(self.agent_views["agents"]), -1).numpy()
        if self.pipes:
            parts = self.in_workers("step", [(actions[block],) for block in self.blocks])
            obs, rewards, terminated, truncated, final_obs, alive, masks = (np.concatenate(part)
                                                                           for part in zip(*parts))
        else:
            obs, rewards, terminated, truncated, final_obs, alive, masks = self.local.step(actions)
        info = self.info(alive, masks)
        if (terminated | truncated).any():
            info.update(final_observation=torch.from_numpy(final_obs), final_info={})
        return (torch.from_numpy(obs), torch.from_numpy(rewards), torch.from_numpy(terminated),
                torch.from_numpy(truncated), info)

    def flush_video(self):
        self.local.video.flush()

    def close(self):
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("close", ()))
        for worker in self.workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
        if not self.pipes:
            self.local.close()


def check_agent_spaces(env_id: str, obs_spaces: list, action_spaces: list, alike: bool):
    """VMAS's and PettingZoo's agents: flat observations; VMAS's of the same spaces (PettingZoo's may differ)."""
    if not all(isinstance(space, gym.spaces.Box) and len(space.shape) == 1 for space in obs_spaces):
        raise UserError(f"{env_id}'s observations ({obs_spaces[0]}) are not flat Boxes; {TRAINER}.py needs them flat "
                        "(or, with action masks, a Dict of an 'observation' Box and an 'action_mask')")
    if alike and (any(space != obs_spaces[0] for space in obs_spaces)
                  or any(space != action_spaces[0] for space in action_spaces)):
        raise UserError(f"{env_id}'s agents have different observation or action spaces ({obs_spaces}, "
                        f"{action_spaces}); {TRAINER}.py stacks VMAS agents' networks and needs them equal")


def gymnasium_space(space):
    """VMAS builds its spaces with the older gym package."""
    if type(space).__name__ == "Box":
        return gym.spaces.Box(space.low, space.high, space.shape, space.dtype)
    if type(space).__name__ == "Discrete":
        return gym.spaces.Discrete(int(space.n), start=int(getattr(space, "start", 0)))
    if type(space).__name__ == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(np.asarray(space.nvec))
    return space


# Copied from ppo.py
def space_to_dict(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "shape": list(space.shape), "nvec": space.nvec.tolist(),
                "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    return {"type": "Box", "shape": list(space.shape), "low": np.asarray(space.low, dtype=np.float64).ravel().tolist(),
            "high": np.asarray(space.high, dtype=np.float64).ravel().tolist()}


class TorchVecEnv:
    """Tensors in, tensors out, on the learner's device, whatever runs the simulation; a row per agent.

    step(action (num_envs, num_agents, ...)) returns (next_obs, reward, terminated, truncated, final_obs, finished):
    next_obs (num_envs, num_agents, obs_dim) is already reset where an episode ended; reward, terminated and
    truncated are (num_envs, num_agents), a ManiSkill task's team reward going to every agent, and ManiSkill's and
    VMAS's episode ends to every agent of the env; final_obs is the true last observation of every agent of an env in
    which some agent's episode ended in this step (next_obs elsewhere), or None when none did; finished maps metric
    names (return: the mean over the episode's agents of their returns, <agent>/return, episode_len, and ManiSkill's
    success_once, success_at_end, fail_once, fail_at_end) to one value per env whose episode ended in this step, or
    is None when none did.

    A PettingZoo agent's episode may end before its env's, which ends once all its agents' have, and an episode may
    start without some of the env's possible agents: alive (num_envs, num_agents) marks the agents that act in the
    next step (the env's info["alive"] where it gives one, PettingZoo's env.agents), ended (num_envs,) the envs whose
    episode ended in the last one. An agent that left, or is absent, observes zeros, earns nothing and has no return
    in finished (NaN) until its env's next episode.

    The env gives one flat observation per env; agent_views["obs_index"][i] lists agent i's entries of it (its
    observation, padded to the widest agent's, and the env's state where the critic reads it: the actor reads the
    first actor_dim entries, the agent's own observation those of agent_obs_dims[i]), agent_views["state_index"]
    the global state's entries of all agents' observations laid end to end, and agent_views["action_spaces"] each
    agent's action space. Actions are the joint action space's (joint_action_space), each agent's first entries
    its own. action_mask: the actions that the last observation allows each agent (num_envs, num_agents, logits),
    from the env's info["action_mask"] (PettingZooEnvs': its agents' Dict observations'), or None where it gives none.
    """

    EPISODE_KEYS = ("success_once", "success_at_end", "fail_once", "fail_at_end")

    def __init__(self, env, device: torch.device, torch_native: bool, agent_views: dict, video_recorder=None):
        self.env = env
        self.video_recorder = video_recorder
        self.device = device
        self.torch_native = torch_native
        self.sim_device = torch.device(env.device) if torch_native else torch.device("cpu")
        self.random_states: Optional[list[torch.Tensor]] = None
        self.num_envs = env.num_envs
        self.batch_shape = (self.num_envs,)  # of the tensors in and out
        self.agents = list(agent_views["agents"])
        self.num_agents = len(self.agents)
        self.obs_index = torch.as_tensor(agent_views["obs_index"], dtype=torch.long, device=device)
        self.state_index = torch.as_tensor(agent_views["state_index"], dtype=torch.long, device=device)
        self.flat_obs_dim = int(np.prod(env.single_observation_space.shape))
        self.obs_dim = self.obs_index.shape[1]
        self.actor_dim = agent_views.get("actor_dim", self.obs_dim)
        self.agent_obs_dims = agent_views.get("agent_obs_dims", [self.obs_dim] * self.num_agents)
        self.critic_input = agent_views.get("critic_input", "all_observations")
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.action_spaces = list(agent_views["action_spaces"])
        kinds = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
        for space in self.action_spaces:
            one_dimensional = len(space.shape) == (0 if isinstance(space, gym.spaces.Discrete) else 1)
            if not isinstance(space, kinds) or not one_dimensional:
                raise UserError(f"action space {space} is not supported; {TRAINER}.py handles Box, Discrete, "
                                "MultiDiscrete and MultiBinary actions of one dimension")
        if len({type(space) for space in self.action_spaces}) > 1 or (
                isinstance(self.action_spaces[0], gym.spaces.MultiDiscrete)
                and any(space != self.action_spaces[0] for space in self.action_spaces)):
            raise UserError(f"the agents act in {self.action_spaces}; {TRAINER}.py's agents may differ in the size of "
                            "their actions, but all of one kind (and MultiDiscrete ones alike)")
        self.joint_action_space = joint_action_space([space_to_dict(space) for space in self.action_spaces])
        nvec = self.joint_action_space.get("nvec", [self.joint_action_space.get("n", 0)])
        self.mask_offsets = torch.as_tensor(np.cumsum([0, *nvec[:-1]]), device=device)  # each dimension's in a mask
        # Each agent's row of its action's bounds or starts, padded to the joint space's width
        width = None if self.joint_action_space["type"] == "Discrete" else self.joint_action_space["shape"][0]

        def rows(values) -> torch.Tensor:
            values = [np.ravel(np.asarray(v, dtype=np.float64)) for v in values]
            if width is not None:
                values = [np.pad(v, (0, width - len(v))) for v in values]
            return torch.as_tensor(np.stack(values), device=device)

        if isinstance(self.action_spaces[0], gym.spaces.Box):
            self.action_low = rows([space.low for space in self.action_spaces]).float()
            self.action_high = rows([space.high for space in self.action_spaces]).float()
        else:  # the agent's actions count from 0 in each dimension, the env's from start
            starts = rows([getattr(space, "start", np.zeros(space.shape)) for space in self.action_spaces]).long()
            self.action_start = starts[:, 0] if width is None else starts
        self.episode_return = torch.zeros((self.num_envs, self.num_agents), dtype=torch.float64, device=device)
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.long, device=device)
        self.alive = torch.ones((self.num_envs, self.num_agents), dtype=torch.bool, device=device)
        self.in_episode = self.alive.clone()  # the agents of each env's current episode
        self.ended = torch.zeros(self.num_envs, dtype=torch.bool, device=device)
        self.action_mask: Optional[torch.Tensor] = None

    def _obs(self, obs) -> torch.Tensor:
        return self._to_device(obs, torch.float32, (-1, self.flat_obs_dim))[:, self.obs_index]

    # Copied from ppo.py
    def _to_device(self, x, dtype: torch.dtype, shape: tuple = (-1,)) -> torch.Tensor:
        return torch.as_tensor(x).to(self.device, dtype).reshape(shape)

    def reset(self, seed: Optional[int | list[int]] = None) -> torch.Tensor:
        obs, info = self.env.reset(seed=seed)
        self.episode_return.zero_()
        self.episode_length.zero_()
        self.alive = self._alive(info, torch.ones_like(self.alive))
        self.in_episode = self.alive.clone()
        self.action_mask = self.read_action_mask(info)
        return self._obs(obs)

    def _alive(self, info: dict, otherwise: torch.Tensor) -> torch.Tensor:
        return self._to_device(info["alive"], torch.bool, self.alive.shape) if "alive" in info else otherwise

    def read_action_mask(self, info: dict) -> Optional[torch.Tensor]:
        if "action_mask" not in info:
            return None
        return self._to_device(info["action_mask"], torch.bool, (self.num_envs, self.num_agents, -1))

    def step(self, action: torch.Tensor):
        if self.action_mask is not None:
            self.check_allowed(action)
        action = env_action(self, action).flatten(1)
        action = action.to(self.env.device) if self.torch_native else action.cpu().numpy()
        obs, reward, terminated, truncated, info = self.env.step(action)
        next_obs = self._obs(obs)
        reward, terminated, truncated = (self._to_device(x, dtype, (self.num_envs, -1)).expand(-1, self.num_agents)
                                         for x, dtype in ((reward, torch.float32), (terminated, torch.bool),
                                                          (truncated, torch.bool)))
        agent_done = terminated | truncated
        self.ended = (agent_done | ~self.alive).all(1)
        self.alive = self._alive(info, self.ended[:, None] | (self.alive & ~agent_done))
        self.episode_return += reward
        self.episode_length += 1

        final_obs, finished = None, None
        if "final_info" in info:  # present only when some agent's episode ended
            if self.torch_native:  # every row of such an env: each row holds the state, or all agents' observations
                env_done = agent_done.any(1)[:, None, None]
                final_obs = torch.where(env_done, self._obs(info["final_observation"]), next_obs)
            else:
                ended = info["_final_obs"]
                final_obs = next_obs.clone()
                final_obs[torch.as_tensor(ended, device=self.device)] = self._obs(np.stack(info["final_obs"][ended]))
        done = self.ended
        if final_obs is not None and done.any():  # the indexing below waits for the GPU anyway
            episode_return = self.episode_return[done].float().masked_fill(~self.in_episode[done], float("nan"))
            finished = {"return": episode_return.nanmean(1), "episode_len": self.episode_length[done].float()}
            finished.update({f"{name}/return": episode_return[:, i] for i, name in enumerate(self.agents)})
            episode = info["final_info"].get("episode", {})
            for key in self.EPISODE_KEYS:
                if key in episode:
                    finished[key] = self._to_device(episode[key], torch.float32)[done]
            self.episode_return = torch.where(done[:, None], 0.0, self.episode_return)
            self.episode_length = torch.where(done, 0, self.episode_length)
        self.in_episode = torch.where(self.ended[:, None], self.alive, self.in_episode)
        self.action_mask = self.read_action_mask(info)
        return next_obs, reward, terminated, truncated, final_obs, finished

    def check_allowed(self, action: torch.Tensor):
        """Every agent's action (counted from 0) is one its mask allows: a copy whose policy drops the mask stops with
        one error line, not a run that trains on forbidden actions."""
        taken = action.reshape(self.num_envs, self.num_agents, -1).long() + self.mask_offsets
        allowed = self.action_mask.gather(-1, taken).all(-1)
        if not allowed.all():
            env, agent = (int(i) for i in (~allowed).nonzero()[0])
            raise UserError(f"agent {self.agents[agent]} took action {action[env, agent].tolist()} (counted from 0) in "
                            f"env {env}, which its action mask forbids: get_action_and_value() and get_action() give "
                            "the mask to the distribution (DiscreteActions; docs/ppo.md)")

    def flush_video(self):
        """ManiSkill's RecordEpisode over many envs saves a video every max_steps_per_video steps only, and VMAS's
        recorder at the end of env 0's episode; an evaluation that ended early saves the rest of its video now."""
        if self.video_recorder is not None:
            self.video_recorder.flush_video()

    # Copied from ppo.py
    def close(self):
        self.env.close()


# A VMAS scenario's episodes end after this many steps (unless --max_episode_steps): VMAS sets no time limit itself.
VMAS_MAX_STEPS = 100


def pettingzoo_time_limit(env_id: str, env_kwargs: dict) -> tuple[Optional[int], Optional[str]]:
    """The episode length a PettingZoo env states, and where: max_cycles (MPE's, SISL's, Butterfly's) on the env or
    its unwrapped env, or spec.max_episode_steps; (None, None) where it states none."""
    try:
        env = pettingzoo_env_fn(env_id)(**env_kwargs)
    except TypeError as e:
        raise UserError(f"cannot make {env_id} with --env_kwargs {env_kwargs}: {e}") from e
    try:
        for holder, name in ((env, "the env's"), (getattr(env, "unwrapped", env), "the unwrapped env's")):
            if isinstance(getattr(holder, "max_cycles", None), int):
                return holder.max_cycles, f"{name} max_cycles"
        steps = getattr(getattr(env, "spec", None), "max_episode_steps", None)
        return (steps, "the env's spec.max_episode_steps") if isinstance(steps, int) else (None, None)
    finally:
        env.close()


def state_dict_leaves(state: dict, path: tuple[str, ...] = ()):
    for key, value in state.items():
        if isinstance(value, dict):
            yield from state_dict_leaves(value, path + (key,))
        else:
            yield path + (key,), value


class VmasVectorEnv:
    """A VMAS scenario as a torch vector env with ManiSkillVectorEnv's conventions: observations are the agents'
    observations end to end (num_envs, num_agents * obs_dim), rewards one per agent (num_envs, num_agents),
    terminated and truncated apart; an env whose episode ended is reset at once (alone), its last observation in
    info["final_observation"]. With a video_dir, the first episode of env 0 after each reset() is recorded.
    """

    def __init__(self, env_id: str, num_envs: int, device: torch.device, max_steps: int, env_kwargs: dict,
                 video_dir: Optional[str]):
        import vmas

        try:
            with warnings.catch_warnings():
                # VMAS only warns about options a scenario does not know: a typo would go unnoticed.
                warnings.filterwarnings("error", message=".*passed but not used by the scenario")
                self.env = vmas.make_env(vmas_scenario(env_id), num_envs=num_envs, device=device, max_steps=max_steps,
                                         terminated_truncated=True, **env_kwargs)
        except UserWarning as e:
            raise UserError(f"{env_id} does not take these --env_kwargs: {e}") from e
        except (TypeError, AssertionError, ValueError) as e:
            raise UserError(f"cannot make {env_id} with --env_kwargs {env_kwargs}: {e or type(e).__name__}") from e
        self.random_state = list(type(self.env).vmas_random_state)
        obs_spaces = [gymnasium_space(space) for space in self.env.observation_space]
        action_spaces = [gymnasium_space(space) for space in self.env.action_space]
        check_agent_spaces(env_id, obs_spaces, action_spaces, alike=True)
        self.num_envs, self.device, self.num_agents = num_envs, device, len(obs_spaces)
        width = self.num_agents * obs_spaces[0].shape[0]
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)
        self.agent_views = {"agents": [agent.name for agent in self.env.agents],
                            "obs_index": np.arange(width).reshape(self.num_agents, -1).tolist(),
                            "state_index": list(range(width)), "action_spaces": action_spaces}
        self.cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.video = None if video_dir is None else FirstEpisodeVideo(video_dir, self.render, env_id)

    def in_own_stream(self, method, *args, **kwargs):
        """VMAS draws every env's random numbers from one stream, a class attribute: each vector env swaps in a
        stream of its own, so that evaluation resets leave training's episode starts as they were."""
        shared = type(self.env).vmas_random_state
        saved, shared[:] = list(shared), self.random_state
        # VMAS keeps only the CPU streams apart; on CUDA its draws (and env.seed's manual_seed) would hit the
        # learner's CUDA stream, so the env's own CUDA state is swapped in as well.
        try:
            if self.cuda_state is None:  # local_seed already keeps the CPU streams apart
                return method(*args, **kwargs)
            with torch.random.fork_rng(devices=[self.device]):
                torch.cuda.set_rng_state(self.cuda_state, self.device)
                result = method(*args, **kwargs)
                self.cuda_state = torch.cuda.get_rng_state(self.device)
                return result
        finally:
            self.random_state, shared[:] = list(shared), saved

    def reset(self, seed: Optional[int] = None):
        if seed is not None:
            self.in_own_stream(self.env.seed, seed)
        obs = self.in_own_stream(self.env.reset)
        if self.video is not None:
            self.video.start()
        return torch.cat(obs, dim=1), {}

    def step(self, action: torch.Tensor):
        obs, rewards, terminated, truncated, _ = self.in_own_stream(
            self.env.step, list(action.reshape(self.num_envs, self.num_agents, -1).unbind(1)))
        obs, reward = torch.cat(obs, dim=1), torch.stack(rewards, dim=1)
        done = terminated | truncated
        if self.video is not None:
            self.video.add(bool(done[0]))
        info = {}
        if done.any():
            info = {"final_observation": obs, "final_info": {}}
            if done.all():
                reset_obs = self.in_own_stream(self.env.reset)
            else:
                for index in done.nonzero().flatten().tolist():
                    self.in_own_stream(self.env.reset_at, index, return_observations=False)
                reset_obs = self.in_own_stream(self.env.get_from_scenario, get_observations=True, get_rewards=False,
                                               get_infos=False, get_dones=False)[0]
            obs = torch.where(done[:, None], torch.cat(reset_obs, dim=1), obs)
        return obs, reward, terminated, truncated, info

    def render(self) -> np.ndarray:
        return self.env.render(mode="rgb_array", env_index=0)

    def flush_video(self):
        self.video.flush()

    def close(self):
        """VMAS holds nothing to release."""


# Copied from ppo.py
def render_without_a_display():
    """Videos render off screen (rgb_array). Without a display, SDL (pygame's, which Gymnasium's classic-control and
    Box2D envs and PettingZoo's MPE draw with) would look for one and print "error: XDG_RUNTIME_DIR is invalid or
    not set", a line that reads as the trainer's own: its dummy driver renders the same frames and prints nothing."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


class PettingZooEnvs:
    """Copies of a PettingZoo Parallel env stepped one after another, numpy in and out, in this process or a worker's.
    Env k is reset with seed + first_index + k by reset(seed); it runs until all its agents' episodes have ended
    (each agent terminated or truncated by its own flags, all that remain truncated after max_steps steps), then
    starts the next. A flat observation holds each agent's observation, padded with zeros to the widest (an agent
    that left: zeros throughout), then the env's state() where the critic reads it. An agent whose observation is a
    Dict {"observation": ..., "action_mask": ...} (PettingZoo's convention) observes the first and acts as the second
    allows (action_masks()). With a video_dir, env 0 renders (render_mode="rgb_array") the evaluation videos."""

    def __init__(self, env_id: str, num_envs: int, max_steps: Optional[int], env_kwargs: dict, state: bool,
                 first_index: int = 0, video_dir: Optional[str] = None):
        make = pettingzoo_env_fn(env_id)
        if video_dir:
            render_without_a_display()
        try:
            self.envs = [make(**env_kwargs, **({"render_mode": "rgb_array"} if video_dir and k == 0 else {}))
                         for k in range(num_envs)]
        except TypeError as e:
            raise UserError(f"cannot make {env_id} with --env_kwargs {env_kwargs}"
                            f"{' and render_mode=rgb_array for videos' if video_dir else ''}: {e}") from e
        env, self.env_id = self.envs[0], env_id
        self.agents, self.max_steps, self.first_index = list(env.possible_agents), max_steps, first_index
        obs_spaces = [env.observation_space(agent) for agent in self.agents]
        self.action_spaces = [env.action_space(agent) for agent in self.agents]
        self.masked = [isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"observation", "action_mask"}
                       for space in obs_spaces]
        obs_spaces = [space["observation"] if masked else space for space, masked in zip(obs_spaces, self.masked)]
        check_agent_spaces(env_id, obs_spaces, self.action_spaces, alike=False)
        if any(masked and not isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
               for space, masked in zip(self.action_spaces, self.masked)):
            raise UserError(f"{env_id}'s agents observe action masks and act in {self.action_spaces}: {TRAINER}.py "
                            "masks Discrete and MultiDiscrete actions")
        # each agent's logits per dimension, and the width of every agent's mask (the joint action space's logits)
        self.nvecs = [np.atleast_1d(getattr(space, "nvec", getattr(space, "n", 0))).tolist()
                      for space in self.action_spaces]
        self.mask_width = max(sum(nvec) for nvec in self.nvecs) if any(self.masked) else 0
        state_space = getattr(env, "state_space", None) if state else None
        if state_space is not None and not (isinstance(state_space, gym.spaces.Box) and len(state_space.shape) == 1):
            raise UserError(f"{env_id}'s state() ({state_space}) is not a flat Box; {TRAINER}.py's critic needs it "
                            "flat: drop --centralized_critic")
        self.obs_dims = [space.shape[0] for space in obs_spaces]
        self.width, num_agents = max(self.obs_dims), len(self.agents)
        self.state_dim = 0 if state_space is None else state_space.shape[0]
        # the entries of its action an agent takes: a Discrete action's one, or its own first of the joint space's
        self.action_sizes = [None if isinstance(space, gym.spaces.Discrete) else space.shape[0]
                             for space in self.action_spaces]
        self.steps = np.zeros(num_envs, dtype=np.int64)
        agents_end = num_agents * self.width
        state_columns = list(range(agents_end, agents_end + self.state_dim))
        if self.state_dim:
            state_index = list(range(self.width, self.width + self.state_dim))  # in the first agent's row
        else:  # every agent's own entries, without the padding
            state_index = [i * self.width + j for i, dim in enumerate(self.obs_dims) for j in range(dim)]
        self.agent_views = {"agents": self.agents, "action_spaces": self.action_spaces,
                            "obs_index": [list(range(i * self.width, (i + 1) * self.width)) + state_columns
                                          for i in range(num_agents)],
                            "state_index": state_index, "actor_dim": self.width, "agent_obs_dims": self.obs_dims,
                            "critic_input": "state()" if self.state_dim else "all_observations"}
        self.flat_dim = agents_end + self.state_dim
        self.video = None
        if video_dir is not None:
            env.reset()  # PettingZoo envs render once reset; the evaluation's reset seeds it anew
            self.video = FirstEpisodeVideo(video_dir, env.render, env_id)

    def observe(self, env, obs: dict) -> np.ndarray:
        flat = np.zeros(self.flat_dim, dtype=np.float32)
        for i, agent in enumerate(self.agents):
            if agent in obs:
                own = obs[agent]["observation"] if self.masked[i] else obs[agent]
                flat[i * self.width:i * self.width + self.obs_dims[i]] = np.ravel(own)
        if self.state_dim:
            flat[len(self.agents) * self.width:] = np.ravel(env.state())
        return flat

    def action_masks(self, k: int, obs: dict) -> np.ndarray:
        """What each agent of env k may do next (num_agents, mask_width), its mask padded with False; an agent without
        one (absent, or unmasked) may do anything. A mask that allows nothing (in a dimension) is an error."""
        masks = np.ones((len(self.agents), self.mask_width), dtype=bool)
        for i, agent in enumerate(self.agents):
            if self.masked[i] and agent in obs:
                # a MultiDiscrete's an array, or one per dimension
                mask, nvec = np.hstack(obs[agent]["action_mask"]).astype(bool), self.nvecs[i]
                if len(mask) != sum(nvec):
                    raise UserError(f"{self.env_id}'s agent {agent} observes an action mask of {len(mask)} entries, "
                                    f"and its actions ({self.action_spaces[i]}) take {sum(nvec)}")
                if not all(part.any() for part in np.split(mask, np.cumsum(nvec)[:-1])):
                    raise UserError(f"{self.env_id}'s action mask allows agent {agent} no action in env "
                                    f"{self.first_index + k} after step {self.steps[k]} of its episode: every state "
                                    "allows one")
                masks[i] = False
                masks[i, :len(mask)] = mask
        return masks

    def reset(self, seed: Optional[int] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The first observations, which agents take part (num_envs, num_agents): those of env.agents, and what each
        may do (action_masks())."""
        self.steps[:] = 0
        first = [env.reset(seed=None if seed is None else seed + self.first_index + k)[0]
                 for k, env in enumerate(self.envs)]
        if self.video is not None:
            self.video.start()
        return (np.stack([self.observe(env, obs) for env, obs in zip(self.envs, first)]),
                np.stack([self.present(env) for env in self.envs]),
                np.stack([self.action_masks(k, obs) for k, obs in enumerate(first)]))

    def present(self, env) -> np.ndarray:
        if not env.agents:
            raise UserError(f"{self.env_id} began an episode with no agents (env.agents is empty after reset())")
        return np.array([agent in env.agents for agent in self.agents])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """actions (num_envs, num_agents, joint width); returns the next observations (reset where an env's episode
        ended), rewards, terminated and truncated (num_envs, num_agents), the final observations, and the agents
        that act next (num_envs, num_agents) and what they may do (action_masks())."""
        shape = (len(self.envs), len(self.agents))
        rewards, terminated, truncated = np.zeros(shape, np.float32), np.zeros(shape, bool), np.zeros(shape, bool)
        obs, final_obs = (np.zeros((len(self.envs), self.flat_dim), np.float32) for _ in range(2))
        alive, masks = np.zeros(shape, bool), np.zeros((*shape, self.mask_width), bool)
        self.steps += 1
        for k, env in enumerate(self.envs):
            live = list(env.agents)
            agent_obs, reward, agent_terminated, agent_truncated, _ = env.step(
                {agent: actions[k, i, 0] if size is None else actions[k, i, :size]
                 for i, (agent, size) in enumerate(zip(self.agents, self.action_sizes)) if agent in live})
            if any(agent not in live for agent in env.agents):
                raise UserError(f"in {self.env_id}, agents joined a running episode ({env.agents} after {live}); "
                                f"{TRAINER}.py's agents all start an episode together")
            time_up = self.steps[k] == self.max_steps
            for i, agent in enumerate(self.agents):
                if agent in live:
                    rewards[k, i] = reward.get(agent, 0.0)
                    terminated[k, i] = agent_terminated.get(agent, False)
                    truncated[k, i] = not terminated[k, i] and (agent_truncated.get(agent, False) or time_up)
            final_obs[k] = self.observe(env, agent_obs)
            if k == 0 and self.video is not None:
                self.video.add(not env.agents or time_up)
            if not env.agents or time_up:
                next_obs = env.reset()[0]
                self.steps[k] = 0
                alive[k] = self.present(env)
            else:
                next_obs = {agent: agent_obs[agent] for agent in env.agents}
                alive[k] = self.present(env) & ~terminated[k] & ~truncated[k]
            obs[k], masks[k] = self.observe(env, next_obs), self.action_masks(k, next_obs)
        return obs, rewards, terminated, truncated, final_obs, alive, masks

    def close(self):
        for env in self.envs:
            env.close()


def make_envs(args: Args, maniskill: bool, device: torch.device, *, evaluation: bool, run_dir: Path,
              num_eval_steps: int, trajectory_path: Optional[Path] = None) -> TorchVecEnv:
    """The run's envs (make_run_envs). Under --num_seeds, the seeds' training envs are blocks of one vector env
    (SeedBlocks; VMAS's and PettingZoo's an env for each seed, EnvBlocks), and each seed evaluates in envs of its own,
    with its videos in its run directory (EachSeed)."""
    if args.num_seeds == 1:
        return make_run_envs(args, maniskill, device, evaluation=evaluation, run_dir=run_dir,
                             num_eval_steps=num_eval_steps, trajectory_path=trajectory_path)
    if evaluation:
        return EachSeed(make_run_envs(seed_args, maniskill, device, evaluation=True, run_dir=seed_setup_dir,
                                      num_eval_steps=num_eval_steps)
                        for seed_args, seed_setup_dir in seed_dirs(args, run_dir))
    envs = make_run_envs(dataclasses.replace(args, num_envs=args.num_envs * args.num_seeds), maniskill, device,
                         evaluation=False, run_dir=run_dir, num_eval_steps=num_eval_steps)
    in_process = not maniskill and not args.async_envs  # a worker process's draws are its own
    return AgentSeedBlocks(envs, args.num_seeds, args.env_id,
                           watch_steps=GLOBAL_DRAW_WATCH_STEPS if in_process else 0)


def make_run_envs(args: Args, maniskill: bool, device: torch.device, *, evaluation: bool, run_dir: Path,
                  num_eval_steps: int, trajectory_path: Optional[Path] = None) -> TorchVecEnv:
    """trajectory_path: ManiSkill only; record every episode there (.h5 and .json) with RecordEpisode."""
    num_envs = args.num_eval_envs if evaluation else args.num_envs
    video_dir, video_trigger, max_steps_per_video = None, None, None
    if args.capture_video and evaluation:
        video_dir = str(run_dir / "videos")
        max_steps_per_video = num_eval_steps
    elif args.capture_video and args.save_train_video_freq is not None:
        video_dir = str(run_dir / "train_videos")
        video_trigger = functools.partial(in_recorded_rollout, num_steps=args.num_steps,
                                          freq=args.save_train_video_freq)
        max_steps_per_video = args.num_steps
    env_kwargs = parse_env_kwargs(args.env_kwargs, maniskill)
    if maniskill:
        return make_maniskill_envs(args, num_envs, device, evaluation, env_kwargs, video_dir, video_trigger,
                                   max_steps_per_video, trajectory_path)
    if trajectory_path is not None:
        raise UserError("trajectories are recorded by ManiSkill's RecordEpisode: VMAS and PettingZoo have none")

    def block(block_envs: int):
        if args.env_id.startswith(PZ_PREFIX):
            cores = max(1, usable_cores() // args.num_seeds)
            num_workers = min(block_envs, cores) if args.async_envs and not evaluation else 0
            return PettingZooVectorEnv(args.env_id, block_envs, args.max_episode_steps, env_kwargs,
                                       args.centralized_critic, num_workers, video_dir)
        return VmasVectorEnv(args.env_id, block_envs, device, args.max_episode_steps, env_kwargs, video_dir)
    blocks = [block(num_envs // args.num_seeds) for _ in range(args.num_seeds)]
    env = blocks[0] if len(blocks) == 1 else EnvBlocks(blocks)
    return TorchVecEnv(env, device, torch_native=True, agent_views=env.agent_views,
                       video_recorder=env if video_dir is not None else None)


class EnvBlocks:
    """--num_seeds on VMAS and PettingZoo: each seed's block of envs is an env of its own, as a run of that seed alone
    builds it (VMAS seeds its whole batch with one seed, PettingZoo env k with seed + k); tensors in and out are
    concatenated, and a step in which some block's episodes ended gives every block's final observations (a block's
    observations where none of its ended)."""

    def __init__(self, blocks: list):
        self.blocks, first = blocks, blocks[0]
        self.num_envs = sum(block.num_envs for block in blocks)
        self.device, self.agent_views = first.device, first.agent_views
        self.single_observation_space = first.single_observation_space

    def reset(self, seed: Optional[list[int]] = None):
        # SeedBlocks gives each env's seed, and a block's first is the seed its run alone resets with
        seeds = [None] * len(self.blocks) if seed is None else seed[::self.blocks[0].num_envs]
        resets = [block.reset(seed=block_seed) for block, block_seed in zip(self.blocks, seeds)]
        return torch.cat([obs for obs, _ in resets]), self.info([info for _, info in resets], [])

    def step(self, action: torch.Tensor):
        steps = [block.step(block_action) for block, block_action in zip(self.blocks, action.chunk(len(self.blocks)))]
        obs, reward, terminated, truncated = (torch.cat(x) for x in zip(*(step[:4] for step in steps)))
        return obs, reward, terminated, truncated, self.info([step[4] for step in steps], [step[0] for step in steps])

    @staticmethod
    def info(infos: list[dict], observations: list[torch.Tensor]) -> dict:
        info = {key: torch.cat([block_info[key] for block_info in infos]) for key in ("alive", "action_mask")
                if key in infos[0]}
        if any("final_info" in block_info for block_info in infos):
            info.update(final_info={}, final_observation=torch.cat(
                [block_info.get("final_observation", obs) for block_info, obs in zip(infos, observations)]))
        return info

    # Copied from ppo.py
    def close(self):
        for block in self.blocks:
            block.close()


def make_maniskill_envs(args: Args, num_envs: int, device: torch.device, evaluation: bool, user_env_kwargs: dict,
                        video_dir: Optional[str], video_trigger, max_steps_per_video: Optional[int],
                        trajectory_path: Optional[Path]) -> TorchVecEnv:
    """ManiSkill's GPU simulation runs all envs in one process and has branches of its own for num_envs > 1; each
    is handled here or refused in validate() (docs/bootstrap.md, "ManiSkill with many envs"):
    - RecordEpisode needs max_steps_per_video (it cannot flush a video at one env's reset): the evaluation's length
      or the rollout's; evaluate() flushes the rest of an evaluation that ends early.
    - Videos tile every env into one frame, so the camera shrinks with the number of envs.
    - ManiSkillVectorEnv cannot reconfigure on a partial reset: refused in validate().
    - reset(seed=s) gives env 0 seed s and the others seeds drawn from RandomState(s); autoresets are unseeded.
    """
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    env_kwargs, ignore_terminations = maniskill_env_kwargs(args, num_envs, device, evaluation, user_env_kwargs)
    gpu = env_kwargs["sim_backend"] != "physx_cpu"
    if video_dir is not None:
        env_kwargs["render_mode"] = "rgb_array"
    camera = dict(shader_pack="default") if evaluation else {}
    if video_dir is not None and gpu and num_envs > 1:
        # RecordEpisode tiles every env into one frame of int(sqrt(num_envs)) rows: each env's camera shrinks so that
        # the frame stays at most about 1024 pixels wide, and a video's memory bounded, whatever the number of envs
        side = max(16, min(512, 1024 // math.ceil(num_envs / int(math.sqrt(num_envs)))))
        camera.update(width=side, height=side)
    if camera:
        env_kwargs["human_render_camera_configs"] = camera
    try:
        # maniskill_env_kwargs asks for enhanced_determinism where the envs run in CPU worker processes
        if not env_kwargs.get("enhanced_determinism"):
            # One CPU env takes the same ManiSkillVectorEnv code path as thousands of GPU envs.
            env = build_maniskill_env(args.env_id, num_envs, env_kwargs, args.agent_obs, video_dir, video_trigger,
                                      max_steps_per_video, trajectory_path)
            vec_env = ManiSkillVectorEnv(env, num_envs, ignore_terminations=ignore_terminations, record_metrics=True)
            recorder = env if video_dir is not None or trajectory_path is not None else None
            return TorchVecEnv(vec_env, device, torch_native=True, agent_views=env.get_wrapper_attr("agent_views"),
                               video_recorder=recorder)
        if trajectory_path is not None:
            raise UserError("trajectories are recorded in one ManiSkill vector env: on the CPU simulation, use one env")
        # The fork start method hangs while workers build SAPIEN scenes; forkserver needs module-level builders.
        # The forkserver, which every worker forks from, imports ManiSkill once for all (about 2 s of CPU a worker).
        multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__", "mani_skill.envs"])
        env_fns = [functools.partial(build_maniskill_cpu_worker_env, args.env_id, env_kwargs, args.agent_obs,
                                     ignore_terminations, video_dir if i == 0 else None, video_trigger,
                                     max_steps_per_video)
                   for i in range(num_envs)]
        # AsyncVectorEnv builds its first env in this process before any worker, so a missing asset or Vulkan
        # driver, or a single-agent task, fails here.
        vec_env = gym.vector.AsyncVectorEnv(env_fns, context="forkserver",
                                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        return TorchVecEnv(vec_env, device, torch_native=False, agent_views=vec_env.get_attr("agent_views")[0])
    except (AssertionError, KeyError, ValueError, TypeError) as e:
        raise UserError(f"cannot make ManiSkill env {args.env_id!r} with {env_kwargs}: {e}") from e
    except RuntimeError as e:
        if "vk::" not in str(e) and "vulkan" not in str(e).lower():
            raise UserError(f"cannot make ManiSkill env {args.env_id!r} with {env_kwargs}: {e}") from e
        raise UserError(f"SAPIEN, ManiSkill's simulator, needs a Vulkan driver even on CPU and found none ({e}); "
                        "on a CPU-only Debian/Ubuntu machine: bash scripts/install_cpu_vulkan.sh") from e


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------


def load_weights(agent: Agent, state: dict, args: Args, envs: TorchVecEnv):
    """Load a checkpoint's weights and observation statistics; refuse one whose agents, spaces or network differ."""
    spaces = agent_spaces(envs)
    if state["agents"] != envs.agents or any(state[key] != value for key, value in spaces.items()):
        raise UserError(f"the checkpoint's agents and spaces ({state['agents']}, "
                        f"{[space['shape'] for space in state['observation_spaces']]}, {state['action_spaces']}) do "
                        f"not match {args.env_id}'s ({envs.agents}, "
                        f"{[space['shape'] for space in spaces['observation_spaces']]}, {spaces['action_spaces']})")
    if not state["model"]:
        name = state["run_name"]
        raise UserError(f"run {name}'s checkpoint holds no weights: each of its {state['args']['num_seeds']} seeds "
                        f"(--num_seeds) has its own, in {name}__seed<S>/ beside it; start from one of those")
    defaults = {field.name: field.default for field in dataclasses.fields(Args)}
    for name in NETWORK_FIELDS:
        trained = state["args"].get(name, defaults[name])  # checkpoints older than the flag used its default
        if trained != getattr(args, name):
            flag = cli_flag(name, trained)
            raise UserError(f"the checkpoint was trained with {flag}, and its network needs the same: pass {flag}")
    load_agent_state(agent, state)


# Copied from ppo.py
def load_agent_state(agent: nn.Module, state: dict):
    """The checkpoint's weights and statistics into the agent, refused in one line where they do not fit its network;
    but --checkpoint of the file a copy came from starts the copy's own state (buffers it added) from their initial
    values."""
    missing = [key for key in agent.state_dict() if key not in state["model"]]
    fresh_buffers = (state.get("trainer") != TRAINER and missing and set(missing) <= dict(agent.named_buffers()).keys()
                     and not state["model"].keys() - agent.state_dict().keys())
    if fresh_buffers:
        print(f"note: {state.get('trainer')}.py's checkpoint has no {', '.join(missing)}, which start from their "
              "initial values", file=sys.stderr)
    try:
        agent.load_state_dict(state["model"], strict=not fresh_buffers)
    except RuntimeError as e:  # a copy whose network changed after the checkpoint was written
        mismatch = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e))[:200]
        raise UserError(f"the checkpoint's weights do not fit {TRAINER}.py's network ({mismatch.rstrip('.')}); "
                        f"evaluate or continue it with the file that wrote it") from e


def open_run(args: Args, setup: Setup, resume_state: Optional[dict], announce: bool = True) -> SummaryWriter:
    """Rank 0's start of the run's logs; on --resume, what came after the checkpoint is set aside first. announce:
    print the run's line (False where the caller announces many runs in one)."""
    purge_step = None
    if resume_state is not None:
        # Only now that the run has started: a resume that fails must leave the run as it was.
        set_aside_later_checkpoints(setup.run_dir, resume_state["iteration"])
        for unfinished in setup.run_dir.glob("*.pt.tmp"):  # checkpoint writes that a kill cut short
            unfinished.unlink()
        purge_step = resume_state["global_step"] + 1  # steps logged after the checkpoint are replaced
    writer = SummaryWriter(str(setup.run_dir), purge_step=purge_step)
    keep_source(setup.run_dir)
    batch_size = args.num_envs * args.num_steps
    derived = {"batch_size": batch_size, "minibatch_size": batch_size // args.num_minibatches,
               "num_iterations": setup.num_iterations, "bootstrap_rule": setup.bootstrap_rule,
               "num_eval_steps": setup.num_eval_steps, "device": str(setup.device), "world_size": world_size(),
               "critic_input": setup.critic_input, "max_episode_steps": args.max_episode_steps
               if setup.time_limit_from is None else f"{args.max_episode_steps} (from {setup.time_limit_from})"}
    if setup.checkpoint_trainer is not None:
        derived["checkpoint_written_by"] = f"{setup.checkpoint_trainer}.py"
    table = {**dataclasses.asdict(flags_of(args)), **derived}
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in table.items()))
    if announce:
        print(f"run {setup.run_name}: {setup.run_dir}  " + "  ".join(f"{k}={v}" for k, v in derived.items()),
              flush=True)
    return writer


# Copied from ppo.py
class RunLog:
    """Rank 0's logs: TensorBoard in the run directory; under --num_seeds each seed's in its own run directory too
    (which this process alone writes: locked, as main() locked the run's), statistic[i] to seed i's; under --track,
    each of these runs' wandb run as well (WandbRun). On the other ranks it writes nothing."""

    def __init__(self, args: Args, setup: Setup, resume_state: Optional[dict]):
        self.writers, self.run_writer, self.locks, self.wandb_runs = [], None, [], []
        self.thread_excepthook = threading.excepthook
        if setup.rank != 0:
            return
        try:  # what a failure half-way opened is closed again
            seed_runs_of_run = seed_runs(args, setup) if args.num_seeds > 1 else []
            for _, seed_setup in seed_runs_of_run:
                self.locks.append(RunDirLock(seed_setup.run_dir))
            if args.track:  # first: a wandb run that cannot start leaves no TensorBoard log behind
                for i, (run_args, run_setup) in enumerate(seed_runs_of_run or [(args, setup)]):
                    # the run's training videos show its first envs, which are its first seed's
                    train_videos = setup.run_dir / "train_videos" if i == 0 else None
                    self.wandb_runs.append(WandbRun(run_args, run_setup, train_videos, quiet=i > 0, resume_step=None
                                                    if resume_state is None else resume_state["global_step"]))
            # TensorBoard's writer thread prints a traceback where a write fails, then hands the error to this
            # thread's next write, which train() reports in one line.
            threading.excepthook = (lambda hook: None if issubclass(hook.exc_type, OSError)
                                    else self.thread_excepthook(hook))
            self.run_writer = open_run(args, setup, resume_state)
            for run in seed_runs_of_run:  # each seed's run as a run alone has it, announced in one line for all
                self.writers.append(open_run(*run, resume_state, announce=False))
            if seed_runs_of_run:
                first, last = seed_runs_of_run[0][1].run_dir, seed_runs_of_run[-1][1].run_dir
                print(f"its {args.num_seeds} seeds' runs: {first} to {last}", flush=True)
            self.writers = self.writers or [self.run_writer]
        except BaseException:
            for lock in self.locks:  # as main() undoes the run directory's start
                lock.undo()
            self.close(exit_code=1)
            raise

    def write(self, i: int, values: dict[str, float], step: int):
        for tag, value in values.items():
            self.writers[i].add_scalar(tag, value, step)
        if self.wandb_runs and values:
            self.wandb_runs[i].log(values, step)

    def scalars(self, values: dict, step: int):
        for i in range(len(self.writers)):
            # tensors until here: only rank 0 waits for them
            seed_values = {tag: float(value.reshape(-1)[i]) if isinstance(value, torch.Tensor) else value
                           for tag, value in values.items()}
            # NaN: the seed took no step, so it has no losses to log
            self.write(i, {tag: value for tag, value in seed_values.items() if not math.isnan(value)}, step)

    def episodes(self, prefix: str, episodes, step: int) -> dict:
        """The means of each seed's finished episodes (a rollout's, which SeedBlocks' "seed_index" splits by seed, or
        evaluate_seeds()'), logged as {prefix}/{metric}; the progress bar's items of their mean over the seeds."""
        if not self.writers:
            return {}
        each_seeds = episodes if isinstance(episodes, list) else episodes_by_seed(episodes, len(self.writers))
        means = [episode_means(seed_episodes) for seed_episodes in each_seeds]
        for i, seed_means in enumerate(means):
            values = {f"{prefix}/{key}": value for key, value in seed_means.items()}
            if prefix == "train" and "return" in seed_means:
                values.update({"charts/episodic_return": seed_means["return"],
                               "charts/episodic_length": seed_means["episode_len"]})
            self.write(i, values, step)
        return progress_items(prefix, mean_over_seeds(means))

    def videos(self, step: int):
        for run in self.wandb_runs:
            run.upload_videos(step)

    def flush(self):
        for writer in self.writers:
            writer.flush()

    def close(self, exit_code: int):
        threading.excepthook = self.thread_excepthook
        try:
            for run in self.wandb_runs:  # before the locks: wandb writes into the seeds' run directories
                run.finish(exit_code)
        finally:
            for writer in {self.run_writer, *self.writers} - {None}:
                with contextlib.suppress(OSError):  # a full disk fails the writer's last flush as well
                    writer.close()
            for lock in self.locks:
                lock.release()


# Copied from ppo.py
class WandbRun:
    """--track: a run's wandb run (a seed's, under --num_seeds), which receives what its TensorBoard log does, at the
    same global steps (its wandb steps, and a global_step key as sync_tensorboard gives), and each video that appears
    in its run directory's videos/ or in train_videos. Its id (wandb_run_id()) comes from the run's checkpoints, so
    --resume continues it. wandb keeps a run's steps increasing and cannot replace them: a resumed run logs from the
    step where the stopped run's wandb log ends (online, as wandb's service says; offline, as wandb_uploads.json in
    the run directory says where the run ended cleanly), first the rows of TensorBoard's log and the videos that the
    stopped run logged up to its checkpoint and wandb may have lost (a run killed outright loses what wandb's service
    had not written)."""

    def __init__(self, args: Args, setup: Setup, train_videos: Optional[Path], quiet: bool, resume_step: Optional[int]):
        import wandb

        self.wandb = wandb
        self.video_dirs = {"eval/video": setup.run_dir / "videos", "train/video": train_videos}
        # which video went at which step ("eval/video:NAME"), and the step a run ended at cleanly
        self.uploads = setup.run_dir / "wandb_uploads.json"
        uploads = json.loads(self.uploads.read_text()) if resume_step is not None and self.uploads.is_file() else {}
        self.video_steps, self.last_step = uploads.get("videos", {}), None
        self.ended_at = uploads.get("ended_at")  # kept till finish(): a kill leaves the last clean end
        try:
            self.run = wandb.init(
                project=wandb_project(args.wandb_project_name, find_env(args.env_id)[0]), entity=args.wandb_entity,
                group=args.wandb_group, tags=list(args.wandb_tags), name=setup.run_name,
                id=wandb_run_id(setup.run_id, args.seed), resume="allow", config=dataclasses.asdict(args),
                dir=os.environ.get("WANDB_DIR", setup.run_dir), save_code=True, reinit="create_new",
                # one process's seeds: the first run alone prints, records the console and the machine's load
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True) if quiet else None)
        except (wandb.errors.Error, ValueError) as e:  # ValueError: settings wandb refuses (WANDB_MODE=...)
            raise UserError(wandb_start_failed(e)) from e
        if self.run.disabled and not quiet:  # WANDB_MODE=disabled, or `wandb disabled`: a run that records nothing
            print("--track: wandb is disabled (WANDB_MODE=disabled or `wandb disabled`): nothing is tracked; the "
                  "TensorBoard logs are written as always", file=sys.stderr)
        # a resumed run's next step (run.step asks wandb's service: once; offline it knows nothing)
        self.first_step = max(self.run.step, 0 if self.ended_at is None else self.ended_at + 1)
        if resume_step is not None and self.first_step <= resume_step:
            self.log_again(setup.run_dir, resume_step)
        self.uploaded = {path for _, path in self.video_files()}  # the rest: a killed run's, after its checkpoint

    def log(self, values: dict, step: int):
        if step >= self.first_step:  # else the stopped run logged this step before this one resumed
            self.run.log({"global_step": step, **values}, step=step)
            self.last_step = step

    def log_again(self, run_dir: Path, resume_step: int):
        """The stopped run's TensorBoard rows and videos from first_step to the checkpoint's step, which wandb lacks
        (online), or may lack (offline: those it has are dropped as it syncs, its steps having gone past them)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        events.Reload()
        rows = defaultdict(dict)
        for tag in events.Tags()["scalars"]:
            for event in events.Scalars(tag):
                if self.first_step <= event.step <= resume_step:
                    rows[event.step][tag] = event.value
        for key, path in self.video_files():
            if self.first_step <= (step := self.video_steps.get(f"{key}:{path.name}", -1)) <= resume_step:
                rows[step].setdefault(key, []).append(self.wandb.Video(str(path), format="mp4"))
        for step in sorted(rows):
            self.log(rows[step], step)

    def video_files(self) -> list[tuple[str, Path]]:
        return [(key, path) for key, folder in self.video_dirs.items() if folder is not None
                for path in sorted(folder.glob("*.mp4"))]

    def upload_videos(self, step: int):
        new = {}
        for key, path in self.video_files():
            if path not in self.uploaded:
                self.uploaded.add(path)
                self.video_steps[f"{key}:{path.name}"] = step
                new.setdefault(key, []).append(self.wandb.Video(str(path), format="mp4"))
        if new:  # a list always: one media type a key, however many videos a step brings
            self.write_uploads()  # before the checkpoint that follows
            self.log(new, step)

    def write_uploads(self):
        if not self.run.disabled:  # which logs nothing: a resume tracked later logs its steps
            write_file(self.uploads, json.dumps({"videos": self.video_steps, "ended_at": self.ended_at}).encode())

    def finish(self, exit_code: int):
        self.run.finish(exit_code=exit_code)
        if self.last_step is not None:
            self.ended_at = self.last_step
        self.write_uploads()


# Copied from ppo.py
def wandb_start_failed(e: Exception) -> str:
    offline = "" if os.environ.get("WANDB_MODE") == "offline" else (
        " (or keep the runs on this machine, to `wandb sync` later: WANDB_MODE=offline)")
    return f"--track could not start a wandb run: {' '.join(str(e).split()).rstrip('.')}"[:400] + offline


# Copied from ppo.py
def wandb_project(wandb_project_name: Optional[str], maniskill: bool) -> str:
    return wandb_project_name or ("ManiSkill" if maniskill else "ppo-baselines")


# Copied from ppo.py
def wandb_run_id(run_id: str, seed: int) -> str:
    """A run's wandb run: its run_id and seed, so that a seed of a --num_seeds run resumed alone continues its own."""
    return f"{run_id}-{seed}"


def checkpoint_states(args: Args, setup: Setup, envs: TorchVecEnv, agent: Agent, optimizer: PPOOptimizer,
                      reward_normalizer: Optional[RewardNormalizer], global_step: int, iteration: int,
                      pbt: Optional[dict] = None) -> list[tuple[Path, dict]]:
    """What a checkpoint holds, by the run directory it goes to. Every rank calls it (each hands rank 0 its random
    state); on the others it is empty. Under --num_seeds, each seed's in its own run directory (seed_dirs()), as a run
    of that seed alone writes one, first; then the run's, which says how they make one run (with_seeds())."""
    if not all_finite(agent):
        raise NonFiniteError("parameters", nonfinite_seeds(agent.state_dict().values(), args.num_seeds))
    rank_rngs = gather_objects(rng_states(setup.device))
    if setup.rank != 0:
        return []
    state = {"format": CHECKPOINT_FORMAT, "trainer": TRAINER, "run_name": setup.run_name,
             "args": dataclasses.asdict(flags_of(args)), "model": agent.state_dict(),
             "optimizer": optimizer.state_dict(),
             "reward_normalizer": None if reward_normalizer is None else reward_normalizer.state_dict(),
             "agents": envs.agents, **agent_spaces(envs),
             "global_step": global_step, "iteration": iteration, "world_size": world_size(),
             "source_sha256": SOURCE_SHA256, "run_id": setup.run_id, "rng": rank_rngs[0],
             "other_ranks_rng": rank_rngs[1:], "seed_rngs": []}
    if args.num_seeds == 1:
        return [(setup.run_dir, state)]
    state["seed_rngs"] = [generator.get_state() for generator in agent.generators]
    # The seeds' first: the run's says that theirs are written. A kill between them makes --resume continue from the
    # run's previous checkpoint (setting aside the seeds' later ones) or, before its first, the same command start
    # afresh (setting the seeds' aside). The run's holds no tensor that a seed's holds: each is stored once.
    seeds = [(seed_dir, seed_checkpoint(state, i, seed_args, seed_dir))
             for i, (seed_args, seed_dir) in enumerate(seed_dirs(args, setup.run_dir))]
    return [*seeds, (setup.run_dir, {**state, "pbt": pbt, "model": {}, "reward_normalizer": None, "seed_rngs": [],
                                     "optimizer": optimizer_groups(state["optimizer"])})]


# Copied from ppo.py
def optimizer_groups(optimizer: dict) -> dict:
    """An optimizer's state dict (PPOOptimizer's, with its own_optimizers') without the state of its parameters."""
    return {**optimizer, "state": {}, **({} if "own_optimizers" not in optimizer else {
        "own_optimizers": {name: optimizer_groups(own) for name, own in optimizer["own_optimizers"].items()}})}


# Copied from ppo.py
def seed_optimizer_state(optimizer: dict, i: int, num_seeds: int) -> dict:
    """Seed i's share of the state dict of an optimizer whose groups are each seed's in turn (SeedOptimizer's and its
    own_optimizers', SeedSteps'), as the optimizer of a run of that seed alone saves it."""
    per_seed = len(optimizer["param_groups"]) // num_seeds
    groups, k = [], 0
    own = {} if "own_optimizers" not in optimizer else {"own_optimizers": {
        name: seed_optimizer_state(own, i, num_seeds) for name, own in optimizer["own_optimizers"].items()}}
    state, saved = {}, optimizer["state"]
    for group in optimizer["param_groups"][i * per_seed:(i + 1) * per_seed]:
        numbers = list(range(k, k + len(group["params"])))
        state.update({n: saved[id_] for n, id_ in zip(numbers, group["params"]) if id_ in saved})
        groups.append({**group, "params": numbers})
        k += len(numbers)
    return {"state": state, "param_groups": groups, **own}


# Copied from ppo.py
def stack_optimizer_states(run_optimizer: dict, seed_optimizers: list[dict]) -> dict:
    """The state dict of a --num_seeds run's optimizer (its groups: run_optimizer's) from its seeds' (the inverse of
    seed_optimizer_state())."""
    per_seed = len(seed_optimizers[0]["param_groups"])
    state, groups = {}, []
    for i, seed in enumerate(seed_optimizers):
        for group, seed_group in zip(run_optimizer["param_groups"][i * per_seed:(i + 1) * per_seed],
                                     seed["param_groups"]):
            state.update({id_: seed["state"][n] for n, id_ in zip(seed_group["params"], group["params"])
                          if n in seed["state"]})
            groups.append({**seed_group, "params": group["params"]})
    own = {} if "own_optimizers" not in run_optimizer else {"own_optimizers": {
        name: stack_optimizer_states(own, [seed["own_optimizers"][name] for seed in seed_optimizers])
        for name, own in run_optimizer["own_optimizers"].items()}}
    return {"state": state, "param_groups": groups, **own}


# Copied from ppo.py
def write_checkpoint(args: Args, setup: Setup, envs: TorchVecEnv, agent: Agent, optimizer: PPOOptimizer,
                     reward_normalizer: Optional[RewardNormalizer], global_step: int, iteration: int,
                     final: bool = False, pbt: Optional[dict] = None) -> Optional[Path]:
    """Every rank calls it; rank 0 writes ckpt_{iteration}.pt (and, final, final_ckpt.pt) in each run directory
    checkpoint_states() names, then keeps the newest --keep_checkpoints of each."""
    states = checkpoint_states(args, setup, envs, agent, optimizer, reward_normalizer, global_step, iteration, pbt)
    for run_dir, state in states:
        save_checkpoint(run_dir / f"ckpt_{iteration}.pt", state)
        if final:
            save_checkpoint(run_dir / "final_ckpt.pt", state)
    for run_dir, _ in states if args.keep_checkpoints is not None else []:
        numbered = numbered_checkpoints(run_dir)  # pruned once all are written: each keeps what the others keep
        for old in sorted(numbered)[:-args.keep_checkpoints]:
            numbered[old].unlink()
    return setup.run_dir / f"ckpt_{iteration}.pt" if states else None


def agent_spaces(envs: TorchVecEnv) -> dict:
    """What a checkpoint says of the agents' spaces: the stacked networks' (an observation row, the joint action
    space) and each agent's own."""
    return {"observation_space": space_to_dict(envs.single_observation_space),
            "observation_spaces": [space_to_dict(gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32))
                                   for dim in envs.agent_obs_dims],
            "action_space": envs.joint_action_space,
            "action_spaces": [space_to_dict(space) for space in envs.action_spaces]}


# Copied from ppo.py
def seed_dirs(args: Args, run_dir: Path) -> list[tuple[Args, Path]]:
    """--num_seeds: each seed as a run of its own, {run_name}__seed{seed} in the run's directory: its flags (those of
    a run of that seed alone, in the run's wandb group) and its directory."""
    names = [f"{run_dir.name}__seed{seed}" for seed in range(args.seed, args.seed + args.num_seeds)]
    return [(dataclasses.replace(member_args(args, i), seed=args.seed + i, exp_name=name,
                                 wandb_group=args.wandb_group or run_dir.name), run_dir / name)
            for i, name in enumerate(names)]


# Copied from ppo.py
def seed_runs(args: Args, setup: Setup) -> list[tuple[Args, Setup]]:
    return [(seed_args, dataclasses.replace(setup, run_name=seed_dir.name, run_dir=seed_dir))
            for seed_args, seed_dir in seed_dirs(args, setup.run_dir)]


# Copied from ppo.py
def seed_checkpoint(state: dict, i: int, seed_args: Args, seed_dir: Path) -> dict:
    """The i-th seed's share of a checkpoint of all seeds, as a run of that seed alone writes one: ppo_eval.py
    evaluates it, and --resume continues it alone."""
    optimizer = seed_optimizer_state(state["optimizer"], i, len(state["seed_rngs"]))
    # its generator is its torch stream: the learner GPU's (whose state the batch's holds), or the CPU's
    rng = {**state["rng"], "cuda" if len(state["rng"]["cuda"]) > 0 else "torch": state["seed_rngs"][i]}
    return {**state, "run_name": seed_dir.name, "args": dataclasses.asdict(seed_args),
            "model": seed_state(state["model"], i), "optimizer": optimizer,
            "reward_normalizer": (None if state["reward_normalizer"] is None
                                  else seed_state(state["reward_normalizer"], i)),
            "rng": rng, "seed_rngs": []}


# Copied from ppo.py
def seeds_parts(args: Args, run_dir: Path, resume_state: Optional[dict],
                init_state: Optional[dict]) -> tuple[Optional[dict], Optional[dict]]:
    """What the run continues (--resume) and starts from (--checkpoint), each seed's part in place under --num_seeds:
    read back from the seeds' own checkpoints (with_seeds), or the same for every seed (for_every_seed)."""
    if args.num_seeds == 1:
        return resume_state, init_state
    return with_seeds(resume_state, run_dir), for_every_seed(init_state, args.num_seeds)


# Copied from ppo.py
def with_seeds(state: Optional[dict], run_dir: Path) -> Optional[dict]:
    """A --num_seeds run's checkpoint whole: its seeds' parts read back from their checkpoints of its iteration, each
    in its run directory, and stacked as the run holds them (the inverse of seed_checkpoint())."""
    if state is None:
        return None
    args = Args(**{f.name: state["args"][f.name] for f in dataclasses.fields(Args) if f.name in state["args"]})
    name, seeds = f"ckpt_{state['iteration']}.pt", []
    for _, seed_dir in seed_dirs(args, run_dir):
        if not seed_dir.is_dir():
            raise UserError(f"{seed_dir}, a seed's run of {run_dir}, is missing (a run of many seeds finds its seeds' "
                            "runs by its directory's name: keep it, or give the seeds' directories the new one)")
        seed = read_checkpoint(seed_dir / name) if (seed_dir / name).is_file() else None
        if seed is None or (seed["iteration"], seed["global_step"]) != (state["iteration"], state["global_step"]):
            raise UserError(f"{seed_dir / name}, a seed's part of the run's {name}, is missing or was written by "
                            f"another run (the seed resumed alone?): resume from an earlier checkpoint of {run_dir} "
                            "(set the later ones aside), or start the run again")
        seeds.append(seed)
    optimizer = stack_optimizer_states(state["optimizer"], [seed["optimizer"] for seed in seeds])
    stream = "cuda" if len(state["rng"]["cuda"]) > 0 else "torch"  # as seed_checkpoint() stores a seed's generator
    return {**state, "model": stack_states([seed["model"] for seed in seeds]), "optimizer": optimizer,
            "reward_normalizer": (None if seeds[0]["reward_normalizer"] is None
                                  else stack_states([seed["reward_normalizer"] for seed in seeds])),
            "seed_rngs": [seed["rng"][stream] for seed in seeds]}


# Copied from ppo.py
def for_every_seed(state: Optional[dict], num_seeds: int) -> Optional[dict]:
    """--checkpoint under --num_seeds: every seed starts from its weights and statistics, as a run of that seed alone
    with --checkpoint does (a checkpoint without weights is refused by load_weights)."""
    if state is None or not state["model"]:
        return state
    normalizer = state.get("reward_normalizer")
    return {**state, "model": stack_states([state["model"]] * num_seeds),
            "reward_normalizer": None if normalizer is None else stack_states([normalizer] * num_seeds)}


# Copied from ppo.py
def kept_source(run_dir: Path, trainer: str, sha256: str) -> Path:
    """Where a run directory keeps the trainer file of this hash (keep_source())."""
    return run_dir / "source" / sha256[:12] / f"{trainer}.py"


# Copied from ppo.py
def keep_source(run_dir: Path):
    """The run directory keeps every trainer file that ran it: the one it started with, and one that resumed it
    changed; each checkpoint says by its source_sha256 which one wrote it."""
    path = kept_source(run_dir, TRAINER, SOURCE_SHA256)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, SOURCE)


# Copied from ppo.py
def note_changed_source(state: dict, checkpoint: Path):
    sha256 = state.get("source_sha256")
    if sha256 is not None and sha256 != SOURCE_SHA256:
        print(f"note: {TRAINER}.py differs from the file that wrote {checkpoint} (kept in "
              f"{kept_source(checkpoint.parent, TRAINER, sha256)}); the run goes on with this one", file=sys.stderr)


# Copied from ppo.py
def stop_message(e: Exception, args: Args, setup: Setup, iteration: int, global_step: int,
                 last_checkpoint: Optional[Path]) -> str:
    """The one line of a run stopped by non-finite numbers (naming the seeds they are in under --num_seeds) or by a
    failed write."""
    kept = f"the last checkpoint {last_checkpoint} is untouched" if last_checkpoint else "none was written"
    problem = f"non-finite {e.args[0]}" if isinstance(e, NonFiniteError) else str(e)
    if isinstance(e, NonFiniteError) and args.num_seeds > 1:
        problem += f" in seed {', '.join(str(args.seed + i) for i in e.args[1])}"
        kept += continue_other_seeds(args, setup.run_dir, e.args[1]) if last_checkpoint else ""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        problem = f"the disk is full ({e})"
        kept += f"; free some space, then --resume {setup.run_dir}" if last_checkpoint else ""
    return f"error: {problem} at iteration {iteration} (global step {global_step}); the run stops and {kept}"


# Copied from ppo.py
def print_how_to_resume(signum: int, checkpoint: Optional[Path], iteration: int, run_dir: Path):
    resume = f"{shlex.quote(sys.argv[0])} --resume {shlex.quote(str(run_dir))}"
    how = f"python {resume}" if world_size() == 1 else f"torchrun (the same options) {resume}"
    print(f"{signal.Signals(signum).name}: saved {checkpoint} at iteration {iteration}; resume with: {how}",
          file=sys.stderr)


# The flags that some of the trainers have, and which: a trainer given another's says so (tests/test_copy.py keeps this
# equal to the trainers' Args).
# Copied from ppo.py
FLAGS_OF_SOME_TRAINERS = {
    "critic_obs": "ppo.py, ppo_rnn.py and ppo_rgb.py",
    "hidden_sizes": "ppo.py, ppo_rgb.py and ippo.py",
    "rnn_type": "ppo_rnn.py", "rnn_hidden_size": "ppo_rnn.py", "rnn_num_layers": "ppo_rnn.py", "seq_len": "ppo_rnn.py",
    "shared_rnn": "ppo_rnn.py",
    "obs_mode": "ppo_rgb.py", "include_state": "ppo_rgb.py", "aug_shift": "ppo_rgb.py", "clip_reward": "ppo_rgb.py",
    "agent_obs": "ippo.py", "centralized_critic": "ippo.py", "env_kwargs": "ippo.py", "share_parameters": "ippo.py"}
# Flags of ManiSkill's baselines whose job another program of the project does: what to run instead
FLAGS_OF_OTHER_PROGRAMS = {
    "evaluate": "evaluate a checkpoint with python ppo_eval.py runs/RUN (docs/checkpoints.md)",
    "save_trajectory": "record a checkpoint's ManiSkill trajectories with python ppo_eval.py runs/RUN "
                       "--save_trajectory (docs/evaluation.md)"}


# Copied from ppo.py
def parse_args(argv: list[str]) -> Args:
    fields = {field.name for field in dataclasses.fields(Args)}
    for flag in argv:
        name = flag[2:].partition("=")[0].replace("-", "_") if flag.startswith("--") else ""
        name = name if name in FLAGS_OF_SOME_TRAINERS else name.removeprefix("no_")
        if name in FLAGS_OF_SOME_TRAINERS and name not in fields:
            raise UserError(f"--{name} is a flag of {FLAGS_OF_SOME_TRAINERS[name]}, not of {TRAINER}.py")
        if name in FLAGS_OF_OTHER_PROGRAMS and name not in fields:
            raise UserError(f"--{name} is not a flag of {TRAINER}.py: {FLAGS_OF_OTHER_PROGRAMS[name]}")
    args = tyro.cli(Args, args=argv, use_underscores=True, description=__doc__)
    if args.resume is None:
        return args
    resumed = load_checkpoint(find_resume_checkpoint(args.resume))
    saved = resumed["args"]
    saved["checkpoint"] = None  # the weights it started from are in the run's own checkpoints by now
    saved_args = Args(**{f.name: saved[f.name] for f in dataclasses.fields(Args) if f.name in saved})
    # Parse again with the run's own arguments as defaults: flags given now override them.
    args = tyro.cli(Args, args=argv, use_underscores=True, default=saved_args, description=__doc__)
    changeable = RESUME_CHANGEABLE_FIELDS + ("resume", "checkpoint")
    fixed = [f.name for f in dataclasses.fields(Args) if f.name not in changeable]
    changed = [f"--{name}" for name in fixed if getattr(args, name) != getattr(saved_args, name)]
    if changed:
        seeds = f" (a seed's: {resumed['run_name']}__seed<S>/final_ckpt.pt)" if saved.get("num_seeds", 1) > 1 else ""
        raise UserError(f"--resume continues the same experiment and only its run-control flags may change, but "
                        f"{', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'} from the run's; start "
                        f"a new run from its weights with --checkpoint{seeds}")
    return args


# Copied from ppo.py
def cli_flag(name: str, value) -> str:
    """How a user writes name=value on the command line."""
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no_{name}"
    if isinstance(value, (tuple, list)):
        return " ".join([f"--{name}", *map(str, value)])
    return f"--{name}={value}"


# Copied from ppo.py
def numbered_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The run's ckpt_<iteration>.pt files by iteration."""
    return {int(m.group(1)): p for p in run_dir.iterdir() if (m := re.fullmatch(r"ckpt_(\d+)\.pt", p.name))}


# Copied from ppo.py
def find_resume_checkpoint(path: str) -> Path:
    """A checkpoint file as given, or a run directory's newest ckpt_<iteration>.pt."""
    path = Path(path)
    if not path.is_dir():
        return path
    numbered = numbered_checkpoints(path)
    if not numbered:
        raise UserError(f"no checkpoint ckpt_<iteration>.pt in {path} to resume from")
    return numbered[max(numbered)]


# Copied from ppo.py
TORCH_LOAD_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation of torch.load")


# Copied from ppo.py
def read_checkpoint(path) -> dict:
    """A checkpoint of any of the trainers, read without running anything in it."""
    path = Path(path)
    if path.is_dir():  # a run of many seeds (--num_seeds) holds no weights: each seed's run does
        example = next(iter(sorted(path.glob(f"{path.name}__seed*/final_ckpt.pt"))), path / "final_ckpt.pt")
        raise UserError(f"checkpoint {path} is a directory; give a checkpoint file, e.g. {example}")
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise UserError(f"checkpoint {path} is empty")
    try:
        with warnings.catch_warnings():
            # a file pickled by other means draws a warning about its protocol before it is refused or read
            warnings.simplefilter("ignore", UserWarning)
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        # torch wraps the reason of a weights_only refusal in advice that does not apply here
        reason = next((line for line in lines if not line.startswith(TORCH_LOAD_ADVICE)),
                      lines[0] if lines else "no message")
        if isinstance(e, pickle.UnpicklingError) and "global" in reason.lower():
            # weights_only stops at the first object that is not a tensor or plain data, before anything is built or run
            raise UserError(f"checkpoint {path} holds pickled Python objects besides tensors and plain data "
                            f"({reason}), which could run code when loaded: refused, nothing in it was run") from e
        raise UserError(f"checkpoint {path} cannot be read, it is damaged or not a checkpoint "
                        f"({type(e).__name__}: {reason})") from e
    if not isinstance(ckpt, dict) or "format" not in ckpt or "model" not in ckpt:
        raise UserError(f"{path} is not a checkpoint of these trainers")
    return ckpt


# Copied from ppo.py
def load_checkpoint(path, any_trainer: bool = False) -> dict:
    """A checkpoint this trainer can continue, or (any_trainer) start from: another file's too, such as the baseline
    a copy of this file starts from, where its network fits (load_weights says where it does not)."""
    ckpt = read_checkpoint(path)
    if ckpt.get("trainer") != TRAINER and not any_trainer:  # before the format: another trainer's may differ
        raise UserError(f"{path} was written by {ckpt.get('trainer')}.py, not {TRAINER}.py: continue or start from it "
                        f"with {ckpt.get('trainer')}.py")
    if ckpt["format"] != CHECKPOINT_FORMAT:
        raise UserError(f"{path} has checkpoint format {ckpt['format']}; this {TRAINER}.py reads format "
                        f"{CHECKPOINT_FORMAT}")
    return ckpt


# Copied from ppo.py
def set_aside_unfinished_start(run_dir: Path) -> Optional[Path]:
    """A start killed before its first checkpoint leaves logs (and videos) but nothing to resume from, as does a run
    with --no_save_model. Starting the same run again moves them to a subdirectory (nothing is deleted; a start that
    fails moves them back) and begins afresh; main() refuses a directory with any checkpoint first."""
    left = [path for path in run_dir.iterdir() if not path.name.startswith((".", "unfinished_start_"))]
    if not left:
        return None
    aside = run_dir / f"unfinished_start_{int(time.time())}"
    aside.mkdir()
    for path in left:
        path.rename(aside / path.name)
    print(f"{run_dir} held no checkpoint to continue from (a start stopped before its first one, or a run without "
          f"--save_model): moved its logs and videos to {aside} and starting afresh", file=sys.stderr)
    return aside


# Copied from ppo.py
def set_aside_later_checkpoints(run_dir: Path, iteration: int):
    """Resuming from an older checkpoint abandons what came after it. Its checkpoints move to a subdirectory
    (nothing is deleted), so that `--resume RUN_DIR` and final_ckpt.pt refer to the continued run."""
    later = [path for number, path in numbered_checkpoints(run_dir).items() if number > iteration]
    final = run_dir / "final_ckpt.pt"
    if final.is_file() and load_checkpoint(final)["iteration"] > iteration:
        later.append(final)
    if not later:
        return
    aside = run_dir / f"abandoned_after_{iteration}_{int(time.time())}"
    aside.mkdir()
    for path in later:
        path.rename(aside / path.name)
    print(f"resuming from iteration {iteration}: moved the {len(later)} later checkpoints to {aside}", file=sys.stderr)


# Copied from ppo.py
class RunDirLock:
    """One process at a time writes a run directory: an exclusive flock on its .lock file, which the kernel releases
    when the process ends, however it ends."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.moved_aside: Optional[Path] = None  # set_aside_unfinished_start's, which undo() moves back
        self.new_dirs = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
        self.entries_before = set(run_dir.iterdir()) if run_dir.is_dir() else set()
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / ".lock"
        self.file = open(path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # a lock file that a failing start unlinked after we opened it locks nothing
            held = path.exists() and os.stat(path).st_ino == os.fstat(self.file.fileno()).st_ino
        except BlockingIOError:
            held = False
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
                raise
            print(f"warning: {run_dir} cannot be locked on this file system ({e.strerror}); "
                  "make sure no other process writes this run", file=sys.stderr)
            held = True
        if not held:
            self.file.seek(0)
            holder = self.file.read().strip()
            self.file.close()
            raise UserError(f"{run_dir} is in use by another process (pid {holder}); wait for it to finish or stop it")
        self.file.truncate(0)
        self.file.write(str(os.getpid()))
        self.file.flush()

    def release(self):
        self.file.close()

    def undo(self):
        """A start that failed leaves the disk as it found it: what it created (the lock file, empty video
        directories, a new run directory) goes, what it set aside comes back, and nothing else is touched."""
        new_entries = set(self.run_dir.iterdir()) - self.entries_before
        try:
            if self.run_dir / ".lock" in new_entries:
                (self.run_dir / ".lock").unlink()  # while still locked: no other start can take it meanwhile
            for path in new_entries:
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
            if self.moved_aside is not None:
                for path in self.moved_aside.iterdir():
                    path.rename(self.run_dir / path.name)
                self.moved_aside.rmdir()
            for path in self.new_dirs:
                if any(path.iterdir()):
                    break
                path.rmdir()
        except OSError:
            pass  # another start is creating entries here at the same time: leave them
        finally:
            self.release()


# Copied from ppo.py
def save_checkpoint(path: Path, state: dict):
    """Serialized in memory first: torch.save onto a full disk fails with a RuntimeError that does not say so, a plain
    write with ENOSPC."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_file(path, buffer.getbuffer())


# Copied from ppo.py
def write_file(path: Path, data: bytes):
    """Write to a temporary file, put it on disk, then rename it: a kill mid-write (or a power cut after the rename)
    never leaves a truncated file, only a stray .tmp (a checkpoint's, the next resume removes)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself
    finally:
        os.close(directory)


# Copied from ppo.py
def rng_states(device: torch.device) -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        # The learner's GPU alone: a resumed job may land on a node with another number of GPUs.
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.empty(0, dtype=torch.uint8),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": random.getstate(),
    }


# Copied from ppo.py
def set_rng_states(states: dict, device: torch.device):
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and len(states["cuda"]) > 0:
        torch.cuda.set_rng_state(states["cuda"], device)
    np_state = states["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


# Copied from ppo.py
class UnsavedState:
    """What checkpoints do not save and every seed of --num_seeds shares, and so no update or evaluation may change:
    the flags (the run's settings as given); the Agent's Python attributes (numbers, arrays, random generators,
    objects, modules kept in a list) and its buffers made persistent=False; the PPO optimizer's own attributes and
    any learning-rate scheduler on an optimizer; this file's module variables, class attributes, default arguments
    and closures. refuse_changes() names the first that changed since the run began, in one error line."""

    def __init__(self, agent: nn.Module, args: Args, optimizer: PPOOptimizer):
        self.agent, self.args, self.optimizer = agent, args, optimizer
        self.before = copy.deepcopy(self.values())

    def values(self) -> dict:
        values = {f"args.{key}": value for key, value in vars(self.args).items()}
        # the seeds' generators (--num_seeds) are the run's: checkpoints save their states
        known, seeds_generators = registered(self.agent), vars(self.agent).get("generators", [])
        for name, module in self.agent.named_modules(prefix=type(self.agent).__name__):
            values.update({f"{name}.{key}": fingerprint(value, known) for key, value in vars(module).items()
                           if not key.startswith("_") and key != "training" and value is not seeds_generators})
            if not isinstance(module, RewardNormalizer):  # its returns restart with the envs, as in a run alone
                values.update({f"{name}.{key} (a buffer made persistent=False)": module._buffers[key]
                               for key in module._non_persistent_buffers_set if module._buffers.get(key) is not None})
        values.update({f"the PPO optimizer's {key}": fingerprint(value, known)
                       for key, value in vars(self.optimizer).items()
                       if not key.startswith("_") and key not in OPTIMIZER_RUN_FIELDS})
        for key, value in vars(sys.modules[__name__]).items():
            if key.startswith("_"):
                continue
            values[f"the module variable {key}"] = fingerprint(value, known)
            functions = {key: value} if callable(value) else {}
            if isinstance(value, type) and value.__module__ == __name__:
                values.update({f"the class attribute {key}.{attribute}": fingerprint(member, known)
                               for attribute, member in vars(value).items() if not attribute.startswith("__")})
                functions.update({f"{key}.{name}": f for name, f in vars(value).items() if inspect.isfunction(f)})
            for name, function in functions.items():
                function = inspect.unwrap(function)  # torch wraps an optimizer's step() when it makes one
                if inspect.isfunction(function) and function.__code__.co_filename == __file__:
                    # data alone: a function's cache (a compiled function made on first call) is no state
                    held = [*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values(),
                            *(cell.cell_contents for cell in function.__closure__ or () if cell_filled(cell))]
                    values[f"the default arguments and closure of {name}()"] = [
                        fingerprint(value, known) for value in held if value is not None and not callable(value)]
        return values

    def refuse_changes(self):
        """Every rank stops alike (rank 0 alone evaluates, and may change what the others do not)."""
        if [id(own) for own in own_optimizers(self.agent).values()] != [id(own) for own in self.optimizer.own]:
            raise UserError("the Agent's own optimizers are not those it had when the PPO optimizer was made, which "
                            "--resume would not restore: make them once, in Agent.__init__")
        optimizers = {"the PPO optimizer": self.optimizer, **own_optimizers(self.agent)}
        scheduled = next((name for name, optimizer in optimizers.items()
                          if hasattr(optimizer.step, "_wrapped_by_lr_sched")), None)
        if scheduled is not None:
            instead = ("change PPOOptimizer.schedule_learning_rate()" if scheduled == "the PPO optimizer" else
                       "set its groups' lr before each of its steps from a counter buffer of the Agent "
                       "(self.register_buffer('updates', torch.tensor(0)); under --num_seeds each seed's groups take "
                       "that seed's value)")
            raise UserError(f"a learning-rate scheduler steps {scheduled}: checkpoints do not save its state and "
                            f"--num_seeds would not split it; {instead} ({TRAINER}.py's docstring, 'A copy's "
                            "contract')")
        now = self.values()
        changed = next((name for name in {**self.before, **now}
                        if name not in now or name not in self.before or not same_data(now[name], self.before[name])),
                       None)
        changed = next((name for name in gather_objects(changed) if name is not None), None)
        if changed is not None:
            raise UserError(f"{changed} changed during training: checkpoints do not save it, so --resume would "
                            "lose it, and the seeds of --num_seeds share it; keep state that changes in the Agent, "
                            "as a buffer (self.register_buffer), a parameter or an optimizer of its own "
                            f"({TRAINER}.py's docstring, 'A copy's contract')")


# Copied from ppo.py
OPTIMIZER_RUN_FIELDS = ("state", "param_groups", "defaults", "agent", "own", "minibatch_steps", "generators",
                        "stacked", "going", "stepping", "scratch")


# Copied from ppo.py
def cell_filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:  # a closure's variable not yet assigned
        return False


# Copied from ppo.py
def registered(agent: nn.Module) -> dict[int, str]:
    """The Agent's modules, parameters and buffers by id: fingerprint() names them, as checkpoints save them."""
    named = [*agent.named_modules(), *agent.named_parameters(), *agent.named_buffers()]
    return {id(value): name or type(agent).__name__ for name, value in named}


# Copied from ppo.py
def fingerprint(value, known: Optional[dict[int, str]] = None, depth: int = 0):
    """value as data that same_data() compares: numbers, strings, tensors and arrays, containers of them; a random
    generator as its state, a module or an object with a state_dict() (a scheduler) as that, another object as its
    attributes; what known (registered()) holds as its name; a function, class, module, optimizer or env as its
    type's name."""
    if known is not None and id(value) in known:
        return f"<{known[id(value)]}>"
    if depth > 8:
        return "<deeper>"
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), torch.Tensor, np.ndarray)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple, deque)):
        return [fingerprint(item, known, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, value))
    if isinstance(value, dict):
        return {key: fingerprint(item, known, depth + 1) for key, item in value.items()}
    if isinstance(value, random.Random):
        return value.getstate()
    if isinstance(value, np.random.Generator):
        return value.bit_generator.state
    if isinstance(value, np.random.RandomState):
        return fingerprint(value.get_state(), known, depth + 1)
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, nn.Module):
        return dict(value.state_dict())
    if isinstance(value, (type, types.ModuleType, torch.optim.Optimizer, gym.Env, gym.vector.VectorEnv)) or (
            inspect.isroutine(value) or not hasattr(value, "__dict__")):  # an optimizer's state: checkpoints save it
        return f"<{type(value).__qualname__}>"
    saved = value.state_dict() if callable(getattr(value, "state_dict", None)) else vars(value)  # a scheduler's too
    return {"<type>": type(value).__qualname__, **fingerprint(saved, known, depth + 1)}


# Copied from ppo.py
def same_data(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and (torch.equal(a, b) or a.is_floating_point() and bool(
            ((a == b) | (a.isnan() & b.isnan())).all()))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, (torch.Tensor, np.ndarray)) or isinstance(b, (torch.Tensor, np.ndarray)):
        return False
    if isinstance(a, (set, frozenset)) and isinstance(b, (set, frozenset)):
        return a == b
    if isinstance(a, deque) and isinstance(b, deque):
        return same_data(list(a), list(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_data(a[key], b[key]) for key in a)
    return a == b or (a != a and b != b)  # NaN


# Copied from ppo.py
def all_finite(module: nn.Module) -> bool:
    tensors = [t for t in module.state_dict().values() if t.is_floating_point()]
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


# ---------------------------------------------------------------------------------------------
# Data parallel: torchrun starts one process (a rank) per GPU, each with its own envs; a plain run is one rank.
# Whatever decides the course of the run is computed from numbers every rank shares, so that all ranks take it alike.
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


# Copied from ppo.py
def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x, concatenated along the first dimension in rank order (x itself in a plain run)."""
    if world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


# Copied from ppo.py
def mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    if world_size() == 1:
        return x
    total = x.clone()
    dist.all_reduce(total)  # gloo has no average
    return total / world_size()


# Copied from ppo.py
def average_gradients(agent: nn.Module, loss_finite: torch.Tensor) -> torch.Tensor:
    """Replace each rank's gradients by their mean over all ranks, in one all-reduce (every rank then clips and steps
    alike); returns whether every rank's loss was finite."""
    grads = [p.grad for p in agent.parameters() if p.grad is not None]  # a frozen or idle part has none, on every rank
    flat = mean_over_ranks(torch.cat([g.flatten() for g in grads] + [(~loss_finite).float().reshape(1)]))
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat[-1] == 0


# Copied from ppo.py
def parameters_finite(agent: nn.Module, iteration: int) -> bool:
    """Whether every rank's parameters and observation statistics are finite; under torchrun every rank must also
    hold rank 0's, bit for bit (else RuntimeError). All ranks reach the same answer, so they stop together."""
    own_finite = all_finite(agent)
    if world_size() == 1:
        return own_finite
    state = torch.cat([t.detach().flatten().double() for t in agent.state_dict().values() if t.is_floating_point()])
    rank0_state = state.clone()
    dist.broadcast(rank0_state, 0)
    counts = torch.tensor([0.0 if torch.equal(state, rank0_state) else 1.0, 0.0 if own_finite else 1.0],
                          device=state.device)
    dist.all_reduce(counts)  # the ranks that differ from rank 0, the ranks with non-finite values
    if counts[1] > 0:
        return False
    if counts[0] > 0:
        raise RuntimeError(f"after the update of iteration {iteration}, {int(counts[0].item())} ranks hold other "
                           "parameters than rank 0")
    return True


# Copied from ppo.py
def agree_on_signal(signum: Optional[int], device: torch.device) -> Optional[int]:
    """A stop signal that reached any rank stops every rank after the same iteration."""
    if world_size() == 1:
        return signum
    received = torch.tensor([signum or 0], device=device)
    dist.all_reduce(received, op=dist.ReduceOp.MAX)
    return int(received.item()) or None


# Copied from ppo.py
def gather_objects(obj) -> list:
    """Every rank's obj (plain data and CPU tensors), in rank order."""
    if world_size() == 1:
        return [obj]
    objects = [None] * world_size()
    dist.all_gather_object(objects, obj)
    return objects


# Copied from ppo.py
def gather_episodes(episodes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every rank's finished episodes (metric -> values), for rank 0's logs."""
    if world_size() == 1:
        return episodes
    per_rank = gather_objects({key: values.cpu() for key, values in episodes.items()})
    return {key: torch.cat([rank_episodes[key] for rank_episodes in per_rank if key in rank_episodes])
            for key in dict.fromkeys(key for rank_episodes in per_rank for key in rank_episodes)}


# ---------------------------------------------------------------------------------------------
# Compiling, signals, the command line
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
def compile_unless_unavailable(fn, enabled: bool):
    """torch.compile(fn) under --compile, else fn. Where compiling fails (the CPU backend needs a C++ compiler; some
    Python versions have no torch.compile), one line says so and fn runs eagerly from then on."""
    if not enabled:
        return fn
    compiled = None

    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is not fn:
            try:
                compiled = compiled or torch.compile(fn)
                return compiled(*args, **kwargs)
            except Exception as e:  # whatever compiling raised: an error of fn itself raises again below
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                print(f"\nwarning: --compile: torch.compile failed ({reason}); running eagerly", file=sys.stderr)
                compiled = fn
        return fn(*args, **kwargs)
    return call


# Copied from ppo.py
class StopSignal:
    """SIGINT/SIGTERM end the run at the next iteration boundary, after a checkpoint; a second signal exits at once."""

    def __init__(self):
        self.signum: Optional[int] = None
        self.previous_handlers = {signum: signal.signal(signum, self.handle)
                                  for signum in (signal.SIGINT, signal.SIGTERM)}

    def restore(self):
        """Give the signals back to whoever had them, e.g. a program that called cli() in-process."""
        for signum, handler in self.previous_handlers.items():
            signal.signal(signum, handler)

    def handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\n{signal.Signals(signum).name} received: stopping after this iteration and saving a checkpoint",
              file=sys.stderr)


# Copied from ppo.py
def cli(argv: Optional[list[str]] = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        return main(args)
    except (UserError, OSError) as e:  # OSError: a run directory that cannot be written, a full disk
        rank, _, num_ranks, _ = torchrun_ranks()
        print(f"error: {e}" if num_ranks == 1 else f"error (rank {rank}): {e}", file=sys.stderr)
        return 2 if isinstance(e, UserError) else 1
    except (MemoryError, torch.OutOfMemoryError) as e:  # the checkpoints written before it stay as they were
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: out of memory ({reason}): run fewer or smaller envs, or a smaller batch or network",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except AttributeError as e:
        if not isinstance(getattr(e, "obj", None), Args):
            raise
        # a copy that removed a flag from Args: the line that still reads it
        where = [f"line {frame.lineno} ({frame.name})" for frame in traceback.extract_tb(e.__traceback__)
                 if frame.filename == __file__] or ["a line"]
        rank, _, num_ranks, _ = torchrun_ranks()
        print(f"error{'' if num_ranks == 1 else f' (rank {rank})'}: {TRAINER}.py's Args has no {e.name}, which "
              f"{where[-1]} reads: keep the flag in Args, or change what reads it", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
