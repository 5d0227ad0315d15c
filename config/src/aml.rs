//! Azure ML's v2 YAML read as a job: a `parallel` job, a parallel component, or a pipeline
//! naming parallel jobs (one chosen by name when it names several). Each key of the v2
//! parallel job reference becomes a key of the job file's table, remembering the YAML key it
//! came from, so the same table is validated as a TOML job file is
//! ([`crate::load_aml`]) and can be printed as TOML with a comment per line
//! ([`Converted::to_toml`]).
//!
//! What has no meaning here (compute, the environment's image) is listed in
//! [`Converted::ignored`]. An input or output whose path cannot be reached here (another
//! step's output, an `azureml://` URI) is refused, naming it, until given with
//! `--set inputs.NAME=PATH` / `--set outputs.NAME=PATH`, which [`convert`] takes out of the
//! overrides; an output with no path is `out/NAME`.

use std::collections::BTreeMap;
use std::path::Path;

use toml::Value;
use yaml_serde::Value as Yaml;

use crate::ConfigError;

/// One key of the job file's table, and the YAML key it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Dotted inside a table: `input.tabular`, `environment_variables.MODE`.
    pub key: String,
    pub value: Value,
    /// `jobs.parallel_train.retry_settings.max_retries`, or the `--set key=value` that gave it.
    pub from: String,
}

/// A v2 parallel job as the job file's keys.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Converted {
    pub lines: Vec<Line>,
    /// YAML keys that mean nothing to fleetrun (`compute`, `task.environment`), dotted.
    pub ignored: Vec<String>,
}

/// The YAML keys a parallel job may hold and fleetrun reads past: where it runs, and what
/// only the Azure ML workspace shows.
const NO_MEANING: [&str; 11] = [
    "compute",
    "task.environment",
    "resources.instance_type",
    "resources.shm_size",
    "display_name",
    "description",
    "tags",
    "experiment_name",
    "settings",
    "identity",
    "version",
];

/// Keys read (or named as without meaning) in a parallel job; any other is refused.
const KNOWN: [&str; 21] = [
    "$schema",
    "type",
    "name",
    "inputs",
    "outputs",
    "input_data",
    "mini_batch_size",
    "resources",
    "max_concurrency_per_instance",
    "retry_settings",
    "error_threshold",
    "mini_batch_error_threshold",
    "logging_level",
    "environment_variables",
    "partition_keys",
    "task",
    "component",
    "is_deterministic",
    "resource_monitor_interval",
    "properties",
    "mini_batch_error_threshold_percent",
];

/// Reads the YAML `text` (from `source`, in `base_dir`), the parallel job `job` of a
/// pipeline (needed when it names several), with the `--set inputs.NAME=…` and
/// `--set outputs.NAME=…` of `overrides`. Returns the job and the overrides left for the
/// job file's keys.
pub fn convert(
    text: &str,
    source: &str,
    base_dir: &Path,
    job: Option<&str>,
    overrides: &[String],
) -> Result<(Converted, Vec<String>), ConfigError> {
    let fail = |at: &str, message: String| ConfigError::Aml {
        origin: source.to_owned(),
        at: at.to_owned(),
        message,
    };
    let doc: Yaml = yaml_serde::from_str(text).map_err(|e| fail("", e.to_string()))?;
    let (mut sets, rest) = split_overrides(overrides);
    let (prefix, node, parent) = pick_job(&doc, job).map_err(|e| fail("jobs", e.to_string()))?;
    let node = with_component(node, base_dir, &prefix).map_err(|(at, m)| fail(&at, m))?;
    let mut out = Converter {
        prefix,
        base_dir,
        lines: Vec::new(),
        ignored: Vec::new(),
        parent,
        sets: &mut sets,
        data_input: None,
    };
    out.job(&node).map_err(|(at, m)| fail(&at, m))?;
    let (lines, ignored) = (out.lines, out.ignored);
    if let Some((name, _)) = sets.iter().find(|(_, (_, used))| !used) {
        return Err(fail(name, format!("--set {name}=…: the job has no {name}")));
    }
    Ok((Converted { lines, ignored }, rest))
}

