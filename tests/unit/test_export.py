"""``hypertf export``: the manifests validate against each target's own schema, and say what
``hypertf train`` would give each task. Offline: schemas in tests/data (see its README)."""

from __future__ import annotations

import functools
import getpass
import json
import os
import re
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
from hypertf.export.docker import local_tensorflow
from hypertf.export.job import QUIET_ENV, node_setup
from hypertf.launch.request import TrainRequest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
EXAMPLES = REPO / "examples"
K8S_VERSION = "1.31.0"
IMAGE = "registry.example/hypertf-digits:1"
SETUP = NodeSetup(task_env=(("DATA_DIR", "/data"),), python_packages=("scikit-learn", "pandas"),
                  python_packages_no_deps=("tf-keras==2.21.0",),
                  tensorflow="tensorflow-cpu==2.19.1")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(NAME) expansion of env values, command and args (k8s.io/kubernetes
    third_party/forked/golang/expansion): '$$' is '$', an unknown $(NAME) stays."""
    return re.sub(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))",
                  lambda m: "$" if m.group(1) == "$" else env.get(m.group(2), m.group(0)),
                  value)


def pod_env(container: dict[str, Any], fields: dict[str, str]) -> dict[str, str]:
    """A container's environment as the kubelet builds it: the downward API's ``fields``,
    each value expanded from the variables defined before it."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = expand(item["value"], env)
    return env


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
                                    args=("--steps", "3")), namespace="ml",
                     name="ps-strategy")
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
        assert container["command"] == ["python", "/app/ps_strategy.py", "--steps", "3"]


def test_k8s_without_priority_or_timeout_sets_neither():
    docs = documents("k8s", request())
    assert [d["kind"] for d in docs] == ["Service"] * 2 + ["Job"] * 2
    for job in docs[2:]:
        assert "activeDeadlineSeconds" not in job["spec"]
        assert "priorityClassName" not in job["spec"]["template"]["spec"]
        assert job["spec"]["backoffLimit"] == 0


def test_legacy_flags_follow_train_rules():
    legacy = documents("k8s", request(ps=1, script=str(EXAMPLES / "legacy_tf1.py")),
                       name="legacy-tf1")
    command = legacy[-1]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["python", "/app/legacy_tf1.py",
                       "--ps_hosts=legacy-tf1-ps-0.default.svc:2222",
                       "--worker_hosts=legacy-tf1-worker-0.default.svc:2222,"
                       "legacy-tf1-worker-1.default.svc:2222",
                       "--job_name=ps", "--task_index=0"]
    off = documents("k8s", request(ps=1, script=str(EXAMPLES / "legacy_tf1.py"),
                                   legacy_flags="off"))
    assert off[-1]["spec"]["template"]["spec"]["containers"][0]["command"] == \
        ["python", "/app/legacy_tf1.py"]


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
                                       args=("--steps", "it's $(HOME) $$")),
                      name="legacy-tf1")[-1]
    container = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "TF_CONFIG": json.dumps({"cluster": {}, "task": {"type": "worker", "index": 1}})}
    command = [expand(a, env) for a in container["command"]]  # as the kubelet does
    script = command[-1].split()[2]  # exec python SCRIPT ...
    assert script == "/app/legacy_tf1.py"
    command[-1] = command[-1].replace(script, str(tmp_path / "legacy_tf1.py"))
    (tmp_path / "legacy_tf1.py").write_text("import json, sys; print(json.dumps(sys.argv[1:]))")
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=True)
    assert json.loads(done.stdout) == [
        "--ps_hosts=legacy-tf1-ps-0.default.svc:2222",
        "--worker_hosts=legacy-tf1-worker-0.default.svc:2222,"
        "legacy-tf1-worker-1.default.svc:2222",
        "--job_name=worker", "--task_index=1", "--steps", "it's $(HOME) $$"]


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
    assert 'RUN ["pip", "install", "--no-cache-dir", "tensorflow-cpu==2.19.1", ' \
           '"scikit-learn", "pandas"]' in dockerfile
    assert 'RUN ["pip", "install", "--no-cache-dir", "--no-deps", "tf-keras==2.21.0"]' \
        in dockerfile
    assert 'ENV DATA_DIR="/data"' in dockerfile
    assert 'WORKDIR /app' in dockerfile
    assert 'CMD ["python", "/app/mirrored_strategy.py", "--steps", "5"]' in dockerfile
    assert (out / "app" / "mirrored_strategy.py").read_bytes() == \
        (EXAMPLES / "mirrored_strategy.py").read_bytes()
    # the modules beside the script: checkpointed.py imports mirrored_strategy
    assert (out / "app" / "checkpointed.py").is_file()
    assert any(f"docker build -t {IMAGE} {out}" in note for note in notes)


