"""What vLLM's processes print names a failure's cause (engine/run/process_log.py)."""

from __future__ import annotations

import subprocess
import sys

from lensapp.engine.run.process_log import ProcessLog

STARTUP_FAILURE = """\
(EngineCore pid=9439) ERROR 12-01 05:21:42 [core.py:1510] EngineCore failed to start.
(EngineCore pid=9439) ERROR 12-01 05:21:42 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=9439) ERROR 12-01 05:21:42 [core.py:1510]     raise RuntimeError(
(EngineCore pid=9439) ERROR 12-01 05:21:42 [core.py:1510] RuntimeError: Insufficient space in /dev/shm for \
shared-memory allocation: 160 MiB required, 64 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host).
Traceback (most recent call last):
  File "x.py", line 1, in <module>
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_the_cause_is_the_last_error_a_child_printed_not_the_parents_wrapper():
    log = ProcessLog()
    mark = log.mark()
    log.feed("(EngineCore pid=1) WARNING 12-01 05:06:36 [arg_utils.py:3005] chunked prefill\n")
    log.feed(STARTUP_FAILURE)
    assert log.cause(mark) == ("RuntimeError: Insufficient space in /dev/shm for shared-memory allocation: 160 MiB "
                               "required, 64 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host).")
    later = log.mark()
    assert log.cause(later) is None                       # nothing new since
    log.feed("(Worker pid=7) ValueError: Available memory on node 0 (5.62/9.09 GiB) is less than requested\n")
    assert log.cause(later).startswith("ValueError: Available memory on node 0")


def test_capture_tees_what_child_processes_print():
    code = ("import subprocess, sys, time\n"
            "from lensapp.engine.run.process_log import LOG\n"
            "LOG.capture(); mark = LOG.mark()\n"
            "child = 'import sys; sys.stderr.write(\"(Worker pid=3) KeyError: 7\\\\n\")'\n"
            "subprocess.run([sys.executable, '-c', child])\n"
            "time.sleep(0.5)\n"
            "print('CAUSE', LOG.cause(mark))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "CAUSE KeyError: 7" in out.stdout, out.stderr
    assert "(Worker pid=3) KeyError: 7" in out.stderr          # the terminal still sees it
