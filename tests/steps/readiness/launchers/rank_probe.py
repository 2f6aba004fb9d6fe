"""A rank program for the launcher's tests: notes where it runs, then sleeps (never shipped).

``python -m tests.steps.readiness.launchers.rank_probe FOLDER SECONDS [MODULE...]`` writes
``FOLDER/rank-<RANK>.json`` with its pid, process group and session, and which of the modules named were
imported already when it started, then sleeps ``SECONDS``.
"""

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    """Note this rank's pid, process group, session and the modules it found imported, then sleep."""
    folder, seconds = Path(sys.argv[1]), float(sys.argv[2])
    imported = [module for module in sys.argv[3:] if module in sys.modules]
    note = {"pid": os.getpid(), "pgid": os.getpgrp(), "sid": os.getsid(0), "imported": imported}
    target = folder / f"rank-{os.environ['RANK']}.json"
    target.with_suffix(".tmp").write_text(json.dumps(note))
    os.replace(target.with_suffix(".tmp"), target)
    time.sleep(seconds)


if __name__ == "__main__":
    main()
