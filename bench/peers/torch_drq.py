"""The PyTorch 2.x peer of `troupe bench learner`: the DrQ network of
bench/learner_bench.cc (and bench/peers/libtorch_drq.cc), forward + backward +
Adam, eager or under torch.compile, on the CPU or a GPU (float32, or bfloat16
autocast: bfloat16 matmul/conv inputs, float32 weights, as troupe's BFLOAT16).
Its input is what troupe's side is handed: uint8 frames [B, 3, H, W, 3] as
replay holds them, made float NCHW / 255 inside the step.

Not part of troupe: the benchmark runs it (on the CPU from a virtual
environment under build/ that it makes; on a GPU with the machine's python3).
Usage: torch_drq.py THREADS BATCH SIZE SECONDS eager|compile [cpu|cuda] [float32|bfloat16];
prints "samples_per_second X".
"""
import sys

import torch
from torch import nn

import peer_timing
from torch_d4pg import pixels_in


class DrqNet(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.convs = nn.ModuleList(
            [nn.Conv2d(9, 32, 3, stride=2)] + [nn.Conv2d(32, 32, 3) for _ in range(3)])
        s = (size - 3) // 2 + 1 - 6
        self.fc = nn.Linear(32 * s * s, 50)
        self.ln = nn.LayerNorm(50)
        self.head = nn.Sequential(nn.Linear(50, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                  nn.Linear(1024, 1))

    def forward(self, frames):
        x = pixels_in(frames)
        for conv in self.convs:
            x = torch.relu(conv(x))
        return self.head(torch.tanh(self.ln(self.fc(x.flatten(1)))))


USAGE = "usage: torch_drq.py THREADS BATCH SIZE SECONDS eager|compile [cpu|cuda] [float32|bfloat16]"


def parse(argv):
    """The arguments, or exits with the usage line naming what is wrong."""
    if not 6 <= len(argv) <= 8:
        sys.exit(USAGE)
    try:
        threads, batch, size, seconds = int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4])
    except ValueError as e:
        sys.exit(f"{USAGE}\n{e}")
    mode = argv[5]
    device = argv[6] if len(argv) > 6 else "cpu"
    dtype = argv[7] if len(argv) > 7 else "float32"
    if mode not in ("eager", "compile") or device not in ("cpu", "cuda") or dtype not in ("float32", "bfloat16"):
        sys.exit(USAGE)
    if threads < 1 or batch < 1 or size < 15 or seconds <= 0:
        sys.exit(f"{USAGE}\nTHREADS, BATCH >= 1, SIZE >= 15, SECONDS > 0")
    return threads, batch, size, seconds, mode, device, dtype


def main():
    threads, batch, size, seconds, mode, device, dtype = parse(sys.argv)
    torch.set_num_threads(threads)
    peer_timing.float32_without_tf32()
    peer_timing.cudnn_algorithms_measured()
    torch.manual_seed(1)
    net = DrqNet(size).to(device)
    adam = torch.optim.Adam(net.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (batch, 3, size, size, 3), dtype=torch.uint8, device=device)
    y = torch.rand(batch, 1, device=device)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

    def step():
        adam.zero_grad(set_to_none=False)
        with autocast:
            loss = torch.nn.functional.mse_loss(net(x).float(), y)
        loss.backward()
        adam.step()

    if mode == "compile":
        step = torch.compile(step)
    print(f"samples_per_second {batch * peer_timing.steps_per_second(step, device, seconds)}")

if __name__ == "__main__":
    main()
