"""``python -m symalg`` runs the ``symalg`` command (:func:`symalg.cli.main`) and exits with its status."""
import sys

from .cli import main

if __name__ == "__main__":  # importing this module (documentation tools do) runs nothing
    sys.exit(main())
