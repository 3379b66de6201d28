"""``hypertf export``: the manifests validate against each target's own schema, and say what
``hypertf train`` would give each task. Offline: schemas in tests/data (see its README)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from hypertf.config.inventory import load_inventory
from hypertf.core.errors import UsageError
from hypertf.export import ExportOptions, NodeSetup, export, job_for
from hypertf.export.job import QUIET_ENV, node_setup
from hypertf.launch.request import TrainRequest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
EXAMPLES = REPO / "examples"
K8S_VERSION = "1.31.0"
IMAGE = "registry.example/hypertf-digits:1"
SETUP = NodeSetup(task_env=(("DATA_DIR", "/data"),), python_packages=("scikit-learn", "pandas"),
                  python_packages_no_deps=("tf-keras==2.21.0",))


def request(**kwargs: Any) -> TrainRequest:
    return TrainRequest(**{"script": str(EXAMPLES / "mirrored_strategy.py"), "workers": 2,
                           **kwargs})


def documents(target: str, req: TrainRequest, **options: Any) -> list[dict[str, Any]]:
    text, _notes = export(req, ExportOptions(target, image=IMAGE, **options), SETUP)
    return list(yaml.safe_load_all(text))


SHAPES = {
    "mirrored": {},
    "parameter server": {"chief": True, "ps": 1, "script": str(EXAMPLES / "ps_strategy.py")},
    "legacy": {"ps": 2, "script": str(EXAMPLES / "legacy_tf1.py"), "gpus_per_ps": 0},
    "everything": {"priority": -7, "timeout": 90.5, "max_restarts": 3, "env": ("LR=0.1",),
                   "checkpoint_dir": "/ckpt", "args": ("--steps", "5", "a b")},
}

# -- Kubernetes ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_k8s_objects_pass_kubernetes_validate_strict(shape):
    for doc in documents("k8s", request(**SHAPES[shape]), queue="team-a"):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_k8s_tf_config_names_the_services_and_maps_the_options():
    docs = documents("k8s", request(script=str(EXAMPLES / "ps_strategy.py"), ps=1,
                                    chief=True, gpus_per_worker=2, priority=5,
                                    timeout=60, max_restarts=2, env=("LR=0.1",),
                                    args=("--steps", "3")), namespace="ml")
    kinds = [d["kind"] for d in docs]
    assert kinds == ["PriorityClass"] + ["Service"] * 4 + ["Job"] * 4
    assert docs[0]["value"] == 5 and docs[0]["preemptionPolicy"] == "Never"
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    jobs = [d for d in docs if d["kind"] == "Job"]
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        tf_config = json.loads(env["TF_CONFIG"])
        task = f"{tf_config['task']['type']}-{tf_config['task']['index']}"
        assert job["metadata"]["name"] == f"ps-strategy-{task}"
        # Every address is a headless Service of this job that selects this very pod.
        for addresses in tf_config["cluster"].values():
            for address in addresses:
                host, port = address.split(":")
                service, namespace, svc = host.split(".")
                assert (namespace, svc, port) == ("ml", "svc", "2222")
                assert services[service]["spec"]["clusterIP"] == "None"
        selector = services[f"ps-strategy-{task}"]["spec"]["selector"]
        assert selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
        gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)
        assert gpus == (0 if task.startswith("ps") else 2)
        assert job["spec"]["backoffLimit"] == 2
        assert job["spec"]["activeDeadlineSeconds"] == 60
        assert pod["priorityClassName"] == "hypertf-priority-5"
        assert env["LR"] == "0.1" and env["DATA_DIR"] == "/data"
        assert {k: env[k] for k in QUIET_ENV} == QUIET_ENV
        assert container["command"] == ["python", "ps_strategy.py", "--steps", "3"]


def test_k8s_without_priority_or_timeout_sets_neither():
    docs = documents("k8s", request())
    assert [d["kind"] for d in docs] == ["Service"] * 2 + ["Job"] * 2
    for job in docs[2:]:
        assert "activeDeadlineSeconds" not in job["spec"]
        assert "priorityClassName" not in job["spec"]["template"]["spec"]
        assert job["spec"]["backoffLimit"] == 0


def test_legacy_flags_follow_train_rules():
    legacy = documents("k8s", request(ps=1, script=str(EXAMPLES / "legacy_tf1.py")))
    command = legacy[-1]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["python", "legacy_tf1.py",
                       "--ps_hosts=legacy-tf1-ps-0.default.svc:2222",
                       "--worker_hosts=legacy-tf1-worker-0.default.svc:2222,"
                       "legacy-tf1-worker-1.default.svc:2222",
                       "--job_name=ps", "--task_index=0"]
    off = documents("k8s", request(ps=1, script=str(EXAMPLES / "legacy_tf1.py"),
                                   legacy_flags="off"))
    assert off[-1]["spec"]["template"]["spec"]["containers"][0]["command"] == \
        ["python", "legacy_tf1.py"]


def test_quiet_env_is_the_launchers():
    from hypertf.launch.attempt import QUIET_ENV as LAUNCHER_QUIET_ENV

    assert QUIET_ENV == LAUNCHER_QUIET_ENV


# -- TFJob ---------------------------------------------------------------------------------


def closed(schema: Any) -> Any:
    """The CRD schema with unknown properties refused (Kubernetes would silently prune
    them, hiding a misspelt field)."""
    if isinstance(schema, dict):
        result = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            result["additionalProperties"] = False
        return result
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    return schema


@functools.cache
def tfjob_schema() -> dict[str, Any]:
    """Parsed once: the CRD is 0.6 MB of YAML."""
    crd = yaml.load((DATA / "kubeflow" / "kubeflow.org_tfjobs.yaml").read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return closed(version["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("shape", SHAPES)
def test_tfjob_matches_the_training_operators_crd(shape):
    schema = tfjob_schema()
    docs = documents("tfjob", request(**SHAPES[shape]), queue="team-a")
    tfjob = docs[-1]
    jsonschema.validate(tfjob, schema)
    for doc in docs[:-1]:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert tfjob["apiVersion"] == "kubeflow.org/v1" and tfjob["kind"] == "TFJob"
    for spec in tfjob["spec"]["tfReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow"
        assert container["ports"][0]["name"] == "tfjob-port"
        assert "TF_CONFIG" not in {e["name"] for e in container["env"]}
        # Kubernetes' own validation of the pod template the operator stamps out.
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": spec["template"]["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_tfjob_a_misspelt_field_fails_the_schema():
    tfjob = documents("tfjob", request())[-1]
    tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replica"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(tfjob, tfjob_schema())


def test_tfjob_shapes_and_note():
    tfjob = documents("tfjob", request(chief=True, ps=1, max_restarts=2, timeout=30))[-1]
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 1}
    assert specs["Worker"]["restartPolicy"] == "ExitCode"
    assert tfjob["spec"]["runPolicy"]["activeDeadlineSeconds"] == 30
    _text, notes = export(request(), ExportOptions("tfjob", image=IMAGE))
    assert any("injects" in note and "TF_CONFIG" in note for note in notes)


def test_tfjob_legacy_flags_take_the_index_from_the_operators_tf_config(tmp_path):
    """The operator's one pod template per role: --task_index comes from TF_CONFIG."""
    tfjob = documents("tfjob", request(ps=1, script=str(EXAMPLES / "legacy_tf1.py"),
                                       args=("--steps", "it's")))[-1]
    command = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"]
    (tmp_path / "legacy_tf1.py").write_text("import json, sys; print(json.dumps(sys.argv[1:]))")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TF_CONFIG": json.dumps({"cluster": {}, "task": {"type": "worker", "index": 1}})}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=True)
    assert json.loads(done.stdout) == [
        "--ps_hosts=legacy-tf1-ps-0.default.svc:2222",
        "--worker_hosts=legacy-tf1-worker-0.default.svc:2222,"
        "legacy-tf1-worker-1.default.svc:2222",
        "--job_name=worker", "--task_index=1", "--steps", "it's"]


