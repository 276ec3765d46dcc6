//! What every call from Python shares: the backend cache, the dtype and shape of a call from
//! its arguments, and the Python exception a library error becomes ([`to_py_err`]).

use distflash::backend::cuda::{CudaBackend, InputDtype};
use distflash::error::{ErrorKind, kind_of};
use distflash::shape::Dims;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// One backend per (GPU, dtype, stream): each keeps its loaded kernels, so a call after the
/// first launches at once. Streams are few (torch's default one, mostly), so the map stays small.
type Backends = Mutex<HashMap<(usize, InputDtype, usize), Arc<CudaBackend>>>;

fn backends() -> &'static Backends {
    static BACKENDS: OnceLock<Backends> = OnceLock::new();
    BACKENDS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The backend for `device` in `dtype` on `stream`, opened on first use.
pub(crate) fn backend(
    device: usize,
    dtype: InputDtype,
    stream: usize,
) -> PyResult<Arc<CudaBackend>> {
    let mut map = backends()
        .lock()
        .map_err(|_| PyRuntimeError::new_err("distflash's backend cache lock is poisoned"))?;
    if let Some(b) = map.get(&(device, dtype, stream)) {
        return Ok(b.clone());
    }
    // SAFETY: `stream` is `torch.cuda.current_stream(device).cuda_stream`, a stream of the
    // device's primary context (the one torch's runtime uses) or 0; torch keeps its streams
    // alive for the process (its pool never destroys them), as long as this cache lives.
    let opened =
        unsafe { CudaBackend::on_borrowed_stream(device, dtype, stream) }.map_err(to_py_err)?;
    let opened = Arc::new(opened);
    map.insert((device, dtype, stream), opened.clone());
    Ok(opened)
}

/// The dtype from torch's name of it.
pub(crate) fn input_dtype(name: &str) -> PyResult<InputDtype> {
    match name {
        "bfloat16" => Ok(InputDtype::Bf16),
        "float16" => Ok(InputDtype::F16),
        other => Err(PyValueError::new_err(format!(
            "distflash's kernels take bfloat16 or float16 tensors, not {other}; convert with .to(torch.bfloat16)"
        ))),
    }
}

pub(crate) fn dims(batch: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Dims {
    Dims {
        batch,
        heads,
        kv_heads,
        head_dim,
    }
}

/// The Python exception of a library error, by the kind the library marked it with
/// (`distflash::error`), its text the whole sentence with every context (`{e:#}`): the
/// caller's input a `ValueError`, missing memory a `MemoryError`, a peer that did not answer a
/// `TimeoutError`; the device failing, and anything unmarked, a `RuntimeError`.
pub(crate) fn to_py_err(e: anyhow::Error) -> PyErr {
    let text = format!("{e:#}");
    match kind_of(&e) {
        Some(ErrorKind::InvalidInput) => PyValueError::new_err(text),
        Some(ErrorKind::OutOfMemory) => PyMemoryError::new_err(text),
        Some(ErrorKind::Timeout) => PyTimeoutError::new_err(text),
        Some(ErrorKind::Device) | None => PyRuntimeError::new_err(text),
    }
}
