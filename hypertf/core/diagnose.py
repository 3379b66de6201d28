"""What a script's source and a task's log say: whether it reads the legacy flags, and why
a task died, in words a user can act on (see docs/tensorflow.md)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hypertf.core import rendezvous

LEGACY_FLAGS = ("ps_hosts", "worker_hosts", "job_name", "task_index")
# A script reads a legacy flag when it defines or parses it: argparse's
# add_argument("--ps_hosts"), a hand-written parser's "--ps_hosts=", absl's and
# tf.compat.v1.flags' DEFINE_string("ps_hosts", ...) or DEFINE_string(name="ps_hosts").
# A bare quoted name elsewhere (an error message in a docstring) does not count.
_FLAG_NAMES = "|".join(LEGACY_FLAGS)
_READS_FLAG = re.compile(
    rf"""["']--(?:{_FLAG_NAMES})["'=]"""
    rf"""|DEFINE_\w+\(\s*(?:name\s*=\s*)?["'](?:{_FLAG_NAMES})["']""")
MAX_SOURCE_BYTES = 4 * 1024 * 1024

# What absl (and tf.compat.v1.flags, which is absl) and argparse print for a flag they do not
# know; the first group is the flag.
_UNKNOWN_FLAG = (
    re.compile(r"Unknown command line flag '(\w+)'"),
    re.compile(rf"unrecognized arguments?: .*?--({_FLAG_NAMES})\b"),
    re.compile(rf"no such option: --({_FLAG_NAMES})\b"),
)
_CAUSE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Exit)\b.*|^(?:F|E)\d{4} .*|FATAL.*|"
                    r"^Killed$|^Segmentation fault.*|^\w+Error: .*")


def reads_legacy_flags(source: str) -> bool:
    """True when the source names --ps_hosts/--worker_hosts/--job_name/--task_index."""
    return bool(_READS_FLAG.search(source))


def files_read_legacy_flags(paths: Iterable[Path]) -> bool:
    """Any of these Python files reads the legacy flags (unreadable ones do not)."""
    for path in paths:
        try:
            with open(path, "rb") as source:
                text = source.read(MAX_SOURCE_BYTES).decode(errors="replace")
        except OSError:
            continue
        if reads_legacy_flags(text):
            return True
    return False


ROLELESS = "the tasks seem to have run without their roles (no cluster formed)"


ROLELESS_PS_ENDED = "a ps never exits by itself"
ROLELESS_NONE_LISTENED = "a ps serves on its port, and none opened one"


def roleless_ps_hint(facts: JobFacts, ps_ended: bool = True) -> str:
    """The fix when a ps job's tasks ran the script without their roles: a parameter
    server exited 0 by itself (``ps_ended``; a ps only serves, so it ran as a lone
    trainer), or every worker exited 0 while no task ever opened its port (no ps served).
    Either order of exits gets the same fix: legacy flags read from a module the scan
    missed, or not passed."""
    flags = "--ps_hosts/--worker_hosts/--job_name/--task_index"
    lead = ROLELESS_PS_ENDED if ps_ended else ROLELESS_NONE_LISTENED
    if facts.legacy_flags:
        return (f"{lead}; it was given {flags} (--job_name=ps), so the script's ps must "
                f"start a server (tf.compat.v1.train.Server) and join() it")
    if facts.legacy_flags is False:
        return (f"{lead}; HyperTF passed no legacy flags: if the script (or a module it "
                f"imports) reads {flags}, run it with --legacy-flags")
    return (f"{lead}; if the script (or a module it imports) reads {flags} and HyperTF "
            f"did not pass them, run it with --legacy-flags")


