//! What a script job asks to have installed ([`wanted`]): its spec's
//! `script.requirements`, else its code's `requirements.txt`, its
//! `pyproject.toml` with its `uv.lock`, or the `pyproject.toml`'s own
//! dependencies, each line held to [`requirement_problem`]'s rule and a
//! project read as TOML; and the pins of a resolved set ([`pins`],
//! [`unpinned`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use trainyard_common::spec::script::{
    requirement_lines, requirement_problem, Requirements, MAX_REQUIREMENTS,
};

/// Largest requirements file, bytes.
pub const MAX_REQUIREMENTS_FILE: u64 = 64 * 1024;
/// Largest `uv.lock`, bytes (a lock lists every platform's wheels).
pub const MAX_LOCK_FILE: u64 = 8 << 20;

/// What a script asks to have installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// Requirement lines (checked).
    Lines(Vec<String>),
    /// The `pyproject.toml` of its code (uv reads its dependencies).
    Pyproject(PathBuf),
    /// The `pyproject.toml` and `uv.lock` of its code: the lock's pinned
    /// set, as `uv export --frozen` gives it, is what is installed.
    Locked {
        /// The project file.
        pyproject: PathBuf,
        /// Its lock.
        lock: PathBuf,
    },
}

impl Wanted {
    /// Its kind, in a word (part of what names its resolution).
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Wanted::Lines(_) => "lines",
            Wanted::Pyproject(_) => "pyproject",
            Wanted::Locked { .. } => "uv.lock",
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Wanted::Lines(l) => format!("{} requirement(s)", l.len()),
            Wanted::Pyproject(_) => "the dependencies of its pyproject.toml".into(),
            Wanted::Locked { .. } => "the set its uv.lock pins".into(),
        }
    }
}

