#!/usr/bin/env python3
"""troupe's TensorBoard event files, read back by TensorBoard's own reader.

    python3 tests/tensorboard/tensorboard_reads_runs.py --troupe BUILD/troupe --build BUILD

ctest runs it as TensorBoard.ReadsRlAndGanRuns (label tensorboard). It makes
two short real runs with `troupe run` and reads each run directory with
tensorboard.backend.event_processing.event_accumulator.EventAccumulator
(orphaned-data purging off, so that what is checked is the files, not
TensorBoard's repair of them):
  * RL (cartpole.swingup from state, 12,000 frames, an evaluation every 4,000
    with its video): every metrics.csv column and every eval.csv column is a
    scalar series whose steps are the rows' frames and whose values are the
    rows' values (to the CSV's printed digits); each evaluation's video is a
    frame strip image at its frames;
  * GAN (Fashion-MNIST, 320 images, then resumed to 480 after rows and an
    event past its checkpoint were added, as a run killed after its
    checkpoint leaves them): the scalars equal metrics.csv and eval.csv rows
    at step = steps, the sample grid is an image at each evaluation, and the
    event written past the checkpoint (by TensorBoard's own writer) is gone.
    Skipped, saying so, without Debian's dataset-fashion-mnist.
Every file's first event is file_version "brain.Event:2".

tensorboard comes from PyPI into a venv under the build tree
(BUILD/tensorboard-venv), installed on first use; it is a test dependency
only. Exit 77 (skipped), saying why, when PyPI cannot be reached or no venv
can be made; a failed install while PyPI answers is a failure.
"""
import argparse
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77
REQUIREMENT = "tensorboard==2.21.0"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def pypi_answers():
    """(True, None) when the index pip uses answers; else (False, why)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/tensorboard/", timeout=20) as reply:
            return reply.status == 200, f"{index} answered {reply.status}"
    except Exception as error:  # noqa: BLE001  (any failure to connect means offline)
        return False, f"{index} cannot be reached: {error}"


def venv_python(build):
    """The venv's python with tensorboard installed, installing it once.
    Exits 77 when PyPI cannot be reached, 1 when it answers but the install fails."""
    venv = os.path.join(build, "tensorboard-venv")
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    if os.path.exists(marker) and open(marker).read().strip() == REQUIREMENT:
        return python
    print(f"(installing {REQUIREMENT} from PyPI into {venv}, once)", flush=True)
    if not os.path.exists(python):
        made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            print(f"skipped: cannot make a venv in {venv} (apt-get install python3-venv): {made.stderr[-300:]}")
            sys.exit(SKIP)
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", REQUIREMENT],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        answers, why = pypi_answers()
        if not answers:
            print(f"skipped: cannot install {REQUIREMENT}: {why}")
            sys.exit(SKIP)
        print(f"FAILED: PyPI answers but `pip install {REQUIREMENT}` failed:\n{done.stdout}{done.stderr}")
        sys.exit(1)
    open(marker, "w").write(REQUIREMENT + "\n")
    return python


class Checks:
    """Collects failures so that one run reports all of them."""

    def __init__(self):
        self.failures = []

    def expect(self, condition, message):
        if not condition:
            self.failures.append(message)
        return condition


def read_csv(path):
    """(header, rows as lists of strings)."""
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def close_to_printed(value, printed):
    """Whether float32 `value` is the number the CSV printed as `printed`
    (half a unit of its last printed digit, and float32's own rounding)."""
    mantissa, _, exponent = printed.lower().partition("e")  # %g may print 6.25e-05
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10.0 ** (int(exponent or 0) - decimals)
    # The two errors add: the CSV rounds the double to its digits, the event
    # file rounds it to float32 (half an ulp, 2^-24 of the value).
    return abs(value - float(printed)) <= 0.5 * unit * 1.01 + abs(float(printed)) * 2.0 ** -23


def compare_series(checks, accumulator, tag, rows, step_column, value_column, run):
    """The scalar series `tag` must be the rows' (step, value) pairs, in order."""
    if not checks.expect(tag in accumulator.Tags()["scalars"], f"{run}: no scalar series {tag}"):
        return
    points = accumulator.Scalars(tag)
    want = [(int(float(row[step_column])), row[value_column]) for row in rows]
    if not checks.expect(len(points) == len(want),
                         f"{run}: {tag} has {len(points)} points, the CSV {len(want)} rows "
                         f"(steps {[p.step for p in points]} against {[w[0] for w in want]})"):
        return
    for point, (step, printed) in zip(points, want):
        checks.expect(point.step == step, f"{run}: {tag} point at step {point.step}, the CSV row at {step}")
        checks.expect(close_to_printed(point.value, printed),
                      f"{run}: {tag} at step {step} is {point.value}, the CSV says {printed}")


def png_size(data):
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def check_files_start_with_version(checks, run_dir, run):
    from tensorboard.backend.event_processing import event_file_loader
    paths = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    checks.expect(paths, f"{run}: no event file in {run_dir}")
    for path in paths:
        events = list(event_file_loader.EventFileLoader(path).Load())
        checks.expect(events and events[0].file_version == "brain.Event:2",
                      f"{run}: {os.path.basename(path)}'s first event is not file_version brain.Event:2")
    return paths


def load(run_dir):
    from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0},
        purge_orphaned_data=False)
    accumulator.Reload()
    return accumulator


