"""fleetrun's EntryScript: the helper entry scripts import for logging and paths.

The runner executes this file as the module ``fleetrun`` and calls ``_install`` with the
process's settings before it loads the entry script. ``_install`` also registers the module
names ParallelRunStep scripts import, so ``from azureml_user.parallel_run import EntryScript``
keeps working unchanged, and the ``azureml.core`` names (``Model.get_model_path``) that
ParallelRunStep scripts load their models with.

The root logger (``logging.info(...)``, at the job's ``logging_level``) and
``warnings.warn`` write to the process's stdout file, as the seed's scripts expect.
"""

import importlib.machinery
import importlib.util
import inspect
import logging
import os
import re
import sys
import threading
import types

__all__ = ["EntryScript", "MiniBatchContext"]

_LOG_FORMAT = "%(asctime)s|%(levelname)s|%(process)d|%(name)s|%(message)s"
_LOGGER_NAME = "fleetrun.entry_script"

_settings = {
    "node_id": "",
    "process_name": "",
    "log_dir": "",
    "output_dir": "",
    "logging_level": "INFO",
    "working_dir": "",
    "models": {},
}


class EntryScript:
    """Per-process paths and logger of a fleetrun (ParallelRunStep) job.

    A singleton: every ``EntryScript()`` returns the same object.
    """

    _instance = None
    _lock = threading.Lock()

    def __new__(cls, *args, **kwargs):
        with cls._lock:
            if cls._instance is None:
                instance = super().__new__(cls)
                instance._logger = None
                cls._instance = instance
            return cls._instance

    def __init__(self, *args, **kwargs):
        pass

    @property
    def node_id(self):
        """The id of the node this process runs on."""
        return _settings["node_id"]

    @property
    def agent_name(self):
        """This process's name, ``processNNN``."""
        return _settings["process_name"]

    process_name = agent_name

    @property
    def log_dir(self):
        """This node's folder of entry-script logs: ``logs/user/entry_script_log/<node_id>/``
        (created on first use)."""
        path = os.path.join(
            _settings["log_dir"], "user", "entry_script_log", _settings["node_id"]
        )
        os.makedirs(path, exist_ok=True)
        return path

    @property
    def output_dir(self):
        """A folder whose files reach the job's output folder: the output folder itself on a
        local output; on an ``s3://`` output, a folder on this node uploaded under the output
        prefix after each mini-batch and when the job ends on this node."""
        return _settings["output_dir"]

    @property
    def working_dir(self):
        """This process's working folder (its current directory at start), holding the
        source directory's files."""
        return _settings["working_dir"] or os.getcwd()

    @property
    def logger(self):
        """A logger writing to ``user/entry_script_log/<node_id>/<process_name>.log.txt``."""
        with EntryScript._lock:
            if self._logger is None:
                self._logger = _make_logger()
            return self._logger

    def get_logger(self):
        """The same logger as ``.logger``."""
        return self.logger


def _log_file_path():
    return os.path.join(
        _settings["log_dir"],
        "user",
        "entry_script_log",
        _settings["node_id"],
        _settings["process_name"] + ".log.txt",
    )


def _make_logger():
    logger = logging.getLogger(_LOGGER_NAME)
    level = logging.getLevelName(str(_settings["logging_level"]).upper())
    logger.setLevel(level if isinstance(level, int) else logging.INFO)
    logger.propagate = False
    path = _log_file_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    logger.addHandler(handler)
    return logger


class MiniBatchContext:
    """What ``run(mini_batch, mini_batch_context)`` receives: the ``partition_keys`` values
    the mini-batch holds (a dict, empty without ``partition_keys``), what it was cut from,
    and its index."""

    __slots__ = ("partition_key_value", "dataset", "minibatch_index")

    def __init__(self, partition_key_value, dataset, minibatch_index):
        self.partition_key_value = partition_key_value
        self.dataset = dataset
        self.minibatch_index = minibatch_index

    def __repr__(self):
        return (
            f"MiniBatchContext(partition_key_value={self.partition_key_value!r}, "
            f"dataset={self.dataset!r}, minibatch_index={self.minibatch_index!r})"
        )


def _context(partition_key_value, dataset, minibatch_index, mini_batch=None):
    """``partition_key_value``: (key, text) pairs in the order of ``partition_keys``. Each
    value is typed as pandas reads it: a tabular mini-batch's own column value (``1000``
    stays an int), a file partition's path part as ``read_csv`` reads a column holding only
    that text."""
    values = {}
    for key, text in partition_key_value or ():
        values[key] = _frame_value(mini_batch, key, text)
    return MiniBatchContext(values, dataset, minibatch_index)


_NOT_IN_FRAME = object()


