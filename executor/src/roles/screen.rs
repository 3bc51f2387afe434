//! Defence in depth before a user's TorchScript module is loaded: its
//! code is read (as text, by this process, without libtorch) and a module
//! that calls an operator that touches files or processes is refused, with
//! the operator and the method in the reason.
//!
//! A TorchScript archive is a zip file whose `code/` entries hold each
//! class's methods as TorchScript source; an operator call is written
//! there as `torch.NAME(` (the `aten` namespace) or `ops.NS.NAME(`. The
//! list below is taken from libtorch's operator registry (every schema
//! with a `filename` argument, and the namespaces that open process
//! groups or shared memory); `tests/python/operators.py` enumerates the
//! registry of the libtorch in use and the test below fails when an
//! operator it finds is missing here. The sandbox remains the guarantee:
//! this only turns an attack into a clear refusal at inspection.

use std::io::Read;
use std::path::Path;

/// `aten` operators that read or write files.
pub const FILE_OPERATORS: &[&str] = &["from_file", "save"];

/// Namespaces whose operators reach files, other processes or shared
/// memory: debug tensor loading, collectives, symmetric memory.
pub const NAMESPACES: &[&str] = &[
    "debugprims",
    "_c10d_functional",
    "_c10d_functional_autograd",
    "_dtensor",
    "symm_mem",
    "c10d",
];

/// The most code an archive may hold (all its `code/` entries together).
const MAX_CODE: u64 = 64 << 20;

/// Why a module is refused before it is loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    /// The fetched file could not be read.
    #[error("reading the model: {0}")]
    Read(std::io::Error),
    /// It is not a zip archive.
    #[error("model.url is not a loadable TorchScript module: not a TorchScript archive ({0})")]
    NotArchive(zip::result::ZipError),
    /// An entry of the archive is damaged.
    #[error("model.url: a damaged TorchScript archive ({0})")]
    Damaged(zip::result::ZipError),
    /// A code entry cannot be read as text.
    #[error("model.url: cannot read {entry} in the archive ({source})")]
    Unreadable {
        /// The entry.
        entry: String,
        /// Why.
        source: std::io::Error,
    },
    /// More code than [`MAX_CODE`].
    #[error("model.url: the archive's code is over {} MiB", MAX_CODE >> 20)]
    TooMuchCode,
    /// The module calls an operator that touches files or processes.
    #[error("the model calls the operator {operator} in `{method}` ({entry}): operators that read or write files or reach other processes are not allowed")]
    Forbidden {
        /// The operator.
        operator: String,
        /// The method calling it.
        method: String,
        /// The code entry it is in.
        entry: String,
    },
}

/// Why a module is refused: the operator and where it is called.
pub fn refused(path: &Path) -> Result<(), ScreenError> {
    let file = std::fs::File::open(path).map_err(ScreenError::Read)?;
    let mut zip =
        zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(ScreenError::NotArchive)?;
    let mut budget = MAX_CODE;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(ScreenError::Damaged)?;
        let name = entry.name().to_owned();
        if !name.ends_with(".py") || !name.contains("/code/") {
            continue;
        }
        let mut code = String::new();
        if let Err(source) = (&mut entry).take(budget + 1).read_to_string(&mut code) {
            return Err(ScreenError::Unreadable {
                entry: name,
                source,
            });
        }
        budget = budget
            .checked_sub(code.len() as u64)
            .ok_or(ScreenError::TooMuchCode)?;
        if let Some((operator, method)) = scan(&code) {
            return Err(ScreenError::Forbidden {
                operator,
                method,
                entry: name,
            });
        }
    }
    Ok(())
}

/// The first forbidden operator called in `code` and the method calling it.
pub fn scan(code: &str) -> Option<(String, String)> {
    let mut method = String::from("(class body)");
    for line in code.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("def ") {
            method = rest.split('(').next().unwrap_or(rest).trim().to_owned();
        }
        if let Some(op) = forbidden_call(line) {
            return Some((op, method));
        }
    }
    None
}

