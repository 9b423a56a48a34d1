"""Many seeds in one process, the update alone (issue 38's prototype): N seeds' PPO minibatch steps at CleanRL's
MuJoCo settings (HalfCheetah's 17-dim observation, 6-dim action, 2x64 tanh networks, minibatches of 64), five ways:

- loop:    N copies of ppo.py's Agent, each with its own fused Adam, stepped one after the other;
- stacked: one Agent whose every weight has a leading seed dimension (ippo.py's AgentLinear), one fused Adam,
           each seed's gradient clipped on its own (ippo.py's clip_grad_norm_per_net);
- vmap:    the N Agents' parameters stacked with torch.func.stack_module_state and the loss of ppo.py's Agent
           run over them with torch.func.vmap and functional_call, one fused Adam;
- per-seed: N copies of ppo.py's Agent, their weights stacked anew at every call (torch.stack, so each seed's
           gradient lands in its own Agent), one fused Adam with a parameter group per seed (each seed its own
           learning rate and step count; a seed whose update stopped takes no step), nn.utils.clip_grad_norm_ per
           seed. One Adam over stacked weights shares one step count and one learning rate across seeds, which an
           adaptive learning rate or a KL stop per seed cannot;
- stacked+groups: stacked weights, each seed's slice of each weight also a parameter of its own (a view: the same
           memory), one fused Adam with a parameter group per seed over those views (each seed its own learning
           rate and step count), the stacked gradients clipped per seed and handed to the views.

    python benchmarks/seeds_update.py                       # N = 1, 2, 4, 8, 16; 320 minibatch steps each
    python benchmarks/seeds_update.py --seeds 1 8 --steps 64
    python benchmarks/seeds_update.py --device cuda --seeds 1 2 4 8 16 32 64 --steps 16   # benchmarks/gpu.sh

Prints a markdown table: milliseconds a minibatch step for all N seeds, and the cost of N seeds relative to one
seed's loop; then the rollout's policy call for N seeds of one env each, the same four ways. Also whether each
way's parameters after the steps equal the loop's (to float rounding), and whether the stacked layer with N = 1
gives ppo.py's numbers bit for bit (nn.Linear's addmm against a batched matmul).
"""

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ippo  # noqa: E402
import ppo  # noqa: E402

OBS, ACT, HIDDEN, MINIBATCH = 17, 6, (64, 64), 64
BOX = {"type": "Box", "shape": [ACT], "low": [-1.0] * ACT, "high": [1.0] * ACT}


def make_agents(num_seeds: int) -> list[ppo.Agent]:
    agents = []
    for seed in range(num_seeds):
        torch.manual_seed(seed)
        agents.append(ppo.Agent(OBS, BOX, False, False, HIDDEN, "tanh", -0.5))
    return agents


def loss_of(logprob, value, old_logprobs, advantages, returns):
    """ppo.py's clipped surrogate and value loss (norm_adv, clip 0.2, vf 0.5) of one seed's minibatch."""
    ratio = (logprob - old_logprobs).exp()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 0.8, 1.2)).mean()
    return pg_loss + 0.5 * 0.5 * ((value - returns) ** 2).mean()


class StackedAgent(nn.Module):
    """ppo.py's Agent with a leading seed dimension on every weight (ippo.py's AgentLinear layers)."""

    def __init__(self, agents: list[ppo.Agent]):
        super().__init__()
        self.actor = ippo.mlp(len(agents), OBS, HIDDEN, "tanh", ACT, out_std=0.01 * np.sqrt(2))
        self.critic = ippo.mlp(len(agents), OBS, HIDDEN, "tanh", 1, out_std=1.0)
        with torch.no_grad():  # the same initial weights as the loop's agents
            for name in ("actor", "critic"):
                stacked = [m for m in getattr(self, name) if isinstance(m, ippo.AgentLinear)]
                for i, agent in enumerate(agents):
                    linears = [m for m in getattr(agent, name) if isinstance(m, nn.Linear)]
                    for layer, linear in zip(stacked, linears):
                        layer.weight[i].copy_(linear.weight.T)
                        layer.bias[i, 0].copy_(linear.bias)
        self.actor_logstd = nn.Parameter(torch.stack([agent.actor_logstd.detach() for agent in agents]))

    def get_action_and_value(self, obs, action=None):
        mean = self.actor(obs)
        std = self.actor_logstd.expand_as(mean).exp()
        if action is None:
            action = torch.normal(mean, std)
        logprob = -((action - mean) ** 2) / (2 * std**2) - std.log() - ppo.LOG_SQRT_2PI
        entropy = ppo.NORMAL_ENTROPY_AT_UNIT_STD + std.log()
        return action, logprob.sum(-1), entropy.sum(-1), self.critic(obs).squeeze(-1)