/// `--set inputs.x=…` and `--set outputs.x=…` (name → (value, used)), and the others.
type Sets = BTreeMap<String, (String, bool)>;

fn split_overrides(overrides: &[String]) -> (Sets, Vec<String>) {
    let mut sets = Sets::new();
    let mut rest = Vec::new();
    for arg in overrides {
        match arg.split_once('=') {
            Some((key, value))
                if key.trim().starts_with("inputs.") || key.trim().starts_with("outputs.") =>
            {
                sets.insert(key.trim().to_owned(), (value.trim().to_owned(), false));
            }
            _ => rest.push(arg.clone()),
        }
    }
    (sets, rest)
}

/// Why no one parallel job of a pipeline was picked.
#[derive(Debug, thiserror::Error)]
enum PickError {
    #[error("neither a parallel job (type: parallel) nor a pipeline with jobs")]
    NotAJob,
    #[error("no parallel job named {wanted:?} (parallel jobs: {names})")]
    NoSuchJob { wanted: String, names: String },
    #[error("the pipeline has no parallel job")]
    NoParallelJob,
    #[error("the pipeline has several parallel jobs; choose one with --job NAME ({names})")]
    Several { names: String },
}

/// The parallel job of `doc`: the document itself, or one of a pipeline's `jobs`. Returns
/// the YAML path of its keys (`jobs.train.`), the job and the pipeline itself (its `inputs`
/// and `outputs` are `${{parent.inputs.x}}` and `${{parent.outputs.x}}`).
fn pick_job(doc: &Yaml, job: Option<&str>) -> Result<(String, Yaml, Yaml), PickError> {
    let kind = doc.get("type").and_then(Yaml::as_str).unwrap_or_default();
    if kind == "parallel" {
        return Ok((String::new(), doc.clone(), Yaml::Null));
    }
    let jobs = doc
        .get("jobs")
        .and_then(Yaml::as_mapping)
        .ok_or(PickError::NotAJob)?;
    let parallel: Vec<(String, &Yaml)> = jobs
        .iter()
        .filter(|(_, node)| {
            node.get("type").and_then(Yaml::as_str) == Some("parallel")
                || node.get("component").is_some() && node.get("type").is_none()
        })
        .filter_map(|(name, node)| Some((name.as_str()?.to_owned(), node)))
        .collect();
    let names = || {
        parallel
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let chosen = match job {
        Some(wanted) => parallel
            .iter()
            .find(|(name, _)| name == wanted)
            .ok_or_else(|| PickError::NoSuchJob {
                wanted: wanted.to_owned(),
                names: names(),
            })?,
        None if parallel.len() == 1 => &parallel[0],
        None if parallel.is_empty() => return Err(PickError::NoParallelJob),
        None => return Err(PickError::Several { names: names() }),
    };
    Ok((format!("jobs.{}.", chosen.0), chosen.1.clone(), doc.clone()))
}

/// A pipeline's job that names a `component` file: the component's keys, with the job's
/// own over them.
fn with_component(node: Yaml, base_dir: &Path, prefix: &str) -> Result<Yaml, (String, String)> {
    let Some(file) = node.get("component").and_then(Yaml::as_str) else {
        return Ok(node);
    };
    let at = format!("{prefix}component");
    let path = base_dir.join(file);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| (at.clone(), format!("cannot read {}: {e}", path.display())))?;
    let mut merged: Yaml = yaml_serde::from_str(&text)
        .map_err(|e| (at.clone(), format!("{}: {e}", path.display())))?;
    let (Some(base), Some(own)) = (merged.as_mapping_mut(), node.as_mapping()) else {
        return Err((at, "a component is a mapping of keys".into()));
    };
    for (key, value) in own {
        if key.as_str() == Some("component") {
            continue;
        }
        match (base.get_mut(key), value) {
            // `inputs` and `outputs` of the job give values to the component's declarations.
            (Some(Yaml::Mapping(declared)), Yaml::Mapping(given)) => {
                for (k, v) in given {
                    declared.insert(k.clone(), v.clone());
                }
            }
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
    Ok(merged)
}

struct Converter<'a> {
    prefix: String,
    base_dir: &'a Path,
    lines: Vec<Line>,
    ignored: Vec<String>,
    /// The pipeline, for `${{parent.inputs.x}}` and `${{parent.outputs.x}}`; null for a
    /// parallel job alone.
    parent: Yaml,
    sets: &'a mut Sets,
    /// The input `input_data` names: the partitioned one.
    data_input: Option<String>,
}

type Fail = (String, String);

impl Converter<'_> {
    /// The YAML key `key` of the job: `jobs.<name>.<key>` in a pipeline; the job's own key
    /// (`jobs.<name>`) for an empty `key`.
    fn at(&self, key: &str) -> String {
        if key.is_empty() {
            return self.prefix.trim_end_matches('.').to_owned();
        }
        format!("{}{key}", self.prefix)
    }

    fn put(&mut self, key: &str, value: Value, from: &str) {
        self.lines.push(Line {
            key: key.to_owned(),
            value,
            from: self.at(from),
        });
    }

    fn job(&mut self, node: &Yaml) -> Result<(), Fail> {
        let map = node
            .as_mapping()
            .ok_or_else(|| (self.at(""), "a parallel job is a mapping of keys".into()))?;
        for key in map.keys().filter_map(Yaml::as_str) {
            if !KNOWN.contains(&key) && !NO_MEANING.contains(&key) {
                return Err((self.at(key), "not a key of an Azure ML parallel job".into()));
            }
            if NO_MEANING.contains(&key) {
                self.ignored.push(self.at(key));
            }
        }
        let name = self
            .prefix
            .strip_prefix("jobs.")
            .map(|p| p.trim_end_matches('.').to_owned())
            .or_else(|| node.get("name").and_then(Yaml::as_str).map(str::to_owned))
            .unwrap_or_else(|| "parallel-job".to_owned());
        // A pipeline's job is named by its key under `jobs`.
        let from = if self.prefix.is_empty() { "name" } else { "" };
        self.put("name", Value::String(job_name(&name)), from);
        if !self.prefix.is_empty()
            && let Some(line) = self.lines.last_mut()
        {
            line.from.push_str(" (the job's key)");
        }

        let task = node.get("task").cloned().unwrap_or(Yaml::Null);
        if let Some(environment) = task.get("environment") {
            let _ = environment;
            self.ignored.push(self.at("task.environment"));
        }
        if let Some(code) = task.get("code").and_then(Yaml::as_str) {
            self.put(
                "source_directory",
                Value::String(code.to_owned()),
                "task.code",
            );
        }
        let entry = task
            .get("entry_script")
            .and_then(Yaml::as_str)
            .ok_or_else(|| (self.at("task.entry_script"), "required".to_owned()))?;
        self.put(
            "entry_script",
            Value::String(entry.to_owned()),
            "task.entry_script",
        );

        let inputs = node.get("inputs").cloned().unwrap_or(Yaml::Null);
        let outputs = self.declared_outputs(node);
        self.input(node, &inputs)?;
        let out_dir = self.output(&task, &outputs)?;
        self.arguments(&task, &inputs, &outputs, &out_dir)?;
        self.settings(node)?;
        Ok(())
    }

    /// `input_data: ${{inputs.x}}`: a `mltable` input is tabular (its folder, read as its
    /// `MLTable` file says), any other is files.
    fn input(&mut self, node: &Yaml, inputs: &Yaml) -> Result<(), Fail> {
        let at = self.at("input_data");
        let reference = node
            .get("input_data")
            .and_then(Yaml::as_str)
            .ok_or_else(|| (at.clone(), "required: ${{inputs.NAME}}".to_owned()))?;
        let name = reference_to("inputs", reference).ok_or_else(|| {
            (
                at.clone(),
                format!("expected ${{{{inputs.NAME}}}}, got {reference:?}"),
            )
        })?;
        self.data_input = Some(name.to_owned());
        let declared = inputs.get(name).cloned().unwrap_or(Yaml::Null);
        let kind = declared
            .get("type")
            .and_then(Yaml::as_str)
            .unwrap_or("uri_folder");
        let path = self.input_path(name, &declared)?;
        let input_at = format!("inputs.{name}.path");
        if kind == "mltable" {
            // The folder itself: its `MLTable` file is read with the input (`crate::mltable`).
            self.put("input.tabular", Value::String(path), &input_at);
        } else {
            self.put("input.files", Value::String(path), &input_at);
        }
        Ok(())
    }

    /// Input `name` at `path`, other than the partitioned one (a model, a folder of
    /// reference files): a side input, staged whole on every node as Azure downloads or
    /// mounts it there; the argument is its `${{side_inputs.name}}`.
    fn side_input(&mut self, name: &str, path: String) -> String {
        let key = format!("side_inputs.{name}");
        if !self.lines.iter().any(|line| line.key == key) {
            self.put(&key, Value::String(path), &format!("inputs.{name}.path"));
        }
        format!("${{{{side_inputs.{name}}}}}")
    }

    /// The path of input `name`: `--set inputs.name=…`, else its own path when it is one
    /// this machine can reach.
    fn input_path(&mut self, name: &str, declared: &Yaml) -> Result<String, Fail> {
        let key = format!("inputs.{name}");
        if let Some((value, used)) = self.sets.get_mut(&key) {
            *used = true;
            return Ok(value.clone());
        }
        let declared = self.parent_value("inputs", declared);
        let path = path_of(&declared);
        if path.is_empty() || unreachable(path) {
            return Err((
                self.at(&format!("{key}.path")),
                format!(
                    "{} cannot be reached here; give the input with --set {key}=PATH",
                    if path.is_empty() { "no path" } else { path }
                ),
            ));
        }
        Ok(path.to_owned())
    }

    /// `${{parent.<kind>.x}}` (`inputs` or `outputs`) as the pipeline's input or output `x`.
    fn parent_value(&self, kind: &str, value: &Yaml) -> Yaml {
        match value
            .as_str()
            .or_else(|| value.get("path").and_then(Yaml::as_str))
            .and_then(|text| reference_to(&format!("parent.{kind}"), text))
        {
            Some(name) => dotted(&self.parent, kind)
                .and_then(|declared| declared.get(name))
                .cloned()
                .unwrap_or(Yaml::Null),
            None => value.clone(),
        }
    }

    /// The job's `outputs`, each bound to the pipeline's (`${{parent.outputs.x}}`) read as
    /// the pipeline declares it.
    fn declared_outputs(&self, node: &Yaml) -> Yaml {
        let mut declared = yaml_serde::Mapping::new();
        for (name, value) in node
            .get("outputs")
            .and_then(Yaml::as_mapping)
            .into_iter()
            .flatten()
        {
            declared.insert(name.clone(), self.parent_value("outputs", value));
        }
        Yaml::Mapping(declared)
    }

    /// The path of output `name`: `--set outputs.name=…`, else its own path when it is one
    /// this machine can reach, else `out/name` when it has none. `file` is true for the
    /// `append_row_to` output of type `uri_file`: the path is the file's.
    fn output_path(&mut self, name: &str, declared: &Yaml, file: bool) -> Result<String, Fail> {
        let key = format!("outputs.{name}");
        if let Some((value, used)) = self.sets.get_mut(&key) {
            *used = true;
            return Ok(value.clone());
        }
        let path = path_of(declared);
        if path.is_empty() {
            return Ok(format!("out/{name}"));
        }
        if unreachable(path) {
            let give = if file {
                let example = path.rsplit('/').next().filter(|f| !f.contains("${{"));
                format!(
                    "give the output's file with --set {key}=PATH{}",
                    example.map_or(String::new(), |f| format!(" (such as out/{f})"))
                )
            } else {
                format!("give the output with --set {key}=PATH")
            };
            return Err((
                self.at(&format!("{key}.path")),
                format!("{path} cannot be reached here; {give}"),
            ));
        }
        Ok(path.to_owned())
    }

    /// The job's output folder: the folder of `task.append_row_to` (its file the
    /// `append_row` file), else `out`; the other outputs are the job's named outputs
    /// (`[outputs]`), each where `--set outputs.NAME=…` says, at its own path, or `out/NAME`
    /// when it has none ([`Self::output_path`]). Returns the path of the `append_row_to`
    /// output, by name.
    fn output(&mut self, task: &Yaml, outputs: &Yaml) -> Result<BTreeMap<String, String>, Fail> {
        let mut named = BTreeMap::new();
        for (name, declared) in outputs
            .as_mapping()
            .into_iter()
            .flatten()
            .filter_map(|(name, declared)| Some((name.as_str()?, declared)))
        {
            let file = append_row_file_output(task, outputs) == Some(name);
            let path = self.output_path(name, declared, file)?;
            named.insert(name.to_owned(), path);
        }
        let appended = self.append_row(task, outputs, &named)?;
        // Every other output is a named output: the script writes to a folder of its runner's
        // own (`${{outputs.NAME}}` stays in the arguments), whose files reach this path.
        for (name, path) in &named {
            if appended.as_deref() != Some(name.as_str()) {
                let key = format!("outputs.{name}");
                self.put(&key, Value::String(path.clone()), &key);
            }
        }
        named.retain(|name, _| appended.as_deref() == Some(name.as_str()));
        Ok(named)
    }

    /// `task.append_row_to` (the output folder and the `append_row` file), else a
    /// `summary_only` job with its output in `out`. Returns the output it names.
    fn append_row(
        &mut self,
        task: &Yaml,
        outputs: &Yaml,
        named: &BTreeMap<String, String>,
    ) -> Result<Option<String>, Fail> {
        match task.get("append_row_to").and_then(Yaml::as_str) {
            Some(target) => {
                let at = "task.append_row_to";
                let (reference, file) = match target.split_once("}}") {
                    Some((head, tail)) => (format!("{head}}}}}"), tail.trim_start_matches('/')),
                    None => (target.to_owned(), ""),
                };
                let name = reference_to("outputs", &reference).ok_or_else(|| {
                    (
                        self.at(at),
                        format!("expected ${{{{outputs.NAME}}}}, got {target:?}"),
                    )
                })?;
                let path = named
                    .get(name)
                    .cloned()
                    .ok_or_else(|| (self.at(at), format!("the job has no output {name:?}")))?;
                let kind = outputs
                    .get(name)
                    .and_then(|o| o.get("type"))
                    .and_then(Yaml::as_str);
                // A `uri_file` output is the file itself.
                let (folder, file) = if kind == Some("uri_file") && file.is_empty() {
                    match path.rsplit_once('/') {
                        Some((folder, file)) => (folder.to_owned(), file.to_owned()),
                        None => (".".to_owned(), path.clone()),
                    }
                } else {
                    (path.clone(), file.to_owned())
                };
                self.put("output_action", Value::String("append_row".into()), at);
                self.put("output.path", Value::String(folder.clone()), at);
                if !file.is_empty() {
                    self.put("append_row_file_name", Value::String(file.clone()), at);
                }
                Ok(Some(name.to_owned()))
            }
            None => {
                self.put(
                    "output_action",
                    Value::String("summary_only".into()),
                    "task",
                );
                self.put("output.path", Value::String("out".into()), "outputs");
                Ok(None)
            }
        }
    }

    /// `task.program_arguments` (a string, split as a shell would, or a list), with
    /// `${{inputs.x}}` replaced by its value or path and `${{outputs.x}}` by the output
    /// folder for the `append_row_to` output; a named output's reference stays, for each
    /// runner to fill in.
    fn arguments(
        &mut self,
        task: &Yaml,
        inputs: &Yaml,
        outputs: &Yaml,
        named: &BTreeMap<String, String>,
    ) -> Result<(), Fail> {
        let at = "task.program_arguments";
        let words: Vec<String> = match task.get("program_arguments") {
            None | Some(Yaml::Null) => return Ok(()),
            Some(Yaml::String(text)) => shell_words(text),
            Some(Yaml::Sequence(items)) => items.iter().map(scalar_text).collect(),
            Some(_) => return Err((self.at(at), "a string or a list".into())),
        };
        let mut arguments = Vec::with_capacity(words.len());
        for word in words {
            arguments.push(Value::String(
                self.substitute(&word, inputs, outputs, named)?,
            ));
        }
        self.put("arguments", Value::Array(arguments), at);
        Ok(())
    }

    fn substitute(
        &mut self,
        word: &str,
        inputs: &Yaml,
        outputs: &Yaml,
        named: &BTreeMap<String, String>,
    ) -> Result<String, Fail> {
        let mut out = String::new();
        let mut rest = word;
        while let Some(start) = rest.find("${{") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find("}}")
                .map(|e| start + e + 2)
                .ok_or_else(|| {
                    (
                        self.at("task.program_arguments"),
                        format!("unclosed ${{{{ in {word:?}"),
                    )
                })?;
            let reference = &rest[start..end];
            let value = if let Some(name) = reference_to("inputs", reference) {
                let declared = inputs.get(name).cloned().unwrap_or(Yaml::Null);
                let declared = self.parent_value("inputs", &declared);
                if declared.is_mapping() {
                    let path = self.input_path(name, &declared)?;
                    if self.data_input.as_deref() == Some(name) {
                        location(self.base_dir, &path)
                    } else {
                        self.side_input(name, path)
                    }
                } else if declared.is_null() {
                    return Err((
                        self.at("task.program_arguments"),
                        format!("{reference} names no input of the job"),
                    ));
                } else {
                    scalar_text(&declared)
                }
            } else if let Some(name) = reference_to("outputs", reference) {
                match named.get(name) {
                    Some(path) => location(self.base_dir, path.trim_end_matches('/')),
                    None if outputs.get(name).is_some() => format!("${{{{outputs.{name}}}}}"),
                    None => {
                        return Err((
                            self.at("task.program_arguments"),
                            format!("{reference} names no output of the job"),
                        ));
                    }
                }
            } else {
                return Err((
                    self.at("task.program_arguments"),
                    format!("{reference} is not a reference fleetrun can give a value"),
                ));
            };
            out.push_str(&value);
            rest = &rest[end..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The settings with a key of their own.
    fn settings(&mut self, node: &Yaml) -> Result<(), Fail> {
        let int = |value: &Yaml| value.as_i64().map(Value::Integer);
        if let Some(size) = node.get("mini_batch_size") {
            let value = match size {
                Yaml::Number(n) => n.as_i64().map(Value::Integer),
                Yaml::String(text) => Some(Value::String(text.to_uppercase())),
                _ => None,
            };
            let value = value
                .ok_or_else(|| (self.at("mini_batch_size"), "a number or a size".to_owned()))?;
            self.put("mini_batch_size", value, "mini_batch_size");
        }
        let simple = [
            ("resources.instance_count", "node_count"),
            ("max_concurrency_per_instance", "process_count_per_node"),
            ("error_threshold", "error_threshold"),
            ("mini_batch_error_threshold", "allowed_failed_count"),
            ("retry_settings.timeout", "run_invocation_timeout"),
            ("resource_monitor_interval", "resource_monitor_interval"),
        ];
        for (yaml_key, key) in simple {
            if let Some(value) = dotted(node, yaml_key) {
                let value =
                    int(value).ok_or_else(|| (self.at(yaml_key), "an integer".to_owned()))?;
                self.put(key, value, yaml_key);
            }
        }
        // Retries after the first attempt; fleetrun counts attempts.
        if let Some(retries) = dotted(node, "retry_settings.max_retries") {
            let retries = retries.as_i64().ok_or_else(|| {
                (
                    self.at("retry_settings.max_retries"),
                    "an integer".to_owned(),
                )
            })?;
            self.put(
                "run_max_try",
                Value::Integer(retries.saturating_add(1)),
                "retry_settings.max_retries",
            );
        }
        if let Some(level) = node.get("logging_level").and_then(Yaml::as_str) {
            self.put(
                "logging_level",
                Value::String(level.to_owned()),
                "logging_level",
            );
        }
        if let Some(keys) = node.get("partition_keys").and_then(Yaml::as_sequence) {
            let keys = keys.iter().map(|k| Value::String(scalar_text(k))).collect();
            self.put("partition_keys", Value::Array(keys), "partition_keys");
        }
        if let Some(variables) = node.get("environment_variables").and_then(Yaml::as_mapping) {
            for (name, value) in variables {
                let name = scalar_text(name);
                self.put(
                    &format!("environment_variables.{name}"),
                    Value::String(scalar_text(value)),
                    &format!("environment_variables.{name}"),
                );
            }
        }
        Ok(())
    }
}

/// The output `task.append_row_to` names when it is the `append_row` file itself: a
/// `uri_file` output named alone (`${{outputs.x}}`, no file after it).
fn append_row_file_output<'a>(task: &'a Yaml, outputs: &Yaml) -> Option<&'a str> {
    let name = reference_to("outputs", task.get("append_row_to")?.as_str()?)?;
    (outputs.get(name)?.get("type")?.as_str()? == "uri_file").then_some(name)
}