# -- Marathon ------------------------------------------------------------------------------


def marathon_validator() -> jsonschema.Validator:
    app = json.loads((DATA / "marathon" / "AppDefinition.json").read_text())
    group = json.loads((DATA / "marathon" / "Group.json").read_text())
    registry = Registry().with_resources([
        ("./AppDefinition.json", Resource.opaque(app)),
        (group["id"].rsplit("/", 1)[0] + "/AppDefinition.json", Resource.opaque(app)),
    ])
    return jsonschema.Draft4Validator(group, registry=registry)


@pytest.mark.parametrize("shape", SHAPES)
def test_marathon_group_matches_marathons_schema(shape):
    text, notes = export(request(**SHAPES[shape]), ExportOptions("marathon", image=IMAGE), SETUP)
    group = json.loads(text)
    marathon_validator().validate(group)
    assert any("restarts tasks that exit" in note for note in notes)
    apps = [(sub["id"], app["id"], app) for sub in group["groups"] for app in sub["apps"]]
    for role, index, app in apps:
        tf_config = json.loads(app["env"]["TF_CONFIG"])
        assert tf_config["task"] == {"type": role, "index": int(index)}
        assert f"{index}-{role}-{group['id'][1:]}.marathon.mesos:2222" in \
            tf_config["cluster"][role]


def test_marathon_schema_refuses_a_bad_app():
    group = json.loads(export(request(), ExportOptions("marathon", image=IMAGE))[0])
    group["groups"][0]["apps"][0]["instance"] = 1
    with pytest.raises(jsonschema.ValidationError):
        marathon_validator().validate(group)


# -- Docker --------------------------------------------------------------------------------