def troupe(binary, args, log, timeout):
    with open(log, "w") as out:
        done = subprocess.run([binary, *args], stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"troupe {' '.join(args)} exited {done.returncode}:\n{open(log).read()[-3000:]}")
    return open(log).read()


def only_run_dir(runs_dir):
    runs = os.listdir(runs_dir)
    assert len(runs) == 1, f"{runs_dir} holds {runs}"
    return os.path.join(runs_dir, runs[0])


RL_CONFIG = """name: "tensorboard_rl" mode: RL
env {{ task: "cartpole.swingup" observation: STATE action_repeat: 4 }}
pool {{ num_envs: 1 num_threads: 1 }}
d4pg {{ hidden: [64, 64] v_min: 0 v_max: 200 n_step: 3 }}
learner {{ batch_size: 64 publish_every: 10 min_replay_size: 300 samples_per_insert: 32 checkpoint_every_s: 1 }}
actors {{ count: 1 random_frames: 2000 }}
evaluator {{ every_frames: 4000 episodes: 1 record_video: true }}
runs_dir: "{runs_dir}"
total_frames: 12000
"""

# metrics.csv column -> tag (step: the frames column); eval.csv likewise.
RL_METRICS = {"updates": "train/updates", "updates_per_s": "speed/updates_per_second",
              "frames_per_s": "speed/frames_per_second", "replay_size": "replay/size",
              "samples_per_insert": "replay/samples_per_insert", "critic_loss": "train/critic_loss",
              "actor_loss": "train/actor_loss", "q_mean": "train/q_mean",
              "parameter_version": "train/parameter_version"}
RL_EVAL = {"eval_return": "eval/return", "actions_at_bound": "eval/actions_at_bound"}


