"""A rank program for the check path's tests: rank 0 writes the text it is given (never shipped).

``python -m tests.steps.readiness.launchers.echo_rank TEXT --out FILE``: rank 0 writes TEXT to FILE; a
TEXT of ``-`` writes nothing, as a rank that lost its result would.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    """Write the text as rank 0's result, unless it is ``-``."""
    text, out = sys.argv[1], Path(sys.argv[sys.argv.index("--out") + 1])
    if os.environ["RANK"] == "0" and text != "-":
        out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
