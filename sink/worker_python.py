"""The Python interpreter Spark's Python workers run: it must have Tally, or every task of a
Tally job fails with `No module named 'sink'` (after pages of Java stack traces).

Spark starts its Python workers with $PYSPARK_PYTHON, else `python3` from the PATH, which is
often not the interpreter that runs the driver and has Tally installed (a venv that was not
activated). It reads the variable twice: the JVM once, when it starts (the lookup of installed
data sources that finds `format("tally")` runs with it), and the driver's SparkContext once,
into `pythonExec`, which every mapInArrow job and registered data source carries. `import
tally` fills the variable in before a session exists (see tally/__init__); for a session that
started earlier, `use_driver_python` corrects `pythonExec` where that is safe: with a local
master, whose workers run on this machine, so this interpreter is one they can run.
"""

from __future__ import annotations

import logging
import subprocess
import sys

log = logging.getLogger("tally.sink")

# Interpreters already checked, by path: whether each can import the sink.
_checked: dict[str, bool] = {}


def has_tally(python: str) -> bool:
    """Whether `python` can import the sink (one subprocess per interpreter and process)."""
    if python == sys.executable:
        return True
    if python not in _checked:
        try:
            done = subprocess.run([python, "-c", "import sink"], capture_output=True,
                                  timeout=120)
            _checked[python] = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _checked[python] = False
    return _checked[python]


def use_driver_python(spark) -> None:
    """With a local master, make Spark's Python workers run this interpreter when the one
    they would run cannot import Tally. Other masters' workers run elsewhere: left alone."""
    context = spark.sparkContext
    if not str(context.master).startswith("local"):
        return
    current = context.pythonExec
    if has_tally(current):
        return
    log.warning("Spark's Python workers would run %s, which cannot import Tally; using %s "
                "(set PYSPARK_PYTHON to choose)", current, sys.executable)
    context.pythonExec = sys.executable