/// The `path` of an input or output declared in YAML (a mapping with a `path`, or the path
/// alone); empty when it has none.
fn path_of(declared: &Yaml) -> &str {
    declared
        .get("path")
        .and_then(Yaml::as_str)
        .or_else(|| declared.as_str())
        .unwrap_or_default()
}

/// Whether a YAML path names a place this machine cannot reach: another step's output
/// (`${{parent.jobs.…}}`), an `azureml://` URI (or `azureml:name:version`), or a URI of any
/// scheme but `s3://` (`https://`, `wasbs://`, `abfss://`).
fn unreachable(path: &str) -> bool {
    let scheme = path.split_once("://").map(|(scheme, _)| scheme);
    path.contains("${{")
        || path.starts_with("azureml:")
        || scheme.is_some_and(|scheme| !scheme.eq_ignore_ascii_case("s3"))
}

/// `x` of `${{<scope>.x}}` (spaces inside the braces allowed).
fn reference_to<'a>(scope: &str, text: &'a str) -> Option<&'a str> {
    let inner = text.trim().strip_prefix("${{")?.strip_suffix("}}")?.trim();
    inner.strip_prefix(scope)?.strip_prefix('.')
}

/// A path as the script gets it: absolute, from the YAML's folder.
fn location(base_dir: &Path, path: &str) -> String {
    if path.starts_with("s3://") || Path::new(path).is_absolute() {
        return path.to_owned();
    }
    let joined = base_dir.join(path.trim_start_matches("./"));
    joined.to_string_lossy().into_owned()
}

