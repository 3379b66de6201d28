"""Matrix products of an unmodified TensorFlow program offloaded to CPU hosts over MPI.

The hook (hook.py) in the task's process hands each large product through shared memory
(channel.py) to the compute agent beside it (agent.py), which cuts it by the shard plan
(plan.py) and sends the shards over MPI (wire.py) to the processors on the offload hosts
(processor.py); world.py starts and stops that MPI world. docs/offload.md tells the design.
"""

DEFAULT_MIN_FLOPS = 1 << 24  # ~16 Mflop: a 256 x 256 x 256 product; smaller ones stay local
