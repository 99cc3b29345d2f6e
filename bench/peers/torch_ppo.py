"""The PyTorch 2.x peer of `troupe bench appo`: PPO (Schulman et al. 2017)
as CleanRL's ppo_continuous_action.py runs it, in one file, on dm_control's
own suite, with troupe's APPO recipe (configs/appo_cartpole_balance_state
.textproto; agents/appo_agent.h) so that both do the same work per frame:

- B = `batch` envs stepped one after another in this thread (as a synchronous
  vector env), each for `unroll` agent steps of `action_repeat` physics
  steps: B x T steps per update, troupe's learner.batch_size trajectories of
  appo.unroll_length;
- the policy: a mean MLP (ReLU) and a state-independent log standard
  deviation (start -0.5), actions tanh-squashed, log-densities of the
  pre-squash sample; a value MLP beside it; observations normalised by
  running mean and variance (clipped to +-10), rewards scaled;
- at an episode's time limit the last reward gains discount x V(last
  observation), as troupe's actors add it;
- GAE(lambda) advantages (troupe uses V-trace's, equal on-policy up to the
  traces), normalised over the batch; `epochs` passes of `minibatches`
  minibatches of the clipped loss + 0.5 value loss; Adam, gradients clipped
  to norm 0.5.

Not part of troupe: the benchmark runs it from a virtual environment under
build/ that it makes (torch, dm_control, MuJoCo from PyPI).
usage: torch_ppo.py THREADS DOMAIN TASK ACTION_REPEAT speed SECONDS [KEY=VALUE...]
       torch_ppo.py THREADS DOMAIN TASK ACTION_REPEAT learn FRAMES [KEY=VALUE...]
keys: batch=32 unroll=32 hidden=64 epochs=10 minibatches=8 lr=1e-3 gamma=0.99 lam=0.95 clip=0.2
reward_scale=0.01 seed=1 anneal=0 entropy=0 mean_bound=0 min_log_std=-inf eval_every=0 eval_episodes=2
pixels=0 frames=3 channels=16 features=50 detach=0;
`speed` prints "frames_per_second X" (env frames, all envs, updates included); `learn` prints
"eval FRAMES SECONDS RETURN" (the mean of eval_episodes episodes of the mean action) every
eval_every frames (0: at the end only) and at FRAMES, then "eval_return X" and "seconds X" (the
training time, evaluations left out). anneal=1 lowers lr linearly to 0 at FRAMES (CleanRL's
anneal_lr, troupe's appo.anneal_learning_rate); entropy is the entropy bonus's coefficient;
mean_bound=M bounds the Gaussian's mean smoothly to +-M (M tanh(y / M), troupe's policy: 5);
min_log_std=F keeps the log standard deviation >= F after every step (troupe's appo.min_log_std).
pixels=P: observations are the last `frames` frames of P x P pixels from camera 0 (the first
repeated at a reset; dm_control's own rendering, with the shadows and reflections that troupe's
default env.render leaves out), through DrQ's encoder of `channels` and `features` (troupe's
appo.conv_channels and appo.encoder_features) shared by the policy and the value; detach=1: the
policy reads its features without gradient (troupe's appo.detach_policy_features).
"""
import os
import sys
import time

USAGE = __doc__[__doc__.index("usage:"):].rstrip()


def parse(argv):
    """The arguments as a dict, or exits with the usage line naming what is wrong (before torch is imported)."""
    if len(argv) < 7 or argv[5] not in ("speed", "learn"):
        sys.exit(USAGE)
    try:
        args = {"threads": int(argv[1]), "domain": argv[2], "task": argv[3], "repeat": int(argv[4]),
                "mode": argv[5], "amount": float(argv[6])}
    except ValueError as e:
        sys.exit(f"{USAGE}\n{e}")
    if args["threads"] < 1 or args["repeat"] < 1 or not args["amount"] > 0:
        sys.exit(f"{USAGE}\nTHREADS, ACTION_REPEAT >= 1 and SECONDS or FRAMES > 0")
    options = {"batch": 32, "unroll": 32, "hidden": 64, "epochs": 10, "minibatches": 8, "lr": 1e-3, "gamma": 0.99,
               "lam": 0.95, "clip": 0.2, "reward_scale": 0.01, "seed": 1, "anneal": 0, "entropy": 0.0,
               "mean_bound": 0.0, "min_log_std": float("-inf"), "eval_every": 0, "eval_episodes": 2,
               "pixels": 0, "frames": 3, "channels": 16, "features": 50, "detach": 0}
    for item in argv[7:]:
        key, _, value = item.partition("=")
        if key not in options:
            sys.exit(f"{USAGE}\nunknown option '{item}'")
        try:
            options[key] = int(value) if isinstance(options[key], int) else float(value)
        except ValueError:
            sys.exit(f"{USAGE}\n{item}: not a number of its kind")
    if min(options["batch"], options["unroll"], options["epochs"], options["minibatches"],
           options["eval_episodes"]) < 1:
        sys.exit(f"{USAGE}\nbatch, unroll, epochs, minibatches and eval_episodes >= 1")
    if options["anneal"] not in (0, 1) or options["eval_every"] < 0 or options["mean_bound"] < 0:
        sys.exit(f"{USAGE}\nanneal is 0 or 1, eval_every and mean_bound >= 0")
    if options["detach"] not in (0, 1) or (options["pixels"] != 0 and options["pixels"] < 15) or \
            min(options["frames"], options["channels"], options["features"]) < 1:
        sys.exit(f"{USAGE}\ndetach is 0 or 1, pixels 0 or >= 15, frames, channels and features >= 1")
    args.update(options)
    return args