fn dotted<'a>(node: &'a Yaml, key: &str) -> Option<&'a Yaml> {
    key.split('.').try_fold(node, |at, part| at.get(part))
}

fn scalar_text(value: &Yaml) -> String {
    match value {
        Yaml::String(s) => s.clone(),
        Yaml::Bool(b) => b.to_string(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Null => String::new(),
        other => yaml_serde::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

/// `text` split into words as a shell splits a command line: on whitespace, with quotes.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// A v2 job's name as a job file's: lower case, `_` and other characters made `-`, 3–32
/// characters.
fn job_name(name: &str) -> String {
    let mut out: String = name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    out = out.trim_matches('-').to_owned();
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert_str(0, "job-");
    }
    out.truncate(32);
    let out = out.trim_end_matches('-').to_owned();
    if out.len() < 3 {
        format!("{out}-job")
    } else {
        out
    }
}

impl Converted {
    /// The job file's TOML: top-level keys, then each table, every line with a comment
    /// naming its YAML key.
    pub fn to_toml(&self, source: &str) -> String {
        let mut text = format!("# fleetrun job file converted from {source}\n");
        if !self.ignored.is_empty() {
            text.push_str(&format!(
                "# not used by fleetrun: {}\n",
                self.ignored.join(", ")
            ));
        }
        let line = |key: &str, l: &Line| {
            let from = if l.from.is_empty() {
                "(the job's name)"
            } else {
                &l.from
            };
            format!("{key} = {}  # {from}\n", l.value)
        };
        for l in self.lines.iter().filter(|l| !l.key.contains('.')) {
            text.push_str(&line(&l.key, l));
        }
        // ParallelRunStep's settings in `arguments` are the job's keys (they stay in the
        // script's argv): one comment each, as `run` and `submit` say them.
        let from = self.lines.iter().find(|l| l.key == "arguments");
        if let Some(from) = from {
            for setting in crate::load::arguments::take(&mut self.table()) {
                text.push_str(&format!("# {setting} ({})\n", from.from));
            }
        }
        let mut tables: Vec<&str> = Vec::new();
        for l in &self.lines {
            if let Some((table, _)) = l.key.split_once('.')
                && !tables.contains(&table)
            {
                tables.push(table);
            }
        }
        for table in tables {
            text.push_str(&format!("\n[{table}]\n"));
            for l in &self.lines {
                if let Some((t, key)) = l.key.split_once('.')
                    && t == table
                {
                    let key = if key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                    {
                        key.to_owned()
                    } else {
                        Value::String(key.to_owned()).to_string()
                    };
                    text.push_str(&line(&key, l));
                }
            }
        }
        text
    }

    /// The job file's table.
    pub fn table(&self) -> toml::Table {
        let mut doc = toml::Table::new();
        for l in &self.lines {
            match l.key.split_once('.') {
                None => {
                    doc.insert(l.key.clone(), l.value.clone());
                }
                Some((table, key)) => {
                    let slot = doc
                        .entry(table)
                        .or_insert_with(|| Value::Table(toml::Table::new()));
                    if let Value::Table(t) = slot {
                        t.insert(key.to_owned(), l.value.clone());
                    }
                }
            }
        }
        doc
    }

    /// The `--set key=value` of `overrides` that [`convert`] left (the job file's keys:
    /// `environment`, `run_max_try`) written into the job, as `run` and `submit` apply them:
    /// each replaces its key's line, its comment naming the `--set`.
    pub fn set(&mut self, overrides: &[String]) -> Result<(), ConfigError> {
        for arg in overrides {
            let (key, value) = crate::load::override_value(arg)?;
            let from = format!("--set {}", arg.trim());
            match self.lines.iter_mut().find(|l| l.key == key) {
                Some(line) => {
                    line.value = value;
                    line.from = from;
                }
                None => self.lines.push(Line { key, value, from }),
            }
        }
        Ok(())
    }

    /// One warning naming the YAML keys fleetrun does not use, if any.
    pub fn warning(&self) -> Option<String> {
        (!self.ignored.is_empty()).then(|| {
            format!(
                "{} have no meaning for fleetrun and are not used (the Python is the job's `environment`: --set environment=PATH)",
                self.ignored.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_as_a_shell_splits_them() {
        assert_eq!(
            shell_words("--a 1\n--b 'x y' \"z\"  "),
            ["--a", "1", "--b", "x y", "z"]
        );
    }

    #[test]
    fn names_become_job_names() {
        assert_eq!(job_name("parallel_train"), "parallel-train");
        assert_eq!(job_name("2a"), "job-2a");
        assert_eq!(job_name("x"), "x-job");
    }

    #[test]
    fn references_name_their_scope() {
        assert_eq!(reference_to("inputs", "${{ inputs.data }}"), Some("data"));
        assert_eq!(reference_to("outputs", "${{inputs.data}}"), None);
    }
}