def check_rl(checks, binary, work):
    runs_dir = os.path.join(work, "rl_runs")
    config = os.path.join(work, "rl.textproto")
    open(config, "w").write(RL_CONFIG.format(runs_dir=runs_dir))
    output = troupe(binary, ["run", config], os.path.join(work, "rl.log"), timeout=600)
    run_dir = only_run_dir(runs_dir)
    checks.expect(f"tensorboard --logdir {run_dir}" in output, "RL: troupe run does not say how to open TensorBoard")
    check_files_start_with_version(checks, run_dir, "RL")
    accumulator = load(run_dir)
    tags = accumulator.Tags()
    checks.expect(sorted(tags["scalars"]) == sorted(list(RL_METRICS.values()) + list(RL_EVAL.values())),
                  f"RL: scalar tags {sorted(tags['scalars'])}")
    header, rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    checks.expect(len(rows) >= 2, f"RL: {len(rows)} metrics rows")
    for column, tag in RL_METRICS.items():
        compare_series(checks, accumulator, tag, rows, header.index("frames"), header.index(column), "RL")
    eval_header, evals = read_csv(os.path.join(run_dir, "eval.csv"))
    checks.expect(len(evals) >= 2, f"RL: {len(evals)} evaluations")
    for column, tag in RL_EVAL.items():
        compare_series(checks, accumulator, tag, evals, eval_header.index("frames"), eval_header.index(column), "RL")
    # Each evaluation's video as a strip of 5 frames at half its 480x480, 4-pixel gaps.
    checks.expect(tags["images"] == ["eval/frames"], f"RL: image tags {tags['images']}")
    if "eval/frames" in tags["images"]:
        images = accumulator.Images("eval/frames")
        checks.expect([i.step for i in images] == [int(row[0]) for row in evals],
                      f"RL: frame strips at {[i.step for i in images]}, evaluations at {[row[0] for row in evals]}")
        for image in images:
            size = png_size(image.encoded_image_string)
            checks.expect(size == (5 * 240 + 4 * 4, 240) == (image.width, image.height),
                          f"RL: frame strip at {image.step} is {size} ({image.width}x{image.height})")
    print(f"RL: {run_dir}: {len(rows)} metrics rows and {len(evals)} evaluations read back; "
          f"{len(tags['scalars'])} scalar series, {len(tags['images'])} image series")


GAN_CONFIG = """name: "tensorboard_gan" mode: GAN
gan {{ batch_size: 16 generator_channels: 8 discriminator_channels: 8 noise_size: 16 total_images: 320
      eval_every_images: 160 eval_samples: 200 classifier_checkpoint: "{classifier}" }}
runs_dir: "{runs_dir}"
"""

GAN_METRICS = {"images": "gan/images_seen", "d_loss": "gan/d_loss", "g_loss": "gan/g_loss",
               "d_lr": "gan/d_learning_rate", "g_lr": "gan/g_learning_rate", "images_per_s": "speed/images_per_second"}
GAN_EVAL = {"classifier_fid": "gan/fid", "classifier_score": "gan/classifier_score"}


