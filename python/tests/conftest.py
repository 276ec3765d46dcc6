import os
import sys

# `fakes` sits beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
