"""What the agent measures: GPU availability, GPU sources, addresses and a free port."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from hypertf.core.errors import HyperTFError
from hypertf.node.probes import (
    GpuReading,
    NoGpuSource,
    NvmlGpuSource,
    StaticGpuSource,
    free_port,
    judge,
    select_address,
    task_key_of,
)
from hypertf.store import GpuProcess
from tests import fake_pynvml
from tests.conftest import wait_for
from tests.fake_pynvml import FakeGpu, FakeNvml

GIB = 1024**3


def reading(util: float = 0.0, used: int = 0, total: int = 16 * GIB, index: int = 0):
    return GpuReading(index=index, name="GPU", uuid=f"GPU-{index}", utilization=util,
                      memory_used=used, memory_total=total)


# --- judge ----------------------------------------------------------------------------------


@pytest.mark.parametrize("util, used, total, available", [
    (0.0, 0, 100, True),
    (10.0, 10, 100, True),       # both exactly at the thresholds
    (10.5, 0, 100, False),       # busy compute
    (0.0, 11, 100, False),       # someone holds memory although the GPU is idle
    (50.0, 50, 100, False),
    (0.0, 0, 0, False),          # no total memory reported: never available
])
def test_judge_needs_both_utilisation_and_memory_low(util, used, total, available):
    [gpu] = judge([reading(util, used, total)], util_max=10.0, mem_max=10.0)
    assert gpu.available is available


def test_judge_keeps_the_figures_and_order():
    readings = [reading(5.0, 1 * GIB, 16 * GIB, index=0), reading(90.0, 0, 16 * GIB, index=1)]
    gpus = judge(readings, util_max=10.0, mem_max=10.0)
    assert [g.index for g in gpus] == [0, 1]
    assert [g.available for g in gpus] == [True, False]
    assert (gpus[0].name, gpus[0].uuid, gpus[0].utilization) == ("GPU", "GPU-0", 5.0)
    assert (gpus[0].memory_used, gpus[0].memory_total) == (GIB, 16 * GIB)
    assert judge([], 10.0, 10.0) == []


def test_judge_thresholds_are_the_callers():
    [gpu] = judge([reading(util=40.0, used=30, total=100)], util_max=50.0, mem_max=30.0)
    assert gpu.available
    [gpu] = judge([reading(util=40.0, used=30, total=100)], util_max=39.9, mem_max=30.0)
    assert not gpu.available


# --- StaticGpuSource ------------------------------------------------------------------------


def test_static_from_a_count_gives_idle_gpus_with_stable_ids():
    readings = StaticGpuSource("node1", 3).read()
    assert [r.index for r in readings] == [0, 1, 2]
    assert [r.uuid for r in readings] == [f"GPU-static-node1-{i}" for i in range(3)]
    assert all(r.name == "Static GPU" and r.utilization == 0.0 and r.memory_used == 0
               for r in readings)
    assert all(r.memory_total == StaticGpuSource.DEFAULT_MEMORY for r in readings)
    assert StaticGpuSource("node1", 0).read() == []
    assert StaticGpuSource.name == "static"


def test_static_from_a_list_of_dicts():
    spec = [{"name": "Tesla K80", "uuid": "GPU-abc", "utilization": 75, "memory_used": 5,
             "memory_total": 10}, {}]
    first, second = StaticGpuSource("n", spec).read()
    assert first == GpuReading(0, "Tesla K80", "GPU-abc", 75.0, 5, 10)
    assert isinstance(first.utilization, float)
    assert second == GpuReading(1, "Static GPU", "GPU-static-n-1", 0.0, 0,
                                StaticGpuSource.DEFAULT_MEMORY)


def test_static_from_a_json_file_is_reread_on_every_probe(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{}, {}]))
    source = StaticGpuSource("n", str(path))
    assert [r.utilization for r in source.read()] == [0.0, 0.0]

    path.write_text(json.dumps([{}, {"utilization": 99}, {}]))
    readings = source.read()
    assert [r.utilization for r in readings] == [0.0, 99.0, 0.0]
    assert [g.available for g in judge(readings, 10.0, 10.0)] == [True, False, True]

    path.write_text("2")  # a count works in the file as well
    assert len(source.read()) == 2


@pytest.mark.parametrize("content", [None, "[{", ""])
def test_static_unreadable_file_is_a_hypertf_error_naming_it(tmp_path, content):
    path = tmp_path / "gpus.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HyperTFError, match=rf"static GPU file {path} unreadable"):
        StaticGpuSource("n", str(path)).read()


@pytest.mark.parametrize("content", [b"\xff\xfe[]", b'{"gpus": 2}', b'"two"'])
def test_static_file_with_bad_bytes_or_shape_is_a_hypertf_error(tmp_path, content):
    path = tmp_path / "gpus.json"
    path.write_bytes(content)
    with pytest.raises(HyperTFError):
        StaticGpuSource("n", str(path)).read()


def test_no_gpu_source_reads_nothing():
    assert NoGpuSource().read() == []


# --- NvmlGpuSource, at its boundary with a fake NVML module ---------------------------------


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(name=b"Tesla V100-SXM2-16GB", uuid=b"GPU-aaaa", util=3, used=1024,
                total=16 * GIB, mig=None),
        FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-bbbb", util=87, used=70 * GIB,
                total=80 * GIB, processes=[(4242, 70 * GIB)]),
    ]


def test_nvml_readings_are_converted():
    fake = FakeNvml(two_gpus())
    source = NvmlGpuSource(fake.module())
    first, second = source.read()
    assert first == GpuReading(0, "Tesla V100-SXM2-16GB", "GPU-aaaa", 3.0, 1024, 16 * GIB)
    assert second == GpuReading(1, "NVIDIA H100 80GB HBM3", "GPU-bbbb", 87.0, 70 * GIB,
                                80 * GIB, processes=(GpuProcess(4242, 70 * GIB),))
    assert isinstance(first.name, str) and isinstance(first.uuid, str)
    assert isinstance(first.utilization, float)
    assert source.name == "nvml"


def test_nvml_versions_of_driver_nvml_and_cuda():
    source = NvmlGpuSource(FakeNvml(two_gpus()).module())
    assert source.versions() == {"driver": "550.54.15", "nvml": "12.550.54.15", "cuda": "12.4"}
    broken = FakeNvml(two_gpus(), init_error=fake_pynvml.NVMLError_DriverNotLoaded())
    assert NvmlGpuSource(broken.module()).versions() == {}


def test_nvml_is_initialised_once_and_shut_down_on_close():
    fake = FakeNvml(two_gpus())
    source = NvmlGpuSource(fake.module())
    source.read()
    source.read()
    assert fake.calls.count("init") == 1
    source.close()
    assert fake.calls[-1] == "shutdown"
    source.close()  # closing twice does not shut NVML down twice
    assert fake.calls.count("shutdown") == 1


def test_nvml_init_failure_means_zero_gpus_without_exception():
    fake = FakeNvml(two_gpus(), init_error=fake_pynvml.NVMLError_DriverNotLoaded())
    source = NvmlGpuSource(fake.module())
    assert source.read() == []
    assert "count" not in fake.calls
    source.close()
    assert "shutdown" not in fake.calls


def test_nvml_count_failure_means_zero_gpus_then_recovers():
    fake = FakeNvml(two_gpus(), count_error=fake_pynvml.NVMLError_DriverNotLoaded())
    source = NvmlGpuSource(fake.module())
    assert source.read() == []
    assert "shutdown" in fake.calls  # NVML is shut down so the next probe starts clean
    fake.count_error = None
    assert len(source.read()) == 2
    assert fake.calls.count("init") == 2


@pytest.mark.parametrize("call, error", [
    ("handle", fake_pynvml.NVMLError_GpuIsLost()),
    ("name", fake_pynvml.NVMLError_GpuIsLost()),
    ("uuid", fake_pynvml.NVMLError_GpuIsLost()),
    ("memory", fake_pynvml.NVMLError_GpuIsLost()),
    ("util", fake_pynvml.NVMLError_NotSupported()),
])
def test_one_gpu_that_fails_is_unavailable_with_its_reason_the_others_stay(call, error):
    gpus = [FakeGpu(uuid=f"GPU-{i}") for i in range(3)]
    gpus[1].faults[call] = error
    fake = FakeNvml(gpus)
    readings = NvmlGpuSource(fake.module()).read()
    assert [r.index for r in readings] == [0, 1, 2]
    assert [bool(r.fault) for r in readings] == [False, True, False]
    assert type(error).__name__ in readings[1].fault
    judged = judge(readings, 10.0, 10.0)
    assert [g.available for g in judged] == [True, False, True]
    assert judged[1].reason.startswith("unreadable (NVMLError_")
    assert "shutdown" not in fake.calls  # the healthy GPUs keep being read


def test_every_gpu_failing_restarts_nvml_on_the_next_probe():
    gpus = [FakeGpu(faults={"memory": fake_pynvml.NVMLError_GpuIsLost()}) for _ in range(2)]
    fake = FakeNvml(gpus)
    source = NvmlGpuSource(fake.module())
    assert all(r.fault for r in source.read())
    assert "shutdown" in fake.calls
    for gpu in gpus:
        gpu.faults.clear()
    assert not any(r.fault for r in source.read())
    assert fake.calls.count("init") == 2


def test_mig_enabled_gpu_is_unavailable_for_whole_gpu_grants():
    gpus = [FakeGpu(uuid="GPU-mig", mig=fake_pynvml.NVML_DEVICE_MIG_ENABLE),
            FakeGpu(uuid="GPU-plain", mig=fake_pynvml.NVML_DEVICE_MIG_DISABLE),
            FakeGpu(uuid="GPU-old", mig=None)]  # MIG not supported: a whole GPU
    readings = NvmlGpuSource(FakeNvml(gpus).module()).read()
    assert [r.mig for r in readings] == [True, False, False]
    assert not readings[0].fault  # its utilisation is not asked (NotSupported on MIG)
    judged = judge(readings, 10.0, 10.0)
    assert [g.available for g in judged] == [False, True, True]
    assert judged[0].reason == "MIG enabled: HyperTF grants whole GPUs only"


def test_process_list_not_supported_is_not_a_fault():
    gpus = [FakeGpu(faults={"processes": fake_pynvml.NVMLError_NotSupported()})]
    [reading] = NvmlGpuSource(FakeNvml(gpus).module()).read()
    assert (reading.fault, reading.processes) == ("", ())


# --- processes on a GPU: foreign or the holding job's -----------------------------------------


def test_any_process_makes_a_gpu_unavailable_and_is_named():
    owners = {100: None, 200: "20261122-085000-a1b2c3.alice"}
    readings = [
        GpuReading(0, "GPU", "GPU-0", 0.0, 0, GIB, processes=(GpuProcess(100, 300),)),
        GpuReading(1, "GPU", "GPU-1", 0.0, 0, GIB, processes=(GpuProcess(200),)),
        GpuReading(2, "GPU", "GPU-2", 0.0, 0, GIB),
    ]
    foreign, own, idle = judge(readings, 10.0, 10.0, task_of=owners.get)
    assert (foreign.available, foreign.reason) == (False, "foreign process pid 100")
    assert foreign.processes == [GpuProcess(100, 300, None)]
    assert (own.available, own.reason) == (False, "in use by 20261122-085000-a1b2c3.alice")
    assert idle.available and idle.reason == ""
    # Foreign to the job that holds the GPU: any process not of that job.
    assert foreign.foreign_processes("20261122-085000-a1b2c3.alice") == foreign.processes
    assert own.foreign_processes("20261122-085000-a1b2c3.alice") == []
    assert own.foreign_processes("20261122-090000-ffffff.bob") == own.processes
    assert own.foreign_processes(None) == own.processes


def test_task_key_of_reads_a_real_process_environment():
    key = "20261122-085000-a1b2c3.alice"
    path = {"PATH": "/bin:/usr/bin"}
    with subprocess.Popen(["sleep", "30"], env={"HYPERTF_TASK_KEY": key, **path}) as ours, \
            subprocess.Popen(["sleep", "30"], env=path) as other:
        try:
            for process in (ours, other):  # environ is the new program's once it has exec'd
                wait_for(lambda p=process: Path(f"/proc/{p.pid}/cmdline").read_bytes()
                         .startswith(b"sleep"), 10, "sleep to start")
            assert task_key_of(ours.pid) == key
            assert task_key_of(other.pid) is None
        finally:
            ours.kill()
            other.kill()
    assert task_key_of(2**22 + 1) is None  # no such process


def test_static_source_stages_processes_mig_and_faults(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"processes": [123]}, {"mig": True},
                                {"fault": "NVMLError_GpuIsLost: GPU is lost"}, {}]))
    readings = StaticGpuSource("n", str(path)).read()
    assert readings[0].processes == (GpuProcess(123),)
    judged = judge(readings, 10.0, 10.0, task_of=lambda pid: None)
    assert [g.available for g in judged] == [False, False, False, True]
    assert [g.reason.split(" ")[0] for g in judged[:3]] == ["foreign", "MIG", "unreadable"]


def test_real_pynvml_without_a_gpu_reads_zero_gpus():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except Exception:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    source = NvmlGpuSource()
    assert source.read() == []
    source.close()


# --- select_address -------------------------------------------------------------------------

ADDRESSES = {
    "lo": ["127.0.0.1"],
    "eth0": ["192.168.1.10", "192.168.1.11"],
    "ib0": ["10.40.3.7"],
}


def test_select_by_interface_name_gives_its_first_address():
    assert select_address("eth0", ADDRESSES, preferred="10.40.3.7") == "192.168.1.10"
    assert select_address("ib0", ADDRESSES, preferred="") == "10.40.3.7"


@pytest.mark.parametrize("spec, expected", [
    ("10.40.0.0/16", "10.40.3.7"),
    ("192.168.1.0/24", "192.168.1.10"),
    ("192.168.1.11/32", "192.168.1.11"),
    ("10.40.3.0/16", "10.40.3.7"),  # host bits set: accepted (strict=False)
    ("127.0.0.0/8", "127.0.0.1"),
])
def test_select_by_cidr(spec, expected):
    assert select_address(spec, ADDRESSES, preferred="") == expected


def test_without_spec_the_preferred_address_wins_when_owned():
    assert select_address(None, ADDRESSES, preferred="10.40.3.7") == "10.40.3.7"
    assert select_address("", ADDRESSES, preferred="192.168.1.11") == "192.168.1.11"


def test_without_spec_falls_back_to_first_non_loopback():
    assert select_address(None, ADDRESSES, preferred="172.16.0.1") == "192.168.1.10"


def test_loopback_comes_last():
    assert select_address(None, {"lo": ["127.0.0.1"]}, preferred="10.0.0.1") == "127.0.0.1"
    assert select_address(None, {}, preferred="10.0.0.1") == "127.0.0.1"


def test_unknown_interface_names_the_interfaces_and_the_cidr_form():
    with pytest.raises(HyperTFError) as err:
        select_address("eth9", ADDRESSES, preferred="")
    message = str(err.value)
    assert "'eth9' is neither an interface of this node (lo, eth0, ib0)" in message
    assert "nor a subnet like 10.40.0.0/16" in message


def test_cidr_matching_nothing_lists_addresses_and_the_setting_to_fix():
    with pytest.raises(HyperTFError) as err:
        select_address("172.16.0.0/12", ADDRESSES, preferred="")
    message = str(err.value)
    assert "no address of this node lies in 172.16.0.0/12" in message
    assert "127.0.0.1, 192.168.1.10, 192.168.1.11, 10.40.3.7" in message
    assert "hypertf_data_network / hypertf_mgmt_network" in message


# --- free_port ------------------------------------------------------------------------------


def _an_unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def test_free_port_is_in_range_and_bindable():
    low, high = 40000, 40999
    port = free_port((low, high))
    assert low <= port <= high
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", port))


def test_free_port_skips_taken_numbers():
    port = _an_unused_port()
    assert free_port((port, port + 1), taken={port + 1}) == port


def test_free_port_raises_when_the_only_port_is_in_use():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(HyperTFError, match=rf"no free port in {port}-{port}; widen"):
            free_port((port, port))


def test_free_port_raises_when_every_number_is_reserved():
    with pytest.raises(HyperTFError, match="hypertf_port_range"):
        free_port((40000, 40001), taken={40000, 40001})
