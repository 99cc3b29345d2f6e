"""The timing loop the PyTorch peers share: warm-up steps (compilation, when
compiling), then whole steps until `seconds` have passed, the device
synchronised before each clock reading."""
import time

import torch


def steps_per_second(step, device, seconds, warm_up=3):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warm_up):
        step()
    sync()
    n, start = 0, time.perf_counter()
    while True:
        step()
        n += 1
        if n % 4 == 0:
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return n / elapsed


def float32_without_tf32():
    """Float32 as float32 on a GPU: PyTorch runs cuDNN convolutions in TF32
    (10-bit mantissa inputs) by default; troupe's FLOAT32 keeps float32
    inputs (its TF32 is off), so the float32 rows compare like with like."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def cudnn_algorithms_measured():
    """cuDNN's convolution algorithms measured once per shape
    (cudnn.benchmark, the usual setting for fixed-shape training), as
    troupe's CUDA backend picks its own (cudnnFind*)."""
    torch.backends.cudnn.benchmark = True
