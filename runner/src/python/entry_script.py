"""fleetrun's EntryScript: the helper entry scripts import for logging and paths.

The runner executes this file as the module ``fleetrun`` and calls ``_install`` with the
process's settings before it loads the entry script. ``_install`` also registers the module
names ParallelRunStep scripts import, so ``from azureml_user.parallel_run import EntryScript``
keeps working unchanged.
"""

import importlib.machinery
import logging
import os
import sys
import threading
import types

__all__ = ["EntryScript"]

_LOG_FORMAT = "%(asctime)s|%(levelname)s|%(process)d|%(name)s|%(message)s"
_LOGGER_NAME = "fleetrun.entry_script"

_settings = {
    "node_id": "",
    "process_name": "",
    "log_dir": "",
    "output_dir": "",
    "logging_level": "INFO",
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
        """The job's log folder."""
        return _settings["log_dir"]

    @property
    def output_dir(self):
        """The job's output folder."""
        return _settings["output_dir"]

    @property
    def working_dir(self):
        """A folder the script may write to (the output folder)."""
        return _settings["output_dir"]

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


def _package(name):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    module.__package__ = name
    return module


def _install(settings):
    """Records this process's settings and registers the ``azureml_user`` aliases."""
    _settings.update(settings)

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