# -- the script and its own modules: read, never run ----------------------------------------
# A script's flags may live in a module beside it (tf_cnn_benchmarks.py imports them from
# benchmark_cnn.py): the scan follows its imports of modules in the script's own directory
# (name.py or name/__init__.py, and their submodules), transitively, at most this much.
MAX_SCAN_FILES = 50
MAX_SCAN_BYTES = 8 * 1024 * 1024
# What only a TF2 ParameterServerStrategy script names (its coordinator is the chief).
TF2_PS_NAMES = frozenset({"ParameterServerStrategy", "ClusterCoordinator"})
_TF2_PS_WORDS = re.compile(rf"\b(?:{'|'.join(sorted(TF2_PS_NAMES))})\b")


@dataclass(frozen=True)
class ScriptScan:
    """What a script and the local modules it imports say: whether they read the legacy
    flags, and whether they name ParameterServerStrategy or ClusterCoordinator (a TF2
    parameter-server script, which needs a chief); ``files``: what was read."""

    legacy_flags: bool = False
    ps_strategy: bool = False
    files: tuple[Path, ...] = ()
    coordinator: str = ""  # why it rendezvouses on a coordinator ("": it does not say so)


def scan_script(script: Path) -> ScriptScan:
    """Read ``script`` and the modules of its own directory that it imports (found by
    parsing, following their imports too), at most MAX_SCAN_FILES files and MAX_SCAN_BYTES
    in all; nothing is executed. A file that cannot be read counts for nothing; one that
    does not parse is still searched, but its imports are not followed."""
    root = script.parent
    todo, seen = [script], {script}
    legacy = tf2_ps = False
    budget = MAX_SCAN_BYTES
    read: list[Path] = []
    texts: list[str] = []
    while todo and len(read) < MAX_SCAN_FILES and budget > 0:
        path = todo.pop(0)
        data = _read_source(path, min(MAX_SOURCE_BYTES, budget))
        if data is None:
            continue
        read.append(path)
        budget -= len(data)
        text = data.decode(errors="replace")
        texts.append(text)
        legacy = legacy or reads_legacy_flags(text)
        try:
            tree = ast.parse(text, str(path))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tf2_ps = tf2_ps or bool(_TF2_PS_WORDS.search(text))
            continue
        tf2_ps = tf2_ps or _names_tf2_ps(tree)
        for found in _local_imports(tree, path, root):
            if found not in seen:
                seen.add(found)
                todo.append(found)
    return ScriptScan(legacy, tf2_ps, tuple(read), rendezvous.detect(texts, {})[1])


def _read_source(path: Path, limit: int) -> bytes | None:
    """A regular file's first ``limit`` bytes (never a FIFO's or a device's: opening one
    could block, reading it never end); None when it cannot be read."""
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as source:
            return source.read(limit)
    except OSError:
        return None


def _names_tf2_ps(tree: ast.AST) -> bool:
    """The code (not a comment or a string) names ParameterServerStrategy or
    ClusterCoordinator: tf.distribute.experimental.ParameterServerStrategy(...), an import
    of it, or a bare name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.alias):
            name = node.name.rsplit(".", 1)[-1]
        else:
            continue
        if name in TF2_PS_NAMES:
            return True
    return False


def _local_imports(tree: ast.AST, path: Path, root: Path) -> list[Path]:
    """The files of ``root`` (the script's directory) that the module at ``path`` imports:
    ``import a.b`` (a and a.b), ``from a import b`` (a, and a/b.py when a is a package),
    ``from . import b`` within a package below ``root``."""
    found: list[Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _module_files(root, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            base = root
            if node.level:  # relative: from the module's package, never above the script's
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                if base != root and root not in base.parents:
                    continue
            parts = node.module.split(".") if node.module else []
            found += _module_files(base, parts)
            for alias in node.names:
                if alias.name != "*" and (base / Path(*parts) if parts else base).is_dir():
                    found += _module_files(base, [*parts, alias.name])
    return found


def _module_files(base: Path, parts: Sequence[str]) -> list[Path]:
    """The files Python would run to import module ``parts`` from ``base``: each prefix's
    ``name.py`` or ``name/__init__.py``, as far as they exist."""
    files: list[Path] = []
    at = base
    for part in parts:
        if not part.isidentifier():
            break
        module, package = at / f"{part}.py", at / part
        if (package / "__init__.py").is_file():
            files.append(package / "__init__.py")
        elif module.is_file():
            files.append(module)
            break  # a module has no submodules
        elif not package.is_dir():  # neither a module nor a (namespace) package here
            break
        at = package
    if not parts and (base / "__init__.py").is_file():
        files.append(base / "__init__.py")
    return files


def unknown_legacy_flag(lines: Sequence[str]) -> str | None:
    """The legacy flag a task's log says its script refused, if that is how it died."""
    for line in lines:
        for pattern in _UNKNOWN_FLAG:
            match = pattern.search(line)
            if match and match.group(1) in LEGACY_FLAGS:
                return match.group(1)
    return None


MAX_ERROR_CHARS = 300  # a longer error line is shortened in the middle (tensor dumps)
MAX_ERROR_LINES = 200  # continuation lines of one exception message read at most
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)(?:, in (.*))?')
# A frame of an installed library or of Python itself, not of the user's script: the
# script's own frame says where to look (train.py:109), the library's only what raised.
_LIBRARY = re.compile(r"[/\\](?:site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python[\d.]*[/\\]"
                      r"|^<frozen |^<string>$")
