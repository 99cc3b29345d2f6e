"""Run directories (`troupe run` writes runs/NAME-DATE-TIME/) and trained policies.

    run = troupe.Run("runs/walker_walk-20260101-120000")
    run.config["env"]["task"], run.metrics["frames"], run.eval["eval_return"]
    policy = troupe.Policy.load(run.path)           # the latest checkpoint
    actions = policy.act(timestep.observation)      # numpy in, float32 [B, A] out
"""
from __future__ import annotations

import json
import os
from typing import List, Optional

import numpy as np

from troupe import _native
from troupe import layout


def _read_csv(path: str) -> Optional[np.ndarray]:
    """A CSV with a header row as a structured array (one field per column), or None if absent."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
        rows = [line.strip().split(",") for line in f if line.strip()]
    columns = []
    for i, name in enumerate(header):
        values = [row[i] if i < len(row) else "" for row in rows]
        for kind in (np.int64, np.float64):
            try:
                columns.append(np.array(values, dtype=kind))
                break
            except ValueError:
                continue
        else:
            columns.append(np.array(values, dtype=str))
    if not rows:
        return np.zeros(0, dtype=[(name, np.float64) for name in header])
    return np.rec.fromarrays(columns, names=header)


class Run:
    """A run directory, read once when made:
    config: the resolved ExperimentConfig as a dict (proto field names; 64-bit integers as strings)
    metrics: metrics.csv as a numpy record array (None if absent); metrics_records(): metrics.jsonl as dicts
    eval: eval.csv (frames, updates, eval_return, ...) as a record array, None if absent
    episodes: episodes.csv (scripted runs), None if absent
    checkpoints: agent checkpoints, oldest first.
    Errors: troupe.NotFoundError / InvalidArgumentError naming the directory (not a run directory)."""

    def __init__(self, path: str):
        self.path = str(path)
        config_json, checkpoints = _native.open_run(self.path)
        self.config: dict = json.loads(config_json)
        self.checkpoints: List[str] = list(checkpoints)
        self.metrics = _read_csv(layout.path(self.path, "metrics_csv"))
        self.eval = _read_csv(layout.path(self.path, "eval_csv"))
        self.episodes = _read_csv(layout.path(self.path, "episodes_csv"))

    @property
    def latest_checkpoint(self) -> Optional[str]:
        return self.checkpoints[-1] if self.checkpoints else None

    def metrics_records(self) -> List[dict]:
        path = layout.path(self.path, "metrics_jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def policy(self, checkpoint: str = "", num_threads: int = 1) -> "Policy":
        return Policy.load(self.path, checkpoint, num_threads)

    def __repr__(self):
        return f"troupe.Run({self.path!r})"


class Policy:
    """The run's agent's policy of a checkpoint, acting deterministically
    (exploration off, as the evaluator does), computed by the C++ policy
    (agents/policy.h)."""

    def __init__(self, native: _native.Policy):
        self._native = native

    @classmethod
    def load(cls, run_dir: str, checkpoint: str = "", num_threads: int = 1) -> "Policy":
        """The policy of `checkpoint` (default: the run's latest) for the run's agent.
        Errors: FailedPrecondition (troupe.Error) when the run has no checkpoint;
        ValueError for a checkpoint of another task or architecture; both name the path."""
        return cls(_native.Policy(str(run_dir), str(checkpoint), num_threads))

    def act(self, observation) -> np.ndarray:
        """Actions float32 [B, A] in [-1, 1] for observations as a pool gives them:
        float32 [B, S] (state) or uint8 [B, H, W, 3k] (pixels); a single
        observation (no batch dimension) gives [A]."""
        observation = np.asarray(observation)
        single = observation.ndim == (3 if self._native.pixels else 1)
        actions = self._native.act(observation[None] if single else observation)
        return actions[0] if single else actions

    @property
    def checkpoint(self) -> str:
        return self._native.path

    @property
    def updates(self) -> int:
        """The learner's update count stored in the checkpoint."""
        return self._native.updates

    @property
    def task(self) -> str:
        return self._native.task

    @property
    def action_size(self) -> int:
        return self._native.action_size

    def __repr__(self):
        return f"troupe.Policy({self.checkpoint!r}, updates={self.updates})"
