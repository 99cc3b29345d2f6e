"""The PyTorch 2.x peer of d4pg_bench: D4PG's pixel update as
agents/d4pg_agent.cc (D4pgAgent::Update) does it, on a synthetic batch like
bench/synthetic.cc's, eager, under torch.compile, or under torch.compile's
"reduce-overhead" mode (CUDA graphs: CUDA only).

One update: the batch (uint8 frames [B, k, H, W, 3], actions, rewards,
discounts) to the device and to float NCHW / 255; DrQ's random shift
(Kostrikov et al. 2020: replicate pad, crop at offsets in [0, 2 pad]) of the
observations and the next observations; the target distribution from the
target encoder, actor and critic at s', projected onto the support through
r + discount z (Bellemare et al. 2017, Algorithm 1); the critic (encoder +
C51 head) by cross-entropy to it, each item weighted by its importance
weight when prioritized (Schaul et al. 2016), clipped by global norm, Adam;
the actor by -E[Q] of the just-updated critic plus the pre-tanh penalty,
the encoder's features detached (DrQ), clipped, Adam; both targets by Polyak
averaging; the per-item losses (priorities), Q and the actor loss read back
to the host, once.

Not part of troupe: the benchmark runs it (on the CPU from a virtual
environment under build/ that it makes; on a GPU with the machine's python3).
Usage: torch_d4pg.py THREADS BATCH SIZE FRAMES SECONDS eager|compile|reduce-overhead [cpu|cuda] [KEY=VALUE...]
keys (troupe's d4pg config defaults): channels=32 hidden=256 actions=1 atoms=51 prioritized=0
precision=float32|bfloat16; prints "updates_per_second X".
"""
import sys

import peer_timing

USAGE = ("usage: torch_d4pg.py THREADS BATCH SIZE FRAMES SECONDS eager|compile|reduce-overhead [cpu|cuda] "
         "[channels=32] [hidden=256] [actions=1] [atoms=51] [prioritized=0|1] [precision=float32|bfloat16]")
MODES = ("eager", "compile", "reduce-overhead")

# troupe's D4pgConfig defaults (proto/config.proto) the update uses.
V_MIN, V_MAX = 0.0, 100.0
LEARNING_RATE = 1e-4   # actor and critic
TARGET_TAU = 0.005
MAX_GRADIENT_NORM = 40.0
FEATURES = 50
AUGMENT_PAD = 4
PRE_TANH_BOUND, PRE_TANH_PENALTY = 3.0, 1.0


def pixels_in(frames):
    """uint8 frames [B, k, H, W, 3] as replay holds them -> float NCHW [B, 3k, H, W] / 255
    (channel f*3 + c: frame f's colour c)."""
    b, k, h, w, c = frames.shape
    return frames.permute(0, 1, 4, 2, 3).reshape(b, k * c, h, w).float() * (1.0 / 255.0)


def parse(argv, usage=USAGE, modes=MODES, devices=("cpu", "cuda")):
    """The arguments as a dict, or exits with the usage line naming what is wrong."""
    if len(argv) < 7:
        sys.exit(usage)
    try:
        args = {"threads": int(argv[1]), "batch": int(argv[2]), "size": int(argv[3]), "frames": int(argv[4]),
                "seconds": float(argv[5])}
    except ValueError as e:
        sys.exit(f"{usage}\n{e}")
    args["mode"] = argv[6]
    rest = argv[7:]
    args["device"] = "cpu"
    if rest and "=" not in rest[0]:
        args["device"] = rest.pop(0)
    if args["mode"] not in modes or args["device"] not in devices:
        sys.exit(usage)
    options = {"channels": 32, "hidden": 256, "actions": 1, "atoms": 51, "prioritized": 0, "precision": "float32"}
    for item in rest:
        key, _, value = item.partition("=")
        if key not in options:
            sys.exit(f"{usage}\nunknown option '{item}'")
        if key == "precision":
            if value not in ("float32", "bfloat16"):
                sys.exit(f"{usage}\nprecision={value}: float32 or bfloat16")
            options[key] = value
            continue
        try:
            options[key] = int(value)
        except ValueError:
            sys.exit(f"{usage}\n{key}={value}: not an integer")
    args.update(options)
    if min(args["threads"], args["batch"], args["frames"], args["channels"], args["hidden"], args["actions"]) < 1:
        sys.exit(f"{usage}\nTHREADS, BATCH, FRAMES, channels, hidden, actions >= 1")
    if args["size"] < 15 or args["seconds"] <= 0 or args["atoms"] < 2 or args["prioritized"] not in (0, 1):
        sys.exit(f"{usage}\nSIZE >= 15, SECONDS > 0, atoms >= 2, prioritized 0 or 1")
    return args


