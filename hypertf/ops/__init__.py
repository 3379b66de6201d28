"""Operations: provisioning with Ansible, the local ZooKeeper, agents without a
service manager, and the lab (a multi-host cluster on one machine)."""
