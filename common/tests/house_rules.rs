//! Rules of the house that a reader relies on, checked over the
//! repository's Rust sources: no non-test function is longer than
//! [`MAX_FN_LINES`] lines, and the executor returns typed errors (no
//! `Result<_, String>`). Test code (`tests/` folders, `tests.rs` files and
//! `#[cfg(test)]` modules) is left out. A small lexer tells code from
//! comments, strings and character literals, so that a brace in a string
//! or a `String` in a doc comment counts for nothing.

use std::path::{Path, PathBuf};

/// The longest a non-test function may be, in lines.
const MAX_FN_LINES: usize = 120;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

/// The non-test Rust files under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if ![
                "target",
                "tests",
                "node_modules",
                ".git",
                "proptest-regressions",
            ]
            .contains(&name.as_str())
                && !name.starts_with('.')
            {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(p);
        }
    }
}

/// `text` with every comment, string and character literal blanked out
/// (line breaks kept), and cut where a top-level `#[cfg(test)]` begins.
fn code_of(text: &str) -> String {
    let text = match text.find("\n#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let keep = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(keep(c[i]));
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' && c.get(i + 1) == Some(&'r'))) && !ident_before {
            // A raw string: r"…", r#"…"#, br"…".
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                out.push(keep(c[j]));
                j += 1;
            }
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = c.get(i) {
                    out.push(keep(ch));
                }
                i += 1;
            }
            i += 1;
        } else if c[i] == '\'' && (c.get(i + 1) == Some(&'\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{1F600}'); a lifetime is code.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The functions of `code` longer than `max` lines: (name, first line,
/// lines).
fn long_functions(code: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let words: Vec<&str> = lines[i]
            .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else {
            i += 1;
            continue;
        };
        let before_ok = words[..at].iter().all(|w| {
            [
                "pub", "crate", "super", "async", "const", "unsafe", "extern", "self", "in",
            ]
            .contains(w)
        });
        if !before_ok || at + 1 >= words.len() {
            i += 1;
            continue;
        }
        let name = words[at + 1].to_owned();
        // Its body: from the first `{` to the brace that closes it; a
        // declaration that ends in `;` first has none.
        let (mut depth, mut started, mut j) = (0i64, false, i);
        'body: while j < lines.len() {
            for ch in lines[j].chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    ';' if !started => break 'body,
                    _ => {}
                }
                if started && depth == 0 {
                    break 'body;
                }
            }
            j += 1;
        }
        if started {
            let n = j - i + 1;
            if n > max {
                out.push((name, i + 1, n));
            }
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// Each `Result<…, String>` of `code`: its line.
fn string_results(code: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        let rest = &code[at + "Result<".len()..];
        let (mut depth, mut last_arg_start, mut end) = (1, 0, None);
        for (k, ch) in rest.char_indices() {
            match ch {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(k);
                        break;
                    }
                }
                ',' if depth == 1 => last_arg_start = k + 1,
                _ => {}
            }
        }
        if let Some(end) = end {
            if last_arg_start > 0 && rest[last_arg_start..end].trim() == "String" {
                out.push(code[..at].matches('\n').count() + 1);
            }
        }
    }
    out
}

#[test]
fn no_non_test_function_is_longer_than_the_limit() {
    let mut files = Vec::new();
    sources(&repo(), &mut files);
    files.sort();
    assert!(files.len() > 100, "found only {} source files", files.len());
    let mut long = Vec::new();
    for f in &files {
        let code = code_of(&std::fs::read_to_string(f).expect("a source file"));
        for (name, line, n) in long_functions(&code, MAX_FN_LINES) {
            let rel = f.strip_prefix(repo()).unwrap_or(f).display().to_string();
            long.push(format!("{rel}:{line} {name}: {n} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (cut them into named steps; a loop as a worker with a step()):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn the_executor_returns_typed_errors() {
    let mut files = Vec::new();
    sources(&repo().join("executor/src"), &mut files);
    files.sort();
    let mut found = Vec::new();
    for f in &files {
        let code = code_of(&std::fs::read_to_string(f).expect("a source file"));
        for line in string_results(&code) {
            let rel = f.strip_prefix(repo()).unwrap_or(f).display().to_string();
            found.push(format!("{rel}:{line}"));
        }
    }
    assert!(
        found.is_empty(),
        "Result<_, String> in the executor (give the boundary a thiserror enum a caller can match on):\n  {}",
        found.join("\n  ")
    );
}

/// The rules' own tests: what they must see, and what they must not.
#[test]
fn the_lexer_and_the_rules_see_code_only() {
    let code = code_of(
        "fn a() -> Result<u8, String> {\n    let s = \"} { Result<u8, String>\";\n    let c = '{';\n    // }\n    /* } { */\n    let r = r#\"}\"#;\n    let l: &'static str = \"\";\n}\n#[cfg(test)]\nmod tests { fn t() -> Result<(), String> { Ok(()) } }\n",
    );
    assert_eq!(string_results(&code), vec![1], "{code}");
    assert!(!code.contains("mod tests"));
    assert_eq!(long_functions(&code, 7), vec![("a".to_owned(), 1, 8)]);
    assert!(long_functions(&code, 8).is_empty());
    assert!(long_functions("trait T {\n    fn f(&self);\n}\n", 0).is_empty());
    assert!(string_results("fn f() -> Result<Vec<String>, Error> {}").is_empty());
    assert_eq!(
        string_results("type R = std::result::Result<(u8, String), String>;"),
        vec![1]
    );
}
