"""python/troupe/layout.py (a run directory's file names and its logs'
columns) for the tools/ scripts, loaded by its path: neither a build nor an
installed troupe package is needed.

    from troupe_layout import layout
    layout.path(run_dir, "eval_csv")
"""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python", "troupe", "layout.py")
_spec = importlib.util.spec_from_file_location("troupe_layout_module", _PATH)
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)
