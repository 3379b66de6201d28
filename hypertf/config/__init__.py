"""The inventory and the hypertf_* settings: read on the operator's machine and by
every node's agent."""
