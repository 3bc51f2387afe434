//! The workspace's module graph has no circles: inside each crate, no two
//! sibling modules depend on each other, directly or through others.
//!
//! `docs/architecture.md` promises it; this test keeps the promise. It lives
//! in `common` because that crate is the cheapest to build, and it reads the
//! other crates' sources from disk rather than linking them. The parser is
//! textual: a file's module comes from its path; its dependencies are the
//! `crate::a::b…` and `super::x…` paths it mentions outside comments,
//! strings and `#[cfg(test)]` items (test modules may reach anywhere). A
//! dependency of module `p::s…` on `p::t…` is an edge `s → t` among the
//! children of `p`; a module using its parent's items, or a parent its
//! children's, is the ordinary tree and no edge — unless the parent's item
//! is a re-export (`pub use child::Item`, or `pub use child::*` of an item
//! the child defines): then the path is followed to the child that holds
//! it, so a circle cannot hide behind a re-export. Each set of siblings
//! (the crate's top-level modules, the children of each module directory)
//! must form a graph without cycles.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate (empty for the crate root).
type ModPath = Vec<String>;

/// Sibling edges: for each parent module, child → children it depends on.
type Graph = BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>>;

#[test]
fn no_crate_has_a_circle_among_sibling_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace Cargo.toml");
    let members = workspace_members(&manifest);
    assert!(
        members.len() > 3,
        "no workspace members found in {manifest}"
    );
    let mut circles = Vec::new();
    for member in &members {
        let src = root.join(member).join("src");
        if !src.is_dir() {
            continue;
        }
        let files = read_tree(&src);
        for cycle in circles_of(&files) {
            circles.push(format!("{member}: {cycle}"));
        }
    }
    assert!(
        circles.is_empty(),
        "modules that depend on each other (break each circle by moving what \
         both need where both can depend on it one way):\n  {}",
        circles.join("\n  ")
    );
}

/// The checker itself finds a circle, through a third module, in `use`
/// groups and in a `super::` path, and ignores test modules.
#[test]
fn a_circle_is_found() {
    let file = |p: &str, s: &str| (PathBuf::from(p), s.to_owned());
    let tree = vec![
        file("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;"),
        file("a.rs", "use crate::{b::X, d};"),
        file("b.rs", "fn f() { super::c::g() }"),
        file(
            "c.rs",
            "// crate::d is only a comment\n pub fn g() { crate::a::h() }",
        ),
        file("d.rs", "#[cfg(test)]\nmod tests { use crate::a; }\n"),
    ];
    assert_eq!(circles_of(&tree), vec!["crate: a → b → c → a".to_owned()]);
    let fixed = vec![tree[0].clone(), tree[1].clone(), tree[2].clone()];
    assert!(circles_of(&fixed).is_empty());
}

/// A circle through a re-export is found: `b` names `A` through its
/// parent, which re-exports it from `a`, by name or by a glob, and `a`
/// uses `b`. A re-export of a module's own item, used by that module,
/// closes nothing.
#[test]
fn a_circle_through_a_re_export_is_found() {
    let file = |p: &str, s: &str| (PathBuf::from(p), s.to_owned());
    for export in [
        "pub use a::A;",
        "pub use self::a::*;",
        "pub(crate) use a::{A, other};",
    ] {
        let tree = vec![
            file("lib.rs", "pub mod spec;"),
            file(
                "spec/mod.rs",
                &format!("mod a; mod b; {export}\npub struct Top;"),
            ),
            file(
                "spec/a.rs",
                "pub struct A { b: super::b::B }\npub fn other() {}",
            ),
            file("spec/b.rs", "pub struct B(super::A, super::Top);"),
        ];
        assert_eq!(
            circles_of(&tree),
            vec!["spec: a → b → a".to_owned()],
            "{export}"
        );
    }
    let own = vec![
        file("lib.rs", "pub mod spec;"),
        file("spec/mod.rs", "mod a; mod b; pub use a::A;"),
        file("spec/a.rs", "pub struct A;\nimpl super::A { fn f() {} }"),
        file("spec/b.rs", "pub struct B(super::A);"),
    ];
    assert!(circles_of(&own).is_empty(), "{:?}", circles_of(&own));
}

