"""troupe from Python: batched MuJoCo env pools, the replay client, runs and policies.

    import troupe
    pool = troupe.make("walker.walk", num_envs=16, observation="pixels", action_repeat=2, frame_stack=3)
    ts = pool.reset()                       # TimeStep of numpy arrays viewing the pool's buffers
    ts = pool.step(actions)                 # actions: float32 [16, action_size]

Errors from the C++ core are exceptions deriving from troupe.Error whose
message is the C++ absl::Status message (a bad argument is also a
ValueError, an unreachable server a ConnectionError, ...).
"""
import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
# An installed copy carries the env worker and the task assets; a build-tree
# copy finds them where the build put them (nothing to set).
if _os.path.isdir(_os.path.join(_here, "assets")):
    _os.environ.setdefault("TROUPE_ASSETS_DIR", _os.path.join(_here, "assets"))
if _os.path.exists(_os.path.join(_here, "bin", "troupe_env_worker")):
    _os.environ.setdefault("TROUPE_ENV_WORKER", _os.path.join(_here, "bin", "troupe_env_worker"))

from troupe._native import (  # noqa: E402
    DeadlineExceededError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)
from troupe.envs import EnvPool, EnvSpec, StepType, TimeStep, make  # noqa: E402
from troupe import replay  # noqa: E402
from troupe.runs import Policy, Run  # noqa: E402

__all__ = [
    "make", "EnvPool", "EnvSpec", "StepType", "TimeStep", "replay", "Run", "Policy",
    "Error", "InvalidArgumentError", "NotFoundError", "UnavailableError", "DeadlineExceededError",
    "PermissionDeniedError",
]
