"""A researcher's own ManiSkill task, registered with ManiSkill when imported:
"tests.maniskill_envs:ShortPushCube-v1"."""

from mani_skill.envs.tasks.tabletop.push_cube import PushCubeEnv
from mani_skill.utils.registration import register_env

SHORT_PUSH_CUBE_STEPS = 20


@register_env("ShortPushCube-v1", max_episode_steps=SHORT_PUSH_CUBE_STEPS)
class ShortPushCubeEnv(PushCubeEnv):
    """PushCube-v1 with a shorter time limit, so that a test can tell whose time limit a run uses."""
