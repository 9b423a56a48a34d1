"""--critic_obs, the privileged critic of ppo.py, ppo_rnn.py and ppo_rgb.py: the actor never sees the critic's vector,
a finished episode's final observation carries its last step's vector (for bootstrapping), and ManiSkill's vector is
the task's state observation. The exported policy, which takes no privileged input, is tested in test_export.py."""

import pytest
import torch

import ppo
import ppo_rgb
import ppo_rnn
import tests.envs  # noqa: F401  (registers the test envs)

BOX = {"type": "Box", "shape": [2], "low": [-1.0, -1.0], "high": [1.0, 1.0]}
CPU = torch.device("cpu")


def agent_and_policy(trainer):
    """An agent whose actor sees 3 dims and whose critic 4 more, with active observation statistics, and a function
    of (actor's part, critic's part) to its (log-probabilities, entropies, values) on a batch of 8 (ppo_rnn.py: 4
    steps of 8 sequences with episode starts inside)."""
    torch.manual_seed(0)
    actions = torch.rand(8, 2) * 2 - 1
    if trainer is ppo_rgb:
        layout = {"critic": ((4,), torch.float32), "image": ((36, 36, 3), torch.uint8), "state": ((3,), torch.float32)}
        agent = ppo_rgb.Agent(layout, BOX, True, False, (16,), "relu", 0.0)
        agent.obs_normalizer.update(torch.randn(64, 3) * 3)
        agent.critic_obs_normalizer.update(torch.randn(64, 4) * 3)
        image = torch.randint(0, 256, (8, 36, 36, 3), dtype=torch.uint8)

        def policy(actor_part, critic_part):
            obs = agent.normalize_obs({"image": image, "state": actor_part, "critic": critic_part})
            return agent.get_action_and_value(obs, actions)[1:]
        return agent, policy, (8, 3), (8, 4)
    if trainer is ppo_rnn:
        agent = ppo_rnn.Agent(3, BOX, True, False, "tanh", 0.0, "lstm", 16, 1, False, critic_dim=4)
        agent.obs_normalizer.update(torch.randn(64, 7) * 3)
        starts = torch.zeros(8, 4, dtype=torch.bool)  # 8 sequences of 4 steps
        starts[:, 0], starts[:4, 2] = True, True

        def policy(actor_part, critic_part):
            obs = agent.normalize_obs(torch.cat([actor_part, critic_part], dim=-1))
            state = agent.initial_state(8, CPU)
            return agent.get_action_and_value(obs, state, starts, actions[:, None].expand(8, 4, 2))[1:4]
        return agent, policy, (8, 4, 3), (8, 4, 4)
    agent = ppo.Agent(3, BOX, True, False, (16, 16), "tanh", 0.0, critic_dim=4)
    agent.obs_normalizer.update(torch.randn(64, 7) * 3)

    def policy(actor_part, critic_part):
        return agent.get_action_and_value(agent.normalize_obs(torch.cat([actor_part, critic_part], dim=-1)),
                                          actions)[1:]
    return agent, policy, (8, 3), (8, 4)


@pytest.mark.parametrize("trainer", [ppo, ppo_rnn, ppo_rgb], ids=["ppo", "ppo_rnn", "ppo_rgb"])
def test_the_actor_never_sees_the_critics_vector(trainer):
    """The policy's log-probabilities and entropies have no gradient with respect to the critic's vector, and give
    every parameter (the shared encoder's too) the same gradient whatever that vector holds; the values depend on it."""
    agent, policy, actor_shape, critic_shape = agent_and_policy(trainer)
    actor_part = torch.randn(actor_shape)
    critic_part = torch.randn(critic_shape, requires_grad=True)
    logprob, entropy, value = policy(actor_part, critic_part)
    (to_critic_part,) = torch.autograd.grad((logprob + entropy).sum(), critic_part, retain_graph=True,
                                            allow_unused=True, materialize_grads=True)
    assert (to_critic_part == 0).all()
    (value_to_critic_part,) = torch.autograd.grad(value.sum(), critic_part)
    assert (value_to_critic_part != 0).any()

    parameters = list(agent.parameters())

    def policy_gradients(critic_values):
        logprob, entropy, value = policy(actor_part, critic_values)
        grads = torch.autograd.grad((logprob + entropy).sum(), parameters, allow_unused=True, materialize_grads=True)
        return grads, value.detach()

    grads, values = policy_gradients(torch.randn(critic_shape))
    other_grads, other_values = policy_gradients(torch.randn(critic_shape) * 5 + 1)
    assert all(torch.equal(a, b) for a, b in zip(grads, other_grads))
    assert any((a != 0).any() for a in grads)  # the actor's parameters do learn from the policy's terms
    assert not torch.equal(values, other_values)


