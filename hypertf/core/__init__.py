"""Pure logic: formats, the matrix, placement, admission, the cluster spec, a job's
fate. No ZooKeeper, SSH, Invoke, Ansible or terminal library (an import contract)."""