/// Why a job's requirements are refused: the error names the field or
/// file and the line.
#[derive(Debug, thiserror::Error)]
pub enum RequirementsError {
    /// The spec's requirements file could not be fetched.
    #[error("{0}")]
    Fetch(String),
    /// Its lines break the rule of a requirements line.
    #[error(transparent)]
    Lines(#[from] LinesProblem),
    /// The file could not be read.
    #[error("{what}: {source}")]
    Read {
        /// The file.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A file over its size bound.
    #[error("{what}: larger than {bound}")]
    TooLarge {
        /// The file.
        what: &'static str,
        /// The bound, in words.
        bound: String,
    },
    /// The code's `pyproject.toml` cannot be installed from.
    #[error("pyproject.toml in script.code: {0}")]
    Pyproject(#[from] PyprojectProblem),
}

/// Why a `pyproject.toml` cannot be installed from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PyprojectProblem {
    /// It does not parse.
    #[error("is not TOML: {0}")]
    NotToml(String),
    /// A dependency list that is not a list of strings.
    #[error("{0} must be a list of strings")]
    NotStrings(&'static str),
    /// Its dependencies break the rule of a requirements line.
    #[error(transparent)]
    Lines(#[from] LinesProblem),
    /// It names package sources of its own ([`SOURCE_KEYS`]).
    #[error("{table} {key} is not taken: packages come from the package index the executor's admin chose (name them in [project] dependencies)")]
    Sources {
        /// `[tool.uv]` or `[tool.uv.pip]`.
        table: &'static str,
        /// The key.
        key: &'static str,
    },
}

/// Requirement lines (of a field, a file or a list in a project) that
/// break [`requirement_problem`]'s rule or are too many.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinesProblem {
    /// More than [`MAX_REQUIREMENTS`].
    #[error("{what}: at most {MAX_REQUIREMENTS} requirements, it has {have}")]
    TooMany {
        /// Where they are.
        what: &'static str,
        /// How many.
        have: usize,
    },
    /// One that is not a plain requirement of the index.
    #[error("{what}: {line:?} {why}")]
    Line {
        /// Where it is.
        what: &'static str,
        /// The line.
        line: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Holds `lines` (of `what`) to the rule of a requirements line.
fn check_lines(lines: &[String], what: &'static str) -> Result<(), LinesProblem> {
    if lines.len() > MAX_REQUIREMENTS {
        return Err(LinesProblem::TooMany {
            what,
            have: lines.len(),
        });
    }
    match lines
        .iter()
        .find_map(|l| requirement_problem(l).map(|why| (l, why)))
    {
        Some((line, why)) => Err(LinesProblem::Line {
            what,
            line: line.clone(),
            why,
        }),
        None => Ok(()),
    }
}

/// What a job asks for: its spec's `requirements` (`fetch` brings a
/// file's), else its code folder's `requirements.txt` or `pyproject.toml`
/// (`None`: nothing). The error names the field or file and the line.
pub fn wanted(
    requirements: Option<&Requirements>,
    fetch: &dyn Fn(&str) -> Result<PathBuf, RequirementsError>,
    code: &Path,
) -> Result<Option<Wanted>, RequirementsError> {
    let checked = |text: &str, what: &'static str| -> Result<Wanted, RequirementsError> {
        let lines = requirement_lines(text);
        check_lines(&lines, what)?;
        Ok(Wanted::Lines(lines))
    };
    let read = |path: &Path, what: &'static str| -> Result<String, RequirementsError> {
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_REQUIREMENTS_FILE + 1).read_to_string(&mut text))
            .map_err(|source| RequirementsError::Read { what, source })?;
        if text.len() as u64 > MAX_REQUIREMENTS_FILE {
            return Err(RequirementsError::TooLarge {
                what,
                bound: format!("{} KiB", MAX_REQUIREMENTS_FILE >> 10),
            });
        }
        Ok(text)
    };
    match requirements {
        Some(Requirements::Lines(lines)) => {
            checked(&lines.join("\n"), "script.requirements").map(Some)
        }
        Some(Requirements::File(url)) => {
            let path = fetch(url)?;
            let what = "script.requirements";
            checked(&read(&path, what)?, what).map(Some)
        }
        None => {
            let txt = code.join("requirements.txt");
            let toml = code.join("pyproject.toml");
            if txt.is_file() {
                let what = "requirements.txt in script.code";
                checked(&read(&txt, what)?, what).map(Some)
            } else if toml.is_file() {
                let text = read(&toml, "pyproject.toml in script.code")?;
                let project = Pyproject::parse(&text)?;
                let lock = code.join("uv.lock");
                // A project that asks for nothing is not read further.
                if lock.is_file() || project.declares_dependencies {
                    if let Some(why) = project.problem {
                        return Err(why.into());
                    }
                }
                if lock.is_file() {
                    let what = "uv.lock in script.code";
                    let bytes = std::fs::metadata(&lock)
                        .map_err(|source| RequirementsError::Read { what, source })?
                        .len();
                    if bytes > MAX_LOCK_FILE {
                        return Err(RequirementsError::TooLarge {
                            what,
                            bound: format!("{} MiB", MAX_LOCK_FILE >> 20),
                        });
                    }
                    return Ok(Some(Wanted::Locked {
                        pyproject: toml,
                        lock,
                    }));
                }
                Ok(project
                    .declares_dependencies
                    .then_some(Wanted::Pyproject(toml)))
            } else {
                Ok(None)
            }
        }
    }
}

/// What a job's `pyproject.toml` asks of the installer, read by a TOML
/// parser (uv reads it the same way).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pyproject {
    /// Whether its `[project]` declares dependencies (static or dynamic).
    declares_dependencies: bool,
    /// Why it cannot be installed from, where it cannot (it matters only
    /// where it is: a project with dependencies or a `uv.lock`).
    problem: Option<PyprojectProblem>,
}

/// `[tool.uv]` (and `[tool.uv.pip]`) keys that say where packages come
/// from. uv runs with `UV_NO_CONFIG` and `--no-sources`, so it would
/// ignore them and take the same names from the admin's index: a package
/// the project meant from a git repository, a URL, a folder or another
/// index would silently be another one. Such a project is refused instead,
/// naming the key.
const SOURCE_KEYS: [&str; 6] = [
    "sources",
    "index",
    "index-url",
    "extra-index-url",
    "find-links",
    "workspace",
];

