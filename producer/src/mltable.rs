//! The input folder's `MLTable` file (`fleetrun_config::mltable`), read from the input's
//! storage (a local folder or an S3 prefix) when a job is submitted, before it is registered:
//! a file asking for what fleetrun does not read refuses the job, naming the file and the key.
//! What it says is kept in the job's spec, so every later listing of the input (the cut, a
//! resume's check) and every runner reads the input as it says.

use fleetrun_common::storage::StorageError;
use fleetrun_config::mltable::{MLTABLE_FILE, MlTable};
use fleetrun_config::{Input, JobSpec, Location, TabularFormat};
use fleetrun_worker::job;
use futures::StreamExt;

use crate::fleet::FleetError;
use crate::tabular::TabularError;

/// Reads the `MLTable` file of the job's input folder into `spec.mltable`, and a tabular
/// input's format and separator from its read transformation. An input that is one file, or
/// a folder without the file, is left as it is; a spec read once is not read again.
pub async fn settle(
    spec: &mut JobSpec,
    s3: &fleetrun_common::storage::s3::S3Settings,
) -> Result<(), FleetError> {
    if spec.mltable.is_some() {
        return Ok(());
    }
    let (field, root) = match &spec.input {
        Input::Files(location) => ("input.files", location.clone()),
        Input::Tabular(tabular) => match job::tabular_root(&tabular.location) {
            (_, Some(_)) => return Ok(()),
            (root, None) => ("input.tabular", root),
        },
    };
    let input = job::open_input(spec, s3).await?;
    let text = match input.get(MLTABLE_FILE).await {
        Ok(text) => text,
        Err(StorageError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let file = file_location(&root);
    let refused = |why: String| FleetError::Refused(format!("{field}: {file}: {why}"));
    let text = std::str::from_utf8(&text).map_err(|_| refused("not UTF-8 text".to_owned()))?;
    let table = MlTable::parse(text).map_err(|e| refused(e.to_string()))?;
    if let (Input::Tabular(tabular), Some(read)) = (&mut spec.input, &table.read) {
        if tabular.format.is_some_and(|format| format != read.format) {
            return Err(FleetError::Refused(format!(
                "input.format: {file} reads its files as {}; remove input.format",
                read.format.as_str()
            )));
        }
        tabular.format = Some(read.format);
        tabular.separator = read.separator;
    }
    check_partition_keys(spec, &table, &file)?;
    let partition_format = table.partition_format.clone();
    spec.mltable = Some(table);
    if let Some(format) = partition_format {
        check_paths(spec, s3, format).await?;
    }
    Ok(())
}

/// Every file the MLTable selects has the columns of its partition format, checked before
/// the run: none would otherwise fail the job once others had run.
async fn check_paths(
    spec: &JobSpec,
    s3: &fleetrun_common::storage::s3::S3Settings,
    format: String,
) -> Result<(), FleetError> {
    let table = spec.mltable.as_ref().expect("settled above");
    let input = job::open_input(spec, s3).await?;
    let mut keys = input.list_keys("");
    while let Some(key) = keys.next().await.transpose()? {
        if table.path_columns(&key).is_none() {
            let off = TabularError::OffPartitionFormat { key, format };
            return Err(FleetError::Refused(off.to_string()));
        }
    }
    Ok(())
}

/// Keys over Parquet rows are not read yet; keys over columns from the path are, whatever
/// the format. A key may not name a dropped column: Azure's mltable gives it no value (every
/// row's is null), so it would group nothing.
fn check_partition_keys(spec: &JobSpec, table: &MlTable, file: &str) -> Result<(), FleetError> {
    let Some(keys) = &spec.partition_keys else {
        return Ok(());
    };
    if let Some(key) = keys.iter().find(|key| table.drops(key)) {
        return Err(FleetError::Refused(format!(
            "partition_keys: {key} is a column {file} drops (drop_columns), so no row has a value for it; remove it from partition_keys or from drop_columns"
        )));
    }
    let Some(read) = &table.read else {
        return Ok(());
    };
    let from_path = table.path_column_names();
    let of_rows: Vec<&String> = keys.iter().filter(|k| !from_path.contains(k)).collect();
    if read.format == TabularFormat::Parquet && !of_rows.is_empty() {
        return Err(FleetError::Refused(format!(
            "partition_keys: {of_rows:?} are not columns {file} takes from the path, and keys over Parquet rows are not supported yet"
        )));
    }
    Ok(())
}

/// Where the `MLTable` file of the folder `root` is, as the user would name it.
fn file_location(root: &Location) -> String {
    format!("{}/{MLTABLE_FILE}", root.to_string().trim_end_matches('/'))
}

/// The location of the file `key` of the input folder `root`: the value of an MLTable's
/// `Path` column.
pub fn item_location(root: &Location, key: &str) -> String {
    format!("{}/{key}", root.to_string().trim_end_matches('/'))
}
