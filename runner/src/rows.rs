//! Turning what `run()` returns into one string per element, in order.
//!
//! - a `list`, `tuple` or `set`: its elements;
//! - a pandas `DataFrame` (anything with `itertuples` and `columns`): one CSV record per
//!   row (the `csv` crate's quoting), values separated by the job's `append_row_separator`
//!   (a space by default), no index; its header is kept aside;
//! - anything else with `tolist()` (a numpy array, a pandas Series): the elements of the list
//!   it returns;
//! - `None`, a `str` or anything else: a `TypeError`.
//!
//! A `str` element is taken as is, `bytes` are decoded as UTF-8 (invalid bytes replaced) and
//! anything else becomes `str(element)`.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyFrozenSet, PyList, PySet, PyString, PyTuple};

use crate::script::wrong_result_type;

/// What `run()` returned: its rows, and a DataFrame's header row.
pub struct Returned {
    pub rows: Vec<String>,
    pub header: Option<String>,
}

impl From<Vec<String>> for Returned {
    fn from(rows: Vec<String>) -> Self {
        Returned { rows, header: None }
    }
}

/// The rows of a `run()` result; a DataFrame's values are separated by `separator`.
pub fn rows(result: &Bound<'_, PyAny>, separator: u8) -> PyResult<Returned> {
    let py = result.py();
    if result.hasattr(intern!(py, "itertuples"))? && result.hasattr(intern!(py, "columns"))? {
        return data_frame_rows(result, separator);
    }
    list_rows(result).map(Returned::from)
}

fn list_rows(result: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let py = result.py();
    if let Ok(list) = result.cast::<PyList>() {
        return strings(list.len(), list.iter());
    }
    if let Ok(tuple) = result.cast::<PyTuple>() {
        return strings(tuple.len(), tuple.iter());
    }
    if let Ok(set) = result.cast::<PySet>() {
        return strings(set.len(), set.iter());
    }
    if let Ok(set) = result.cast::<PyFrozenSet>() {
        return strings(set.len(), set.iter());
    }
    if result.is_none()
        || result.is_instance_of::<PyString>()
        || result.is_instance_of::<PyBytes>()
        || result.is_instance_of::<PyDict>()
    {
        return Err(wrong_result_type(result));
    }
    if result.hasattr(intern!(py, "tolist"))? {
        let list = result.call_method0(intern!(py, "tolist"))?;
        return match list.cast::<PyList>() {
            Ok(list) => strings(list.len(), list.iter()),
            Err(_) => Err(wrong_result_type(result)),
        };
    }
    Err(wrong_result_type(result))
}

fn data_frame_rows(frame: &Bound<'_, PyAny>, separator: u8) -> PyResult<Returned> {
    let py = frame.py();
    let columns: Vec<String> = frame
        .getattr(intern!(py, "columns"))?
        .try_iter()?
        .map(|c| c.and_then(|c| value(&c)))
        .collect::<PyResult<_>>()?;
    let header = record(&columns, separator)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("index", false)?;
    kwargs.set_item("name", py.None())?;
    let mut rows = Vec::new();
    let mut fields = Vec::with_capacity(columns.len());
    for row in frame
        .call_method(intern!(py, "itertuples"), (), Some(&kwargs))?
        .try_iter()?
    {
        fields.clear();
        for field in row?.try_iter()? {
            fields.push(value(&field?)?);
        }
        rows.push(record(&fields, separator)?);
    }
    Ok(Returned {
        rows,
        header: Some(header),
    })
}

/// One CSV record, without its line end: fields holding the separator, a quote or a line
/// break are quoted.
fn record(fields: &[String], separator: u8) -> PyResult<String> {
    let mut writer = csv::WriterBuilder::new()
        .delimiter(separator)
        .terminator(csv::Terminator::Any(b'\n'))
        .buffer_capacity(256)
        .from_writer(Vec::new());
    // A record of one empty field would be written as an empty line: quote it.
    if fields.len() == 1 && fields[0].is_empty() {
        return Ok("\"\"".to_owned());
    }
    let csv_error =
        |e: &dyn std::fmt::Display| pyo3::exceptions::PyValueError::new_err(e.to_string());
    writer.write_record(fields).map_err(|e| csv_error(&e))?;
    let mut bytes = writer.into_inner().map_err(|e| csv_error(&e))?;
    bytes.pop();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A DataFrame value as the output file says it: missing values (None, NaN, NaT) empty,
/// anything else as `str()` says it.
fn value(field: &Bound<'_, PyAny>) -> PyResult<String> {
    if field.is_none() {
        return Ok(String::new());
    }
    if let Ok(f) = field.cast::<pyo3::types::PyFloat>()
        && f.value().is_nan()
    {
        return Ok(String::new());
    }
    // pandas' NaT and NA are not equal to themselves.
    if !field.is_instance_of::<PyString>() && field.ne(field).unwrap_or(false) {
        return Ok(String::new());
    }
    string(field)
}

fn strings<'py>(
    len: usize,
    elements: impl Iterator<Item = Bound<'py, PyAny>>,
) -> PyResult<Vec<String>> {
    let mut out = Vec::with_capacity(len);
    for element in elements {
        out.push(string(&element)?);
    }
    Ok(out)
}

fn string(element: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = element.cast::<PyString>() {
        return Ok(s.to_string_lossy().into_owned());
    }
    if let Ok(b) = element.cast::<PyBytes>() {
        return Ok(String::from_utf8_lossy(b.as_bytes()).into_owned());
    }
    if let Ok(b) = element.cast::<PyByteArray>() {
        return Ok(String::from_utf8_lossy(&b.to_vec()).into_owned());
    }
    Ok(element.str()?.to_string_lossy().into_owned())
}