def test_docker_sync_dir_and_gpu_wheel(tmp_path):
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "train.py").write_text("print('hi')\n")
    out = tmp_path / "ctx"
    _text, notes = export(TrainRequest(script="pkg/train.py", sync_dir=str(code)),
                          ExportOptions("docker"), NodeSetup(), output=str(out))
    dockerfile = (out / "Dockerfile").read_text()
    version = local_tensorflow()
    wheel = f"tensorflow[and-cuda]=={version}" if version else "tensorflow[and-cuda]"
    assert f'"{wheel}", "scikit-learn", "tensorboard"]' in dockerfile
    assert any(("pinned to this machine's" if version else "is not pinned") in note
               for note in notes), notes
    assert 'CMD ["python", "/app/pkg/train.py"]' in dockerfile
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
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"]["python_env_tensorflow_package"] = "tensorflow-cpu==2.20.0"
    inventory.write_text(yaml.safe_dump(data))
    assert node_setup(load_inventory(inventory)).tensorflow == "tensorflow-cpu==2.20.0"
    assert job_for(request(), ExportOptions("k8s", image=IMAGE), setup).tasks[0].env["A"] == "1"


BAD = {
    "unknown target": (ExportOptions("nomad", image=IMAGE), ["nomad", "k8s", "docker"]),
    "no image": (ExportOptions("k8s"), ["--image"]),
    "underscore name": (ExportOptions("k8s", image=IMAGE, name="my_job"),
                        ["'my_job'", "DNS-1123", "lowercase"]),
    "long name": (ExportOptions("tfjob", image=IMAGE, name="a" * 60), ["at most 54"]),
    "long jobset name": (ExportOptions("jobset", image=IMAGE, name="a" * 60), ["at most 52"]),
    "volcano without image": (ExportOptions("volcano"), ["--image"]),
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


def test_kubernetes_expansion_leaves_user_values_alone():
    """'$(HOME)' in --env or the script's arguments reaches the task as typed."""
    for target in ("k8s", "jobset"):
        docs = documents(target, request(env=("A=$(HOME)$$x",), args=("--x", "$(PATH)")))
        (container,) = docs[-1]["spec"]["template"]["spec"]["containers"] \
            if target == "k8s" else \
            docs[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
                "containers"]
        fields = {jobset_fields(0, 0)[0]: "0", jobset_fields(0, 0)[1]: "0"}
        env = pod_env(container, {**fields})
        assert env["A"] == "$(HOME)$$x"
        assert [expand(a, env) for a in container["command"]][-2:] == ["--x", "$(PATH)"]


# -- JobSet and Kueue ----------------------------------------------------------------------


def crd_schema(path: Path, version: str) -> dict[str, Any]:
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return closed(found["schema"]["openAPIV3Schema"])


@functools.cache
def jobset_schema() -> dict[str, Any]:
    return crd_schema(DATA / "jobset" / "jobset.x-k8s.io_jobsets.yaml", "v1alpha2")


@functools.cache
def workload_priority_class_schema() -> dict[str, Any]:
    return crd_schema(DATA / "kueue" / "kueue.x-k8s.io_workloadpriorityclasses.yaml",
                      "v1beta2")


def jobset_fields(index: int, attempt: int) -> tuple[str, str]:
    from hypertf.export import jobset

    return jobset.COMPLETION_INDEX, jobset.RESTART_ATTEMPT


def replicated(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in doc["spec"]["replicatedJobs"]}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("queue", [None, "team-a"])
def test_jobset_matches_the_jobset_crd(shape, queue):
    docs = documents("jobset", request(**SHAPES[shape]), queue=queue)
    js = docs[-1]
    jsonschema.validate(js, jobset_schema())
    for doc in docs[:-1]:
        if doc["kind"] == "WorkloadPriorityClass":
            jsonschema.validate(doc, workload_priority_class_schema())
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for rjob in js["spec"]["replicatedJobs"]:
        # Kubernetes' own validation of the Job JobSet stamps out (pod template included)
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
               "spec": rjob["template"]["spec"]}
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_jobset_a_misspelt_field_fails_the_schema():
    js = documents("jobset", request())[-1]
    js["spec"]["failurePolicy"]["maxRestart"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(js, jobset_schema())


@pytest.mark.parametrize(("shape", "finishers"), [
    ({}, ["worker"]),
    ({"chief": True}, ["chief", "worker"]),
    ({"chief": True, "ps": 1, "script": str(EXAMPLES / "ps_strategy.py")}, ["chief"]),
    ({"ps": 1, "script": str(EXAMPLES / "legacy_tf1.py")}, ["worker"]),
])
def test_jobset_success_policy_is_trains_finishers(shape, finishers):
    js = documents("jobset", request(**shape))[-1]
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": finishers}
    assert list(replicated(js)) == [r for r in ("chief", "worker", "ps") if r in
                                    {"chief": shape.get("chief"), "worker": True,
                                     "ps": shape.get("ps")} and
                                    {"chief": shape.get("chief"), "worker": True,
                                     "ps": shape.get("ps")}[r]]


def test_jobset_restarts_the_whole_set_and_maps_the_options():
    docs = documents("jobset", request(script=str(EXAMPLES / "ps_strategy.py"), chief=True,
                                       ps=1, workers=3, gpus_per_worker=2, max_restarts=4,
                                       timeout=600, priority=5),
                     queue="team-a", name="ps", cpu="4", memory="16Gi")
    wpc, js = docs
    assert wpc["kind"] == "WorkloadPriorityClass" and wpc["value"] == 5
    assert "metadata" in wpc and "namespace" not in wpc["metadata"]
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == wpc["metadata"]["name"]
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 4 and policy["restartStrategy"] == "BlockingRecreate"
    assert policy["rules"] == [{"name": "final", "action": "FailJobSet",
                                "onJobFailureReasons": ["DeadlineExceeded",
                                                        "PodFailurePolicy"]}]
    assert js["spec"]["network"] == {"enableDNSHostnames": True,
                                     "publishNotReadyAddresses": True}
    for name, rjob in replicated(js).items():
        spec = rjob["template"]["spec"]
        # Kueue admits the JobSet; a queue label on a Job would make it a workload of its own
        assert "kueue.x-k8s.io/queue-name" not in rjob["template"].get("metadata", {}).get(
            "labels", {})
        assert rjob["replicas"] == 1 and spec["completionMode"] == "Indexed"
        assert spec["completions"] == spec["parallelism"] == {"chief": 1, "worker": 3,
                                                              "ps": 1}[name]
        assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 600
        assert spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == \
            list(range(1, 128))
        pod = spec["template"]["spec"]
        assert "priorityClassName" not in pod  # Kueue's class, not the scheduler's
        (container,) = pod["containers"]
        assert container["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
        gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu", 0)
        assert gpus == (0 if name == "ps" else 2)
    on_failure = documents("jobset", request(max_restarts=1, restart_on_failure=True))[-1]
    assert on_failure["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] == \
        ["DeadlineExceeded"]
    assert all("podFailurePolicy" not in r["template"]["spec"]
               for r in on_failure["spec"]["replicatedJobs"])
    no_queue = documents("jobset", request(priority=2))
    assert no_queue[0]["kind"] == "PriorityClass"
    assert replicated(no_queue[-1])["worker"]["template"]["spec"]["template"]["spec"][
        "priorityClassName"] == "hypertf-priority-2"


def jobset_pods(js: dict[str, Any], attempt: int = 0) -> list[tuple[str, list[str],
                                                                     dict[str, str]]]:
    """(hostname.subdomain, command, environment) of every pod JobSet would make: the
    Job '<jobset>-<rjob>-0', its Indexed pods '<job>-<i>' under the subdomain '<jobset>'."""
    from hypertf.export import jobset

    name = js["metadata"]["name"]
    result = []
    for rjob in js["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        (container,) = spec["template"]["spec"]["containers"]
        for index in range(spec["completions"]):
            env = pod_env(container, {jobset.COMPLETION_INDEX: str(index),
                                      jobset.RESTART_ATTEMPT: str(attempt)})
            command = [expand(a, env) for a in container["command"]]
            result.append((f"{name}-{rjob['name']}-0-{index}.{name}", command, env))
    return result


@pytest.mark.parametrize("shape", ["mirrored", "parameter server", "legacy"])
def test_jobset_pods_get_trains_tf_config_from_their_own_names(shape):
    """Each pod's TF_CONFIG, after Kubernetes' expansion, is what hypertf train builds, with
    the stable names JobSet's headless Service answers to."""
    req = request(**SHAPES[shape])
    js = documents("jobset", req, name="tf")[-1]
    k8s_job = job_for(req, ExportOptions("k8s", image=IMAGE, name="tf"))
    expected = {t.name: t for t in k8s_job.tasks}
    pods = jobset_pods(js)
    hosts = [host for host, _, _ in pods]
    assert len(pods) == len(expected)
    for host, command, env in pods:
        tf_config = json.loads(env["TF_CONFIG"])
        role, index = tf_config["task"]["type"], tf_config["task"]["index"]
        assert host == f"tf-{role}-0-{index}.tf"
        assert env["HYPERTF_TASK"] == f"{role}:{index}"
        assert env["HYPERTF_RESTART"] == "0"
        assert [f"{h}:2222" for h in hosts if f"-{role}-0-" in h] == \
            tf_config["cluster"][role]
        assert set(tf_config["cluster"]) == set(json.loads(
            expected[f"{role}:{index}"].env["TF_CONFIG"])["cluster"])
        train_argv = list(expected[f"{role}:{index}"].argv)
        if shape == "legacy":  # the same flags, with JobSet's names
            assert f"--job_name={role}" in command and f"--task_index={index}" in command
            assert len(command) == len(train_argv)
        else:
            assert command == train_argv


def test_jobset_names_fit_a_dns_label():
    """The pod's hostname '<name>-worker-0-<i>' must be a DNS label (63)."""
    with pytest.raises(UsageError) as err:
        job_for(request(workers=10), ExportOptions("jobset", image=IMAGE, name="a" * 52))
    assert "at most 51" in str(err.value)
    job_for(request(workers=10), ExportOptions("jobset", image=IMAGE, name="a" * 51))


# -- Volcano -------------------------------------------------------------------------------


@functools.cache
def volcano_schema() -> dict[str, Any]:
    return crd_schema(DATA / "volcano" / "batch.volcano.sh_jobs.yaml", "v1alpha1")


@pytest.mark.parametrize("shape", SHAPES)
def test_volcano_job_matches_volcanos_crd(shape):
    docs = documents("volcano", request(**SHAPES[shape]), queue="research")
    vj = docs[-1]
    jsonschema.validate(vj, volcano_schema())
    for doc in docs[:-1]:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert vj["apiVersion"] == "batch.volcano.sh/v1alpha1" and vj["kind"] == "Job"
    assert vj["spec"]["minAvailable"] == sum(t["replicas"] for t in vj["spec"]["tasks"])
    assert vj["spec"]["queue"] == "research"
    assert set(vj["spec"]["plugins"]) == {"tensorflow", "svc", "env"}
    for task in vj["spec"]["tasks"]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": task["template"]["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        (container,) = task["template"]["spec"]["containers"]
        assert "TF_CONFIG" not in {e["name"] for e in container["env"]}


def test_volcano_a_misspelt_field_fails_the_schema():
    vj = documents("volcano", request())[-1]
    vj["spec"]["minAvailible"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(vj, volcano_schema())


def volcano_tf_config(vj: dict[str, Any], task: str, index: int) -> str:
    """What Volcano's tensorflow plugin (generateTFClusterSpec) writes into a pod."""
    name = vj["metadata"]["name"]
    cluster = {t["name"]: [f"{name}-{t['name']}-{i}.{name}:2222" for i in range(t["replicas"])]
               for t in vj["spec"]["tasks"]}
    return json.dumps({"cluster": cluster, "task": {"type": task, "index": index}})


def volcano_pods(vj: dict[str, Any]) -> list[tuple[str, list[str], dict[str, str]]]:
    """(hostname.subdomain, command, environment) of every pod Volcano would make, with the
    env plugin's VC_TASK_INDEX and the tensorflow plugin's TF_CONFIG appended."""
    from hypertf.export import volcano

    name = vj["metadata"]["name"]
    result = []
    for task in vj["spec"]["tasks"]:
        (container,) = task["template"]["spec"]["containers"]
        for index in range(task["replicas"]):
            env = pod_env(container, {volcano.TASK_INDEX: str(index),
                                      volcano.RETRY_COUNT: "0"})
            env |= {"VC_TASK_INDEX": str(index),
                    "TF_CONFIG": volcano_tf_config(vj, task["name"], index)}
            command = [expand(a, env) for a in container["command"]]
            result.append((f"{name}-{task['name']}-{index}.{name}", command, env))
    return result


@pytest.mark.parametrize(("shape", "policies"), [
    ({}, {}),
    ({"chief": True, "ps": 1, "script": str(EXAMPLES / "ps_strategy.py")},
     {"chief": [{"event": "TaskCompleted", "action": "CompleteJob"}]}),
    ({"ps": 1, "script": str(EXAMPLES / "legacy_tf1.py")},
     {"worker": [{"event": "TaskCompleted", "action": "CompleteJob"}]}),
])
def test_volcano_finishers_complete_the_job(shape, policies):
    vj = documents("volcano", request(**shape))[-1]
    assert {t["name"]: t["policies"] for t in vj["spec"]["tasks"] if "policies" in t} == \
        policies
    assert "maxRetry" not in vj["spec"]  # Volcano's default would be 3 restarts
    assert all(p["action"] == "TerminateJob" for p in vj["spec"]["policies"])


def test_volcano_restarts_the_whole_job_after_a_signal():
    vj = documents("volcano", request(max_restarts=2, timeout=60))[-1]
    assert vj["spec"]["maxRetry"] == 2
    assert vj["spec"]["policies"] == [
        {"exitCode": 137, "action": "RestartJob"}, {"exitCode": 143, "action": "RestartJob"},
        {"event": "PodFailed", "action": "TerminateJob"},
        {"event": "PodEvicted", "action": "RestartJob"}]
    pod = vj["spec"]["tasks"][0]["template"]["spec"]
    assert pod["activeDeadlineSeconds"] == 60
    on_failure = documents("volcano", request(max_restarts=1, restart_on_failure=True))[-1]
    assert {"event": "PodFailed", "action": "RestartJob"} in on_failure["spec"]["policies"]


def test_volcano_legacy_flags_name_the_plugins_hosts():
    vj = documents("volcano", request(ps=1, script=str(EXAMPLES / "legacy_tf1.py")),
                   name="v")[-1]
    pods = volcano_pods(vj)
    for host, command, env in pods:
        tf_config = json.loads(env["TF_CONFIG"])
        role, index = tf_config["task"]["type"], tf_config["task"]["index"]
        assert host == f"v-{role}-{index}.v" and env["HYPERTF_TASK"] == f"{role}:{index}"
        assert f"--ps_hosts={','.join(tf_config['cluster']['ps'])}" in command
        assert f"--worker_hosts={','.join(tf_config['cluster']['worker'])}" in command
        assert command[-2:] == [f"--job_name={role}", f"--task_index={index}"]


# -- legacy targets, notes, refusals -------------------------------------------------------


def test_tfjob_mirrored_waits_for_every_worker_and_says_legacy():
    text, notes = export(request(), ExportOptions("tfjob", image=IMAGE))
    assert list(yaml.safe_load_all(text))[-1]["spec"]["successPolicy"] == "AllWorkers"
    assert any("legacy" in note and "--to jobset" in note for note in notes)
    ps = documents("tfjob", request(chief=True, ps=1, script=str(EXAMPLES / "ps_strategy.py")))
    assert "successPolicy" not in ps[-1]["spec"]  # the chief decides
    _text, notes = export(request(), ExportOptions("marathon", image=IMAGE))
    assert any("legacy" in note for note in notes)


def test_k8s_notes_say_tasks_restart_alone_and_servers_need_a_timeout():
    _text, notes = export(request(ps=1, script=str(EXAMPLES / "legacy_tf1.py")),
                          ExportOptions("k8s", image=IMAGE))
    assert any("restart their own pod only" in n and "--to jobset" in n for n in notes)
    assert any("never exit" in n and "--timeout" in n for n in notes)
    _text, notes = export(request(ps=1, timeout=60, script=str(EXAMPLES / "legacy_tf1.py")),
                          ExportOptions("k8s", image=IMAGE))
    assert not any("never exit" in n for n in notes)


def test_default_name_is_script_user_and_job_hash():
    user = re.sub(r"[^a-z0-9]+", "-", getpass.getuser().lower()).strip("-")[:12]
    first = job_for(request(), ExportOptions("jobset", image=IMAGE))
    assert re.fullmatch(rf"mirrored-strategy-{re.escape(user)}-[0-9a-f]{{6}}", first.name)
    assert job_for(request(), ExportOptions("jobset", image=IMAGE)).name == first.name
    assert job_for(request(workers=3), ExportOptions("jobset", image=IMAGE)).name != first.name
    assert any(f"named {first.name}" in note and "--name" in note for note in first.notes)
    named = job_for(request(), ExportOptions("jobset", image=IMAGE, name="digits"))
    assert named.name == "digits" and not any("--name" in note for note in named.notes)


def test_output_directory_has_one_file_per_kind(tmp_path):
    out = tmp_path / "manifests"
    _text, notes = export(request(priority=3), ExportOptions("k8s", image=IMAGE), SETUP,
                          output=f"{out}/")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["00-priorityclass.yaml", "01-service.yaml", "02-job.yaml"]
    assert [d["kind"] for d in yaml.safe_load_all((out / files[0]).read_text())] == \
        ["PriorityClass"]
    assert any("cluster-scoped" in note for note in notes)
    single = tmp_path / "one.yaml"
    export(request(priority=3), ExportOptions("jobset", image=IMAGE, queue="q"), SETUP,
           output=str(single))
    assert [d["kind"] for d in yaml.safe_load_all(single.read_text())] == \
        ["WorkloadPriorityClass", "JobSet"]


def test_docker_says_what_the_image_lacks(tmp_path):
    _text, notes = export(request(env=("TF_USE_LEGACY_KERAS=1",)), ExportOptions("docker"),
                          NodeSetup())
    assert any("no tf-keras" in note and "hypertf_python_packages_no_deps" in note
               for note in notes)
    _text, notes = export(request(env=("TF_USE_LEGACY_KERAS=1",)), ExportOptions("docker"),
                          SETUP)
    assert not any("no tf-keras" in note for note in notes)


def test_docker_context_inside_the_code_is_not_copied_into_itself(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "utils.py").write_text("X = 1\n")
    out = tmp_path / "build"
    for _ in range(2):
        export(TrainRequest(script=str(tmp_path / "train.py")), ExportOptions("docker"),
               NodeSetup(), output=str(out))
    assert sorted(p.name for p in (out / "app").iterdir()) == ["train.py", "utils.py"]


@pytest.mark.parametrize("runner", ["hypertf", "invoke"])
def test_cli_refuses_train_only_options(tmp_path, runner):
    argv = ["export", "--to", "jobset", "--image", IMAGE, "--script", "a.py", "--idle-fail",
            "--start-timeout", "5", "-i", str(tmp_path / "none.yml")]
    head = [sys.executable, "-m", "hypertf.cli"] if runner == "hypertf" else \
        [str(Path(sys.executable).parent / "invoke"), "-r", str(REPO)]
    done = subprocess.run([*head, *argv], capture_output=True, text=True, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "--idle-fail" in lines[0] and "--start-timeout" in lines[0], lines[0]


def test_cli_export_help_lists_only_its_own_options():
    done = subprocess.run([sys.executable, "-m", "hypertf.cli", "export", "--help"],
                          capture_output=True, text=True, check=True)
    for flag in ("--idle-fail", "--no-wait", "--start-timeout", "--detach", "--timings",
                 "--policy", "--offload-hosts"):
        assert flag not in done.stdout
    for flag in ("--to", "--queue", "--max-restarts", "--cpu", "jobset", "volcano"):
        assert flag in done.stdout


def test_jobset_gives_every_pod_the_frameworks_rendezvous_from_stable_hostnames():
    """docs/frameworks.md: the same variables as `hypertf train`, from the JobSet's stable
    pod names; the ranks from each pod's completion index (one task per pod)."""
    js = documents("jobset", request(workers=3))[-1]
    container = replicated(js)["worker"]["template"]["spec"]["template"]["spec"][
        "containers"][0]
    envs = [pod_env(container, {jobset.COMPLETION_INDEX: str(i), jobset.RESTART_ATTEMPT: "0"})
            for i in range(3) for jobset in [__import__("hypertf.export.jobset",
                                                        fromlist=["jobset"])]]
    cluster = json.loads(envs[0]["TF_CONFIG"])["cluster"]["worker"]
    for index, env in enumerate(envs):
        assert env["RANK"] == env["JAX_PROCESS_ID"] == env["NODE_RANK"] == str(index)
        assert env["KERAS_DISTRIBUTION_PROCESS_ID"] == str(index)
        assert env["WORLD_SIZE"] == env["JAX_NUM_PROCESSES"] == "3"
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")  # a pod each
        assert env["JAX_COORDINATOR_ADDRESS"] == cluster[0]  # worker 0's stable name
        assert f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" == cluster[0]
        assert env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == ",".join(cluster)
    assert cluster[0].split(":")[0].split(".")[0].endswith("worker-0-0")


def test_a_role_whose_ranks_do_not_start_at_zero_gets_no_rank_in_its_template():
    """With a chief, worker i is rank i + 1: a template cannot add, so the workers' pods get
    the shared variables only; the chief (one task) gets its rank."""
    js = documents("jobset", request(workers=2, chief=True))[-1]
    names = {role: {e["name"]: e.get("value") for e in
                    r["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
             for role, r in replicated(js).items()}
    assert names["chief"]["RANK"] == "0" and "MASTER_ADDR" in names["worker"]
    assert "RANK" not in names["worker"] and names["worker"]["WORLD_SIZE"] == "3"
    k8s_envs = {d["metadata"]["name"]: {e["name"]: e["value"] for e in
                                        d["spec"]["template"]["spec"]["containers"][0]["env"]}
                for d in documents("k8s", request(workers=2, chief=True)) if d["kind"] == "Job"}
    assert sorted(e["RANK"] for e in k8s_envs.values()) == ["0", "1", "2"]  # a Job each