def minibatches(num_seeds: int, steps: int):
    """Drawn on the CPU whatever the device, so that every device steps on the same numbers."""
    generator = torch.Generator().manual_seed(0)
    return [tuple(torch.randn((num_seeds, MINIBATCH) + shape, generator=generator, device="cpu")
                  .to(torch.get_default_device()) for shape in ((OBS,), (ACT,), (), (), ())) for _ in range(steps)]


def stacked_mlp(mlps: list[nn.Sequential], x: torch.Tensor) -> torch.Tensor:
    """N MLPs of one shape on x (N, B, in) in batched matmuls, with their weights as they are now."""
    for layers in zip(*mlps):
        if isinstance(layers[0], nn.Linear):
            weight = torch.stack([layer.weight for layer in layers]).transpose(1, 2)
            x = torch.baddbmm(torch.stack([layer.bias for layer in layers])[:, None], x, weight)
        else:
            x = layers[0](x)
    return x


def per_seed_policy(agents: list[ppo.Agent], obs, action=None):
    """ppo.py's get_action_and_value for N Agents at once, on (N, B, ...) inputs."""
    mean = stacked_mlp([agent.actor for agent in agents], obs)
    std = torch.stack([agent.actor_logstd for agent in agents]).expand_as(mean).exp()
    if action is None:
        action = torch.normal(mean, std)
    logprob = -((action - mean) ** 2) / (2 * std**2) - std.log() - ppo.LOG_SQRT_2PI
    entropy = ppo.NORMAL_ENTROPY_AT_UNIT_STD + std.log()
    value = stacked_mlp([agent.critic for agent in agents], obs).squeeze(-1)
    return action, logprob.sum(-1), entropy.sum(-1), value


def run_per_seed(agents, data):
    optimizer = torch.optim.Adam([{"params": agent.parameters()} for agent in agents], lr=3e-4, eps=1e-5,
                                 fused=True)
    per_seed_loss = vmap(loss_of)
    for obs, actions, *targets in data:
        _, logprob, _, value = per_seed_policy(agents, obs, actions)
        loss = per_seed_loss(logprob, value, *targets).sum()
        optimizer.zero_grad()
        loss.backward()
        for agent in agents:
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()
    return agents


def run_loop(agents, data):
    """Returns nothing: the agents are stepped in place."""
    optimizers = [torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5, fused=True) for agent in agents]
    for batch in data:
        for i, (agent, optimizer) in enumerate(zip(agents, optimizers)):
            obs, actions, *targets = (x[i] for x in batch)
            _, logprob, _, value = agent.get_action_and_value(obs, actions)
            loss = loss_of(logprob, value, *targets)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()


def run_stacked(agent: StackedAgent, data):
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5, fused=True)
    per_seed_loss = vmap(loss_of)
    for obs, actions, *targets in data:
        _, logprob, _, value = agent.get_action_and_value(obs, actions)
        loss = per_seed_loss(logprob, value, *targets).sum()  # seeds' losses summed: disjoint gradients
        optimizer.zero_grad()
        loss.backward()
        ippo.clip_grad_norm_per_net(list(agent.parameters()), 0.5)
        optimizer.step()
    return agent