/// The `members = [...]` of the workspace manifest.
fn workspace_members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else {
        return Vec::new();
    };
    let rest = &manifest[start..];
    let list = &rest[rest.find('[').unwrap_or(0)..rest.find(']').unwrap_or(0)];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every `.rs` file under `src` (but `src/bin`, other crates' roots), with
/// its path relative to `src`.
fn read_tree(src: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source dir") {
            let path = entry.expect("dir entry").path();
            let rel = path.strip_prefix(src).expect("under src").to_path_buf();
            if path.is_dir() {
                if rel != Path::new("bin") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("readable source file");
                out.push((rel, text));
            }
        }
    }
    out.sort();
    out
}

/// The module a file (relative to `src`) holds.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// One line per circle in the crate whose files are `files`.
fn circles_of(files: &[(PathBuf, String)]) -> Vec<String> {
    let modules: HashSet<ModPath> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut test_modules: HashSet<ModPath> = HashSet::new();
    let mut cleaned = Vec::new();
    for (path, text) in files {
        let module = module_of(path);
        let (code, tests) = strip(text);
        for t in tests {
            let mut child = module.clone();
            child.push(t);
            test_modules.insert(child);
        }
        cleaned.push((module, code));
    }
    let exports = Exports::of(&cleaned, &modules);
    let mut graph = Graph::new();
    for (module, code) in &cleaned {
        if test_modules
            .iter()
            .any(|t| module.starts_with(t.as_slice()))
        {
            continue;
        }
        for target in mentioned_paths(module, code) {
            // `super::Name` re-exported from a sibling is that sibling's.
            let target = exports.resolve(&target, &modules);
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            let (Some(from), Some(to)) = (module.get(common), target.get(common)) else {
                continue; // an ancestor's item, or a descendant's
            };
            let mut sibling = module[..common].to_vec();
            sibling.push(to.clone());
            if modules.contains(&sibling) && !test_modules.contains(&sibling) {
                graph
                    .entry(module[..common].to_vec())
                    .or_default()
                    .entry(from.clone())
                    .or_default()
                    .insert(to.clone());
            }
        }
    }
    let mut out = Vec::new();
    for (parent, edges) in &graph {
        let name = if parent.is_empty() {
            "crate".to_owned()
        } else {
            parent.join("::")
        };
        for cycle in cycles(edges) {
            out.push(format!("{name}: {}", cycle.join(" → ")));
        }
    }
    out
}

/// What each module re-exports (`pub use`, `pub(crate) use`) from a
/// module below it, and the items each module defines, so that a path to
/// a re-exported name can be followed to the module that holds it.
#[derive(Default)]
struct Exports {
    /// Module → name → the module the name is taken from.
    named: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    /// Module → the modules below it whose items it re-exports (`*`).
    globs: BTreeMap<ModPath, Vec<ModPath>>,
    /// Module → the names of the `pub` items it defines.
    defined: BTreeMap<ModPath, BTreeSet<String>>,
}

impl Exports {
    fn of(cleaned: &[(ModPath, String)], modules: &HashSet<ModPath>) -> Exports {
        let mut e = Exports::default();
        for (module, code) in cleaned {
            e.defined
                .insert(module.clone(), defined_names(code).into_iter().collect());
            let b = code.as_bytes();
            for key in ["pub use ", "pub(crate) use ", "pub(super) use "] {
                let mut from = 0;
                while let Some(at) = code[from..].find(key) {
                    let start = from + at;
                    from = start + key.len();
                    if ident_before(b, start) {
                        continue;
                    }
                    let (paths, end) = use_tree(code, from);
                    let glob = code[end..].trim_start().starts_with('*');
                    for p in paths {
                        let Some(abs) = absolute(module, &p, modules) else {
                            continue;
                        };
                        // Only what comes from below: a re-export of a
                        // parent's or a sibling's item is an ordinary use.
                        if abs.len() <= module.len() || !abs.starts_with(module) {
                            continue;
                        }
                        if glob || modules.contains(&abs) && p.len() == 1 {
                            if modules.contains(&abs) {
                                e.globs.entry(module.clone()).or_default().push(abs);
                            }
                        } else if let Some((name, holder)) = abs.split_last() {
                            e.named
                                .entry(module.clone())
                                .or_default()
                                .insert(name.clone(), holder.to_vec());
                        }
                    }
                }
            }
        }
        e
    }

