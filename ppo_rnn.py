"""Recurrent PPO (LSTM or GRU) for GPU-vectorized ManiSkill tasks and any Gymnasium environment, in one file.

    python ppo_rnn.py --env_id=PickCube-v1                               # ManiSkill, GPU sim when CUDA is there
    python ppo_rnn.py --env_id=pomdp:CartPoleNoVel-v1 --num_envs=8 --num_steps=64 --num_minibatches=4  # any Gym id
    python ppo_rnn.py --env_id=pomdp:CartPoleNoVel-v1 --num_envs=8 --num_steps=64 --num_minibatches=4 --num_seeds=5
    python ppo_rnn.py --resume runs/RUN_NAME                             # continue an interrupted run
    torchrun --standalone --nproc_per_node=4 ppo_rnn.py --env_id=PickCube-v1   # data parallel: 4 GPUs, 4 x 512 envs

ppo.py with a recurrent policy: `diff ppo.py ppo_rnn.py` shows what recurrence changes. The recurrent state is carried
from step to step (and across rollouts), zeroed where an episode starts, and stored at the start of each sequence of
--seq_len steps; the update replays whole sequences from their stored states, resetting where the rollout reset. A
finished episode's V(final obs) comes from that episode's own state. Everything happens on torch tensors on the
learner's device: rollout, final-value bootstrapping, GAE, update. The file reads top to bottom: Args; the Agent; ALGO
LOGIC (rollout(), compute_advantages(), ppo_loss(), update(), PPOOptimizer with both learning-rate schedules);
train(), the loop that runs them inside a Run (below the divider: logs, evaluation, checkpoints, signals); the run's
settings (settings(), seed_process(), the envs' kwargs, env_action(), what the critic sees). Above the "Plumbing"
divider stands what an idea changes; below it stand many seeds in one process (--num_seeds), env adapters, run
directories, checkpoints and resume, collectives, signals and validation, which decide numbers too (what the envs
return, dtypes, time limits, what a resume restores): a change there is a refactor, checked to the bit by
benchmarks/same_numbers.py.
A copy (cp ppo_rnn.py my_idea.py) is a trainer of its own: runs/ENV__my_idea__SEED__TIME, its own resume and
evaluation. Docs: docs/recurrent.md (flags, examples), docs/ppo.md (the contract below at length), docs/bootstrap.md,
docs/checkpoints.md.

A copy's contract (python scripts/verify_copy.py my_idea.py checks it in short runs), ppo.py's with sequences:
- Where to change what: the loss, ppo_loss(); advantages and returns, compute_advantages() (bootstrapping at episode
  ends: rollout()); the memory, RecurrentCore; the distribution and the network, Agent (get_action_and_value()
  samples and scores actions, get_action(deterministic=True) is what evaluation and export act with); what the envs
  receive, env_action(); the optimizer's step, the early stop and the learning rate, PPOOptimizer; what is logged,
  the statistics update() returns.
- Shapes: rollout tensors are (num_steps, num_envs, ...), the env's action masks among them (buf.action_masks,
  booleans (..., logits), or None, docs/ppo.md); the Agent takes sequences (batch, time, ...), as
  nn.LSTM(batch_first=True) does, with the state before their first step, (num_layers, batch, state_size), and their
  episode starts (batch, time): the rollout steps sequences of one step, update() replays minibatches of the
  rollout's sequences (num_envs * num_steps / seq_len, seq_len, ...); ppo_loss() reduces each term over its steps,
  the last two dimensions as rows (.flatten(-2), .mean(-1)). Under --num_seeds N everything carries a leading seed
  dimension: rollout tensors (num_steps, N, num_envs, ...), sequences, states and minibatches (N, ...), the Agent's
  parameters and buffers (N, ...) (stack_seeds), one value per seed of each statistic. Code written for one seed
  batches where it reduces over the last dimensions, indexes parameters and buffers from the end
  (self.mean[..., None, :]) and compares statistics elementwise (torch.where); where it does not, the first
  iteration stops with one error line naming the rule.
  Under --pbt_interval the settings a population searches (args.learning_rate, args.gamma, ...: --pbt_space) hold
  one value per member, each meeting its member's part of what it multiplies: use them in tensor arithmetic, never as
  Python numbers (float(), if).
- Random draws: the policy draws with torch.normal, torch.randn_like, torch.bernoulli, torch.multinomial or a Normal,
  Categorical or Bernoulli's sample(); under --num_seeds each seed's from its own generator (PerSeedDraws), any other
  refused.
- State: a copy's own state lives in the Agent, in one place, __init__: modules, parameters, buffers and optimizers
  of its own, each stepping in its own phase after PPO's step (ppo.py's docstring shows one; PPOOptimizer steps
  whatever PPO's loss reaches). Checkpoints save all of it with the PPO optimizer's state, the reward normalizer and
  the random streams; --resume restores it, --num_seeds gives each seed its own, ppo_eval.py loads it. Nothing else
  is state: what else an update or evaluation changes stops the run with one error line (ppo.py's docstring). The
  recurrent state of the envs' episodes is not saved: a resumed run starts new episodes, from a zero state.
- What an exported policy computes (ppo_eval.py --export): from a batch of observations, recurrent states and
  episode starts (and action masks, where the env gives them), env_action() of get_action(normalize_obs(obs)[:, None],
  state, episode_start[:, None], deterministic=True, action_mask=action_mask[:, None]), one step, and the next state;
  env_action() may read the envs' single_action_space, action_low, action_high, action_start.
"""

from __future__ import annotations

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

CHECKPOINT_FORMAT = 2
# The file's own name: a copy (cp ppo_rnn.py my_idea.py) names its runs after itself, and its checkpoints say which
# file wrote them, so that neither this file nor ppo_eval.py mistakes a copy's runs for this file's.
TRAINER = Path(__file__).stem
# The file's text as it was imported: each run directory keeps it (keep_source) and each checkpoint names it by hash,
# so that a run can be told from, and evaluated with, the code that trained it.
SOURCE = Path(__file__).read_bytes()
SOURCE_SHA256 = hashlib.sha256(SOURCE).hexdigest()
CPU_WORKERS_PER_CORE = 4
GLOBAL_DRAW_WATCH_STEPS = 1000  # --num_seeds: the first resets and steps of Gymnasium envs watched (SeedBlocks)
# The flags that shape the network: a checkpoint's weights fit only a network built with the same.
NETWORK_FIELDS = ("norm_obs", "norm_value", "critic_obs", "activation", "rnn_type", "rnn_hidden_size", "rnn_num_layers",
                  "shared_rnn")
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
    """name of the run; runs/{exp_name} (default: {env_id}__ppo_rnn__{seed}__{unix time})"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the environments)"""
    num_seeds: int = 1
    """train seeds seed, seed+1, ..., seed+num_seeds-1 in this one process, each a run of its own in
    runs/{run_name}/{run_name}__seed{seed}, as a run of that seed alone would train (docs/ppo.md); an env that draws
    from Python's, numpy's or torch's global random generator shares it between the seeds (a warning says so)"""
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

    env_id: str = "PickCube-v1"
    """ManiSkill task id, Gymnasium id, or "module:EnvId" for an env registered on import of module"""
    max_episode_steps: Optional[int] = None
    """the episodes' time limit (None: the task's own)"""
    sim_backend: Literal["auto", "gpu", "cpu"] = "auto"
    """ManiSkill simulation backend; auto = gpu when CUDA is available. Ignored for other Gymnasium envs"""
    control_mode: Optional[str] = "pd_joint_delta_pos"
    """ManiSkill control mode (None: the task's default)"""
    num_envs: int = 512
    """number of parallel training environments (of each torchrun process)"""
    async_envs: bool = False
    """Gymnasium envs: step training envs in worker processes (steps over ~0.1 ms); ManiSkill's CPU envs always are"""
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
    """normalize observations with running mean/std (float64 statistics, saved in checkpoints)"""
    norm_reward: bool = False
    """divide rewards by a running std of the discounted return, clip to +-10 (SB3's VecNormalize, CleanRL's MuJoCo)"""
    norm_value: bool = False
    """the critic predicts standardized returns (running mean/std of the value targets, float64, saved in checkpoints,
    updated before each update); its values are de-standardized for GAE and bootstrapping"""
    critic_obs: bool = False
    """privileged critic: the critic also sees the vector that the env puts in info["critic"] (its full state); the
    actor never does (Gymnasium envs, separate cores; docs/privileged_critic.md)"""
    activation: Literal["tanh", "relu"] = "tanh"
    """the encoder's nonlinearity"""
    log_std_init: float = -0.5
    """the Gaussian policy's initial log-std (CleanRL: 0; zoo's MuJoCo: -2); a loaded checkpoint's trained one wins"""
    bootstrap_at_done: Literal["auto", "always", "truncated", "never"] = "auto"
    """finished episodes that bootstrap from V(final obs): always, truncated (terminations are terminal), never;
    auto: always for ManiSkill tasks, truncated otherwise"""

    rnn_type: str = "lstm"
    """the recurrent layer: lstm or gru"""
    rnn_hidden_size: int = 256
    """width of the encoder's two layers and of each recurrent layer"""
    rnn_num_layers: int = 1
    """number of stacked recurrent layers"""
    shared_rnn: bool = False
    """if toggled, actor and critic share one encoder and RNN (half the compute); else each has its own, as in ppo.py"""

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
    seq_len: Optional[int] = None
    """training sequence length: each env's rollout is cut into sequences of this many steps, replayed from the
    recurrent state stored at their start (None: num_steps, whole rollouts)"""
    num_minibatches: int = 32
    """number of minibatches per epoch (each torchrun process splits its own rollout into this many); each holds
    whole sequences, so it must divide num_envs * num_steps / seq_len"""
    update_epochs: int = 4
    """number of epochs over each rollout"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = False
    """clip the value loss like the policy ratio"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm for gradient clipping"""
    target_kl: Optional[float] = 0.1
    """stop the update of a rollout once a minibatch's approximate KL exceeds this (None: never)"""
    reward_scale: float = 1.0
    """multiply rewards by this before computing advantages"""
    eval_freq: int = 25
    """evaluate every this many iterations, and at the end"""
    save_train_video_freq: Optional[int] = None
    """with capture_video, record a training video every this many iterations"""