def conv_output(size):
    """The encoder's output height and width: one 3x3 stride-2 conv, three 3x3 stride-1."""
    return (size - 3) // 2 + 1 - 6


def build(args):
    """The update, a function of the batch that returns its readout, and the
    networks it updates ({"critic", "actor", "target_critic", "target_actor"})."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    device = args["device"]
    actions, atoms, hidden = args["actions"], args["atoms"], args["hidden"]

    class Mlp(nn.Module):
        """Linear layers with ReLU between; `detached` reads the weights as
        constants (troupe's Weights{trainable=false}: the critic inside the
        actor loss)."""

        def __init__(self, sizes):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

        def forward(self, x, detached=False):
            for i, layer in enumerate(self.layers):
                w, b = (layer.weight.detach(), layer.bias.detach()) if detached else (layer.weight, layer.bias)
                x = F.linear(x, w, b)
                if i + 1 < len(self.layers):
                    x = torch.relu(x)
            return x

    class Critic(nn.Module):
        """DrQ's encoder (convs, linear, layer norm, tanh) and the C51 head over
        (features, action): one parameter set, one optimizer, as troupe's."""

        def __init__(self):
            super().__init__()
            channels, frames = args["channels"], args["frames"]
            self.convs = nn.ModuleList([nn.Conv2d(3 * frames, channels, 3, stride=2)] +
                                       [nn.Conv2d(channels, channels, 3) for _ in range(3)])
            s = conv_output(args["size"])
            self.linear = nn.Linear(channels * s * s, FEATURES)
            self.norm = nn.LayerNorm(FEATURES)
            self.head = Mlp([FEATURES + actions, hidden, hidden, atoms])

        def encode(self, pixels):
            x = pixels
            for conv in self.convs:
                x = torch.relu(conv(x))
            return torch.tanh(self.norm(self.linear(x.flatten(1))))

        def logits(self, features, action, detached=False):
            return self.head(torch.cat([features, action], dim=1), detached)

    torch.manual_seed(1)
    critic = Critic().to(device)
    actor = Mlp([FEATURES, hidden, hidden, actions]).to(device)
    target_critic = Critic().to(device)
    target_actor = Mlp([FEATURES, hidden, hidden, actions]).to(device)
    target_critic.load_state_dict(critic.state_dict())
    target_actor.load_state_dict(actor.state_dict())
    for p in list(target_critic.parameters()) + list(target_actor.parameters()):
        p.requires_grad_(False)
    # Adam in PyTorch's form is troupe's (betas 0.9, 0.999, eps 1e-8).
    critic_adam = torch.optim.Adam(critic.parameters(), lr=LEARNING_RATE)
    actor_adam = torch.optim.Adam(actor.parameters(), lr=LEARNING_RATE)
    support = torch.linspace(V_MIN, V_MAX, atoms, device=device)
    dz = (V_MAX - V_MIN) / (atoms - 1)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=args["precision"] == "bfloat16")

    def random_shift(x):
        # Each image shifted by offsets in [-pad, pad], the border replicated:
        # out[r, q] = in[clamp(r + dy), clamp(q + dx)] (troupe's RandomShift).
        n, _, h, w = x.shape
        shifts = torch.randint(0, 2 * AUGMENT_PAD + 1, (n, 2), device=x.device) - AUGMENT_PAD
        rows = (torch.arange(h, device=x.device)[None, :] + shifts[:, :1]).clamp(0, h - 1)
        cols = (torch.arange(w, device=x.device)[None, :] + shifts[:, 1:]).clamp(0, w - 1)
        batch_index = torch.arange(n, device=x.device)[:, None, None, None]
        channel_index = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
        return x[batch_index, channel_index, rows[:, None, :, None], cols[:, None, None, :]]

    def project(probs, reward, discount):
        # Bellemare et al. 2017, Algorithm 1: Tz_j = r + discount z_j clipped to
        # [v_min, v_max], its probability split between the atoms either side
        # of b_j = (Tz_j - v_min) / dz in proportion to nearness, which is
        # p_j max(0, 1 - |b_j - i|) to atom i (all of it to b_j when whole).
        tz = (reward[:, None] + discount[:, None] * support[None, :]).clamp(V_MIN, V_MAX)
        b = ((tz - V_MIN) / dz).clamp(0, atoms - 1)
        nearness = (1 - (b[:, :, None] - torch.arange(atoms, device=b.device)[None, None, :]).abs()).clamp(min=0)
        return (probs[:, :, None] * nearness).sum(dim=1)

    def clip_by_global_norm(parameters):
        # troupe's ClipGradientsByGlobalNorm: all gradients scaled by
        # max_norm / norm when their joint norm exceeds max_norm.
        grads = [p.grad for p in parameters]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        scale = torch.where(norm > MAX_GRADIENT_NORM, MAX_GRADIENT_NORM / norm, torch.ones_like(norm))
        torch._foreach_mul_(grads, scale)

    critic_parameters = list(critic.parameters())
    actor_parameters = list(actor.parameters())
    online = critic_parameters + actor_parameters
    targets = list(target_critic.parameters()) + list(target_actor.parameters())

    def update(observation, action, reward, discount, next_observation, weights):
        observation = random_shift(pixels_in(observation))
        next_observation = random_shift(pixels_in(next_observation))
        # Target distribution: target critic at (s', target actor(s')), projected.
        with torch.no_grad(), autocast:
            next_features = target_critic.encode(next_observation)
            next_action = torch.tanh(target_actor(next_features))
            next_probs = torch.softmax(target_critic.logits(next_features, next_action).float(), dim=1)
        target = project(next_probs, reward, discount)

        # Critic: cross-entropy to the target; the encoder trained by this loss only.
        critic_adam.zero_grad(set_to_none=False)
        with autocast:
            features = critic.encode(observation)
            logits = critic.logits(features, action)
        log_probs = torch.log_softmax(logits.float(), dim=1)
        with torch.no_grad():
            item_loss = -(target * log_probs).sum(dim=1)
            item_q = torch.softmax(log_probs, dim=1) @ support
        weighted_target = target * weights[:, None] if args["prioritized"] else target
        critic_loss = -(log_probs * weighted_target).sum() / log_probs.shape[0]
        critic_loss.backward()
        clip_by_global_norm(critic_parameters)
        critic_adam.step()

        # Actor: -E[Q] of the updated critic (constants) at (s, actor(s)) on
        # the detached features, plus the pre-tanh penalty beyond the bound.
        actor_adam.zero_grad(set_to_none=False)
        actor_features = features.detach()
        with autocast:
            pre_tanh = actor(actor_features).float()
            q_logits = critic.logits(actor_features, torch.tanh(pre_tanh), detached=True)
        q = torch.softmax(q_logits.float(), dim=1) @ support
        above = torch.relu(pre_tanh - PRE_TANH_BOUND)
        below = torch.relu(-pre_tanh - PRE_TANH_BOUND)
        actor_loss = -q.mean() + PRE_TANH_PENALTY * ((above * above).mean() + (below * below).mean())
        actor_loss.backward()
        clip_by_global_norm(actor_parameters)
        actor_adam.step()

        # Targets by Polyak averaging: target += tau (online - target).
        with torch.no_grad():
            torch._foreach_lerp_(targets, online, TARGET_TAU)
        return torch.cat([item_loss, item_q, actor_loss.detach()[None]])

    return update, {"critic": critic, "actor": actor, "target_critic": target_critic, "target_actor": target_actor}