def run_stacked_groups(agent: StackedAgent, data, stopped: frozenset = frozenset()):
    """stopped: seeds left out of every step, as a seed whose update stopped at its KL would be."""
    stacked = list(agent.parameters())
    views = [[nn.Parameter(p.detach()[seed]) for p in stacked] for seed in range(stacked[0].shape[0])]
    optimizer = torch.optim.Adam([{"params": seed_views} for seed_views in views], lr=3e-4, eps=1e-5, fused=True)
    per_seed_loss = vmap(loss_of)
    for obs, actions, *targets in data:
        _, logprob, _, value = agent.get_action_and_value(obs, actions)
        loss = per_seed_loss(logprob, value, *targets).sum()
        agent.zero_grad()
        optimizer.zero_grad()  # the views' gradients to None: a view given none below takes no step
        loss.backward()
        ippo.clip_grad_norm_per_net(list(agent.parameters()), 0.5)
        for seed, seed_views in enumerate(views):
            for view, p in zip(seed_views, stacked):
                view.grad = None if seed in stopped else p.grad[seed]
        optimizer.step()
    return agent


def meta_agent(agent: ppo.Agent) -> ppo.Agent:
    """A weightless copy of agent whose call is get_action_and_value, for functional_call."""
    base = copy.deepcopy(agent).to("meta")
    base.forward = base.get_action_and_value
    return base


def run_vmap(agents, data):
    params, buffers = stack_module_state(agents)
    params = {name: nn.Parameter(p.detach()) for name, p in params.items()}
    base = meta_agent(agents[0])

    def seed_loss(seed_params, seed_buffers, obs, actions, *targets):
        _, logprob, _, value = functional_call(base, (seed_params, seed_buffers), (obs, actions))
        return loss_of(logprob, value, *targets)

    optimizer = torch.optim.Adam(params.values(), lr=3e-4, eps=1e-5, fused=True)
    losses = vmap(seed_loss)
    for batch in data:
        loss = losses(params, buffers, *batch).sum()
        optimizer.zero_grad()
        loss.backward()
        grads = [p.grad for p in params.values()]
        norms = torch.stack([g.reshape(g.shape[0], -1).square().sum(1) for g in grads]).sum(0).sqrt()
        scale = (0.5 / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.reshape((-1,) + (1,) * (g.dim() - 1)))
        optimizer.step()
    return params, base


def outputs(call, probe_obs, probe_actions) -> torch.Tensor:
    """Log-probabilities and values of probe actions: what a policy computes, to compare the ways' results."""
    with torch.no_grad():
        _, logprob, _, value = call(probe_obs, probe_actions)
    return torch.cat([logprob.flatten(), value.flatten()])


def agrees(reference: list[torch.Tensor], batched: torch.Tensor) -> bool:
    """Whether the (2, N, probes) outputs of all seeds at once equal each seed's loop outputs, to float rounding."""
    batched = batched.reshape(2, len(reference), -1)
    return all(torch.allclose(ref, torch.cat([batched[0, i], batched[1, i]]), rtol=1e-3, atol=1e-4)
               for i, ref in enumerate(reference))


