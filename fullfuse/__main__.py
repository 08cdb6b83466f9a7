"""``python -m fullfuse ...``: the `fullfuse` command, where the console script is not on PATH (a venv not activated,
``pip install --user``)."""
import sys

from .cli import main

sys.exit(main())