fn forbidden_call(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    // Every dotted name in the line, e.g. `torch.from_file` or
    // `ops.symm_mem.rendezvous`, checked as a whole.
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b'.')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && (ident(bytes[i]) || bytes[i] == b'.') {
            i += 1;
        }
        let parts: Vec<&str> = line[start..i].split('.').collect();
        let named = match parts.as_slice() {
            ["torch", op] | ["ops", "aten", op] | ["torch", "ops", "aten", op] => {
                FILE_OPERATORS.contains(op).then(|| format!("aten::{op}"))
            }
            ["ops", ns, op, ..] | ["torch", "ops", ns, op, ..] if NAMESPACES.contains(ns) => {
                Some(format!("{ns}::{op}"))
            }
            _ => None,
        };
        if named.is_some() {
            return named;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_of_file_operators_are_found_with_their_method() {
        let code = "class M(Module):\n  def forward(self: __torch__.M,\n    x: Tensor) -> Tensor:\n    b = torch.from_file(\"/etc/passwd\", None, 32, dtype=0)\n    return x\n";
        assert_eq!(
            scan(code),
            Some(("aten::from_file".into(), "forward".into()))
        );
        assert_eq!(
            scan("  def f(self):\n    _0 = ops.aten.save(x, \"/tmp/x\")\n").map(|f| f.0),
            Some("aten::save".into())
        );
        assert_eq!(
            scan("  def g(self):\n    y = ops.symm_mem.one_shot_all_reduce(x, \"sum\", \"g\")\n"),
            Some(("symm_mem::one_shot_all_reduce".into(), "g".into()))
        );
    }

    #[test]
    fn names_that_only_look_alike_pass() {
        // A user's own `save` method, a field named from_file, strings.
        for code in [
            "  def forward(self):\n    self.save(x)\n",
            "  def forward(self):\n    y = self.from_file\n",
            "  def forward(self):\n    s = \"from_file\"\n",
            "  def forward(self):\n    y = torch.linear(x, w, b)\n",
            "  def forward(self):\n    y = mytorch.save(x)\n",
        ] {
            assert_eq!(scan(code), None, "{code}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_line_calling_a_file_operator_is_refused(
            pre in "[ a-z_=(,]{0,12}",
            op in proptest::sample::select(FILE_OPERATORS),
            form in 0usize..3,
        ) {
            let call = match form {
                0 => format!("torch.{op}(x)"),
                1 => format!("ops.aten.{op}(x)"),
                _ => format!("torch.ops.aten.{op}(x)"),
            };
            let code = format!("  def forward(self):\n    {pre} {call}\n");
            proptest::prop_assert_eq!(scan(&code).map(|f| f.0), Some(format!("aten::{op}")));
        }
    }
}

#[cfg(test)]
mod registry {
    use super::*;

    /// Every operator of libtorch's registry that reaches files or other
    /// processes (as `tests/python/operators.py` finds them) is refused.
    #[test]
    fn the_screen_covers_the_registry() {
        let out = std::env::temp_dir().join(format!("trainyard-ops-{}.json", std::process::id()));
        crate::replica::tests::python(include_str!("../../../tests/python/operators.py"), &out);
        let ops: Vec<(String, String)> =
            serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let _ = std::fs::remove_file(&out);
        assert!(
            ops.iter().any(|(ns, op)| ns == "aten" && op == "from_file"),
            "{ops:?}"
        );
        for (ns, op) in &ops {
            let call = if ns == "aten" {
                format!("torch.{op}(x)")
            } else {
                format!("ops.{ns}.{op}(x)")
            };
            let code = format!("  def forward(self):\n    y = {call}\n");
            assert!(scan(&code).is_some(), "{ns}::{op} is not refused");
        }
    }
}
