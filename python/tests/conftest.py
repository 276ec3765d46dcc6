"""The tests exercise the installed package, whose compiled extension (``_distflash``) the
source folder ``python/distflash`` lacks. ``python -m pytest`` run from ``python/`` puts that
folder's parent first on ``sys.path``, where the source would shadow the installed package and
fail to collect; it is taken off the path here, before any test module imports ``distflash``.
"""

import os
import sys

SOURCE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != SOURCE_PARENT]