def _frame_value(mini_batch, key, text):
    columns = getattr(mini_batch, "columns", None)
    if columns is None or key not in columns or len(mini_batch) == 0:
        return _read_like_pandas(text)
    value = mini_batch[key].iloc[0]
    item = getattr(value, "item", None)
    # numpy scalars become Python's own (int, float, bool, str), as a script compares them.
    return item() if callable(item) else value


_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_TRUE = ("True", "TRUE", "true")
_FALSE = ("False", "FALSE", "false")


def _read_like_pandas(text):
    """``text`` as ``pandas.read_csv`` types a column holding only it: an int (int64 or
    uint64), a float (``inf`` too), a bool, else the text itself. pandas' missing-value
    markers (``NA``, ``null``, ``nan``) stay text: a path part is never missing."""
    stripped = text.strip()
    if _INT.fullmatch(stripped):
        number = int(stripped)
        if -(2**63) <= number < 2**64:
            return number
        return text
    if _FLOAT.fullmatch(stripped) or stripped.lstrip("+-").lower() in ("inf", "infinity"):
        return float(stripped)
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return text


def _takes_context(run):
    """Whether ``run`` takes a second positional parameter (the mini-batch context)."""
    try:
        parameters = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in parameters:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if p.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            positional += 1
    return positional >= 2


class ModelNotFoundError(KeyError):
    """``Model.get_model_path`` of a name the job's ``[models]`` table does not define."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def _model_path(model_name, version=None, _workspace=None):
    models = _settings["models"]
    if model_name in models:
        return models[model_name]
    known = ", ".join(sorted(models)) or "none"
    raise ModelNotFoundError(
        f"no model named {model_name!r} in the job's [models] table (known: {known}); "
        "add it there: [models] name = \"path-or-s3-prefix\""
    )


class Model:
    """fleetrun's stand-in for ``azureml.core.Model``: ``get_model_path(name)`` returns the
    local copy of the job's ``[models]`` entry ``name``."""

    def __init__(self, workspace=None, name=None, **kwargs):
        self.name = name
        self.workspace = workspace

    @staticmethod
    def get_model_path(model_name, version=None, _workspace=None):
        return _model_path(model_name, version, _workspace)


def _install_models():
    """Registers ``azureml.core`` / ``azureml.core.model`` with fleetrun's ``Model`` when the
    real azureml-core is not installed. When it is, the real ``Model.get_model_path`` is
    wrapped: names in ``[models]`` get fleetrun's local copy, other names go to the real one."""
    try:
        real = importlib.util.find_spec("azureml.core") is not None
    except (ImportError, ValueError):
        real = False
    if real:
        if not _settings["models"]:
            return
        from azureml.core import model as real_model  # noqa: PLC0415

        original = real_model.Model.get_model_path

        def get_model_path(model_name, version=None, _workspace=None):
            if model_name in _settings["models"]:
                return _settings["models"][model_name]
            return original(model_name, version, _workspace)

        real_model.Model.get_model_path = staticmethod(get_model_path)
        return
    if "azureml" in sys.modules:
        azureml = sys.modules["azureml"]
    else:
        azureml = _package("azureml")
        sys.modules["azureml"] = azureml
    core = _package("azureml.core")
    model = types.ModuleType("azureml.core.model")
    model.__spec__ = importlib.machinery.ModuleSpec(model.__name__, None)
    for module in (core, model):
        module.Model = Model
    core.model = model
    azureml.core = core
    sys.modules["azureml.core"] = core
    sys.modules["azureml.core.model"] = model


def _install_root_logger():
    """Python's root logger and ``warnings`` go to this process's stdout (its stdout file),
    at the job's ``logging_level``; a script's own ``logging.basicConfig()`` then changes
    nothing, as on ParallelRunStep."""
    level = logging.getLevelName(str(_settings["logging_level"]).upper())
    level = level if isinstance(level, int) else logging.INFO
    root = logging.getLogger()
    root.setLevel(level)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    root.addHandler(handler)
    logging.captureWarnings(True)


def _package(name):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    module.__package__ = name
    return module


def _install(settings):
    """Records this process's settings and registers the ``azureml_user`` aliases, the
    ``azureml.core`` model names and the root logger's handler."""
    _settings.update(settings)
    _install_root_logger()
    _install_models()

    azureml_user = _package("azureml_user")
    parallel_run = _package("azureml_user.parallel_run")
    entry_script = types.ModuleType("azureml_user.parallel_run.entry_script")
    entry_script.__spec__ = importlib.machinery.ModuleSpec(entry_script.__name__, None)
    for module in (parallel_run, entry_script):
        module.EntryScript = EntryScript
        module.__all__ = ["EntryScript"]
    azureml_user.parallel_run = parallel_run
    parallel_run.entry_script = entry_script
    sys.modules["azureml_user"] = azureml_user
    sys.modules["azureml_user.parallel_run"] = parallel_run
    sys.modules["azureml_user.parallel_run.entry_script"] = entry_script