ARGS = parse(sys.argv) if __name__ == "__main__" else None
os.environ.setdefault("MUJOCO_GL", "egl")  # no window
import numpy as np  # noqa: E402
import torch  # noqa: E402
from dm_control import suite  # noqa: E402


def flat(observation):
    return np.concatenate([np.asarray(v, dtype=np.float32).ravel() for v in observation.values()])


class Observer:
    """An env's observations: its state vector, or (pixels=P) its last `frames` frames [3 k, P, P] uint8."""

    def __init__(self, env, pixels, frames):
        self.env, self.pixels, self.frames, self.stack = env, pixels, frames, []

    def __call__(self, ts):
        if not self.pixels:
            return flat(ts.observation)
        frame = self.env.physics.render(self.pixels, self.pixels, camera_id=0).transpose(2, 0, 1)
        self.stack = [frame] * self.frames if ts.first() else self.stack[1:] + [frame]
        return np.concatenate(self.stack)


class RunningMoments:
    def __init__(self, size):
        self.mean, self.var, self.count = np.zeros(size), np.ones(size), 0.0

    def update(self, x):
        n = x.shape[0]
        mean, var = x.mean(0), x.var(0)
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + var * n + delta ** 2 * self.count * n / total) / total
        self.count = total

    def normalize(self, x):
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10, 10).astype(np.float32)


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Encoder(torch.nn.Module):
    """DrQ's: four 3x3 convolutions (the first of stride 2) with ReLU, linear, layer norm, tanh; pixels / 255."""

    def __init__(self, shape, channels, features):
        super().__init__()
        layers, size = [], shape[1]
        for i in range(4):
            layers += [torch.nn.Conv2d(shape[0] if i == 0 else channels, channels, 3, stride=2 if i == 0 else 1),
                       torch.nn.ReLU()]
            size = (size - 3) // (2 if i == 0 else 1) + 1
        self.convs = torch.nn.Sequential(*layers, torch.nn.Flatten())
        self.trunk = torch.nn.Sequential(torch.nn.Linear(channels * size * size, features),
                                         torch.nn.LayerNorm(features), torch.nn.Tanh())

    def forward(self, x):
        return self.trunk(self.convs(x.float() / 255.0))


class Model(torch.nn.Module):
    def __init__(self, shape, actions, a):
        super().__init__()
        self.encoder = Encoder(shape, a["channels"], a["features"]) if a["pixels"] else None
        inputs = a["features"] if a["pixels"] else shape[0]
        self.policy = mlp([inputs, a["hidden"], a["hidden"], actions])
        self.log_std = torch.nn.Parameter(torch.full((actions,), -0.5))
        self.value_head = mlp([inputs, a["hidden"], a["hidden"], 1])
        self.mean_bound, self.detach = a["mean_bound"], a["detach"]

    def features(self, x):
        return self.encoder(x) if self.encoder is not None else x

    def value(self, x):
        return self.value_head(self.features(x))

    def mean(self, x, features=None):
        features = self.features(x) if features is None else features
        y = self.policy(features.detach() if self.detach else features)
        return self.mean_bound * torch.tanh(y / self.mean_bound) if self.mean_bound > 0 else y

    def distribution(self, x, features=None):
        return torch.distributions.Normal(self.mean(x, features), self.log_std.exp())