impl Pyproject {
    /// Reads `text` (an error: it is not TOML) and whether it declares
    /// dependencies; its problem, if any: a dependency (of `[project]` or
    /// of its build system) is not a plain requirement of the index (the
    /// rule of a requirements line, [`requirement_problem`]), or it names
    /// its own package sources ([`SOURCE_KEYS`]).
    fn parse(text: &str) -> Result<Pyproject, PyprojectProblem> {
        let doc: toml_edit::DocumentMut = text
            .parse()
            .map_err(|e: toml_edit::TomlError| PyprojectProblem::NotToml(e.message().to_owned()))?;
        let project = doc.get("project");
        let dynamic = project
            .and_then(|p| p.get("dynamic"))
            .and_then(toml_edit::Item::as_array)
            .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("dependencies")));
        Ok(Pyproject {
            declares_dependencies: project.is_some_and(|p| p.get("dependencies").is_some())
                || dynamic,
            problem: Self::problem(&doc).err(),
        })
    }

    fn problem(doc: &toml_edit::DocumentMut) -> Result<(), PyprojectProblem> {
        let strings = |item: &toml_edit::Item, what: &'static str| {
            let Some(a) = item.as_array() else {
                return Err(PyprojectProblem::NotStrings(what));
            };
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or(PyprojectProblem::NotStrings(what))
                })
                .collect::<Result<Vec<String>, _>>()
        };
        let mut checked = Vec::new();
        let project = doc.get("project");
        if let Some(d) = project.and_then(|p| p.get("dependencies")) {
            checked.push((
                "[project] dependencies",
                strings(d, "[project] dependencies")?,
            ));
        }
        if let Some(r) = doc.get("build-system").and_then(|b| b.get("requires")) {
            checked.push((
                "[build-system] requires",
                strings(r, "[build-system] requires")?,
            ));
        }
        for (what, lines) in &checked {
            check_lines(lines, what)?;
        }
        let uv = doc.get("tool").and_then(|t| t.get("uv"));
        for (table, at) in [
            (uv, "[tool.uv]"),
            (uv.and_then(|u| u.get("pip")), "[tool.uv.pip]"),
        ] {
            if let Some(t) = table.and_then(toml_edit::Item::as_table_like) {
                if let Some(key) = SOURCE_KEYS.iter().find(|k| t.contains_key(k)) {
                    return Err(PyprojectProblem::Sources { table: at, key });
                }
            }
        }
        Ok(())
    }
}

/// The first line of uv's resolved set `text` that is not a pin of the
/// index (`name==version`): what a project's dynamic dependencies (its
/// build backend's answer, which no reading of the file shows) may add.
pub(super) fn unpinned(text: &str) -> Option<String> {
    requirement_lines(text).into_iter().find(|l| {
        let l = l.split(';').next().unwrap_or_default().trim();
        requirement_problem(l).is_some() || !l.contains("==")
    })
}