def check_gan(checks, binary, work, build, classifier=None):
    if not os.path.isdir(FASHION_MNIST):
        print(f"GAN: skipped: no Fashion-MNIST at {FASHION_MNIST} (apt-get install dataset-fashion-mnist)")
        return
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    runs_dir = os.path.join(work, "gan_runs")
    config = os.path.join(work, "gan.textproto")
    # The FID classifier: FashionClassifierTest's (ctest runs that first), or
    # one trained on first use and kept in the build tree for the next run of this test.
    if classifier is None or not os.path.exists(classifier):
        classifier = os.path.join(build, "tensorboard-test", "fashion_mnist_classifier.ckpt")
        os.makedirs(os.path.dirname(classifier), exist_ok=True)
    open(config, "w").write(GAN_CONFIG.format(classifier=classifier, runs_dir=runs_dir))
    troupe(binary, ["run", config], os.path.join(work, "gan.log"), timeout=900)
    run_dir = only_run_dir(runs_dir)
    # As a run killed after its checkpoint (20 steps) leaves them: rows and an
    # event past it. The event comes from TensorBoard's own writer, in a file of its own.
    with open(os.path.join(run_dir, "eval.csv"), "a") as f:
        f.write("999999,9999,1.0,1.0,1.0\n")
    with open(os.path.join(run_dir, "metrics.csv"), "a") as f:
        f.write("999.0,999999,9999,1,0,0,0,0\n")
    time.sleep(1.1)  # a later file name than troupe's first
    writer = EventFileWriter(run_dir)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=9999, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="gan/d_loss", simple_value=1e6)])))
    writer.close()
    time.sleep(1.1)
    troupe(binary, ["run", "--resume", run_dir, "--set", "gan.total_images=480"], os.path.join(work, "gan_resume.log"),
           timeout=900)
    paths = check_files_start_with_version(checks, run_dir, "GAN")
    checks.expect(len(paths) == 3, f"GAN: {len(paths)} event files (the run's, TensorBoard's writer's, the resumed run's)")
    # The resumed run's file marks the restart past its checkpoint (20 steps),
    # which TensorBoard's default reader honours by dropping later points.
    from tensorboard.backend.event_processing import event_file_loader
    resumed = list(event_file_loader.EventFileLoader(paths[-1]).Load())
    checks.expect(len(resumed) > 1 and resumed[1].session_log.status == event_pb2.SessionLog.START
                  and resumed[1].step == 21, f"GAN: the resumed file's second event is {resumed[1:2]}, not a START at 21")
    accumulator = load(run_dir)
    tags = accumulator.Tags()
    checks.expect(sorted(tags["scalars"]) == sorted(list(GAN_METRICS.values()) + list(GAN_EVAL.values())),
                  f"GAN: scalar tags {sorted(tags['scalars'])}")
    header, rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    for column, tag in GAN_METRICS.items():
        compare_series(checks, accumulator, tag, rows, header.index("steps"), header.index(column), "GAN")
    eval_header, evals = read_csv(os.path.join(run_dir, "eval.csv"))
    for column, tag in GAN_EVAL.items():
        compare_series(checks, accumulator, tag, evals, eval_header.index("steps"), eval_header.index(column), "GAN")
    checks.expect([int(r[eval_header.index("steps")]) for r in evals] == [0, 10, 20, 30],
                  f"GAN: evaluations at steps {[r[1] for r in evals]}")
    # The 8x8 sample grid at each evaluation, as samples.png has it.
    checks.expect(tags["images"] == ["gan/samples"], f"GAN: image tags {tags['images']}")
    if "gan/samples" in tags["images"]:
        images = accumulator.Images("gan/samples")
        checks.expect([i.step for i in images] == [int(r[1]) for r in evals],
                      f"GAN: grids at steps {[i.step for i in images]}")
        last = images[-1].encoded_image_string if images else b""
        checks.expect(last == open(os.path.join(run_dir, "samples.png"), "rb").read(),
                      "GAN: the last grid is not samples.png's bytes")
    print(f"GAN: {run_dir}: {len(rows)} metrics rows and {len(evals)} evaluations read back across a resume; "
          f"{len(tags['scalars'])} scalar series, {len(tags['images'])} image series")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--troupe", required=True, help="the troupe binary")
    parser.add_argument("--build", required=True, help="the build tree (the venv and the classifier live there)")
    parser.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["rl", "gan"], help="one of the two runs")
    parser.add_argument("--classifier", help="an FID classifier checkpoint to use when it exists "
                        "(FashionClassifierTest's); else one is trained into the build tree")
    args = parser.parse_args()
    if not args.in_venv:
        python = venv_python(args.build)
        os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:], "--in-venv"])
    import tensorboard
    print(f"tensorboard {tensorboard.__version__} reads troupe's runs", flush=True)
    checks = Checks()
    work = tempfile.mkdtemp(prefix="troupe_tensorboard_")
    try:
        if args.only in (None, "rl"):
            check_rl(checks, args.troupe, work)
        if args.only in (None, "gan"):
            check_gan(checks, args.troupe, work, args.build, args.classifier)
    finally:
        if not checks.failures:
            shutil.rmtree(work, ignore_errors=True)
    for failure in checks.failures:
        print("FAILED:", failure)
    if checks.failures:
        print(f"(the runs are kept in {work})")
        return 1
    print("every series, step and value read back as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