_NEW_RECORD = re.compile(r"^(?:Traceback \(most recent call last\)|During handling of the above"
                         r"|The above exception was the direct cause)")


def shorten(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` whole, or its head and tail around `` ... `` when longer than ``limit``:
    an exception's type and its last words (what it could not convert, to what) both
    matter, the tensor dump between them does not."""
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep].rstrip()} ... {text[-keep:].lstrip()}"


@dataclass(frozen=True)
class Raised:
    """The last traceback of a log: the frame to look at and the whole error line."""

    frame: str  # the script's own innermost frame (else the innermost), with its code line
    error: str  # the exception line and its continuation lines, joined, shortened

    @property
    def lines(self) -> list[str]:
        return [line for line in (self.frame, self.error) if line]


def _script_frame(lines: Sequence[str], frames: Sequence[int]) -> str:
    """The innermost frame outside installed libraries (the script's own), else the
    innermost frame; followed by the code line Python printed under it."""
    own = [i for i in frames
           if not _LIBRARY.search(m.group(1) if (m := _FRAME.match(lines[i])) else "")]
    if not (own or frames):
        return ""
    index = (own or frames)[-1]
    frame = lines[index].strip()
    code = lines[index + 1].strip() if index + 1 < len(lines) else ""
    if code and lines[index + 1][:1].isspace() and not _FRAME.match(lines[index + 1]) \
            and set(code) - set("^~ "):
        frame = f"{frame}: {code}"
    return frame


def last_traceback(lines: Sequence[str]) -> Raised | None:
    """The last Python traceback of a log, or None. The error is the first unindented line
    after the last frame (Python's format) with the lines that continue its message up to
    a blank line outside a tensor dump, joined: a message cut at its first line hides what it says
    (``ValueError: Attempt to convert a value (PerReplica:{``)."""
    start = max((i for i, line in enumerate(lines)
                 if line.startswith("Traceback (most recent call last)")), default=-1)
    if start < 0:
        return None
    frames = [i for i in range(start + 1, len(lines)) if _FRAME.match(lines[i])]
    first = (frames[-1] + 1) if frames else start + 1
    error_at = next((i for i in range(first, len(lines))
                     if lines[i].strip() and not lines[i][:1].isspace()), None)
    if error_at is None:  # not Python's format: the last line that reads like an error
        error_at = next((i for i in range(len(lines) - 1, start, -1)
                         if _CAUSE.match(lines[i].strip())), None)
    message = _message(lines, error_at) if error_at is not None else []
    return Raised(_script_frame(lines, frames), shorten(" ".join(message)))


_OPEN, _CLOSE = "([{", ")]}"


def _message(lines: Sequence[str], at: int) -> list[str]:
    """The exception line at ``at`` and the lines that continue it, up to a blank line; a
    blank line inside an open bracket whose dump goes on (numpy prints a 3-d tensor with a
    blank line between its slices) does not end it."""
    message: list[str] = []
    depth = 0
    end = min(len(lines), at + MAX_ERROR_LINES)
    for index in range(at, end):
        line = lines[index]
        if message and _NEW_RECORD.match(line):
            break
        if not line.strip():
            after = next((later for later in lines[index + 1:end] if later.strip()), "")
            if depth > 0 and (after[:1].isspace() or after[:1] in _CLOSE):
                continue
            break
        message.append(line.strip())
        depth += sum(line.count(c) for c in _OPEN) - sum(line.count(c) for c in _CLOSE)
    return message


def cause_lines(lines: Sequence[str], limit: int = 4) -> list[str]:
    """The lines that name why a task died: FATAL and error lines, then the last
    traceback's frame in the script and its whole error (kept whatever the limit); at most
    ``limit`` lines, in log order."""
    raised = last_traceback(lines)
    start = max((i for i, line in enumerate(lines)
                 if line.startswith("Traceback (most recent call last)")), default=len(lines))
    traceback = raised.lines if raised else []
    others = [shorten(line.strip()) for line in lines[:start] if _CAUSE.match(line.strip())]
    room = max(0, limit - len(traceback))
    return (others[-room:] if room else []) + traceback


# A TF1 between-graph job whose worker 0 ended while another worker is silent: its session
# (no device_filters) waits for every task of the cluster spec, worker 0 included, forever.
TF1_WORKER_LEFT_WAITING = (
    "a TF1 between-graph worker waits for every task of the cluster spec, and worker 0 (the "
    "chief) has ended, so it waits forever. Fix the script: give each worker's session "
    "device_filters (tf.compat.v1.ConfigProto(device_filters=['/job:ps', "
    "'/job:worker/task:<its index>'])), or make the chief wait for the other workers before "
    "it exits (e.g. a barrier on a shared counter)")


# -- hints: the fix for a death HyperTF recognises ------------------------------------------
@dataclass(frozen=True)
class JobFacts:
    """What the launcher knows that changes a hint: whether the tasks ran with
    TF_USE_LEGACY_KERAS=1, whether tf-keras is in the nodes' virtualenv (their
    preflight looked; None: not known, e.g. a node without the check), and whether the
    legacy flags were passed (None: not known)."""

    legacy_keras: bool = False
    tf_keras: bool | None = None
    legacy_flags: bool | None = None


# Its Keras hint is left out when TF_USE_LEGACY_KERAS=1 is set: tf.compat.v1 is then the fix.
TF1_RNN_CELL = "tf.nn.rnn_cell is tf.compat.v1.nn.rnn_cell, whose cells are Keras 2 classes"
# Keras 3's errors for Keras 2 habits (seen with scripts written for TF <= 2.15; each one
# ran under --env TF_USE_LEGACY_KERAS=1 with tf-keras on the nodes).
KERAS3_ERRORS = (
    (re.compile(r"Attempt to convert a value \(PerReplica"),
     "model.fit under a distribution strategy"),
    (re.compile(r"has no attribute 'reset_states'"), "reset_states() is reset_state() in Keras 3"),
    (re.compile(r"module 'keras[\w.]*\.layers' has no attribute 'experimental'"),
     "layers.experimental is gone from Keras 3"),
    (re.compile(r"A KerasTensor cannot be used as input to a TensorFlow function"),
     "a TensorFlow op on a Keras input"),
    (re.compile(r"ModelCheckpoint.*must end in `\.(?:weights\.h5|keras)`"),
     "ModelCheckpoint's file name"),
    (re.compile(r"pass this dataset to ClusterCoordinator\.create_per_worker_dataset"
                r"|ParameterServerStrategy.*(?:not supported|unsupported)"),
     "model.fit under ParameterServerStrategy"),
    # TensorFlow's lazy loader: "`BasicLSTMCell` is not available with Keras 3." for
    # tf.compat.v1.nn.rnn_cell's cells, tf.compat.v1.layers, tf.compat.v1.keras
    (re.compile(r"not (?:available|supported) with Keras 3|(?:Error|Exception): .*"
                r"\bwith Keras 3\b"),
     "TF1's Keras classes, e.g. tf.compat.v1.nn.rnn_cell.BasicLSTMCell, are not in Keras 3"),
    (re.compile(r"module 'tensorflow(?:\._api\.v2)?\.nn' has no attribute 'rnn_cell'"),
     TF1_RNN_CELL),
)
_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")

# TF1-only names: not in TensorFlow 2's tf namespace but kept in tf.compat.v1 (TensorFlow 2.21:
# hasattr(tf, name) is False, hasattr(tf.compat.v1, name) True), the ones TF1 scripts use; a
# name below tf.train, tf.summary or tf.nn is written with its submodule. A name not listed
# (a typo: tf.kears) gets no hint. docs/tensorflow.md lists them.
TF1_ONLY = frozenset({
    "app", "flags", "logging", "gfile", "placeholder", "placeholder_with_default", "Session",
    "InteractiveSession", "ConfigProto", "GPUOptions", "RunOptions", "get_variable",
    "variable_scope", "global_variables_initializer", "local_variables_initializer",
    "global_variables", "trainable_variables", "reset_default_graph", "get_default_graph",
    "set_random_seed", "random_normal", "to_float", "Print", "assign", "layers",
    "disable_eager_execution", "enable_eager_execution",
    "train.Supervisor", "train.MonitoredTrainingSession", "train.replica_device_setter",
    "train.Server", "train.SyncReplicasOptimizer", "train.StopAtStepHook", "train.Saver",
    "train.GradientDescentOptimizer", "train.AdamOptimizer", "train.MomentumOptimizer",
    "train.get_or_create_global_step", "train.get_global_step", "train.start_queue_runners",
    "summary.FileWriter", "summary.merge_all", "nn.rnn_cell", "nn.dynamic_rnn",
})
# Python's words for tf.<name> and tf.<submodule>.<name> (tensorflow._api.v2.train); the
# first group is the submodule, the second the name. tf.compat.v1's own errors do not match.
_NO_ATTRIBUTE = re.compile(r"module 'tensorflow(?:\._api\.v2)?(?:\.(\w+))?' has no attribute "
                           r"'(\w+)'")
COMPAT_V1 = "'import tensorflow.compat.v1 as tf; tf.disable_v2_behavior()'"
TF_UPGRADE_V2 = "tf_upgrade_v2 --infile train.py --outfile train_v2.py"
# TF1 modules that TensorFlow 2 removed and no package provides: what to do instead.
TF2_REMOVED = {
    "tensorflow.examples": "port the script to TensorFlow 2, e.g. "
                           "tensorflow.examples.tutorials.mnist -> tf.keras.datasets.mnist "
                           "(load_data() gives the arrays input_data.read_data_sets did)",
    "tensorflow.contrib": f"port the script to TensorFlow 2; tensorflow.contrib has no TF2 "
                          f"home: {TF_UPGRADE_V2} lists each use of it and renames those that "
                          f"have a replacement",
}
_TB_MISSING = re.compile(r"TBNotInstalledError|TensorBoard is not installed")
TF_KERAS_PACKAGE = "hypertf_python_packages_no_deps: [tf-keras==<TensorFlow's version>]"


def keras3_error(lines: Sequence[str]) -> str | None:
    """What Keras 2 habit the log's error is, when Keras 3 refused one."""
    for line in lines:
        for pattern, what in KERAS3_ERRORS:
            if pattern.search(line):
                return what
    return None


def tf1_api(lines: Sequence[str]) -> str | None:
    """The TF1-only name (tf.train.Supervisor) a TF1 script asked TensorFlow 2 for."""
    for line in lines:
        for match in _NO_ATTRIBUTE.finditer(line):
            sub, name = match.groups()
            qualified = f"{sub}.{name}" if sub else name
            if qualified in TF1_ONLY:
                return f"tf.{qualified}"
    return None


def removed_module(lines: Sequence[str]) -> str | None:
    """The TF1 module TensorFlow 2 removed (TF2_REMOVED) that the log's script imports."""
    for line in lines:
        missing = _MISSING_MODULE.search(line)
        attribute = _NO_ATTRIBUTE.search(line)
        if missing:
            module = missing.group(1)
        elif attribute and not attribute.group(1):
            module = f"tensorflow.{attribute.group(2)}"
        else:
            continue
        for removed in TF2_REMOVED:
            if module == removed or module.startswith(f"{removed}."):
                return removed
    return None


def _tf_keras_words(facts: JobFacts) -> str:
    if facts.tf_keras:
        return "tf-keras is on the nodes"
    if facts.tf_keras is False:
        return (f"tf-keras is not on the nodes: add {TF_KERAS_PACKAGE} to the inventory and "
                f"run invoke cluster.setup")
    return f"tf-keras must be on the nodes ({TF_KERAS_PACKAGE} in the inventory)"


def hints(lines: Sequence[str], facts: JobFacts = JobFacts()) -> list[str]:
    """The fixes HyperTF can name for a task's log: Keras 2 scripts under Keras 3
    (TF_USE_LEGACY_KERAS with tf-keras), TF1 API under TensorFlow 2 (tf.compat.v1), a TF1
    module TensorFlow 2 removed (port the script), else a module missing from the nodes'
    virtualenv (hypertf_python_packages; TensorBoard is no longer a dependency of
    tensorflow-cpu)."""
    found: list[str] = []
    keras = keras3_error(lines)
    if keras and not facts.legacy_keras:
        found.append(f"a Keras 2 script under Keras 3 ({keras}): run it with --env "
                     f"TF_USE_LEGACY_KERAS=1; {_tf_keras_words(facts)}; a script that does "
                     f"'import keras' then needs 'import tf_keras as keras'")
    elif keras and keras != TF1_RNN_CELL:  # with Keras 2 set, tf.compat.v1 is the fix
        found.append(f"a Keras 3 error ({keras}) although TF_USE_LEGACY_KERAS=1 is set: that "
                     f"only changes tf.keras, so a script that does 'import keras' needs "
                     f"'import tf_keras as keras'; {_tf_keras_words(facts)}")
    api = tf1_api(lines)
    if api:
        found.append(f"TF1 API under TensorFlow 2 ({api}): TensorFlow 2 keeps it in "
                     f"tf.compat.v1, so start the script with {COMPAT_V1}, or port it "
                     f"({TF_UPGRADE_V2} rewrites what it can)")
    text = "\n".join(lines)
    missing = _MISSING_MODULE.search(text)
    removed = removed_module(lines)
    if _TB_MISSING.search(text) or (missing and missing.group(1).split(".")[0] == "tensorboard"):
        found.append("TensorBoard is not on the nodes (tensorflow-cpu no longer depends on "
                     "it): add tensorboard to hypertf_python_packages in the inventory and run "
                     "invoke cluster.setup")
    elif removed:  # before the generic hint: no package provides it
        found.append(f"module {removed!r} is TF1 code that TensorFlow 2 removed (no package "
                     f"provides it): {TF2_REMOVED[removed]}")
    elif missing:  # named whole: 'google' is protobuf's namespace, 'google.cloud' is not
        module = missing.group(1)
        found.append(f"module {module!r} is not on the nodes: add its package to "
                     f"hypertf_python_packages in the inventory and run invoke cluster.setup")
    return found
