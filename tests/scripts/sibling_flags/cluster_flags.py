"""The command line of train.py, kept apart from it as tf_cnn_benchmarks keeps its flags in
benchmark_cnn.py: the four legacy flags, with a strict parser (an unknown flag is fatal)."""

from __future__ import annotations

import argparse


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ps_hosts", default="", help="comma-separated host:port of the ps")
    parser.add_argument("--worker_hosts", default="", help="comma-separated host:port")
    parser.add_argument("--job_name", default="", help="ps or worker; none: train alone")
    parser.add_argument("--task_index", type=int, default=0, help="index within the job")
    parser.add_argument("--work_s", type=float, default=1.0, help="a worker's training time")
    return parser.parse_args(argv)
