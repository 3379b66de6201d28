"""Matrix products of an unmodified TensorFlow program offloaded to CPU hosts over MPI.

The hook (hook.py) in the task's process hands each large product through shared memory
(channel.py) to the compute agent beside it (agent.py), which cuts it by the shard plan
(plan.py) and sends the shards over MPI (wire.py) to the processors on the offload hosts
(processor.py); world.py starts and stops that MPI world. docs/offload.md tells the design.
"""