    /// `path` with a re-exported name replaced by the path of the module
    /// that holds it (followed through chains of re-exports).
    fn resolve(&self, path: &ModPath, modules: &HashSet<ModPath>) -> ModPath {
        let mut path = path.clone();
        for _ in 0..8 {
            // The deepest module the path names, and the name after it.
            let Some(k) = (0..path.len())
                .rev()
                .find(|&k| modules.contains(&path[..k].to_vec()))
            else {
                return path;
            };
            let (module, name) = (path[..k].to_vec(), &path[k]);
            if self.defined.get(&module).is_some_and(|d| d.contains(name)) {
                return path;
            }
            let holder = self
                .named
                .get(&module)
                .and_then(|n| n.get(name))
                .cloned()
                .or_else(|| {
                    self.globs.get(&module)?.iter().find_map(|g| {
                        let holds = self.defined.get(g).is_some_and(|d| d.contains(name))
                            || self.named.get(g).is_some_and(|n| n.contains_key(name))
                            || self.globs.contains_key(g);
                        holds.then(|| g.clone())
                    })
                });
            match holder {
                Some(h) if h != module => path = [h, path[k..].to_vec()].concat(),
                _ => return path,
            }
        }
        path
    }
}

/// `p`, a path in a `use` of module `module`, from the crate root; `None`
/// for another crate's.
fn absolute(module: &ModPath, p: &ModPath, modules: &HashSet<ModPath>) -> Option<ModPath> {
    let first = p.first()?;
    match first.as_str() {
        "crate" => Some(p[1..].to_vec()),
        "self" => Some([module.clone(), p[1..].to_vec()].concat()),
        "super" => {
            let mut base = module.clone();
            let mut rest = &p[..];
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            Some([base, rest.to_vec()].concat())
        }
        _ => {
            let mut child = module.clone();
            child.push(first.clone());
            modules
                .contains(&child)
                .then(|| [module.clone(), p.clone()].concat())
        }
    }
}

