"""fake_tf.py standing in for a TF2 ParameterServerStrategy script: it behaves as fake_tf.py
does, and its code names ParameterServerStrategy, as such a script's does (what HyperTF's
scan looks for before it suggests --chief)."""

from __future__ import annotations

import sys

import fake_tf

ParameterServerStrategy = None  # the name a real script uses; this one never calls it

if __name__ == "__main__":
    sys.exit(fake_tf.main())