def main():
    a = ARGS
    torch.set_num_threads(a["threads"])
    torch.manual_seed(a["seed"])
    rng = np.random.default_rng(a["seed"])
    envs = [suite.load(a["domain"], a["task"], task_kwargs={"random": a["seed"] * 1000 + i}) for i in range(a["batch"])]
    observers = [Observer(env, a["pixels"], a["frames"]) for env in envs]
    spec = envs[0].action_spec()
    observations = np.stack([observe(env.reset()) for env, observe in zip(envs, observers)])
    shape, actions = observations.shape[1:], spec.shape[0]
    model = Model(shape, actions, a)
    optimizer = torch.optim.Adam(model.parameters(), lr=a["lr"], eps=1e-8)
    moments = RunningMoments(shape[0])

    def inputs(x):
        """Observations as the model takes them: states normalised, pixels as they are."""
        return torch.from_numpy(x if a["pixels"] else moments.normalize(x))
    b, t, repeat = a["batch"], a["unroll"], a["repeat"]
    frames = 0

    def env_step(env, action):
        reward, ts = 0.0, None
        for _ in range(repeat):
            ts = env.step(action)
            reward += ts.reward or 0.0
            if ts.last():
                break
        return ts, reward

    def update():
        nonlocal observations, frames
        obs = np.zeros((t + 1, b) + shape, observations.dtype)
        us = np.zeros((t, b, actions), np.float32)
        behaviour = np.zeros((t, b), np.float32)
        rewards = np.zeros((t, b), np.float32)
        discounts = np.zeros((t, b), np.float32)
        for step in range(t):
            obs[step] = observations
            with torch.no_grad():
                mean = model.mean(inputs(observations))
                u = mean + model.log_std.exp() * torch.randn_like(mean)
                action = torch.tanh(u).clamp(-1 + 1e-6, 1 - 1e-6)
                u = torch.atanh(action)
                behaviour[step] = torch.distributions.Normal(mean, model.log_std.exp()).log_prob(u).sum(-1).numpy()
            us[step] = u.numpy()
            for i, (env, observe) in enumerate(zip(envs, observers)):
                ts, reward = env_step(env, action[i].numpy())
                frames += repeat
                discount = a["gamma"] * (ts.discount if ts.discount is not None else 1.0)
                observation = observe(ts)
                if ts.last():
                    if ts.discount:  # a time limit: the value bootstrap
                        with torch.no_grad():
                            v = model.value(inputs(observation[None]))
                        reward += a["gamma"] * float(v) / a["reward_scale"]
                    discount = 0.0
                    observation = observe(env.reset())
                observations[i] = observation
                rewards[step, i] = reward * a["reward_scale"]
                discounts[step, i] = discount
        obs[t] = observations
        if not a["pixels"]:
            moments.update(obs[:t].reshape(-1, shape[0]))
        x = inputs(obs.reshape((-1,) + shape)).reshape((t + 1, b) + shape)
        u_t = torch.from_numpy(us)
        behaviour_t = torch.from_numpy(behaviour)
        for _ in range(a["epochs"]):
            with torch.no_grad():
                values = model.value(x.reshape((-1,) + shape)).reshape(t + 1, b).numpy()
            advantages = np.zeros((t, b), np.float32)
            last = np.zeros(b, np.float32)
            for step in reversed(range(t)):
                delta = rewards[step] + discounts[step] * values[step + 1] - values[step]
                last = delta + discounts[step] * a["lam"] * last
                advantages[step] = last
            targets = torch.from_numpy(advantages + values[:t]).reshape(-1)
            adv = torch.from_numpy((advantages - advantages.mean()) / (advantages.std() + 1e-8)).reshape(-1)
            flat_x = x[:t].reshape((-1,) + shape)
            flat_u = u_t.reshape(-1, actions)
            flat_b = behaviour_t.reshape(-1)
            order = rng.permutation(t * b)
            for chunk in np.array_split(order, a["minibatches"]):
                chunk = torch.from_numpy(chunk)
                features = model.features(flat_x[chunk])
                pi = model.distribution(None, features)
                ratio = (pi.log_prob(flat_u[chunk]).sum(-1) - flat_b[chunk]).clamp(-20, 20).exp()
                policy = -torch.min(ratio * adv[chunk],
                                    ratio.clamp(1 - a["clip"], 1 + a["clip"]) * adv[chunk]).mean()
                value = 0.5 * ((model.value_head(features).squeeze(-1) - targets[chunk]) ** 2).mean()
                loss = policy + 0.5 * value - a["entropy"] * pi.entropy().sum(-1).mean()
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
                with torch.no_grad():
                    model.log_std.clamp_(min=a["min_log_std"])

    if a["mode"] == "speed":
        update()  # warm-up
        start, frames_before = time.perf_counter(), frames
        while time.perf_counter() - start < a["amount"]:
            update()
        print(f"frames_per_second {(frames - frames_before) / (time.perf_counter() - start):.1f}")
        return
    def evaluate():
        """The mean return of eval_episodes episodes of the mean action, from fixed start states."""
        total = 0.0
        for episode in range(a["eval_episodes"]):
            env = suite.load(a["domain"], a["task"], task_kwargs={"random": 10_000 + episode})
            observe = Observer(env, a["pixels"], a["frames"])
            ts = env.reset()
            while not ts.last():
                with torch.no_grad():
                    mean = model.mean(inputs(observe(ts)[None]))
                ts, reward = env_step(env, torch.tanh(mean)[0].numpy())
                total += reward
        return total / a["eval_episodes"]

    seconds, next_eval, result = 0.0, a["eval_every"] or a["amount"], 0.0
    while frames < a["amount"]:
        if a["anneal"]:
            for group in optimizer.param_groups:
                group["lr"] = a["lr"] * max(0.0, 1.0 - frames / a["amount"])
        start = time.perf_counter()
        update()
        seconds += time.perf_counter() - start
        if frames >= next_eval or frames >= a["amount"]:
            result = evaluate()
            print(f"eval {frames} {seconds:.1f} {result:.1f}", flush=True)
            while next_eval <= frames:
                next_eval += a["eval_every"] or a["amount"]
    print(f"eval_return {result:.1f}")
    print(f"seconds {seconds:.1f}")

if __name__ == "__main__":
    main()