def test_the_actors_dims_normalize_alone_as_within_the_whole_observation():
    """The exported policy normalizes the actor's part without the critic's, with the same statistics (ppo.py's
    RunningMeanStd; ppo_rnn.py's is a checked copy)."""
    rms = ppo.RunningMeanStd(7)
    rms.update(torch.randn(64, 7) * 3 + 1)
    whole = torch.randn(8, 7) * 3
    assert torch.equal(rms(whole[:, :3]), rms(whole)[:, :3])


@pytest.mark.parametrize("trainer,env_id", [(ppo, "tests.envs:PointMassCritic-v0"),
                                            (ppo_rgb, "tests.envs:PointMassPixelsCritic-v0")],
                         ids=["ppo", "ppo_rgb"])
def test_a_finished_episode_bootstraps_from_its_last_steps_critic_vector(tmp_path, trainer, env_id):
    """PointMass's info["critic"] is (x^2, step count): where the 16-step episodes end, the final observation holds
    step 16's vector and the next observation the new episode's, for the envs in this process and in workers.
    ppo_rnn.py's envs (make_envs, TorchVecEnv, CriticObservation) are checked copies of ppo.py's."""
    for async_envs in (False, True):
        args = trainer.Args(env_id=env_id, num_envs=2, critic_obs=True, capture_video=False, async_envs=async_envs,
                            max_episode_steps=16)
        envs = trainer.make_envs(args, False, CPU, evaluation=False, run_dir=tmp_path, num_eval_steps=16)
        obs = envs.reset(seed=0)
        critic = (lambda o: o["critic"]) if trainer is ppo_rgb else (lambda o: o[:, -2:])
        x = (lambda o: o["state"][:, 0]) if trainer is ppo_rgb else (lambda o: o[:, 0])
        assert torch.equal(critic(obs), torch.tensor([[1.0, 0.0]] * 2))
        for step in range(1, 17):
            obs, _, terminated, truncated, final_obs, finished = envs.step(torch.full((2, 1), 0.5))
            if step < 16:
                assert finished is None and (critic(obs)[:, 1] == step).all()
        envs.close()
        assert truncated.all() and not terminated.any()
        assert (critic(final_obs)[:, 1] == 16).all() and (critic(obs)[:, 1] == 0).all()
        torch.testing.assert_close(critic(final_obs)[:, 0], x(final_obs) ** 2)
        assert (x(final_obs) > 1.5).all() and (critic(obs)[:, 0] == 1.0).all()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_maniskills_critic_vector_is_the_tasks_state_observation(tmp_path):
    """ppo_rgb.py's camera actor on PushCube-v1 and ppo.py's state observation, same seed and actions, through
    ManiSkillVectorEnv: the critic's vector is ppo.py's observation (object poses included, unlike the actor's
    "state") at the reset, at each step and in the final observation at the time limit, and after the autoreset."""
    common = dict(env_id="PushCube-v1", num_envs=1, capture_video=False, max_episode_steps=3, sim_backend="cpu")
    camera = ppo_rgb.make_envs(ppo_rgb.Args(critic_obs=True, **common), True, CPU, evaluation=False,
                               run_dir=tmp_path, num_eval_steps=3)
    state = ppo.make_envs(ppo.Args(**common), True, CPU, evaluation=False, run_dir=tmp_path, num_eval_steps=3)
    try:
        camera_obs, state_obs = camera.reset(seed=5), state.reset(seed=5)
        assert camera_obs["critic"].shape == state_obs.shape == (1, 35) and camera_obs["state"].shape == (1, 25)
        torch.testing.assert_close(camera_obs["critic"], state_obs)
        torch.manual_seed(0)
        for step in range(4):  # the third step ends the episode, the fourth steps the next one
            action = torch.rand(1, 8) * 2 - 1
            steps = []
            for envs in (camera, state):  # an autoreset draws its episode from torch's stream: the same for both
                with torch.random.fork_rng():
                    torch.manual_seed(step)
                    steps.append(envs.step(action))
            camera_step, state_step = steps
            assert torch.equal(camera_step[3], state_step[3])  # truncated alike
            for camera_obs, state_obs in ((camera_step[0], state_step[0]), (camera_step[4], state_step[4])):
                torch.testing.assert_close(camera_obs["critic"], state_obs)
        assert state_step[5] is None and camera_step[5] is None
    finally:
        camera.close()
        state.close()
