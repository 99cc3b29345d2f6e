"""The PyTorch 2.x peer of `troupe bench learner`: the DrQ network of
bench/learner_bench.cc (and bench/peers/libtorch_drq.cc), forward + backward +
Adam on CPU, eager or under torch.compile.

Not part of troupe: the benchmark runs it from a virtual environment under
build/ that it makes. Usage: torch_drq.py THREADS BATCH SIZE SECONDS eager|compile;
prints "samples_per_second X".
"""
import sys
import time

import torch
from torch import nn


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

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x))
        return self.head(torch.tanh(self.ln(self.fc(x.flatten(1)))))


def main():
    if len(sys.argv) != 6 or sys.argv[5] not in ("eager", "compile"):
        sys.exit("usage: torch_drq.py THREADS BATCH SIZE SECONDS eager|compile")
    threads, batch, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    seconds = float(sys.argv[4])
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    net = DrqNet(size)
    adam = torch.optim.Adam(net.parameters(), lr=1e-4)
    x = torch.rand(batch, 9, size, size)
    y = torch.rand(batch, 1)

    def step():
        adam.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        adam.step()

    if sys.argv[5] == "compile":
        step = torch.compile(step)
    for _ in range(3):  # warm up (compiles, when compiling)
        step()
    n, start = 0, time.perf_counter()
    while True:
        step()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 3:
            break
    print(f"samples_per_second {n * batch / elapsed}")


if __name__ == "__main__":
    main()
