"""ppo_rnn.py's update replay at GPU scale, timed on the CPU: forward and backward of the agent over one minibatch of
sequences with episode starts inside them, as the update replays it.

    python benchmarks/rnn_replay.py                                  # 256 sequences of 50 steps, ~50-step episodes
    python benchmarks/rnn_replay.py --packed                         # CUDA's replay, one packed call
    python benchmarks/rnn_replay.py --device cuda                    # on the GPU (packed), timed with syncs
    python benchmarks/rnn_replay.py --sequences 4 --repeats 1        # a quick check

Prints a markdown row: the batch, how many episode starts lie inside its sequences and on how many of its time steps,
and the median time of a forward and backward pass.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ppo_rnn  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--seq_len", type=int, default=50)
    parser.add_argument("--episode_len", type=float, default=50.0, help="mean episode length (starts at random)")
    parser.add_argument("--rnn_type", choices=["lstm", "gru"], default="lstm")
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch_threads", type=int, default=1)
    parser.add_argument("--packed", action="store_true", help="replay in one packed call, as on CUDA")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    ppo_rnn.PACKED_REPLAY_DEVICES = (device.type,) if args.packed else ()
    torch.manual_seed(0)
    obs_dim, action_dim, steps, batch = 42, 8, args.seq_len, args.sequences  # PickCube's spaces
    agent = ppo_rnn.Agent(obs_dim, {"type": "Box", "shape": [action_dim]}, False, False, "tanh", -0.5, args.rnn_type,
                          args.hidden_size, 1, False).to(device)
    obs, actions = torch.randn(batch, steps, obs_dim), torch.randn(batch, steps, action_dim)  # (batch, time, ...)
    starts = torch.rand(batch, steps) < 1.0 / args.episode_len
    state = torch.randn(agent.initial_state(batch, device).shape)
    obs, actions, starts, state = (x.to(device) for x in (obs, actions, starts, state))
    seconds = []
    for repeat in range(args.repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        _, logprob, entropy, value, _ = agent.get_action_and_value(obs, state, starts, actions)
        (logprob.mean() + value.pow(2).mean() - entropy.mean()).backward()
        agent.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if repeat > 0:
            seconds.append(time.perf_counter() - start)
    inside = starts[:, 1:].T
    print("| sequences x steps | RNN | device | replay | starts inside | steps with a start | forward+backward "
          "(median) |")
    print("|---|---|---|---|---:|---:|---:|")
    print(f"| {batch} x {steps} | {args.rnn_type} {args.hidden_size} | {device.type} | "
          f"{'packed' if args.packed else 'stretches'} | "
          f"{int(inside.sum())} | {int(inside.any(dim=1).sum())} of {steps - 1} | "
          f"{statistics.median(seconds) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
