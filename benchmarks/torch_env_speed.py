"""ppo.py's torch-native path on a batched env in torch (issue 49): CartPole-v1's torch version (tests/envs.py's
CartPoleTorch-v1) stepped on the learner's device, at each number of envs, eagerly and under --compile.

For each setting it builds what train() builds (make_torch_native_envs, make_agents, make_optimizer, the policy step
and losses compiled or not) with ppo.py's defaults otherwise (50 steps a rollout, 32 minibatches, 4 epochs), runs
WARMUP iterations (compiling), then ITERATIONS more, and reports per iteration:

- SPS: num_envs * num_steps over the rollout, the advantages and the update;
- the shares of an iteration in the env, the policy and the update: the env's num_steps steps under random actions
  and the policy step's num_steps calls are timed on their own (a rollout's steps are the two of them, plus the
  normalization and the buffer's copies: the rest of the rollout's share);
- host syncs: those torch.cuda.set_sync_debug_mode("warn") reports in the rollout and in the update (CUDA only);
- the learner's limit: samples per second of the advantages and the update on a buffer of random observations
  and rewards with the policy's actions on them (no env, no rollout).

    python benchmarks/torch_env_speed.py                                           # CPU: 64 and 256 envs
    python benchmarks/torch_env_speed.py --device cuda --num_envs 1024 4096 16384 --compile both   # gpu.sh

Prints a markdown table.
"""

import argparse
import functools
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ppo  # noqa: E402
import tests.envs  # noqa: E402, F401  (registers CartPoleTorch-v1)

ENV_ID = "tests.envs:CartPoleTorch-v1"


def synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, call, repeats: int) -> float:
    """Seconds a call takes, the mean of repeats, with the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def counted_syncs(device: torch.device, call) -> int | None:
    """The host synchronizations CUDA reports while call runs (None off CUDA)."""
    if device.type != "cuda":
        call()
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # not the warning that the debug mode is a prototype, which the first call in a process gives
    return sum("called a synchronizing CUDA operation" in str(warning.message) for warning in caught)


def measure(num_envs: int, compile_: bool, device: torch.device, warmup: int, iterations: int) -> dict:
    args = ppo.parse_args(["--env_id", ENV_ID, "--num_envs", str(num_envs), "--no_capture_video",
                           "--cuda" if device.type == "cuda" else "--no_cuda", *(["--compile"] if compile_ else [])])
    torch.manual_seed(1)
    envs = ppo.make_torch_native_envs(args, num_envs, device)
    agent = ppo.make_agents(args, envs, device, None)
    optimizer = ppo.make_optimizer(agent, args)
    policy_step = ppo.compile_unless_unavailable(ppo.policy_step_of(agent, args, envs), compile_)
    update_losses = ppo.compile_unless_unavailable(functools.partial(ppo.ppo_loss, agent, args), compile_)
    buf = ppo.RolloutBuffer(args.num_steps, envs, device)
    state = {"next_obs": envs.reset(seed=1)}

    def rollout():
        agent.eval()
        state["next_obs"], _ = ppo.rollout(agent, envs, buf, state["next_obs"], policy_step, None, args, "truncated")

    def learn():
        with torch.no_grad():
            next_value = agent.get_value(agent.normalize_obs(state["next_obs"]))
            advantages = ppo.compute_advantages(buf.rewards, buf.values, buf.dones, buf.bootstrap_values, next_value,
                                                args.gamma, args.gae_lambda, args.finite_horizon_gae)
        agent.train()
        ppo.update(agent, optimizer, buf, advantages, advantages + buf.values, update_losses, args)

    for _ in range(warmup):
        rollout()
        learn()
    rollout_syncs = counted_syncs(device, rollout)
    update_syncs = counted_syncs(device, learn)
    iteration = timed(device, lambda: (rollout(), learn()), iterations)
    update_alone = timed(device, learn, iterations)
    actions = torch.randint(0, 2, (args.num_steps, num_envs), device=device)
    env_steps = timed(device, lambda: [envs.step(action) for action in actions], iterations)
    obs = state["next_obs"]
    with torch.inference_mode():
        policy_steps = timed(device, lambda: [policy_step(obs) for _ in range(args.num_steps)], iterations)
    # the learner's limit: random observations and rewards, the policy's own actions on them (so that the update's
    # KL stays that of a real one), no env
    buf.obs.normal_()
    buf.rewards.normal_()
    buf.dones.bernoulli_(0.02)
    with torch.no_grad():
        action, logprob, _, value = agent.get_action_and_value(buf.obs.flatten(0, 1))
    for x, drawn in ((buf.actions, action), (buf.logprobs, logprob), (buf.values, value)):
        x.copy_(drawn.reshape(x.shape))
    synthetic = timed(device, learn, iterations)
    batch = num_envs * args.num_steps
    return {"num_envs": num_envs, "compile": compile_, "SPS": batch / iteration,
            "env": env_steps / iteration, "policy": policy_steps / iteration, "update": update_alone / iteration,
            "rollout_syncs": rollout_syncs, "update_syncs": update_syncs, "learner_limit": batch / synthetic}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num_envs", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--compile", choices=["no", "yes", "both"], default="no")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=3)
    options = parser.parse_args()
    device = torch.device(options.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda needs a machine with CUDA; pass --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # as ppo.py's --torch_threads
    compiles = {"no": [False], "yes": [True], "both": [False, True]}[options.compile]
    print(f"{ENV_ID} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}; ppo.py's "
          f"defaults (50 steps a rollout, 32 minibatches, 4 epochs); the mean of {options.iterations} iterations "
          f"after {options.warmup}\n")
    print("| envs | --compile | SPS | env share | policy share | update share | host syncs: rollout / update | "
          "learner's limit (samples/s) |")
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    for compile_ in compiles:  # the eager rows first: a run stopped while compiling has them
        for num_envs in options.num_envs:
            row = measure(num_envs, compile_, device, options.warmup, options.iterations)
            syncs = "n/a (CPU)" if row["rollout_syncs"] is None else f"{row['rollout_syncs']} / {row['update_syncs']}"
            print(f"| {num_envs} | {'yes' if compile_ else 'no'} | {row['SPS']:,.0f} | {row['env']:.0%} | "
                  f"{row['policy']:.0%} | {row['update']:.0%} | {syncs} | {row['learner_limit']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
