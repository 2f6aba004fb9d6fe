"""``python -m workflows.cli`` runs the ``dsx`` command."""

from workflows.cli.main import main

main()
