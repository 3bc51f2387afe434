//! The tensor list an inspection reports, checked before the scheduler
//! lays a job out by it ([`super::inspection`]): names, dtypes and which
//! tensors can be trained, each error naming the tensor's field.

use crate::error::{ApiError, ApiResult};
use std::collections::HashMap;
use trainyard_common::model::{ParamInfo, TensorKind};

/// The dtypes an inspection may report (PyTorch's names without `torch.`).
pub const DTYPES: [&str; 10] = [
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
];

/// The floating dtypes, the only ones a trainable parameter can have.
const FLOAT_DTYPES: [&str; 4] = ["float32", "float64", "float16", "bfloat16"];

/// Most tensors an inspection may report.
pub const MAX_TENSORS: usize = 1_000_000;

/// Refuses an inspection's tensor list that the scheduler and the roles
/// could not lay out: bad or repeated names, dtypes outside [`DTYPES`], a
/// trainable parameter that is not floating point (PyTorch cannot take its
/// gradient). Each error names the tensor's field.
pub(super) fn check_tensors(params: &[ParamInfo]) -> ApiResult<()> {
    if params.len() > MAX_TENSORS {
        return Err(ApiError::invalid_field(
            "result.parameters",
            format!("at most {MAX_TENSORS} tensors"),
        ));
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        let field = |f: &str| format!("result.parameters[{i}].{f}");
        if p.name.is_empty() || p.name.len() > 1024 || p.name.chars().any(char::is_control) {
            return Err(ApiError::invalid_field(
                &field("name"),
                "must be 1–1024 characters without control characters",
            ));
        }
        if let Some(j) = seen.insert(&p.name, i) {
            return Err(ApiError::invalid_field(
                &field("name"),
                format!(
                    "{:?} is also result.parameters[{j}]: names must be unique",
                    p.name
                ),
            ));
        }
        if !DTYPES.contains(&p.dtype.as_str()) {
            return Err(ApiError::invalid_field(
                &field("dtype"),
                format!(
                    "must be one of {}, got {:?}",
                    DTYPES.join(", "),
                    p.dtype.chars().take(32).collect::<String>()
                ),
            ));
        }
        if p.kind == TensorKind::Parameter && !FLOAT_DTYPES.contains(&p.dtype.as_str()) {
            return Err(ApiError::invalid_field(
                &field("dtype"),
                format!(
                    "a trainable parameter must be floating point ({}), got {}; report it as a buffer or a frozen parameter",
                    FLOAT_DTYPES.join(", "),
                    p.dtype
                ),
            ));
        }
    }
    Ok(())
}