/// The names of the `pub` (or `pub(crate)`) items `code` defines at any
/// depth: structs, enums, unions, traits, functions, types, constants,
/// statics and modules.
fn defined_names(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '(' || c == ')'))
        .filter(|w| !w.is_empty())
        .collect();
    for w in words.windows(3) {
        let is_pub = w[0] == "pub" || w[0].starts_with("pub(");
        let kind = matches!(
            w[1],
            "struct" | "enum" | "union" | "trait" | "fn" | "type" | "const" | "static" | "mod"
        );
        if is_pub && kind {
            let name: String = w[2]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// One cycle (closed, first node repeated) for each strongly connected
/// group of more than one node, found by depth-first search.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut in_a_cycle: HashSet<String> = HashSet::new();
    for start in edges.keys() {
        if in_a_cycle.contains(start) {
            continue;
        }
        // Depth-first from `start`, looking for a way back to it.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = HashSet::new();
        while let Some((node, path)) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if next == start {
                    let mut cycle = path.clone();
                    cycle.push(start.clone());
                    in_a_cycle.extend(path.iter().cloned());
                    found.push(cycle);
                    stack.clear();
                    break;
                }
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found
}

/// `text` without comments, string and char literals and `#[cfg(test)]`
/// items, and the names of the `#[cfg(test)] mod name;` files it declares.
fn strip(text: &str) -> (String, Vec<String>) {
    let b = text.as_bytes();
    let mut code = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                code.push(' ');
            }
            b'r' if !ident_before(b, i)
                && (b.get(i + 1) == Some(&b'"')
                    || b.get(i + 1) == Some(&b'#')
                        && b[i + 1..].iter().find(|&&c| c != b'#') == Some(&b'"')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                i += 1 + hashes + 1;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                code.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                code.push_str("\"\"");
            }
            // A char literal ('x', '\n', '"'); a lifetime ('a) stays.
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
                code.push_str("' '");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => {
                i += 3;
                code.push_str("' '");
            }
            _ => {
                // Multi-byte characters are copied whole.
                let len = text[i..].chars().next().map_or(1, char::len_utf8);
                code.push_str(&text[i..i + len]);
                i += len;
            }
        }
    }
    let mut tests = Vec::new();
    let mut out = String::with_capacity(code.len());
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(") {
        let attr_end = match rest[at..].find(']') {
            Some(e) => at + e + 1,
            None => break,
        };
        let attr = &rest[at..attr_end];
        let is_test = attr == "#[cfg(test)]" || attr.starts_with("#[cfg(all(test");
        out.push_str(&rest[..at]);
        if !is_test {
            out.push_str(attr);
            rest = &rest[attr_end..];
            continue;
        }
        // The item the attribute covers: up to its `;` or its `{ … }`.
        let item = &rest[attr_end..];
        let semi = item.find(';').unwrap_or(item.len());
        let brace = item.find('{').unwrap_or(item.len());
        let end = if semi < brace {
            let decl = item[..semi].trim();
            if let Some(name) = decl
                .strip_prefix("mod ")
                .or(decl.strip_prefix("pub(crate) mod "))
            {
                tests.push(name.trim().to_owned());
            } else if let Some(name) = decl.rsplit(' ').next().filter(|_| decl.contains("mod ")) {
                tests.push(name.to_owned());
            }
            semi + 1
        } else {
            let mut depth = 0;
            let mut end = item.len();
            for (k, c) in item[brace..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = brace + k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        rest = &item[end.min(item.len())..];
    }
    out.push_str(rest);
    (out, tests)
}

/// Whether the byte before `i` continues an identifier.
fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The crate-absolute paths that `code` (module `module`'s) names with
/// `crate::…` or `super::…`, each `use` group expanded.
fn mentioned_paths(module: &ModPath, code: &str) -> Vec<ModPath> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_start = !ident_before(b, i);
        let base = if word_start && b[i..].starts_with(b"crate::") {
            i += "crate::".len();
            Some(Vec::new())
        } else if word_start && b[i..].starts_with(b"super::") {
            let mut base = module.clone();
            while b[i..].starts_with(b"super::") {
                base.pop();
                i += "super::".len();
            }
            Some(base)
        } else {
            None
        };
        match base {
            Some(base) => {
                let (paths, end) = use_tree(code, i);
                out.extend(paths.into_iter().map(|p| [base.clone(), p].concat()));
                i = end.max(i + 1);
            }
            None => i += 1,
        }
    }
    out
}

/// The paths of the use tree (or plain path) that starts at `i`, and where
/// it ends: `a::b::{c, d::e}` is `a::b::c` and `a::b::d::e`.
fn use_tree(code: &str, mut i: usize) -> (Vec<ModPath>, usize) {
    let b = code.as_bytes();
    let mut prefix = ModPath::new();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) == Some(&b'{') {
            i += 1;
            let mut all = Vec::new();
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    i += 1;
                    break;
                }
                let (sub, end) = use_tree(code, i);
                all.extend(sub.into_iter().map(|s| [prefix.clone(), s].concat()));
                if end <= i {
                    i += 1;
                } else {
                    i = end;
                }
            }
            return (if all.is_empty() { vec![prefix] } else { all }, i);
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i == start {
            return (vec![prefix], i);
        }
        prefix.push(code[start..i].to_owned());
        if code.as_bytes()[i..].starts_with(b"::") {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}
