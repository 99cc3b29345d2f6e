"""tools/gan_study_table.py on a study written here: a row per run with its
batch, scaling and replicas from the config, its last and best FID and
median images/s; unfinished runs in brackets; a missing directory refused."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "gan_study_table.py")


def write_run(directory, batch, scaling, replicas, evals, rates, done):
    os.makedirs(directory)
    with open(os.path.join(directory, "config.textproto"), "w") as f:
        f.write(f'name: "gan"\nlearner {{\n  engine {{\n    replicas: 4\n  }}\n}}\n'
                f"gan {{\n  batch_size: {batch}\n  lr_scaling: {scaling}\n  engine {{\n    replicas: {replicas}\n  }}\n}}\n")
    with open(os.path.join(directory, "eval.csv"), "w") as f:
        f.write("images,steps,classifier_fid,classifier_score,seconds\n0,0,970.0,1.0,1.0\n")
        for images, fid in evals:
            f.write(f"{images},{images // batch},{fid},3.0,10.0\n")
    with open(os.path.join(directory, "metrics.csv"), "w") as f:
        f.write("seconds,images,steps,images_per_s,d_loss,g_loss,d_lr,g_lr\n")
        for i, rate in enumerate(rates):
            f.write(f"{i},{i * batch},{i},{rate},1,1,0.0004,0.0001\n")
    if done:
        with open(os.path.join(directory, "done"), "w") as f:
            f.write("done\n")


class GanStudyTableTest(unittest.TestCase):
    def test_table(self):
        with tempfile.TemporaryDirectory() as top:
            write_run(os.path.join(top, "equal_images", "b64"), 64, "LINEAR", 1,
                      [(250000, 60.0), (500032, 27.5)], [100, 200, 300], True)
            write_run(os.path.join(top, "equal_images", "b1024"), 1024, "SQRT", 1,
                      [(250880, 80.0), (500736, 90.25)], [400, 500, 600, 700], True)
            write_run(os.path.join(top, "replicas_2", "b256"), 256, "LINEAR", 2, [(125184, 150.0)], [250], False)
            write_run(os.path.join(top, "equal_steps", "none_yet"), 64, "LINEAR", 1, [], [], False)
            out = subprocess.run([sys.executable, TOOL, top, "--machine", "test box"], capture_output=True,
                                 text=True, check=True).stdout
            rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:]]
            self.assertEqual(rows, [
                ["equal_images", "64", "LINEAR", "1", "500,032", "7,813", "27.5", "27.5", "200", "test box"],
                ["equal_images", "1024", "SQRT", "1", "500,736", "489", "90.2", "80.0", "550", "test box"],
                ["replicas_2", "256", "LINEAR", "2", "125,184", "489", "(150.0 at 125k images)", "150.0", "250",
                 "test box"],
            ])

    def test_not_a_directory(self):
        result = subprocess.run([sys.executable, TOOL, "/nonexistent/study"], capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("/nonexistent/study is not a directory", result.stderr)


if __name__ == "__main__":
    unittest.main()
