//! Turning what `run()` returns into one string per element, in order.
//!
//! - a `list`, `tuple` or `set`: its elements;
//! - a pandas `DataFrame` (anything with `to_csv` and `columns`): one line per row, values
//!   separated by a space, no header or index;
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

/// The rows of a `run()` result.
pub fn rows(result: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
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
    if result.hasattr(intern!(py, "to_csv"))? && result.hasattr(intern!(py, "columns"))? {
        return data_frame_rows(result);
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

fn data_frame_rows(frame: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let py = frame.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("sep", " ")?;
    kwargs.set_item("header", false)?;
    kwargs.set_item("index", false)?;
    let csv = frame.call_method(intern!(py, "to_csv"), (), Some(&kwargs))?;
    let csv = csv.cast::<PyString>()?.to_string_lossy();
    Ok(csv.lines().map(str::to_owned).collect())
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