# --resume continues one experiment: only the flags that say how long it runs and how it is run, watched and stored
# may change. Any other difference (the task, the algorithm, the evaluation) is another experiment: start it from the
# run's weights with --checkpoint.
# Copied from ppo.py
RESUME_CHANGEABLE_FIELDS = ("total_timesteps", "eval_freq", "checkpoint_freq", "keep_checkpoints", "capture_video",
                            "save_train_video_freq", "save_model", "track", "wandb_project_name", "wandb_entity",
                            "wandb_group", "wandb_tags", "torch_threads", "cuda", "torch_deterministic")


# ---------------------------------------------------------------------------------------------
# Agent: recurrent cores, actor and critic, running normalization
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


# Where the update replays sequences with episode starts inside them in one packed call (cuDNN's). On the CPU,
# torch's packed LSTM backward costs several times a plain call (3.5x, benchmarks/rnn_replay.py), more than a call
# for each stretch between starts: there the replay makes those calls instead.
PACKED_REPLAY_DEVICES = ("cuda",)
# The Agent's sequences are (batch, time, ...): ppo_eval.py's export reads it (earlier copies of ppo_rnn.py have no
# such line, and sequences (time, batch, ...)).
SEQUENCES_BATCH_FIRST = True


class RecurrentCore(nn.Module):
    """A two-layer MLP encoder, then stacked LSTM or GRU layers whose state is zeroed where an episode starts,
    all hidden_size wide (256: ppo.py's width).

    Sequences are (batch, time, ...), as nn.LSTM(batch_first=True) takes them; the state is one tensor (num_layers,
    batch, state_size), an LSTM's h and c side by side. Under --num_seeds each has the seed dimension first.
    """

    def __init__(self, obs_dim: int, activation: str, rnn_type: str, hidden_size: int, num_layers: int):
        super().__init__()
        self.encoder = nn.Sequential(layer_init(nn.Linear(obs_dim, hidden_size)), ACTIVATIONS[activation](),
                                     layer_init(nn.Linear(hidden_size, hidden_size)), ACTIVATIONS[activation]())
        self.lstm = rnn_type == "lstm"
        self.rnn = (nn.LSTM if self.lstm else nn.GRU)(hidden_size, hidden_size, num_layers, batch_first=True)
        for name, param in self.rnn.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.constant_(param, 0.0)
        self.state_size = 2 * hidden_size if self.lstm else hidden_size

    def forward(self, obs: torch.Tensor, state: torch.Tensor, episode_starts: torch.Tensor):
        """obs (B, T, obs_dim); state (num_layers, B, state_size) from before obs[:, 0]; episode_starts (B, T), True
        where obs[:, t] is an episode's first observation. Returns the outputs (B, T, hidden_size) and the state after
        obs[:, -1]."""
        features = self.encoder(obs)
        # zeroed where a sequence starts with an episode: starts (B,) against the state (num_layers, B, size)
        state = torch.where(episode_starts[..., None, :, 0, None], 0.0, state)
        num_steps = episode_starts.shape[-1]
        # (T - 1,): the steps after the first where some sequence (of any seed) starts an episode
        starts_inside = episode_starts[..., 1:].flatten(0, -2).any(0)
        if num_steps == 1 or not starts_inside.any():
            return self.run_rnn(features, state)
        if obs.device.type not in PACKED_REPLAY_DEVICES or features.dim() > 3:  # a packed call runs one network
            # A call for each stretch between two steps where some sequence starts an episode.
            cuts = (starts_inside.nonzero().flatten() + 1).tolist()
            outputs = []
            for begin, end in zip([0] + cuts, cuts + [num_steps]):
                output, state = self.run_rnn(features[..., begin:end, :],
                                             torch.where(episode_starts[..., None, :, begin, None], 0.0, state))
                outputs.append(output)
            return torch.cat(outputs, dim=-2), state
        # An episode that starts inside a sequence is a sequence of its own from a zero state: every piece of every
        # sequence runs in one packed call, however many episodes start.
        batch = episode_starts.shape[0]
        piece_starts = episode_starts.clone()  # (B, T): pieces start with every sequence and every episode
        piece_starts[:, 0] = True
        piece_starts = piece_starts.flatten()
        piece = piece_starts.cumsum(0) - 1  # the piece of each (sequence, step), sequence by sequence
        first = piece_starts.nonzero().flatten()
        position = torch.arange(batch * num_steps, device=obs.device) - first[piece]
        lengths = torch.bincount(piece).cpu()
        padded = features.new_zeros(len(lengths), int(lengths.max()), features.shape[-1])
        padded[piece, position] = features.flatten(0, 1)
        piece_state = state.new_zeros(state.shape[0], len(lengths), state.shape[-1])
        piece_state[:, piece[::num_steps]] = state  # a sequence's first piece continues from its stored state
        output, piece_state = self.run_rnn(
            nn.utils.rnn.pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False), piece_state)
        output = nn.utils.rnn.pad_packed_sequence(output, batch_first=True)[0][piece, position]
        return output.view(batch, num_steps, -1), piece_state[:, piece[num_steps - 1::num_steps]]

    def run_rnn(self, inputs, state: torch.Tensor):
        """inputs: (B, T, hidden_size), or a PackedSequence of B sequences."""
        if self.lstm:
            h, c = state.chunk(2, dim=-1)
            output, (h, c) = self.rnn(inputs, (h.contiguous(), c.contiguous()))
            return output, torch.cat((h, c), dim=-1)
        return self.rnn(inputs, state.contiguous())


# Copied from ppo.py
class RunningMeanStd(nn.Module):
    """Running mean and variance in float64 (parallel-variance merge); buffers, so checkpoints carry them. Rows are
    x's second-to-last dimension: where the buffers have a leading dimension (one statistic per network of a stack),
    x has the same one before its rows."""

    def __init__(self, dim: int, clip: float = 10.0):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, x: torch.Tensor):
        batch_var, batch_mean = torch.var_mean(x.double(), dim=-2, correction=0)
        batch_count = x.shape[-2]
        count = self.count.unsqueeze(-1)
        delta = batch_mean - self.mean
        total = count + batch_count
        self.mean += delta * batch_count / total
        self.var.copy_((self.var * count + batch_var * batch_count + delta**2 * count * batch_count / total) / total)
        self.count.copy_(total.squeeze(-1))

    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + 1e-8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = x.shape[-1]  # the first dims normalize alone too: the actor's part of a --critic_obs observation
        return torch.clamp((x.double() - self.mean[..., None, :dims]) / self.std()[..., None, :dims], -self.clip,
                           self.clip).float()

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() * self.std() + self.mean).float()


# Copied from ppo.py
class RewardNormalizer(nn.Module):
    """Divides rewards by the running std of each env's discounted return (SB3's VecNormalize): the critic then
    learns values of about unit scale whatever the task's reward scale. The return restarts when an episode ends."""

    def __init__(self, num_envs: int | tuple[int, ...], gamma: float, clip: float = 10.0):
        super().__init__()
        self.gamma, self.clip = gamma, clip
        self.return_rms = RunningMeanStd(1)
        # Not saved: a resumed run resets its envs, so their returns start again from 0.
        self.register_buffer("discounted_return", torch.zeros(num_envs, dtype=torch.float64), persistent=False)

    def forward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        self.discounted_return.mul_(self.gamma).add_(reward)
        self.return_rms.update(gather_rows(self.discounted_return[..., None]))  # so that every rank scales alike
        self.discounted_return.masked_fill_(done, 0.0)
        return torch.clamp(reward / torch.sqrt(self.return_rms.var + 1e-8), -self.clip, self.clip).float()


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