def test_docker_context_installs_what_python_env_does(tmp_path):
    out = tmp_path / "ctx"
    _text, notes = export(request(gpus_per_worker=0, args=("--steps", "5")),
                          ExportOptions("docker", image=IMAGE), SETUP, output=str(out))
    dockerfile = (out / "Dockerfile").read_text()
    assert 'RUN ["pip", "install", "--no-cache-dir", "tensorflow-cpu", "scikit-learn", ' \
           '"pandas"]' in dockerfile
    assert 'RUN ["pip", "install", "--no-cache-dir", "--no-deps", "tf-keras==2.21.0"]' \
        in dockerfile
    assert 'ENV DATA_DIR="/data"' in dockerfile
    assert 'CMD ["python", "mirrored_strategy.py", "--steps", "5"]' in dockerfile
    assert (out / "app" / "mirrored_strategy.py").read_bytes() == \
        (EXAMPLES / "mirrored_strategy.py").read_bytes()
    assert any(f"docker build -t {IMAGE} {out}" in note for note in notes)


def test_docker_sync_dir_and_gpu_wheel(tmp_path):
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "train.py").write_text("print('hi')\n")
    out = tmp_path / "ctx"
    export(TrainRequest(script="pkg/train.py", sync_dir=str(code)),
           ExportOptions("docker"), NodeSetup(), output=str(out))
    dockerfile = (out / "Dockerfile").read_text()
    assert '"tensorflow[and-cuda]", "scikit-learn"]' in dockerfile
    assert 'CMD ["python", "pkg/train.py"]' in dockerfile
    assert (out / "app" / "pkg" / "train.py").is_file()


# -- inventory and bad input ---------------------------------------------------------------


def test_node_setup_reads_the_inventory(tmp_path):
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"hypertf_zookeeper_hosts": "127.0.0.1:2181",
                 "hypertf_task_env": {"A": 1}, "hypertf_python_packages": ["numpy"]},
        "children": {"gpu_nodes": {"hosts": {"n1": {"ansible_host": "10.0.0.1"},
                                             "n2": {"ansible_host": "10.0.0.2"}}}}}}))
    setup = node_setup(load_inventory(inventory))
    assert setup == NodeSetup(task_env=(("A", "1"),), python_packages=("numpy",))
    assert job_for(request(), ExportOptions("k8s", image=IMAGE), setup).tasks[0].env["A"] == "1"


BAD = {
    "unknown target": (ExportOptions("nomad", image=IMAGE), ["nomad", "k8s", "docker"]),
    "no image": (ExportOptions("k8s"), ["--image"]),
    "underscore name": (ExportOptions("k8s", image=IMAGE, name="my_job"),
                        ["'my_job'", "DNS-1123", "lowercase"]),
    "long name": (ExportOptions("tfjob", image=IMAGE, name="a" * 60), ["at most 54"]),
    "bad namespace": (ExportOptions("k8s", image=IMAGE, namespace="ML"), ["--namespace"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_a_usage_error(case):
    options, words = BAD[case]
    with pytest.raises(UsageError) as err:
        job_for(request(), options)
    assert err.value.exit_code == 2
    assert all(word in str(err.value) for word in words), str(err.value)


def test_offload_hosts_are_not_exported():
    """The offload's MPI world runs over the static cluster's SSH: a manifest cannot hold it,
    and silently dropping it would run a different job."""
    with pytest.raises(UsageError) as err:
        job_for(request(offload_hosts=2), ExportOptions("k8s", image=IMAGE))
    assert err.value.exit_code == 2 and "--offload-hosts is not exported" in str(err.value)


# -- the command lines ---------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "words"), [
    (["--to", "nomad"], ["unknown export target"]),
    (["--to", "k8s"], ["--image"]),
    (["--to", "k8s", "--image", "x:1", "--name", "My_Job"], ["DNS-1123"]),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, argv, words):
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "export", *argv, "--script",
                           "a.py", "-i", str(tmp_path / "none.yml")],
                          capture_output=True, text=True, cwd=tmp_path)
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert all(word in errors[0] for word in words)


@pytest.mark.parametrize("runner", ["hypertf", "invoke"])
def test_cli_and_invoke_export_what_the_function_does(tmp_path, runner):
    argv = ["export", "--to", "k8s", "--image", IMAGE, "--script",
            str(EXAMPLES / "mirrored_strategy.py"), "--worker", "2", "--max-restarts", "1",
            "-i", str(tmp_path / "none.yml"), "--", "--steps", "5"]
    head = [sys.executable, "-m", "hypertf.cli"] if runner == "hypertf" else \
        [str(Path(sys.executable).parent / "invoke"), "-r", str(REPO)]
    done = subprocess.run([*head, *argv], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    expected, _ = export(request(max_restarts=1, args=("--steps", "5")),
                         ExportOptions("k8s", image=IMAGE))
    assert done.stdout == expected