/// A distribution's name as the index compares them (PEP 503).
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    let mut sep = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The `name==version` pins of a compiled requirements file.
pub fn pins(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter_map(|l| {
            let l = l.split(';').next().unwrap_or_default().trim();
            let (name, version) = l.split_once("==")?;
            let name = name.split('[').next().unwrap_or(name);
            Some((normalize(name), version.trim().to_owned()))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What of `resolved` the runtime lacks (a pin it has at that exact
/// version is the runtime's to give).
pub fn to_install(
    resolved: &[(String, String)],
    installed: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    resolved
        .iter()
        .filter(|(n, v)| installed.get(n) != Some(v))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_compare_as_the_index_does() {
        assert_eq!(normalize("Scikit_Learn"), "scikit-learn");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("Jinja2"), "jinja2");
        assert_eq!(normalize("a--b__c"), "a-b-c");
    }

    #[test]
    fn a_compiled_file_gives_its_pins_and_the_runtime_keeps_its_own() {
        let compiled = "numpy==2.4.6\n    # via scikit-learn\nScikit_Learn==1.9.1\ntqdm==4.66.5 ; python_version >= '3.8'\ntorch==2.11.0\n";
        let p = pins(compiled);
        assert_eq!(
            p,
            [
                ("numpy".to_owned(), "2.4.6".to_owned()),
                ("scikit-learn".into(), "1.9.1".into()),
                ("torch".into(), "2.11.0".into()),
                ("tqdm".into(), "4.66.5".into()),
            ]
        );
        let runtime: BTreeMap<String, String> = [
            ("numpy".to_owned(), "2.4.6".to_owned()),
            ("torch".into(), "2.11.0".into()),
            ("tqdm".into(), "4.70.1".into()),
        ]
        .into();
        assert_eq!(
            to_install(&p, &runtime),
            [
                ("scikit-learn".to_owned(), "1.9.1".to_owned()),
                ("tqdm".into(), "4.66.5".into())
            ],
            "torch is never installed twice; another tqdm is the job's"
        );
    }

    #[test]
    fn the_job_asks_through_its_spec_or_its_code() {
        let dir = std::env::temp_dir().join(format!("trainyard-wanted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let no_fetch = |_: &str| -> Result<PathBuf, RequirementsError> {
            Err(RequirementsError::Fetch("no".into()))
        };
        assert_eq!(wanted(None, &no_fetch, &dir).unwrap(), None);
        let lines = Requirements::Lines(vec!["tqdm==4.66.5".into()]);
        assert_eq!(
            wanted(Some(&lines), &no_fetch, &dir).unwrap(),
            Some(Wanted::Lines(vec!["tqdm==4.66.5".into()]))
        );
        std::fs::write(
            dir.join("pyproject.toml"),
            "[project]\nname = \"mine\"\ndependencies = [\"tqdm\"]\n",
        )
        .unwrap();
        assert_eq!(
            wanted(None, &no_fetch, &dir).unwrap(),
            Some(Wanted::Pyproject(dir.join("pyproject.toml")))
        );
        std::fs::write(dir.join("uv.lock"), "version = 1\n").unwrap();
        assert_eq!(
            wanted(None, &no_fetch, &dir).unwrap(),
            Some(Wanted::Locked {
                pyproject: dir.join("pyproject.toml"),
                lock: dir.join("uv.lock"),
            })
        );
        std::fs::remove_file(dir.join("uv.lock")).unwrap();
        std::fs::write(
            dir.join("requirements.txt"),
            "# mine\ntqdm\n-r /etc/passwd\n",
        )
        .unwrap();
        let e = wanted(None, &no_fetch, &dir).unwrap_err().to_string();
        assert!(
            e.contains("requirements.txt") && e.contains("-r /etc/passwd"),
            "{e}"
        );
        let file = dir.join("req.txt");
        std::fs::write(&file, "x @ file:///etc/shadow\n").unwrap();
        let fetch = |_: &str| -> Result<PathBuf, RequirementsError> { Ok(file.clone()) };
        let e = wanted(
            Some(&Requirements::File("artifact:req.txt".into())),
            &fetch,
            &dir,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("script.requirements") && e.contains("direct references"),
            "{e}"
        );
        // A project's sources matter where it asks for packages: with
        // dependencies, or with a lock; a pyproject that asks for nothing
        // is not the installer's.
        std::fs::remove_file(dir.join("requirements.txt")).unwrap();
        let sourced = "[tool.uv.sources]\nx = { git = \"https://example.org/x\" }\n";
        std::fs::write(
            dir.join("pyproject.toml"),
            format!("[project]\nname = \"m\"\n{sourced}"),
        )
        .unwrap();
        assert_eq!(wanted(None, &no_fetch, &dir).unwrap(), None);
        std::fs::write(dir.join("uv.lock"), "version = 1\n").unwrap();
        let e = wanted(None, &no_fetch, &dir).unwrap_err().to_string();
        assert!(
            e.contains("pyproject.toml in script.code: [tool.uv] sources"),
            "{e}"
        );
        std::fs::remove_file(dir.join("uv.lock")).unwrap();
        std::fs::write(
            dir.join("pyproject.toml"),
            format!("[project]\nname = \"m\"\ndependencies = [\"x\"]\n{sourced}"),
        )
        .unwrap();
        let e = wanted(None, &no_fetch, &dir).unwrap_err().to_string();
        assert!(e.contains("[tool.uv] sources is not taken"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pyproject_names_packages_of_the_index_and_no_sources() {
        let declares = |t: &str| Pyproject::parse(t).unwrap().declares_dependencies;
        assert!(!declares("[tool.x]\ndependencies = []\n"));
        assert!(!declares("[project]\nname = \"x\"\n"));
        assert!(declares("[project]\ndynamic = [\"dependencies\"]\n"));
        assert!(declares(
            "[project]\nname = \"x\"\ndependencies = [\n  \"tqdm>=4\",  # bars\n]\n[tool.uv]\ndev-dependencies = [\"pytest\"]\n"
        ));
        let refused = |t: &str, want: &str| {
            let e = match Pyproject::parse(t) {
                Ok(p) => p.problem.unwrap_or_else(|| panic!("{t:?} was taken")),
                Err(e) => e,
            }
            .to_string();
            assert!(e.contains(want), "{t:?}: {e}");
        };
        refused("[project\n", "is not TOML");
        refused("[project]\ndependencies = \"tqdm\"\n", "list of strings");
        refused(
            "[project]\ndependencies = [\"evil @ https://127.0.0.1:5432/evil.whl\"]\n",
            "direct references",
        );
        refused(
            "[project]\ndependencies = [\"x @ file:///etc/passwd\"]\n",
            "[project] dependencies",
        );
        refused(
            "[build-system]\nrequires = [\"setuptools @ git+https://example.org/s\"]\n",
            "[build-system] requires",
        );
        refused(
            "[project]\ndependencies = [\"tabulate\"]\n[tool.uv.sources]\ntabulate = { git = \"https://example.org/t\" }\n",
            "[tool.uv] sources",
        );
        refused(
            "[project]\ndependencies = [\"torch\"]\n[[tool.uv.index]]\nname = \"cpu\"\nurl = \"http://127.0.0.1:5432/simple\"\n",
            "[tool.uv] index",
        );
        refused(
            "[tool.uv.pip]\nextra-index-url = [\"http://127.0.0.1:8080\"]\n",
            "[tool.uv.pip] extra-index-url",
        );
        refused(
            "[tool.uv.workspace]\nmembers = [\"../../\"]\n",
            "[tool.uv] workspace",
        );
        let many: Vec<String> = (0..=MAX_REQUIREMENTS)
            .map(|i| format!("\"p{i}\""))
            .collect();
        refused(
            &format!("[project]\ndependencies = [{}]\n", many.join(",")),
            "at most",
        );
    }

    #[test]
    fn a_resolved_set_is_pins_of_the_index() {
        assert_eq!(
            unpinned("tqdm==4.66.5\n# via x\nnumpy==2.1.0 ; python_version >= \"3.10\"\n"),
            None
        );
        assert_eq!(
            unpinned("tqdm==4.66.5\nevil @ https://example.org/evil.whl\n").as_deref(),
            Some("evil @ https://example.org/evil.whl")
        );
        assert_eq!(unpinned("-e ./local\n").as_deref(), Some("-e ./local"));
        assert_eq!(unpinned("mine\n").as_deref(), Some("mine"));
    }

    proptest! {
        #[test]
        fn normalizing_is_idempotent_and_case_blind(name in "[A-Za-z0-9][A-Za-z0-9._-]{0,20}") {
            let n = normalize(&name);
            prop_assert_eq!(normalize(&n), n.clone());
            prop_assert_eq!(normalize(&name.to_uppercase()), n);
        }
    }
}
