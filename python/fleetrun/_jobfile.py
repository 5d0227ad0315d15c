"""Jobs as the API takes them: a dict of a job file's fields, local paths absolute."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from ._binary import fleetrun_binary
from ._errors import FleetrunError

__all__ = ["JobLike", "load_job", "absolute_paths", "to_toml"]

#: A job: a dict of a job file's fields, or the path of a job file (TOML) or of an Azure ML
#: v2 YAML, or the text of such a YAML.
JobLike = Union[Mapping[str, Any], str, "os.PathLike[str]"]

# The fields that hold one local path (or an s3:// URL), relative to the job file's folder.
_TOP_PATHS = ("source_directory", "environment")
_TABLE_PATHS = {"input": ("files", "tabular"), "output": ("path",)}
# The tables of name = path.
_NAMED_PATHS = ("side_inputs", "models", "outputs")


def _loads_toml(text: str, source: str) -> Dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            raise FleetrunError(
                f"{source}: reading a TOML job file needs Python 3.11 or the tomli package "
                "(pip install tomli); or pass the job as a dict"
            ) from None
    try:
        return dict(tomllib.loads(text))
    except ValueError as e:
        raise FleetrunError(f"{source}: not TOML: {e}") from e


def _converted(yaml_file: Path, job: Optional[str], binary: Optional[str]) -> str:
    """An Azure ML v2 YAML as a fleetrun job file (TOML), by ``fleetrun convert``."""
    args = [fleetrun_binary(binary), "convert", str(yaml_file)]
    if job:
        args += ["--job", job]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise FleetrunError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                            f"fleetrun convert {yaml_file} exited {done.returncode}")
    return done.stdout


def _is_local_relative(text: Any) -> bool:
    return isinstance(text, str) and "://" not in text and not os.path.isabs(text)


def absolute_paths(job: Mapping[str, Any], base: Path) -> Dict[str, Any]:
    """``job`` with its relative local paths made absolute against ``base``, as the job file
    rules resolve them (``entry_script`` against ``source_directory`` when that is set)."""
    out: Dict[str, Any] = dict(job)
    base = base.resolve()

    def fix(value: Any) -> Any:
        return str(base / value) if _is_local_relative(value) else value

    for key in _TOP_PATHS:
        if key in out:
            out[key] = fix(out[key])
    if "entry_script" in out and "source_directory" not in out:
        out["entry_script"] = fix(out["entry_script"])
    for table, keys in _TABLE_PATHS.items():
        if isinstance(out.get(table), Mapping):
            out[table] = {k: fix(v) if k in keys else v for k, v in out[table].items()}
    for table in _NAMED_PATHS:
        value = out.get(table)
        if isinstance(value, Mapping):
            out[table] = {k: fix(v) for k, v in value.items()}
        elif isinstance(value, list):
            out[table] = [fix(v) for v in value]
    return out


def load_job(job: JobLike, pipeline_job: Optional[str] = None,
             binary: Optional[str] = None) -> Dict[str, Any]:
    """The job ``job`` as a dict whose local paths are absolute.

    A dict's relative paths are taken relative to the current folder; a job file's (TOML)
    relative to its folder; an Azure ML v2 YAML (a path ending ``.yaml``/``.yml``, or its
    text) is converted by ``fleetrun convert`` first, ``pipeline_job`` naming the parallel
    job of a pipeline that has several.
    """
    if isinstance(job, Mapping):
        return absolute_paths(job, Path.cwd())
    text = os.fspath(job)
    if "\n" in text:  # the text of a v2 YAML
        import tempfile

        with tempfile.TemporaryDirectory(prefix="fleetrun-yaml-") as folder:
            yaml_file = Path(folder) / "job.yaml"
            yaml_file.write_text(text, encoding="utf-8")
            toml = _converted(yaml_file, pipeline_job, binary)
        return absolute_paths(_loads_toml(toml, "the YAML"), Path.cwd())
    path = Path(text)
    if not path.is_file():
        raise FleetrunError(f"{path}: no such job file")
    if path.suffix.lower() in (".yaml", ".yml"):
        toml = _converted(path, pipeline_job, binary)
    else:
        toml = path.read_text(encoding="utf-8")
    return absolute_paths(_loads_toml(toml, str(path)), path.parent)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_string(str(k))} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise FleetrunError(f"a job field cannot hold {type(value).__name__}: {value!r}")


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c >= " " or c == "\t" else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


def to_toml(job: Mapping[str, Any]) -> str:
    """``job`` written as a job file (TOML): plain fields first, then one table per dict."""
    lines = []
    tables = []
    for key, value in job.items():
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{_toml_string(str(key))} = {_toml_value(value)}")
    for key, table in tables:
        lines.append(f"\n[{_toml_string(str(key))}]")
        lines.extend(f"{_toml_string(str(k))} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"
