"""The launcher, on the operator's machine: a request, its attempts, the node
sessions over SSH, detached jobs and their logs."""
