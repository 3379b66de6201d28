"""An absl entry point around the mirrored example: flags defined with absl, run by app.run.

absl refuses any flag it does not define, so this is the kind of script the legacy flags
(``--ps_hosts/--worker_hosts/--job_name/--task_index``) used to break. HyperTF's default
(``--legacy-flags`` auto) does not pass them here, because this script defines none: the
cluster comes from TF_CONFIG. Forced with ``--legacy-flags``, every task dies with
"FATAL Flags parsing error: Unknown command line flag 'ps_hosts'" and HyperTF's failure
message names ``--no-legacy-flags``.

    hypertf train --script examples/absl_flags.py --worker 2 -- --steps 200

The training itself is mirrored_strategy.py's (imported from beside this file), so its last
line is the same ``test_accuracy=<x.xxxx>`` and its exit code the same.
"""

from __future__ import annotations

import mirrored_strategy
from absl import app, flags

BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "global batch, split across the workers")
LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.01, "Adam learning rate")
STEPS = flags.DEFINE_integer("steps", 200, "synchronous training steps")


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    return mirrored_strategy.main([f"--batch_size={BATCH_SIZE.value}",
                                   f"--learning_rate={LEARNING_RATE.value}",
                                   f"--steps={STEPS.value}"])


if __name__ == "__main__":
    app.run(main)