def policy_steps(n: int, steps: int) -> tuple[float, float, float, float]:
    """Milliseconds of one rollout step's policy call (a sampled action, its log-probability and the value) for n
    seeds of one env each, as ppo.py's rollout makes it (inference mode): the loop, stacked weights, torch.func,
    per-seed weights stacked at the call."""
    obs = torch.randn(n, 1, OBS)
    agents = make_agents(n)
    stacked = StackedAgent(agents)
    params, buffers = stack_module_state(agents)
    base = meta_agent(agents[0])
    policy = vmap(lambda p, b, o: functional_call(base, (p, b), (o,)), randomness="different")
    ways = (lambda: [agent.get_action_and_value(obs[i]) for i, agent in enumerate(agents)],
            lambda: stacked.get_action_and_value(obs), lambda: policy(params, buffers, obs),
            lambda: per_seed_policy(agents, obs))
    with torch.inference_mode():
        return tuple(timed(lambda: [way() for _ in range(steps)]) / steps * 1e3 for way in ways)


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.get_default_device().type == "cuda":  # the time of the work, not of its launch
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=320, help="minibatch steps (ppo.py at CleanRL's settings: 320)")
    parser.add_argument("--device", default="cpu", help="where the networks, optimizers and minibatches live")
    options = parser.parse_args()
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"error: --device {options.device}, but torch sees no GPU here (torch.cuda.is_available() is False)")
    torch.set_num_threads(1)
    torch.set_default_device(options.device)
    print(f"device: {options.device}\n")
    x = torch.randn(MINIBATCH, OBS)
    linear = ppo.layer_init(nn.Linear(OBS, 64))
    stacked = ippo.AgentLinear(1, OBS, 64)
    with torch.no_grad():
        stacked.weight[0].copy_(linear.weight.T)
        stacked.bias[0, 0].copy_(linear.bias)
    same_bits = torch.equal(linear(x), stacked(x[None])[0])
    print(f"stacked layer with N = 1 equals nn.Linear bit for bit: {same_bits}\n")
    print("| seeds | loop (ms/step) | stacked (ms/step) | vmap (ms/step) | per-seed (ms/step) "
          "| stacked+groups (ms/step) | loop / one seed | stacked / one seed | vmap / one seed | per-seed / one seed "
          "| stacked+groups / one seed "
          "| stacked = loop | vmap = loop | per-seed = loop | stacked+groups = loop |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    one_seed = None
    for n in options.seeds:
        data = minibatches(n, options.steps)
        loop_time = timed(lambda: run_loop(make_agents(n), data)) / options.steps * 1e3
        stacked_time = timed(lambda: run_stacked(StackedAgent(make_agents(n)), data)) / options.steps * 1e3
        vmap_time = timed(lambda: run_vmap(make_agents(n), data)) / options.steps * 1e3
        per_seed_time = timed(lambda: run_per_seed(make_agents(n), data)) / options.steps * 1e3
        groups_time = timed(lambda: run_stacked_groups(StackedAgent(make_agents(n)), data)) / options.steps * 1e3
        one_seed = one_seed or loop_time
        probe_obs, probe_actions = torch.randn(n, 32, OBS), torch.randn(n, 32, ACT)
        loop_agents = make_agents(n)
        run_loop(loop_agents, data)
        reference = [outputs(a.get_action_and_value, probe_obs[i], probe_actions[i]) for i, a in enumerate(loop_agents)]
        stacked_out = outputs(run_stacked(StackedAgent(make_agents(n)), data).get_action_and_value, probe_obs,
                              probe_actions)
        params, base = run_vmap(make_agents(n), data)
        vmap_out = torch.stack([outputs(lambda o, a: functional_call(base, {k: v[i] for k, v in params.items()},
                                                                     (o, a)),
                                        probe_obs[i], probe_actions[i]).reshape(2, 32) for i in range(n)], dim=1)
        per_seed_agents = run_per_seed(make_agents(n), data)
        per_seed_out = outputs(lambda o, a: per_seed_policy(per_seed_agents, o, a), probe_obs, probe_actions)
        groups_out = outputs(run_stacked_groups(StackedAgent(make_agents(n)), data).get_action_and_value, probe_obs,
                             probe_actions)
        stacked_close, vmap_close, per_seed_close, groups_close = (
            agrees(reference, out) for out in (stacked_out, vmap_out, per_seed_out, groups_out))
        print(f"| {n} | {loop_time:.2f} | {stacked_time:.2f} | {vmap_time:.2f} | {per_seed_time:.2f} | "
              f"{groups_time:.2f} | {loop_time / one_seed:.2f} | {stacked_time / one_seed:.2f} | "
              f"{vmap_time / one_seed:.2f} | {per_seed_time / one_seed:.2f} | {groups_time / one_seed:.2f} | "
              f"{stacked_close} | {vmap_close} | {per_seed_close} | {groups_close} |", flush=True)
    print("\nThe rollout's policy call (one env a seed, inference mode), ms a step for all seeds:\n")
    print("| seeds | loop | stacked | vmap | per-seed |\n|---:|---:|---:|---:|---:|")
    for n in options.seeds:
        print("| {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} |".format(n, *policy_steps(n, options.steps)), flush=True)


if __name__ == "__main__":
    main()
