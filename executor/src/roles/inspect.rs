//! Inspection of a user's TorchScript model: the API asks an executor to
//! list a model file's parameters (names and shapes) before it plans the
//! job, because only libtorch can read the file.

use crate::storage::Fetcher;
use trainyard_common::cluster::InspectionResult;
use trainyard_common::model::ParamInfo;

/// Loads the TorchScript file at `url` (through `fetcher` when it is in an
/// object store) and lists its trainable tensors.
pub fn inspect_file(url: &str, fetcher: &Fetcher) -> InspectionResult {
    let path = match fetcher.materialize(url) {
        Ok(p) => p,
        Err(e) => return InspectionResult::Error(e.to_string()),
    };
    if !path.is_file() {
        return InspectionResult::Error(format!("{url}: no such file"));
    }
    let loaded =
        std::panic::catch_unwind(|| tch::CModule::load(&path).and_then(|m| m.named_parameters()));
    match loaded {
        Ok(Ok(params)) => InspectionResult::Parameters(
            params
                .into_iter()
                .map(|(name, t)| {
                    ParamInfo::new(
                        name,
                        &t.size()
                            .iter()
                            .map(|&d| d.max(0) as u64)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect(),
        ),
        Ok(Err(e)) => InspectionResult::Error(
            e.to_string()
                .lines()
                .next()
                .unwrap_or("unreadable")
                .to_owned(),
        ),
        Err(_) => InspectionResult::Error("libtorch crashed while loading the file".into()),
    }
}