class Agent(nn.Module):
    """Actor and critic heads on recurrent cores: one core each, or one shared core (--shared_rnn).

    Every method takes (B, T, ...) sequences with the state from before their first step and the episode starts
    (RecurrentCore's); the rollout steps with T = 1, the update replays sequences of seq_len steps. With --critic_obs
    an observation is the actor's obs_dim dims followed by critic_dim privileged ones, which only the critic's core
    reads.
    """

    def __init__(self, obs_dim: int, action_space: dict, norm_obs: bool, norm_value: bool, activation: str,
                 log_std_init: float, rnn_type: str, rnn_hidden_size: int, rnn_num_layers: int, shared_rnn: bool,
                 critic_dim: int = 0):
        super().__init__()
        self.discrete = action_space["type"] != "Box"
        self.obs_dim = obs_dim
        self.obs_normalizer = RunningMeanStd(obs_dim + critic_dim) if norm_obs else None
        self.value_normalizer = RunningMeanStd(1) if norm_value else None
        self.actor_core = RecurrentCore(obs_dim, activation, rnn_type, rnn_hidden_size, rnn_num_layers)
        self.critic_core = None if shared_rnn else RecurrentCore(obs_dim + critic_dim, activation, rnn_type,
                                                                 rnn_hidden_size, rnn_num_layers)
        self.critic = layer_init(nn.Linear(rnn_hidden_size, 1), std=1.0)
        if self.discrete:
            self.discrete_actions = DiscreteActions(action_space)
            self.actor = layer_init(nn.Linear(rnn_hidden_size, DiscreteActions.num_logits(action_space)), std=0.01)
        else:
            action_dim = action_space["shape"][0]
            self.actor = layer_init(nn.Linear(rnn_hidden_size, action_dim), std=0.01 * np.sqrt(2))
            self.actor_logstd = nn.Parameter(torch.ones(1, action_dim) * log_std_init)
        self.state_shape = (rnn_num_layers, self.actor_core.state_size * (1 if shared_rnn else 2))

    def initial_state(self, num_envs: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(self.state_shape[0], num_envs, self.state_shape[1], device=device)

    # Copied from ppo.py
    def normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.obs_normalizer is None else self.obs_normalizer(obs)

    def cores(self, obs: torch.Tensor, state: torch.Tensor, episode_starts: torch.Tensor):
        """The actor's and the critic's features, and the state after the last step."""
        if self.critic_core is None:
            features, state = self.actor_core(obs, state, episode_starts)
            return features, features, state
        actor_state, critic_state = state.chunk(2, dim=-1)
        actor_features, actor_state = self.actor_core(obs[..., :self.obs_dim], actor_state, episode_starts)
        critic_features, critic_state = self.critic_core(obs, critic_state, episode_starts)
        return actor_features, critic_features, torch.cat((actor_state, critic_state), dim=-1)

    def get_value(self, obs: torch.Tensor, state: torch.Tensor, episode_starts: torch.Tensor) -> torch.Tensor:
        if self.critic_core is None:
            features, _ = self.actor_core(obs, state, episode_starts)
        else:
            features, _ = self.critic_core(obs, state.chunk(2, dim=-1)[1], episode_starts)
        return self.value(features)

    def value(self, features: torch.Tensor) -> torch.Tensor:
        value = self.critic(features).squeeze(-1)  # (batch, time)
        if self.value_normalizer is None:
            return value
        return self.value_normalizer.denormalize(value.flatten(-2)).view_as(value)  # as rows, which it takes

    def get_action(self, obs: torch.Tensor, state: torch.Tensor, episode_starts: torch.Tensor,
                   deterministic: bool = False,
                   action_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        if not deterministic:
            action, _, _, _, state = self.get_action_and_value(obs, state, episode_starts, action_mask=action_mask)
            return action, state
        if self.critic_core is None:
            features, state = self.actor_core(obs, state, episode_starts)
        else:  # acting needs neither the critic's core nor the privileged dims it reads: its state passes unchanged
            actor_state, critic_state = state.chunk(2, dim=-1)
            features, actor_state = self.actor_core(obs[..., :self.obs_dim], actor_state, episode_starts)
            state = torch.cat((actor_state, critic_state), dim=-1)
        logits_or_mean = self.actor(features)
        return (self.discrete_actions.mode(logits_or_mean, action_mask) if self.discrete else logits_or_mean), state

    def get_action_and_value(self, obs: torch.Tensor, state: torch.Tensor, episode_starts: torch.Tensor,
                             action: Optional[torch.Tensor] = None, action_mask: Optional[torch.Tensor] = None):
        actor_features, critic_features, state = self.cores(obs, state, episode_starts)
        value = self.value(critic_features)
        if self.discrete:
            pi = self.discrete_actions.distribution(self.actor(actor_features), action_mask)
            if action is None:
                action = pi.sample()
            return action, pi.log_prob(action), pi.entropy(), value, state
        # torch.distributions.Normal's sample, log_prob and entropy, written out: building its object costs more than
        # the arithmetic at a rollout step's batch size (12% of the training time of one CPU env at CleanRL's
        # settings). The same operations, so the same numbers (tests/test_parts.py).
        mean = self.actor(actor_features)
        std = self.actor_logstd[..., None, :].expand_as(mean).exp()  # the (1, action_dim) of every (batch, time)
        if action is None:
            with torch.no_grad():
                # torch.normal(mean, std)'s numbers (in a new tensor's order) without its check that std >= 0,
                # which waits for a GPU
                action = mean + std * torch.randn_like(mean, memory_format=torch.contiguous_format)
        # Two logs of std, as Normal takes: one shared log would add the entropy's gradient to the log-probability's
        # before dividing by std, which rounds otherwise (with ent_coef > 0).
        logprob = -((action - mean) ** 2) / (2 * std**2) - std.log() - LOG_SQRT_2PI
        entropy = NORMAL_ENTROPY_AT_UNIT_STD + std.log()
        return action, logprob.sum(-1), entropy.sum(-1), value, state


def make_agent(args: Args, envs: TorchVecEnv) -> Agent:
    return Agent(envs.obs_dim - envs.critic_dim, space_to_dict(envs.single_action_space), args.norm_obs,
                 args.norm_value, args.activation, args.log_std_init, args.rnn_type, args.rnn_hidden_size,
                 args.rnn_num_layers, args.shared_rnn, envs.critic_dim)


# ---------------------------------------------------------------------------------------------
# ALGO LOGIC: rollout with final-value bootstrapping, advantages, the clipped-surrogate update
# ---------------------------------------------------------------------------------------------

class RolloutBuffer:
    """One rollout's tensors, (num_steps, num_envs, ...), on the learner's device (a vector env of seed blocks':
    (num_steps, num_seeds, num_envs, ...)). dones[t] marks the episodes that ended with step t; bootstrap_values[t]
    is V(final obs) for those of them that bootstrap, 0 elsewhere. episode_starts[t] marks the episodes that obs[t]
    starts; sequence_states[k] is the recurrent state before step k * seq_len, from which the update replays the k-th
    sequence of each env."""

    def __init__(self, num_steps: int, envs: TorchVecEnv, device: torch.device, seq_len: int,
                 state_shape: tuple[int, int]):
        self.env_dims, self.seq_len = len(envs.batch_shape), seq_len
        self.obs = torch.zeros((num_steps, *envs.batch_shape, envs.obs_dim), device=device)
        action_space = space_to_dict(envs.single_action_space)
        integer = action_space["type"] in ("Discrete", "MultiDiscrete")  # MultiBinary's are Bernoulli's floats
        self.actions = torch.zeros((num_steps, *envs.batch_shape, *action_space.get("shape", [])),
                                   dtype=torch.long if integer else torch.float32, device=device)
        self.logprobs, self.rewards, self.dones, self.values, self.bootstrap_values = (
            torch.zeros((num_steps, *envs.batch_shape), device=device) for _ in range(5))
        self.episode_starts = torch.zeros((num_steps, *envs.batch_shape), dtype=torch.bool, device=device)
        self.action_masks = None if envs.action_mask is None else torch.zeros(
            (num_steps, *envs.action_mask.shape), dtype=torch.bool, device=device)
        *seeds, num_envs = envs.batch_shape
        self.sequence_states = torch.zeros((num_steps // seq_len, *seeds, state_shape[0], num_envs, state_shape[1]),
                                           device=device)

    # Copied from ppo.py
    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """A rollout tensor as the batch's rows, (num_steps * num_envs, ...); seed blocks' as each seed's rows,
        (num_seeds, num_steps * num_envs, ...)."""
        return x.flatten(0, 1) if self.env_dims == 1 else x.transpose(0, 1).flatten(1, 2)

    def sequences(self, x: torch.Tensor) -> torch.Tensor:
        """A rollout tensor as the update's sequences of seq_len steps, (num_steps / seq_len * num_envs, seq_len,
        ...), sequence k * num_envs + i env i's k-th; seed blocks' (num_seeds, ...) as rows() makes them."""
        return self.rows(x.unflatten(0, (-1, self.seq_len)).movedim(1, self.env_dims + 1))


def rollout(agent: Agent, envs: TorchVecEnv, buf: RolloutBuffer, next_obs: torch.Tensor, state: torch.Tensor,
            next_start: torch.Tensor, policy_step, reward_normalizer: Optional[RewardNormalizer], args: Args,
            bootstrap_rule: str):
    """Step the envs num_steps times with the policy (policy_step: get_action_and_value, compiled under
    --compile), filling buf; state is the recurrent state before next_obs, and next_start marks the envs whose
    next_obs starts an episode. Returns the observation, the state and the episode starts after the last step,
    and the finished episodes' metrics (key -> one value per episode)."""
    episodes, ended = defaultdict(list), []
    buf.bootstrap_values.zero_()
    continuing = torch.zeros_like(next_start)[..., None]  # a final observation continues its episode
    for step in range(args.num_steps):
        if step % args.seq_len == 0:
            buf.sequence_states[step // args.seq_len] = state  # the update replays each sequence from here
        # inference_mode, not no_grad: it skips autograd's version and view tracking, a large share of the cost of a
        # rollout step's small ops. Its tensors never reach the update's autograd: they are copied into buf, and the
        # env gets a clamped or shifted copy of the action.
        with torch.inference_mode():
            if agent.obs_normalizer is not None:
                agent.obs_normalizer.update(gather_rows(next_obs))  # so that every rank normalizes alike
            obs = agent.normalize_obs(next_obs)
            # each env's step a sequence of one step: a time dimension after the envs'
            action_mask = None if envs.action_mask is None else envs.action_mask[..., None, :]
            action, logprob, _, value, state = policy_step(obs[..., None, :], state, next_start[..., None],
                                                           action_mask=action_mask)
            action, logprob, value = (x.squeeze(buf.env_dims) for x in (action, logprob, value))
        buf.obs[step], buf.actions[step], buf.logprobs[step], buf.values[step] = obs, action, logprob, value
        buf.episode_starts[step] = next_start
        if buf.action_masks is not None:
            buf.action_masks[step] = envs.action_mask
        next_obs, reward, terminated, truncated, final_obs, finished = envs.step(action)
        done = next_start = terminated | truncated
        if reward_normalizer is not None:
            reward = reward_normalizer(reward, done)
        buf.rewards[step] = reward * args.reward_scale
        buf.dones[step] = done
        if finished is not None:
            if bootstrap_rule != "never":
                with torch.inference_mode():
                    # The ended episodes' own memory: their state after this step, before the reset.
                    final_values = agent.get_value(agent.normalize_obs(final_obs)[..., None, :], state, continuing)
                bootstrap = bootstrap_mask(bootstrap_rule, terminated, truncated)
                buf.bootstrap_values[step] = torch.where(bootstrap, final_values[..., 0], 0.0)
            ended.append(done)
            for key, values in finished.items():
                episodes[key].append(values)
    ended = torch.stack(ended) if ended else None  # selected once a rollout, not each step: it waits for the device
    episodes = {key: torch.stack(values)[ended] for key, values in episodes.items()}
    return next_obs, state, next_start, episodes


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


def ppo_loss(agent: Agent, args: Args, obs, states, starts, actions, old_logprobs, advantages, returns, old_values,
             action_masks=None):
    """The clipped surrogate, value and entropy terms of one minibatch of sequences, replayed from their stored
    states, each reduced over its steps (the last two dimensions, as rows); its log-ratios and ratios, detached."""
    _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(obs, states, starts, actions,
                                                                     action_mask=action_masks)
    newlogprob, entropy, newvalue, old_logprobs, advantages, returns, old_values = (
        x.flatten(-2) for x in (newlogprob, entropy, newvalue, old_logprobs, advantages, returns, old_values))
    logratio = newlogprob - old_logprobs
    ratio = logratio.exp()
    if args.norm_adv:
        advantages = (advantages - advantages.mean(-1, keepdim=True)) / (advantages.std(-1, keepdim=True) + 1e-8)
    clipped_ratio = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean(-1)
    if agent.value_normalizer is not None:  # the loss of standardized values; each term is a difference of values
        value_std = agent.value_normalizer.std().float()
        newvalue, returns, old_values = newvalue / value_std, returns / value_std, old_values / value_std
    if args.clip_vloss:
        v_clipped = old_values + torch.clamp(newvalue - old_values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean(-1)
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean(-1)
    return (pg_loss, v_loss, entropy.mean(-1)), logratio.detach(), ratio.detach()


def update(agent: Agent, optimizer: PPOOptimizer, buf: RolloutBuffer, advantages: torch.Tensor,
           returns: torch.Tensor, update_losses, args: Args) -> dict:
    """update_epochs epochs of minibatch steps over the rollout's sequences, stopped before the step of the first
    minibatch whose approximate KL exceeds target_kl. update_losses is ppo_loss with agent and args bound (compiled
    under --compile). Returns the statistics to log: the losses of the last minibatch that stepped, the KL of the
    last minibatch (the one that stopped the update if one did). Under --num_seeds each holds one value per seed
    (SeedOptimizer)."""
    b_obs, b_starts, b_actions, b_logprobs, b_advantages, b_returns, b_values = (buf.sequences(x) for x in (
        buf.obs, buf.episode_starts, buf.actions, buf.logprobs, advantages, returns, buf.values))
    b_states = buf.rows(buf.sequence_states.transpose(-3, -2))  # (sequences, num_layers, state_size)
    b_action_masks = None if buf.action_masks is None else buf.sequences(buf.action_masks)
    num_sequences = b_returns.shape[-2]
    stats, clipfracs = {}, []
    for mb in optimizer.minibatches(num_sequences, num_sequences // args.num_minibatches, args.update_epochs):
        mb_action_masks = None if b_action_masks is None else b_action_masks[mb]
        (pg_loss, v_loss, entropy_loss), logratio, ratio = update_losses(
            b_obs[mb], b_states[mb].transpose(-3, -2), b_starts[mb], b_actions[mb], b_logprobs[mb], b_advantages[mb],
            b_returns[mb], b_values[mb], mb_action_masks)
        with torch.no_grad():
            old_approx_kl, approx_kl = mean_over_ranks(
                torch.stack([(-logratio).mean(-1), ((ratio - 1) - logratio).mean(-1)]))
            if "losses/first_minibatch_ratio_error" not in stats:
                stats["losses/first_minibatch_ratio_error"] = (ratio - 1.0).abs().amax(-1)
            for key, value in (("losses/old_approx_kl", old_approx_kl), ("losses/approx_kl", approx_kl)):
                stats[key] = optimizer.stepping_or(value, stats.get(key, torch.nan))
        if args.target_kl is not None and optimizer.stop(approx_kl > args.target_kl):
            break
        clipfracs.append(optimizer.stepping_or(((ratio - 1.0).abs() > args.clip_coef).float().mean(-1), torch.nan))
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

        optimizer.zero_grad()
        loss.sum().backward()  # seeds' losses are independent: each seed's parameters get its own loss's gradient
        optimizer.step(loss, args.max_grad_norm)
        if args.lr_schedule == "adaptive":
            optimizer.adapt_learning_rates(approx_kl, args)
        for key, value in (("losses/policy_loss", pg_loss), ("losses/value_loss", v_loss),
                           ("losses/entropy", entropy_loss)):
            stats[key] = optimizer.stepping_or(value.detach(), stats.get(key, torch.nan))
    if clipfracs:  # empty when the first minibatch already exceeded target_kl
        stats["losses/clipfrac"] = torch.stack(clipfracs).nanmean(0)
    b_returns, b_values = buf.rows(returns), buf.rows(buf.values)
    var_y = b_returns.var(-1)
    stats["losses/explained_variance"] = torch.where(var_y == 0, float("nan"),
                                                     1 - (b_returns - b_values).var(-1) / var_y)
    return {**stats, **optimizer.stats()}


# Copied from ppo.py
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
        grad_norm = nn.utils.clip_grad_norm_(self.param_groups[0]["params"], max_grad_norm)
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


# ---------------------------------------------------------------------------------------------
# The training loop and evaluation
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
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
    reward_normalizer = (stack_seeds([RewardNormalizer(args.num_envs, args.gamma) for _ in range(args.num_seeds)])
                         .to(setup.device) if args.norm_reward else None)
    policy_step = compile_unless_unavailable(policy_step_of(agent, args, envs), args.compile)
    update_losses = compile_unless_unavailable(functools.partial(ppo_loss, agent, args), args.compile)
    update_step = update_step_of(agent, args, envs)  # update(); --num_seeds: its first call checked (plumbing)
    with Run(args, setup, envs, eval_envs, agent, optimizer, reward_normalizer, resume_state, init_state) as run:
        # after the reset, which gives the first action masks
        buf = RolloutBuffer(args.num_steps, envs, setup.device, args.seq_len, agent.state_shape)
        next_obs = run.next_obs
        # Episodes run on across rollouts, and so does their memory; the envs' first observations start episodes.
        next_start = torch.ones(envs.batch_shape, dtype=torch.bool, device=setup.device)
        state = agent.initial_state(args.num_envs, setup.device).expand(*envs.batch_shape[:-1], -1, -1, -1)
        for iteration in run.iterations():
            optimizer.schedule_learning_rate(iteration, setup.num_iterations, args)
            with run.timed("time/rollout_time"):
                agent.eval()
                next_obs, state, next_start, episodes = rollout(agent, envs, buf, next_obs, state, next_start,
                                                                policy_step, reward_normalizer, args,
                                                                setup.bootstrap_rule)
                with torch.no_grad():
                    next_value = agent.get_value(agent.normalize_obs(next_obs)[..., None, :], state,
                                                 next_start[..., None])[..., 0]
                    advantages = compute_advantages(buf.rewards, buf.values, buf.dones, buf.bootstrap_values,
                                                    next_value, args.gamma, args.gae_lambda, args.finite_horizon_gae)
                    returns = advantages + buf.values
                    if agent.value_normalizer is not None:  # standardize the critic's targets by every rank's
                        agent.value_normalizer.update(gather_rows(buf.rows(returns)[..., None]))
            with run.timed("time/update_time"):
                agent.train()
                stats = update_step(agent, optimizer, buf, advantages, returns, update_losses, args)
            run.end_iteration(stats, episodes)  # TRY NOT TO MODIFY: checks, logs, evaluation, checkpoints, signals
    return run.status


def evaluate(agent: Agent, eval_envs: TorchVecEnv, num_eval_steps: int, seed: Optional[int],
             episodes_per_env: Optional[torch.Tensor] = None, deterministic: bool = True) -> dict[str, torch.Tensor]:
    """Env i contributes its first episodes_per_env[i] episodes (default: one each) that finish within num_eval_steps
    steps; actions are the policy's mode unless deterministic=False. One value per counted episode, in the order
    they finished, and "episodes", their number.

    Counting every finished episode would weigh envs that fail early many times over those that last. Each eval env
    carries its own recurrent state, zeroed where its episodes start; the training envs' state is not touched.
    """
    finished_metrics = defaultdict(list)
    if episodes_per_env is None:
        episodes_per_env = torch.ones(eval_envs.num_envs, dtype=torch.long)
    quota = episodes_per_env.to(eval_envs.device)
    counted = torch.zeros_like(quota)
    obs = eval_envs.reset(seed=seed)
    state = agent.initial_state(eval_envs.num_envs, eval_envs.device)
    episode_start = torch.ones(eval_envs.num_envs, dtype=torch.bool, device=eval_envs.device)
    for _ in range(num_eval_steps):
        with torch.no_grad():
            action_mask = None if eval_envs.action_mask is None else eval_envs.action_mask[:, None]
            action, state = agent.get_action(agent.normalize_obs(obs)[:, None], state, episode_start[:, None],
                                             deterministic, action_mask=action_mask)
        obs, _, terminated, truncated, _, finished = eval_envs.step(action[:, 0])
        done = episode_start = terminated | truncated
        if finished is not None:
            wanted = done & (counted < quota)
            for key, value in finished.items():
                finished_metrics[key].append(value[wanted])
            counted += wanted
            if (counted == quota).all():
                break
    eval_envs.flush_video()
    metrics = {key: torch.cat(values) for key, values in finished_metrics.items()}
    metrics["episodes"] = counted.sum(dtype=torch.float32).reshape(1)
    return metrics


# Copied from ppo.py
def episode_means(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {key: values.float().mean().item() for key, values in metrics.items() if values.numel() > 0}


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
    schedule, and the update's sequences the whole rollout unless --seq_len; and what follows from them (Setup's
    fields): the bootstrap rule (auto: always for ManiSkill tasks, whose defaults are tuned with it, truncated
    otherwise; docs/bootstrap.md), the evaluation's length (the time limit unless --num_eval_steps) and the iterations
    of num_ranks processes."""
    args = dataclasses.replace(
        args, max_episode_steps=time_limit if args.max_episode_steps is None else args.max_episode_steps,
        lr_schedule="linear" if args.anneal_lr else args.lr_schedule,
        seq_len=args.num_steps if args.seq_len is None else args.seq_len)
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


# Copied from ppo.py
def maniskill_env_kwargs(args: Args, num_envs: int, device: torch.device, evaluation: bool) -> tuple[dict, bool]:
    """gym.make's kwargs for a ManiSkill task, and ignore_terminations (--no_partial_reset: episodes run to the time
    limit). The simulation runs on the learner's GPU (each torchrun rank's own) or on the CPU; CPU envs beyond one are
    worker processes, whose unseeded resets (every autoreset) would draw on an unseeded torch stream:
    enhanced_determinism draws their seeds from the env's own, seeded, stream instead."""
    gpu = resolve_sim_backend(args.sim_backend) == "gpu"
    on_device = "" if device.index is None else f":{device.index}"
    env_kwargs = dict(obs_mode="state", sim_backend=f"physx_cuda{on_device}" if gpu else "physx_cpu",
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


# Copied from ppo.py
def env_action(envs: TorchVecEnv, action: torch.Tensor) -> torch.Tensor:
    """The action the envs receive: a Box action clamped to the space's bounds (its log-prob stays the sampled
    one's); a discrete one shifted from the agent's count from 0 to the space's start."""
    if isinstance(envs.single_action_space, gym.spaces.Box):
        return torch.clamp(action, envs.action_low, envs.action_high)
    return action.long() + envs.action_start


# Copied from ppo.py
class CriticObservation(gym.Wrapper):
    """--critic_obs: the vector that the env puts in info["critic"] at reset and at every step (its full state),
    appended to the observation; the agent's actor reads the observation's own dims only."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        _, info = env.reset()
        if "critic" not in info:
            raise UserError(f"--critic_obs needs an env that puts its critic's vector in info['critic'] at reset and "
                            f"every step, and {env.spec.id if env.spec else env} does not: docs/privileged_critic.md")
        self.critic_dim = np.asarray(info["critic"]).size
        unbounded = np.full(self.critic_dim, np.inf)
        self.observation_space = gym.spaces.Box(np.append(space.low.ravel(), -unbounded).astype(np.float32),
                                                np.append(space.high.ravel(), unbounded).astype(np.float32))

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self.with_critic(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.with_critic(obs, info), reward, terminated, truncated, info

    @staticmethod
    def with_critic(obs, info: dict) -> np.ndarray:
        return np.concatenate([np.ravel(obs), np.ravel(info["critic"])]).astype(np.float32)


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


# Copied from ppo.py
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
                            f"rows alone (.mean(-1)) ({TRAINER}.py's docstring, 'A copy's contract')")
        give_seeds_gradients([group["params"] for group in self.param_groups], self.stacked, self.going)
        grad_norms = torch.stack([nn.utils.clip_grad_norm_(group["params"], max_norm) for group, go, max_norm in
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


# Copied from ppo.py
def main(args: Args) -> int:
    rank, local_rank, num_ranks, local_ranks = torchrun_ranks()
    maniskill, time_limit = find_env(args.env_id)
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
            setup = Setup(run_name, run_dir, device, rank, **derived,
                          checkpoint_trainer=init_state and init_state.get("trainer"),
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
FLAG_RULES = (
    (("exp_name",), plain_name, "a plain directory name under runs/ (no '/', not '..')"),
    (("env_id",), bool, "a task id"),
    (("num_envs", "num_eval_envs", "num_steps", "num_minibatches", "update_epochs", "eval_freq", "total_timesteps",
      "num_seeds", "rnn_hidden_size", "rnn_num_layers"), lambda value: value >= 1, "positive"),
    (("rnn_type",), lambda value: value in ("lstm", "gru"), "lstm or gru"),
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
    (("seq_len",), lambda value: value is None or value >= 1, "positive (or None: num_steps)"),
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
    if args.critic_obs and maniskill:
        raise UserError(f"--critic_obs gives the critic a ManiSkill task's state, which {TRAINER}.py's actor already "
                        "sees; for a camera actor with a state critic use ppo_rgb.py --critic_obs")
    if args.critic_obs and args.shared_rnn:
        raise UserError("--critic_obs gives the critic privileged inputs, which a core shared with the actor would "
                        "pass on to it: drop --shared_rnn")
    if not maniskill and torch_native_id(args.env_id):
        refuse_torch_native_flags(args)
    if args.checkpoint is not None and args.resume is not None:
        raise UserError("--checkpoint starts a new run from saved weights and --resume continues a run; give one")
    if args.num_steps % args.seq_len != 0:
        raise UserError(f"--seq_len={args.seq_len} does not divide --num_steps={args.num_steps}; sequences are cut "
                        "from each env's rollout, so pick a divisor of num_steps")
    batch_size = args.num_envs * args.num_steps
    num_sequences = batch_size // args.seq_len
    if num_sequences % args.num_minibatches != 0:
        raise UserError(f"the rollout's {num_sequences} sequences (num_envs*num_steps/seq_len) do not split into "
                        f"--num_minibatches={args.num_minibatches} minibatches of whole sequences; pick "
                        "num_minibatches dividing it, or a shorter --seq_len")
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
            minibatches = max(d for d in range(1, args.num_minibatches + 1)
                              if num_envs * args.num_steps // args.seq_len % d == 0)
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
# Environments: one torch interface over ManiSkill's GPU/CPU vector envs and Gymnasium vector envs
# ---------------------------------------------------------------------------------------------

# Copied from ppo.py
def find_env(env_id: str) -> tuple[bool, Optional[int]]:
    """Whether env_id is a ManiSkill task, and its time limit (None: none), from the registries before any env is built.

    "module:EnvId" imports module first, so a task that module registers with ManiSkill's @register_env is
    ManiSkill's. ManiSkill registers its tasks with Gymnasium too; an id that Gymnasium knows while ManiSkill is not
    imported is not ManiSkill's, so plain Gymnasium ids are resolved without importing ManiSkill.
    """
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(f"cannot import module {module!r} of env id {env_id!r}: {e} (a module of your own: "
                            "beside this script, or on PYTHONPATH)") from e
    if "mani_skill" in sys.modules or (not module and name not in gym.registry):
        try:
            import mani_skill.envs  # noqa: F401  (registers the ManiSkill tasks)
            from mani_skill.utils.registration import REGISTERED_ENVS
        except ImportError as e:
            if name not in gym.registry:
                raise UserError(f"unknown env id {env_id!r}, and ManiSkill is not importable ({e}); "
                                "pip install mani_skill") from e
        else:
            if name in REGISTERED_ENVS:
                return True, REGISTERED_ENVS[name].max_episode_steps
    try:
        return False, gym.spec(name).max_episode_steps
    except gym.error.Error as e:
        raise UserError(f"unknown env id {env_id!r}: {e}") from e


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


# Copied from ppo.py
def starts_recorded_rollout(step: int, num_steps: int, freq: int) -> bool:
    """Gymnasium RecordVideo's trigger: start a recording at the first step of every freq-th rollout."""
    return step % (num_steps * freq) == 0


# Copied from ppo.py
def build_maniskill_env(env_id: str, num_envs: int, env_kwargs: dict, video_dir: Optional[str],
                        video_trigger, max_steps_per_video: Optional[int],
                        trajectory_path: Optional[Path] = None) -> gym.Env:
    import mani_skill.envs  # noqa: F401
    from mani_skill.utils.wrappers.flatten import FlattenActionSpaceWrapper
    from mani_skill.utils.wrappers.record import RecordEpisode

    refuse_asset_download(env_id)
    env = gym.make(env_id, num_envs=num_envs, **env_kwargs)
    if isinstance(env.action_space, gym.spaces.Dict):
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


# Copied from ppo.py
def build_maniskill_cpu_worker_env(env_id: str, env_kwargs: dict, ignore_terminations: bool,
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
    env = build_maniskill_env(env_id, 1, env_kwargs, video_dir, video_trigger, max_steps_per_video)
    return CPUGymWrapper(env, ignore_terminations=ignore_terminations, record_metrics=True)


# Copied from ppo.py
class ResetEpisodeTrigger:
    """Gymnasium eval videos: record the episode that an explicit reset starts, not those that autoresets start,
    which the end of an evaluation would cut off after a frame or two."""

    def __init__(self):
        self.armed = False

    def __call__(self, episode_id: int) -> bool:
        fired, self.armed = self.armed, False
        return fired


# Copied from ppo.py
def render_without_a_display():
    """Videos render off screen (rgb_array). Without a display, SDL (pygame's, which Gymnasium's classic-control and
    Box2D envs and PettingZoo's MPE draw with) would look for one and print "error: XDG_RUNTIME_DIR is invalid or
    not set", a line that reads as the trainer's own: its dummy driver renders the same frames and prints nothing."""
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


# Copied from ppo.py
def build_gym_env(env_id: str, max_episode_steps: Optional[int], video_dir: Optional[str], video_trigger,
                  video_length: Optional[int], name_prefix: str, critic_obs: bool = False) -> gym.Env:
    if video_dir is None:  # not every env's constructor takes a render_mode
        return observed(gym.make(env_id, max_episode_steps=max_episode_steps), critic_obs)
    render_without_a_display()
    try:
        env = gym.make(env_id, max_episode_steps=max_episode_steps, render_mode="rgb_array")
    except TypeError as e:
        if "render_mode" not in str(e):
            raise
        raise UserError(f"{env_id} takes no render_mode, so it cannot record videos; pass --no_capture_video") from e
    env = observed(env, critic_obs)
    # Rendering dependencies (pygame, a GL context) fail only at the first frame: find out now, not mid-run.
    env.reset()
    env.render()
    return record_video(env, video_dir, video_trigger, video_length, name_prefix)


# Copied from ppo.py
def observed(env: gym.Env, critic_obs: bool) -> gym.Env:
    """A Gymnasium env as the agent observes it, a Box: a Dict observation's "action_mask" goes to info
    (ActionMaskInInfo); other spaces are flattened (a Discrete one one-hot, as Taxi-v4's states); --critic_obs appends
    info["critic"]."""
    if isinstance(env.observation_space, gym.spaces.Dict) and "action_mask" in env.observation_space.spaces:
        env = ActionMaskInInfo(env)
    if not isinstance(env.observation_space, gym.spaces.Box):
        env = gym.wrappers.FlattenObservation(env)
    return CriticObservation(env) if critic_obs else env


# Copied from ppo.py
class ActionMaskInInfo(gym.Wrapper):
    """Action masks as PettingZoo gives them, a Dict observation's "action_mask" entry, moved to where Gymnasium gives
    them, info["action_mask"]: the observation is the Dict's other entries."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({key: space for key, space in env.observation_space.spaces.items()
                                                  if key != "action_mask"})

    def reset(self, **kwargs):
        return self.moved(*self.env.reset(**kwargs))

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        obs, info = self.moved(obs, info)
        return obs, reward, terminated, truncated, info

    @staticmethod
    def moved(obs: dict, info: dict) -> tuple:
        rest = {key: value for key, value in obs.items() if key != "action_mask"}
        return rest, {**info, "action_mask": obs["action_mask"]}


# Copied from ppo.py
def record_video(env: gym.Env, video_dir: str, video_trigger, video_length: Optional[int], name_prefix: str) -> gym.Env:
    """Gymnasium's RecordVideo. It numbers a process's videos from 0: a resumed run's take a prefix of their own
    (eval2-episode-0.mp4) beside the earlier ones, whose folder it need not warn of."""
    if isinstance(video_trigger, ResetEpisodeTrigger):
        trigger = dict(episode_trigger=video_trigger)
    else:
        trigger = dict(step_trigger=video_trigger, video_length=video_length)
    taken = {path.name.split("-")[0] for path in Path(video_dir).glob("*.mp4")}
    name_prefix = next(name for name in (name_prefix, *(f"{name_prefix}{k}" for k in range(2, len(taken) + 2)))
                       if name not in taken)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
        return gym.wrappers.RecordVideo(env, video_dir, name_prefix=name_prefix, disable_logger=True, **trigger)


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


# Copied from ppo.py
class TorchVecEnv:
    """Tensors in, tensors out, on the learner's device, whatever runs the simulation.

    step(action) returns (next_obs, reward, terminated, truncated, final_obs, finished):
    next_obs is already reset where an episode ended; final_obs is the true last observation of those
    episodes (next_obs elsewhere); finished maps metric names (return, episode_len, and ManiSkill's
    success_once, success_at_end, fail_once, fail_at_end) to one value per env, that of the episode it ended in this
    step where terminated | truncated, or is None when the env says that none ended (a torch-native env need not:
    reading whether any ended would wait for its device). Under --critic_obs the last critic_dim dims of an
    observation are the critic's. action_mask: the actions that the last observation allows, (num_envs, logits)
    booleans (read_action_mask()), or None where the env gives no mask.
    """

    EPISODE_KEYS = ("success_once", "success_at_end", "fail_once", "fail_at_end")

    def __init__(self, env: gym.vector.VectorEnv, device: torch.device, torch_native: bool,
                 reset_video_trigger: Optional[ResetEpisodeTrigger] = None,
                 video_recorder: Optional[gym.Wrapper] = None, critic_dim: int = 0, env_id: str = "the env"):
        self.env, self.env_id = env, env_id
        self.critic_dim = critic_dim
        self.reset_video_trigger = reset_video_trigger
        self.video_recorder = video_recorder
        self.device = device
        self.torch_native = torch_native
        self.sim_device = torch.device(env.device) if torch_native else torch.device("cpu")
        self.random_states: Optional[list[torch.Tensor]] = None
        self.num_envs = env.num_envs
        self.batch_shape = (self.num_envs,)  # of the tensors in and out
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        if not isinstance(self.single_observation_space, gym.spaces.Box):
            raise UserError(f"observation space {self.single_observation_space} is not supported; {TRAINER}.py "
                            "needs a Box observation, or one that gym.spaces.flatten_space makes a Box")
        space = self.single_action_space
        kinds = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
        one_dimensional = len(space.shape) == (0 if isinstance(space, gym.spaces.Discrete) else 1)
        if not isinstance(space, kinds) or not one_dimensional:
            raise UserError(f"action space {space} is not supported; {TRAINER}.py handles Box, Discrete, MultiDiscrete "
                            "and MultiBinary actions of one dimension")
        if isinstance(space, gym.spaces.Box):
            self.action_low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
            self.action_high = torch.as_tensor(space.high, dtype=torch.float32, device=device)
        else:  # the agent's actions count from 0 in each dimension, the env's from start
            self.action_start = torch.as_tensor(getattr(space, "start", 0), dtype=torch.long, device=device)
        # a discrete action's logits in each dimension, and where each dimension's start in an action mask
        self.nvec = np.atleast_1d(getattr(space, "nvec", getattr(space, "n", 0))).tolist()
        self.mask_offsets = torch.as_tensor(np.cumsum([0, *self.nvec[:-1]]), device=device)
        self.obs_dim = int(np.prod(self.single_observation_space.shape))
        self.episode_return = torch.zeros(self.num_envs, dtype=torch.float64, device=device)
        self.episode_length = torch.zeros(self.num_envs, dtype=torch.long, device=device)
        self.action_mask: Optional[torch.Tensor] = None

    def _obs(self, obs) -> torch.Tensor:
        return self._to_device(obs, torch.float32, (-1, self.obs_dim))

    def _to_device(self, x, dtype: torch.dtype, shape: tuple = (-1,)) -> torch.Tensor:
        return torch.as_tensor(x).to(self.device, dtype).reshape(shape)

    def reset(self, seed: Optional[int | list[int]] = None) -> torch.Tensor:
        if self.reset_video_trigger is not None:
            self.reset_video_trigger.armed = True
        obs, info = self.env.reset(seed=seed)
        self.episode_return.zero_()
        self.episode_length.zero_()
        self.action_mask = self.read_action_mask(info, at_reset=True)
        return self._obs(obs)

    def step(self, action: torch.Tensor):
        self.check_shape(action, "the agent's")  # env_action()'s clamp or shift would broadcast another width
        if self.action_mask is not None:
            self.check_allowed(action)
        action = env_action(self, action)
        self.check_shape(action, "env_action()'s")
        action = action.to(self.env.device) if self.torch_native else action.cpu().numpy()
        obs, reward, terminated, truncated, info = self.env.step(action)
        next_obs = self._obs(obs)
        reward = self._to_device(reward, torch.float32)
        terminated = self._to_device(terminated, torch.bool)
        truncated = self._to_device(truncated, torch.bool)
        self.episode_return += reward
        self.episode_length += 1

        final_obs, finished = next_obs, None
        # Gymnasium's vector envs give final observations where an episode ended (a torch-native one there or every
        # step, as a tensor with its mask: whether any ended is not read), ManiSkill's in "final_observation" and
        # "final_info" when any ended.
        if "final_obs" in info or "final_info" in info:
            done = terminated | truncated
            if self.torch_native:
                ended_obs = info["final_obs"] if "final_obs" in info else info["final_observation"]
                final_obs = torch.where(done[:, None], self._obs(ended_obs), next_obs)
            else:
                ended = info["_final_obs"]
                final_obs = next_obs.clone()
                final_obs[torch.as_tensor(ended, device=self.device)] = self._obs(np.stack(info["final_obs"][ended]))
            finished = {"return": self.episode_return.float(), "episode_len": self.episode_length.float()}
            episode = info.get("final_info", {}).get("episode", {})
            for key in self.EPISODE_KEYS:
                if key in episode:
                    finished[key] = self._to_device(episode[key], torch.float32)
            self.episode_return = torch.where(done, 0.0, self.episode_return)
            self.episode_length = torch.where(done, 0, self.episode_length)
        self.action_mask = self.read_action_mask(info)
        return next_obs, reward, terminated, truncated, final_obs, finished

    def read_action_mask(self, info: dict, at_reset: bool = False) -> Optional[torch.Tensor]:
        """info["action_mask"] (Gymnasium's convention: 1 where an action is allowed; a MultiDiscrete's one array per
        dimension or their concatenation) as (num_envs, logits) booleans, checked to allow an action in every
        dimension; None where the env gives none. A Gymnasium vector env's is its reset's for the envs that reset."""
        given, before, space = "action_mask" in info, self.action_mask is not None, self.single_action_space
        if (before and not given) or (given and not before and not at_reset):
            when = "before and none now" if before else "now and none at reset"
            raise UserError(f"{self.env_id} gave info['action_mask'] {when}: give it at reset and on every step")
        if not given:
            return None
        if not isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            raise UserError(f"{self.env_id} gives info['action_mask'] and its actions are {space}: {TRAINER}.py masks "
                            "Discrete and MultiDiscrete actions")
        mask = info["action_mask"]
        reported = info.get("_action_mask")  # a Gymnasium vector env's: which envs gave one
        if isinstance(reported, np.ndarray) and not reported.all():
            missing = int(np.flatnonzero(~reported)[0])
            raise UserError(f"{self.env_id} gave info['action_mask'] in some envs and none in env {missing}: give it "
                            "at reset and on every step")
        if isinstance(mask, (tuple, list)):  # a torch-native MultiDiscrete's, a tensor per dimension
            mask = torch.cat([torch.as_tensor(dim).reshape(self.num_envs, -1) for dim in mask], -1)
        elif isinstance(mask, np.ndarray) and mask.dtype == object:  # each env's tuple (a MultiDiscrete's) or list
            mask = np.stack([np.hstack(env_mask) for env_mask in mask])
        mask, nvec = torch.as_tensor(mask), self.nvec
        if mask.shape[:1] != (self.num_envs,) or mask[0].numel() != sum(nvec):
            raise UserError(f"{self.env_id}'s info['action_mask'] has shape {tuple(mask.shape)}: one mask of "
                            f"{sum(nvec)} entries per env, for {space} (docs/ppo.md)")
        mask = mask.reshape(self.num_envs, -1).bool()
        allowed = torch.stack([dim.any(-1) for dim in mask.split(nvec, dim=-1)], -1).all(-1)
        if not allowed.all():  # a GPU env's mask waits for the device here
            env = int((~allowed).nonzero()[0])
            raise UserError(f"{self.env_id}'s info['action_mask'] allows no action in env {env} after step "
                            f"{int(self.episode_length[env])} of its episode"
                            f"{'' if len(nvec) == 1 else ' (in one of its dimensions)'}: every state allows one")
        return mask.to(self.device)

    def check_allowed(self, action: torch.Tensor):
        """The agent's actions (counted from 0) are ones their masks allow: a copy whose policy drops the mask stops
        with one error line, not a run that trains on forbidden actions (a GPU env's check waits for the device)."""
        allowed = self.action_mask.gather(1, action.reshape(self.num_envs, -1).long() + self.mask_offsets).all(-1)
        if not allowed.all():
            env = int((~allowed).nonzero()[0])
            raise UserError(f"the agent took action {action[env].tolist()} (counted from 0) in env {env}, which "
                            f"{self.env_id}'s action mask forbids: get_action_and_value() and get_action() give the "
                            "mask to the distribution (DiscreteActions; docs/ppo.md)")

    def check_shape(self, action: torch.Tensor, whose: str):
        """A copy's Agent or env_action() of another width is refused in one line, not broadcast."""
        if action.shape[1:] != self.single_action_space.shape:
            raise UserError(f"{whose} actions have shape {tuple(action.shape[1:])} each, and {self.single_action_space}"
                            f" takes {self.single_action_space.shape}: get_action(), get_action_and_value() and "
                            "env_action() give one action of the space's shape per env")

    def flush_video(self):
        """An evaluation's video saved as it ends, so that it is logged at its step: ManiSkill's RecordEpisode over
        many envs saves one every max_steps_per_video steps only, Gymnasium's RecordVideo at the episode's end, which
        may come after the evaluation's last step (its video would be saved by the next evaluation's reset, the last
        evaluation's after the run's end)."""
        if self.video_recorder is not None:
            self.video_recorder.flush_video()
        elif self.reset_video_trigger is not None and self.env.envs[0].recording:
            self.env.envs[0].stop_recording()

    def close(self):
        self.env.close()


# Copied from ppo.py
def make_envs(args: Args, maniskill: bool, device: torch.device, *, evaluation: bool, run_dir: Path,
              num_eval_steps: int, trajectory_path: Optional[Path] = None) -> TorchVecEnv:
    """The run's envs (make_run_envs). Under --num_seeds, the seeds' training envs are blocks of one vector env
    (SeedBlocks), and each seed evaluates in envs of its own, with its videos in its run directory (EachSeed)."""
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
    return SeedBlocks(envs, args.num_seeds, args.env_id, watch_steps=GLOBAL_DRAW_WATCH_STEPS if in_process else 0)


# Copied from ppo.py
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
        video_trigger = functools.partial(in_recorded_rollout if maniskill else starts_recorded_rollout,
                                          num_steps=args.num_steps, freq=args.save_train_video_freq)
        max_steps_per_video = args.num_steps
    try:
        if maniskill:
            return make_maniskill_envs(args, num_envs, device, evaluation, video_dir, video_trigger,
                                       max_steps_per_video, trajectory_path)
        if torch_native_id(args.env_id):
            return make_torch_native_envs(args, num_envs, device)
        prefix = "eval" if evaluation else "train"
        if evaluation and video_dir is not None:
            video_trigger = ResetEpisodeTrigger()
        env_fns = [functools.partial(build_gym_env, args.env_id, args.max_episode_steps, video_dir if i == 0 else None,
                                     video_trigger, max_steps_per_video, prefix, args.critic_obs)
                   for i in range(num_envs)]
        if args.async_envs and not evaluation:  # evaluation's video trigger must live in this process
            env = gym.vector.AsyncVectorEnv(env_fns, context="forkserver",
                                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        else:
            env = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        critic_dim = env.get_attr("critic_dim")[0] if args.critic_obs else 0
        return TorchVecEnv(env, device, torch_native=False, reset_video_trigger=video_trigger if evaluation else None,
                           critic_dim=critic_dim, env_id=args.env_id)
    except gym.error.DependencyNotInstalled as e:
        hint = "; or pass --no_capture_video" if args.capture_video else ""
        raise UserError(f"{args.env_id} needs an optional dependency: {e}{hint}") from e
    except (gym.error.Error, ImportError) as e:
        raise UserError(f"cannot make env {args.env_id!r}: {e}") from e


# Copied from ppo.py
def refuse_torch_native_flags(args: Args):
    for given, flag, why in (
            (args.capture_video, "--capture_video", "videos are recorded from envs stepped one by one (the "
                                                    "trainers record them by default): pass --no_capture_video"),
            (args.critic_obs, "--critic_obs", "the critic's vector is read from envs stepped one by one"),
            (args.async_envs, "--async_envs", "it steps its whole batch in one call")):
        if given:
            raise UserError(f"{flag} does not apply to {args.env_id}, a torch-native vector env: {why}")


# Copied from ppo.py
def torch_native_id(env_id: str) -> bool:
    """Whether env_id is registered with Gymnasium's vector_entry_point alone: a batch of envs stepped as torch tensors
    (docs/ppo.md, "A torch-native env"). One with an entry_point too, such as CartPole-v1, steps its envs one by one."""
    spec = gym.spec(env_id.rpartition(":")[2])
    return spec.vector_entry_point is not None and spec.entry_point is None


# Copied from ppo.py
def make_torch_native_envs(args: Args, num_envs: int, device: torch.device) -> TorchVecEnv:
    """Under --num_seeds, one env for each seed's block (EnvBlocks)."""
    if args.num_seeds == 1:
        return TorchVecEnv(make_torch_native_env(args, num_envs, device), device, torch_native=True, env_id=args.env_id)
    blocks = [make_torch_native_env(args, num_envs // args.num_seeds, device) for _ in range(args.num_seeds)]
    return TorchVecEnv(EnvBlocks(blocks), device, torch_native=True, env_id=args.env_id)


# Copied from ppo.py
def make_torch_native_env(args: Args, num_envs: int, device: torch.device) -> gym.vector.VectorEnv:
    """The env built on the learner's device, as docs/ppo.md's "A torch-native env" says one is."""
    kwargs = {} if args.max_episode_steps is None else {"max_episode_steps": args.max_episode_steps}
    try:
        env = gym.make_vec(args.env_id, num_envs, vectorization_mode="vector_entry_point", device=device, **kwargs)
    except TypeError as e:
        innermost = e.__traceback__
        while innermost.tb_next is not None:
            innermost = innermost.tb_next
        if not innermost.tb_frame.f_code.co_filename.endswith("registration.py"):  # raised inside the constructor
            raise
        raise UserError(f"cannot make torch-native env {args.env_id!r} ({e}): its constructor takes num_envs, "
                        "device and, where it has a time limit, max_episode_steps (docs/ppo.md)") from e
    kept = torch.device(getattr(env, "device", None) or "meta")
    if kept.type != device.type or (kept.index or 0) != (device.index or 0):  # "cuda" is a process's cuda:0
        raise UserError(f"{args.env_id} has device {getattr(env, 'device', None)!r} after it was built with device="
                        f"{device}: a torch-native env keeps the device it is given in self.device (docs/ppo.md)")
    if env.metadata.get("autoreset_mode") != gym.vector.AutoresetMode.SAME_STEP:
        raise UserError(f"{args.env_id}'s metadata['autoreset_mode'] is {env.metadata.get('autoreset_mode')!r}: "
                        f"{TRAINER}.py bootstraps from final observations, which need AutoresetMode.SAME_STEP "
                        "(docs/ppo.md)")
    return TorchEnvContract(env, args.env_id, check_every=args.num_steps)


# Copied from ppo.py
class TorchEnvContract:
    """A torch-native env's results checked against what the trainers assume of them (docs/ppo.md): tuples of the
    right length, tensors with the batch first, observations of the space's shape, info["final_obs"] on the steps
    where an episode ended. At each call on the host alone (types and shapes, never values), so that a broken rule is
    one error line, not a traceback; whether an episode ended on a step without its final observation, which waits
    for the device, every check_every steps (a rollout's) and at each reset."""

    def __init__(self, env: gym.vector.VectorEnv, env_id: str, check_every: int):
        self.env, self.env_id, self.check_every = env, env_id, check_every
        self.episode_keys: Optional[set[str]] = None  # of info["final_info"]["episode"], the same each step
        self.steps = 0
        self.unreported: Optional[torch.Tensor] = None  # whether an episode ended on a step without info["final_obs"]

    def __getattr__(self, name: str):  # num_envs, device, metadata, spaces: the env's
        return getattr(self.env, name)

    def reset(self, *, seed: Optional[int] = None, options=None):
        self.check_final_obs()
        return self.checked(self.env.reset(seed=seed, options=options), "reset()", ("obs", "info"))

    def step(self, action: torch.Tensor):
        result = self.checked(self.env.step(action), "step()", ("obs", "reward", "terminated", "truncated", "info"))
        if "final_obs" not in result[4]:  # Gymnasium's convention: no episode ended in this step
            ended = (result[2].bool() | result[3].bool()).any()
            self.unreported = ended if self.unreported is None else self.unreported | ended
        self.steps += 1
        if self.steps % self.check_every == 0:
            self.check_final_obs()
        return result

    def check_final_obs(self):
        if self.unreported is not None and self.unreported.item():
            raise UserError(f"{self.env_id}'s step() ended an episode without info['final_obs'], its final "
                            "observation: give it (with the mask info['_final_obs']) on every step where an episode "
                            "ends, or on every step (docs/ppo.md)")
        self.unreported = None

    def checked(self, result, call: str, names: tuple[str, ...]):
        if not isinstance(result, tuple) or len(result) != len(names):
            raise UserError(f"{self.env_id}'s {call} returned {type(result).__name__}, not ({', '.join(names)}) "
                            "(docs/ppo.md)")
        obs, *per_env, info = result
        if not isinstance(info, dict):
            raise UserError(f"{self.env_id}'s {call} returned info {type(info).__name__}, not a dict (docs/ppo.md)")
        leaves = [*self.observation_leaves("obs", obs), *((name, x, ()) for name, x in zip(names[1:], per_env))]
        if call == "step()":
            final_info = info.get("final_info", {})
            episode = final_info.get("episode", {}) if isinstance(final_info, dict) else final_info
            if not isinstance(episode, dict):
                given = "info['final_info']" + ("['episode']" if isinstance(final_info, dict) else "")
                raise UserError(f"{self.env_id}'s step() returned {given} {type(episode).__name__}, not a dict: "
                                "info['final_info']['episode'] is a dict of tensors (docs/ppo.md)")
            if "final_obs" not in info and ("final_info" in info or "_final_obs" in info):
                raise UserError(f"{self.env_id}'s step() returned info['final_info'] or info['_final_obs'] without "
                                "info['final_obs']: give the final observations where episodes end (docs/ppo.md)")
            if "final_obs" in info:  # the finished episodes' metrics are stacked over these steps
                self.episode_keys = set(episode) if self.episode_keys is None else self.episode_keys
                if set(episode) != self.episode_keys:
                    raise UserError(f"{self.env_id}'s step() returned info['final_info']['episode'] with keys "
                                    f"{sorted(episode)}, and {sorted(self.episode_keys)} before: the same on every "
                                    "step that gives info['final_obs'] (docs/ppo.md)")
                leaves += self.observation_leaves("info['final_obs']", info["final_obs"])
            leaves += [(f"info['final_info']['episode'][{key!r}]", x, ()) for key, x in episode.items()]
        for name, x, shape in leaves:
            if not isinstance(x, torch.Tensor) or x.shape != (self.num_envs, *shape):
                given = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise UserError(f"{self.env_id}'s {call} returned {name} {given}, not a tensor of shape "
                                f"{(self.num_envs, *shape)} (docs/ppo.md)")
        return result

    def observation_leaves(self, name: str, obs) -> list[tuple[str, object, tuple]]:
        """(name, tensor, its single space's shape) for each tensor of an observation: a Dict space's by key."""
        space = self.single_observation_space
        if isinstance(space, gym.spaces.Dict):
            if not isinstance(obs, dict):
                raise UserError(f"{self.env_id} returned an observation {type(obs).__name__}, not a dict of "
                                f"{list(space.spaces)} as its Dict space says (docs/ppo.md)")
            return [(f"{name}[{key!r}]", obs.get(key), sub.shape) for key, sub in space.spaces.items()]
        return [(name, obs, space.shape)]

    def close(self):
        self.env.close()


# Copied from ppo.py
class EnvBlocks:
    """--num_seeds on a torch-native env: each seed's block of envs is an env of its own, as a run of that seed alone
    builds it (a torch-native env takes one seed for its whole batch); tensors in and out are concatenated."""

    def __init__(self, blocks: list[gym.vector.VectorEnv]):
        self.blocks, first = blocks, blocks[0]
        self.num_envs = sum(block.num_envs for block in blocks)
        self.device, self.metadata = first.device, first.metadata
        self.single_observation_space, self.single_action_space = (first.single_observation_space,
                                                                   first.single_action_space)

    def reset(self, *, seed: Optional[list[int]] = None, options=None):
        # SeedBlocks gives each env's seed, and a block's first is the seed its run alone resets with
        seeds = [None] * len(self.blocks) if seed is None else seed[::self.blocks[0].num_envs]
        obs, infos = zip(*(block.reset(seed=block_seed) for block, block_seed in zip(self.blocks, seeds)))
        return concatenated(obs), self.action_masks(infos)

    def step(self, action: torch.Tensor):
        steps = [block.step(block_action) for block, block_action in zip(self.blocks, action.chunk(len(self.blocks)))]
        obs, reward, terminated, truncated = (concatenated(x) for x in zip(*(step[:4] for step in steps)))
        infos = [step[4] for step in steps]
        info = self.action_masks(infos)
        # A block gives its final observations and episode metrics every step or where its episodes ended (its
        # contract checks which): a block without them stands in its obs and zeros, where none ended.
        if any("final_obs" in block_info for block_info in infos):
            info["final_obs"] = concatenated([block_info.get("final_obs", step[0]) for block_info, step in
                                              zip(infos, steps)])
        episodes = [block_info.get("final_info", {}).get("episode", {}) for block_info in infos]
        if keys := next((episode for episode in episodes if episode), None):
            info["final_info"] = {"episode": {key: torch.cat([episode[key] if episode else torch.zeros_like(keys[key])
                                                              for episode in episodes]) for key in keys}}
        return obs, reward, terminated, truncated, info

    @staticmethod
    def action_masks(infos) -> dict:
        if "action_mask" not in infos[0]:
            return {}
        masks = [info["action_mask"] for info in infos]  # a MultiDiscrete's a tensor per dimension, or one
        return {"action_mask": torch.cat([torch.cat(mask, -1) if isinstance(mask, (tuple, list)) else mask
                                          for mask in masks])}

    def close(self):
        for block in self.blocks:
            block.close()


# Copied from ppo.py
def concatenated(blocks: list) -> torch.Tensor | dict[str, torch.Tensor]:
    """The blocks' tensors (or dicts of them, ppo_rgb.py's observations) one after another."""
    if isinstance(blocks[0], dict):
        return {key: torch.cat([block[key] for block in blocks]) for key in blocks[0]}
    return torch.cat(blocks)


# Copied from ppo.py
def make_maniskill_envs(args: Args, num_envs: int, device: torch.device, evaluation: bool, video_dir: Optional[str],
                        video_trigger, max_steps_per_video: Optional[int],
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

    env_kwargs, ignore_terminations = maniskill_env_kwargs(args, num_envs, device, evaluation)
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
            env = build_maniskill_env(args.env_id, num_envs, env_kwargs, video_dir, video_trigger, max_steps_per_video,
                                      trajectory_path)
            vec_env = ManiSkillVectorEnv(env, num_envs, ignore_terminations=ignore_terminations, record_metrics=True)
            recorder = env if video_dir is not None or trajectory_path is not None else None
            return TorchVecEnv(vec_env, device, torch_native=True, video_recorder=recorder, env_id=args.env_id)
        if trajectory_path is not None:
            raise UserError("trajectories are recorded in one ManiSkill vector env: on the CPU simulation, use one env")
        # The fork start method hangs while workers build SAPIEN scenes; forkserver needs module-level builders.
        # The forkserver, which every worker forks from, imports ManiSkill once for all (about 2 s of CPU a worker).
        multiprocessing.get_context("forkserver").set_forkserver_preload(["__main__", "mani_skill.envs"])
        env_fns = [functools.partial(build_maniskill_cpu_worker_env, args.env_id, env_kwargs, ignore_terminations,
                                     video_dir if i == 0 else None, video_trigger, max_steps_per_video)
                   for i in range(num_envs)]
        # AsyncVectorEnv builds its first env in this process before any worker, so a missing asset or Vulkan
        # driver fails here.
        vec_env = gym.vector.AsyncVectorEnv(env_fns, context="forkserver",
                                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        return TorchVecEnv(vec_env, device, torch_native=False, env_id=args.env_id)
    except (AssertionError, KeyError, ValueError) as e:
        raise UserError(f"cannot make ManiSkill env {args.env_id!r} with {env_kwargs}: {e}") from e
    except RuntimeError as e:
        if "vk::" not in str(e) and "vulkan" not in str(e).lower():
            raise
        raise UserError(f"SAPIEN, ManiSkill's simulator, needs a Vulkan driver even on CPU and found none ({e}); "
                        "on a CPU-only Debian/Ubuntu machine: bash scripts/install_cpu_vulkan.sh") from e


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------


# Copied from ppo.py
def load_weights(agent: Agent, state: dict, args: Args, envs: TorchVecEnv):
    """Load a checkpoint's weights and observation statistics; refuse one whose spaces or network differ."""
    observation_space = space_to_dict(envs.single_observation_space)
    action_space = space_to_dict(envs.single_action_space)
    if state["observation_space"] != observation_space or state["action_space"] != action_space:
        raise UserError(f"the checkpoint's spaces ({space_shapes(state['observation_space'])}, "
                        f"{state['action_space']}) do not match {args.env_id}'s ({space_shapes(observation_space)}, "
                        f"{action_space})")
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
def space_shapes(space: dict):
    """A space_to_dict() space's shape; a Dict's (ppo_rgb.py's observations), its spaces' by key."""
    if space["type"] == "Dict":
        return {key: space_shapes(sub) for key, sub in space["spaces"].items()}
    return space["shape"]


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


# Copied from ppo.py
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
               "num_eval_steps": setup.num_eval_steps, "device": str(setup.device), "world_size": world_size()}
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


# Copied from ppo.py
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
             "observation_space": space_to_dict(envs.single_observation_space),
             "action_space": space_to_dict(envs.single_action_space),
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
