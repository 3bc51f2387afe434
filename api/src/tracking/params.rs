//! A job spec as MLflow params: the stored spec's JSON flattened into
//! dotted keys (`optimizer.lr`, `model.hidden`), within MLflow's rules for
//! names (letters, digits, `_ - . ` and space; at most 250 characters) and
//! values (at most 6000 characters, longer ones truncated with a marker).
//! Pure, and deterministic: a params batch sent again after a restart
//! carries the same values, which MLflow accepts (a param, once logged,
//! may only be logged again with the same value).

use serde_json::Value;
use std::collections::BTreeSet;

/// MLflow's longest param, metric or tag key.
pub const MAX_KEY_CHARS: usize = 250;
/// MLflow's longest param value.
pub const MAX_PARAM_VALUE_CHARS: usize = 6000;
/// MLflow's longest tag value.
pub const MAX_TAG_VALUE_CHARS: usize = 8000;
/// What ends a value that was cut to fit.
const CUT: &str = "...";

/// The params of `spec`: objects are walked into dotted keys; arrays and
/// scalars are leaves (an array as its JSON text, a string as itself);
/// nulls are left out. Keys are made valid (other characters become `_`),
/// bounded, and unique (the first of two that end up alike wins).
pub fn flatten(spec: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    walk("", spec, &mut out);
    let mut seen = BTreeSet::new();
    out.retain(|(k, _)| seen.insert(k.clone()));
    out
}

fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Null => {}
        Value::Object(m) => {
            for (k, child) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                walk(&key, child, out);
            }
        }
        leaf => {
            let text = match leaf {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let key = if prefix.is_empty() { "spec" } else { prefix };
            out.push((key_name(key), truncate(&text, MAX_PARAM_VALUE_CHARS)));
        }
    }
}

/// `key` with the characters MLflow refuses (and `/` and `:`, which it
/// reads as paths on some systems) replaced by `_`, and at most
/// [`MAX_KEY_CHARS`] long.
pub fn key_name(key: &str) -> String {
    let clean: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_KEY_CHARS)
        .collect();
    // A name made only of dots would read as a path ("." or "..").
    if clean.is_empty() || clean.chars().all(|c| c == '.') {
        return "_".into();
    }
    clean
}

/// `s` cut to at most `max` characters, ending in `...` when it was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max - CUT.len()).collect();
    t.push_str(CUT);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_spec_flattens_into_dotted_keys() {
        let spec = json!({
            "name": "digits",
            "optimizer": {"kind": "adam", "lr": 0.001, "schedule": {"warmup_steps": 10}},
            "model": {"kind": "mlp", "hidden": [128, 64]},
            "resume_from": null,
            "workers": {"min": 2, "max": 2},
            "seed": 3,
            "sandboxed": true
        });
        let params = flatten(&spec);
        let get = |k: &str| {
            params
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("name"), Some("digits"));
        assert_eq!(get("optimizer.lr"), Some("0.001"));
        assert_eq!(get("optimizer.schedule.warmup_steps"), Some("10"));
        assert_eq!(get("model.hidden"), Some("[128,64]"));
        assert_eq!(get("workers.min"), Some("2"));
        assert_eq!(get("sandboxed"), Some("true"));
        assert_eq!(get("resume_from"), None);
        assert_eq!(params.len(), 10);
    }

    #[test]
    fn long_values_are_cut_with_a_marker() {
        let spec = json!({"script": {"code": "x".repeat(10_000)}});
        let params = flatten(&spec);
        assert_eq!(params[0].0, "script.code");
        assert_eq!(params[0].1.chars().count(), MAX_PARAM_VALUE_CHARS);
        assert!(params[0].1.ends_with("..."));
        assert_eq!(truncate("short", 10), "short");
    }

    #[test]
    fn bad_key_characters_become_underscores() {
        assert_eq!(key_name("a/b:c[0]"), "a_b_c_0_");
        assert_eq!(key_name(".."), "_");
        assert_eq!(key_name(&"k".repeat(400)).len(), MAX_KEY_CHARS);
        let spec = json!({"x": {"a/b": 1, "a_b": 2}});
        assert_eq!(flatten(&spec), vec![("x.a_b".to_owned(), "1".to_owned())]);
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            ".{0,50}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(".{0,300}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn every_param_fits_mlflow(spec in json_value()) {
            let params = flatten(&spec);
            let mut keys = BTreeSet::new();
            for (k, v) in &params {
                prop_assert!(!k.is_empty() && k.chars().count() <= MAX_KEY_CHARS);
                prop_assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || "_-. ".contains(c)), "{}", k);
                prop_assert!(k.chars().any(|c| c != '.'));
                prop_assert!(v.chars().count() <= MAX_PARAM_VALUE_CHARS);
                prop_assert!(keys.insert(k.clone()));
            }
            prop_assert_eq!(flatten(&spec), params);
        }
    }
}