def synthetic_batch(args):
    """One random batch on the host, served every update (bench/synthetic.cc:
    uniform bytes for pixels, U(-1, 1) for floats; importance weights U(0, 1])."""
    import torch
    generator = torch.Generator().manual_seed(1)
    b, frames, size = args["batch"], args["frames"], args["size"]

    def uniform(*shape):
        return torch.rand(*shape, generator=generator) * 2 - 1

    pixels = (b, frames, size, size, 3)
    return [torch.randint(0, 256, pixels, dtype=torch.uint8, generator=generator), uniform(b, args["actions"]),
            uniform(b), uniform(b), torch.randint(0, 256, pixels, dtype=torch.uint8, generator=generator),
            1 - torch.rand(b, generator=generator)]


def main():
    args = parse(sys.argv)
    if args["mode"] == "reduce-overhead" and args["device"] == "cpu":
        # Exit 0 without a figure: the bench reports the row missing.
        print("torch_d4pg.py: reduce-overhead is CUDA graphs, unsupported on the CPU; skipped")
        return
    import torch
    torch.set_num_threads(args["threads"])
    peer_timing.float32_without_tf32()
    peer_timing.cudnn_algorithms_measured()
    update, _ = build(args)
    if args["mode"] == "compile":
        update = torch.compile(update)
    elif args["mode"] == "reduce-overhead":
        update = torch.compile(update, mode="reduce-overhead")
    host = synthetic_batch(args)
    batch = args["batch"]

    def step():
        # The batch to the device each update, the step's readout back once, as the learner does.
        readout = update(*[t.to(args["device"]) for t in host]).cpu()
        item_loss, item_q, actor_loss = readout[:batch], readout[batch:2 * batch], readout[-1]
        return float(item_loss.mean()), float(item_q.mean()), float(actor_loss)

    print(f"updates_per_second {peer_timing.steps_per_second(step, args['device'], args['seconds'])}")


if __name__ == "__main__":
    main()
