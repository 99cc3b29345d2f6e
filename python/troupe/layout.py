"""A run directory's file names and its logs' columns, for Python: the
troupe package (troupe.runs) and the tools/ scripts read them from here.
Standard library only, and importable on its own (tools/ load this file by
path, without the native module). The C++ owner of the layout is
common/run_layout.h; ctest Python.runs checks that FILES and the columns
here are its RunFileNames() and its schemas. docs/running.md describes them.

    from troupe import layout
    os.path.join(run_dir, layout.FILES["eval_csv"])
"""

# key -> file or folder name in a run directory (common/run_layout.h).
FILES = {
    "config": "config.textproto",
    "launch": "launch.txt",
    "status": "status.txt",
    "learner_address": "learner.address",
    "metrics_csv": "metrics.csv",
    "metrics_jsonl": "metrics.jsonl",
    "eval_csv": "eval.csv",
    "episodes_csv": "episodes.csv",
    "learning_curve": "learning_curve.png",
    "fid_curve": "fid_curve.png",
    "returns": "returns.png",
    "samples": "samples.png",
    "samples_folder": "samples",
    "report": "report.html",
    "checkpoints": "checkpoints",
    "logs": "logs",
    "videos": "videos",
    "slurm": "slurm",
    "secrets": "secrets",
    "slurm_script": "job.sh",
    "slurm_jobs": "jobs.txt",
    "agent_checkpoint": "agent.ckpt",
    "replay_checkpoint": "replay.ckpt",
    "counters": "counters.txt",
}

# Each log's CSV columns, in order, by (mode, file key). A resumed run of an
# older troupe may have fewer: read columns by name. An RL run's metrics.csv
# has its agent's own metrics (Agent::metric_names, agents/agent.h) between
# samples_per_insert and eval_return; these are the platform's columns around them.
COLUMNS = {
    ("RL", "metrics_csv"): ("seconds", "frames", "updates", "updates_per_s", "frames_per_s", "replay_size",
                            "samples_per_insert", "eval_return", "parameter_version", "input_wait_ms",
                            "frames_uploaded_per_update", "device_idle_ms"),
    ("RL", "eval_csv"): ("frames", "updates", "eval_return", "actions_at_bound"),
    ("GAN", "metrics_csv"): ("seconds", "images", "steps", "images_per_s", "d_loss", "g_loss", "d_lr", "g_lr"),
    ("GAN", "eval_csv"): ("images", "steps", "classifier_fid", "classifier_score", "seconds"),
    ("SCRIPTED", "episodes_csv"): ("episode", "env", "frames", "return", "seconds"),
}


def path(run_dir, key):
    """RUN_DIR/NAME of FILES[key]."""
    import os
    return os.path.join(run_dir, FILES[key])
