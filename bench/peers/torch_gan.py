"""The PyTorch 2.x peer of `troupe bench gan`: the GAN mode's generator +
discriminator step (gan/networks.h, as bench/peers/libtorch_gan_step.cc): DCGAN
generator with batch norm, spectrally normalised discriminator with one power
iteration per D update, hinge loss, Adam for both; eager or under
torch.compile, on the CPU or a GPU, float32 or bfloat16 autocast.

Not part of troupe: the benchmark runs it. Usage:
torch_gan.py THREADS BATCH CHANNELS NOISE SECONDS eager|compile [cpu|cuda] [float32|bfloat16];
prints "images_per_second X" (real images shown to D per second).
"""
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

import peer_timing

USAGE = ("usage: torch_gan.py THREADS BATCH CHANNELS NOISE SECONDS eager|compile "
         "[cpu|cuda] [float32|bfloat16]")


class SpectralWeight:
    """w / sigma(w) with a persistent u (one power iteration when `update`)."""

    def __init__(self, shape, fan_in, device):
        self.w = ((torch.rand(shape, device=device) * 2 - 1) / math.sqrt(fan_in)).requires_grad_()
        self.u = torch.randn(shape[0], device=device)

    def normalized(self, update):
        mat = self.w.reshape(self.w.shape[0], -1)
        if update:
            with torch.no_grad():
                v = F.normalize(mat.t() @ self.u, dim=0)
                self.u = F.normalize(mat @ v, dim=0)
        v = F.normalize(mat.t() @ self.u, dim=0).detach()
        sigma = torch.dot(self.u.detach(), mat @ v)
        return self.w / sigma


def parse(argv):
    if not 7 <= len(argv) <= 9:
        sys.exit(USAGE)
    try:
        threads, batch, c, noise, seconds = int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5])
    except ValueError as e:
        sys.exit(f"{USAGE}\n{e}")
    mode = argv[6]
    device = argv[7] if len(argv) > 7 else "cpu"
    dtype = argv[8] if len(argv) > 8 else "float32"
    if mode not in ("eager", "compile") or device not in ("cpu", "cuda") or dtype not in ("float32", "bfloat16"):
        sys.exit(USAGE)
    if min(threads, batch, c, noise) < 1 or seconds <= 0:
        sys.exit(f"{USAGE}\nTHREADS, BATCH, CHANNELS, NOISE >= 1, SECONDS > 0")
    return threads, batch, c, noise, seconds, mode, device, dtype


def main():
    threads, batch, c, noise, seconds, mode, device, dtype = parse(sys.argv)
    torch.set_num_threads(threads)
    peer_timing.float32_without_tf32()
    peer_timing.cudnn_algorithms_measured()
    torch.manual_seed(1)
    fc = nn.Linear(noise, 2 * c * 49, bias=False)
    bn0, bn1 = nn.BatchNorm2d(2 * c), nn.BatchNorm2d(c)
    up1 = nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1, bias=False)
    up2 = nn.ConvTranspose2d(c, 1, 4, stride=2, padding=1)
    generator = nn.ModuleList([fc, bn0, bn1, up1, up2]).to(device)

    def generate(z):
        h = torch.relu(bn0(fc(z).view(-1, 2 * c, 7, 7)))
        h = torch.relu(bn1(up1(h)))
        return torch.tanh(up2(h))

    w1 = SpectralWeight((c, 1, 4, 4), 16, device)
    w2 = SpectralWeight((2 * c, c, 4, 4), c * 16, device)
    w3 = SpectralWeight((1, 2 * c * 49), 2 * c * 49, device)
    b1, b2, b3 = (torch.zeros(n, device=device, requires_grad=True) for n in (c, 2 * c, 1))

    def discriminate(x, update):
        h = F.leaky_relu(F.conv2d(x, w1.normalized(update), b1, stride=2, padding=1), 0.2)
        h = F.leaky_relu(F.conv2d(h, w2.normalized(update), b2, stride=2, padding=1), 0.2)
        return F.linear(h.flatten(1), w3.normalized(update), b3)

    g_adam = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.0, 0.9))
    d_adam = torch.optim.Adam([w1.w, w2.w, w3.w, b1, b2, b3], lr=4e-4, betas=(0.0, 0.9))
    real = torch.rand(batch, 1, 28, 28, device=device) * 2 - 1
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def d_step():
        d_adam.zero_grad(set_to_none=False)
        with autocast:
            with torch.no_grad():
                fake = generate(torch.randn(batch, noise, device=device))
            scores = discriminate(torch.cat([real, fake.to(real.dtype)]), True).float()
        loss = torch.relu(1 - scores[:batch]).mean() + torch.relu(1 + scores[batch:]).mean()
        loss.backward()
        d_adam.step()

    def g_step():
        g_adam.zero_grad(set_to_none=False)
        with autocast:
            loss = -discriminate(generate(torch.randn(batch, noise, device=device)), False).float().mean()
        loss.backward()
        g_adam.step()

    if mode == "compile":
        g_step = torch.compile(g_step)  # the D step updates u in Python state: left eager
    def step():
        d_step()
        g_step()

    print(f"images_per_second {batch * peer_timing.steps_per_second(step, device, seconds)}")


if __name__ == "__main__":
    main()
