//! A script job's code, put in place for its ranks: one `.py` file copied
//! as is, or an archive of a folder (`.tar.gz`, `.tgz`, `.zip`) extracted
//! with every entry checked first. An archive is a stranger's bytes: no
//! absolute path, no `..`, no link (symbolic or hard), no device, FIFO or
//! other special file (a tar's entry type, a zip's Unix mode), and bounded in entries and in bytes, each file and all
//! together, counted as they are written (a header's size is not trusted).

use std::io::Read;
use std::path::{Path, PathBuf};
use trainyard_common::spec::script::{relative_path_problem, CodePackaging};

/// Most entries (files and folders) an archive may hold.
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes an archive's files may hold together, extracted.
pub const MAX_BYTES: u64 = 512 << 20;

/// Why an archive was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodeError {
    /// An entry breaks a rule.
    #[error("the code archive's entry {entry:?} {why}")]
    Entry {
        /// Its path as the archive gives it.
        entry: String,
        /// Which rule.
        why: String,
    },
    /// Too many entries or bytes.
    #[error("the code archive is too large: {0}")]
    TooLarge(String),
    /// It does not read as its format.
    #[error("the code archive does not read as {format}: {why}")]
    Format {
        /// The format its name says.
        format: &'static str,
        /// What went wrong.
        why: String,
    },
    /// The entrypoint is not a file of the code.
    #[error("script.entrypoint {0:?} is not a file of the code")]
    NoEntrypoint(String),
    /// Writing the extracted files.
    #[error("writing the code: {0}")]
    Io(String),
}

/// Puts the code in `file` (packaged as `packaging`, named `name`) into
/// `dir` and checks that `entrypoint` is one of its files.
pub fn materialize(
    file: &Path,
    name: &str,
    packaging: CodePackaging,
    dir: &Path,
    entrypoint: &str,
) -> Result<(), CodeError> {
    let io = |e: std::io::Error| CodeError::Io(e.to_string());
    std::fs::create_dir_all(dir).map_err(io)?;
    match packaging {
        CodePackaging::Python => {
            let size = std::fs::metadata(file).map_err(io)?.len();
            if size > MAX_BYTES {
                return Err(CodeError::TooLarge(format!("{size} bytes")));
            }
            std::fs::copy(file, dir.join(name)).map_err(io)?;
        }
        CodePackaging::TarGz => {
            let f = std::fs::File::open(file).map_err(io)?;
            untar(flate2::read::GzDecoder::new(f), dir)?;
        }
        CodePackaging::Zip => unzip(file, dir)?,
    }
    let at = dir.join(entrypoint);
    if relative_path_problem(entrypoint).is_some() || !at.is_file() || at.is_symlink() {
        return Err(CodeError::NoEntrypoint(entrypoint.to_owned()));
    }
    Ok(())
}

/// Bounds shared by one extraction.
struct Budget {
    entries: usize,
    bytes: u64,
}

impl Budget {
    fn entry(&mut self) -> Result<(), CodeError> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(CodeError::TooLarge(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        Ok(())
    }

    /// Copies `from` into a new file `to`, counting its bytes.
    fn write(&mut self, from: &mut dyn Read, to: &Path) -> Result<(), CodeError> {
        let io = |e: std::io::Error| CodeError::Io(e.to_string());
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(to)
            .map_err(io)?;
        let left = MAX_BYTES - self.bytes;
        let n = std::io::copy(&mut from.take(left + 1), &mut out).map_err(io)?;
        self.bytes += n;
        if self.bytes > MAX_BYTES {
            return Err(CodeError::TooLarge(format!(
                "more than {} MiB extracted",
                MAX_BYTES >> 20
            )));
        }
        Ok(())
    }
}

/// Where entry `raw` goes under `dir`, if its path is safe.
fn target(dir: &Path, raw: &str) -> Result<Option<PathBuf>, CodeError> {
    let trimmed = raw.trim_start_matches("./").trim_end_matches('/');
    if trimmed.is_empty() || trimmed == "." {
        return Ok(None);
    }
    if let Some(why) = relative_path_problem(trimmed) {
        return Err(CodeError::Entry {
            entry: raw.to_owned(),
            why: why.to_owned(),
        });
    }
    Ok(Some(dir.join(trimmed)))
}

fn make_parent(path: &Path) -> Result<(), CodeError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| CodeError::Io(e.to_string()))?;
    }
    Ok(())
}

fn untar(r: impl Read, dir: &Path) -> Result<(), CodeError> {
    let format = |e: std::io::Error| CodeError::Format {
        format: "a gzipped tar archive",
        why: e.to_string(),
    };
    let mut archive = tar::Archive::new(r);
    let mut budget = Budget {
        entries: 0,
        bytes: 0,
    };
    for entry in archive.entries().map_err(format)? {
        let mut entry = entry.map_err(format)?;
        budget.entry()?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        let Some(to) = target(dir, &raw)? else {
            continue;
        };
        if kind.is_dir() {
            std::fs::create_dir_all(&to).map_err(|e| CodeError::Io(e.to_string()))?;
        } else if kind.is_file() {
            make_parent(&to)?;
            budget.write(&mut entry, &to)?;
        } else if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            continue;
        } else {
            let what = if kind.is_symlink() || kind.is_hard_link() {
                "is a link; the code may hold only files and folders"
            } else {
                "is not a file or a folder"
            };
            return Err(CodeError::Entry {
                entry: raw,
                why: what.into(),
            });
        }
    }
    Ok(())
}

/// The file-type bits of a Unix mode, and the types a zip entry may be.
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

fn unzip(file: &Path, dir: &Path) -> Result<(), CodeError> {
    let format = |e: zip::result::ZipError| CodeError::Format {
        format: "a zip archive",
        why: e.to_string(),
    };
    let f = std::fs::File::open(file).map_err(|e| CodeError::Io(e.to_string()))?;
    let mut archive = zip::ZipArchive::new(f).map_err(format)?;
    if archive.len() > MAX_ENTRIES {
        return Err(CodeError::TooLarge(format!(
            "more than {MAX_ENTRIES} entries"
        )));
    }
    let mut budget = Budget {
        entries: 0,
        bytes: 0,
    };
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(format)?;
        budget.entry()?;
        let raw = entry.name().to_owned();
        let Some(to) = target(dir, &raw)? else {
            continue;
        };
        // A zip records a link, a FIFO or a device as a file whose Unix
        // mode says so (no mode: a plain file or folder, by its name).
        let kind = entry.unix_mode().unwrap_or(0) & S_IFMT;
        if kind == S_IFLNK {
            return Err(CodeError::Entry {
                entry: raw,
                why: "is a link; the code may hold only files and folders".into(),
            });
        }
        if kind != 0 && kind != S_IFREG && kind != S_IFDIR {
            return Err(CodeError::Entry {
                entry: raw,
                why: "is not a file or a folder".into(),
            });
        }
        if entry.is_dir() {
            std::fs::create_dir_all(&to).map_err(|e| CodeError::Io(e.to_string()))?;
        } else {
            make_parent(&to)?;
            budget.write(&mut entry, &to)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ty-code-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An entry written raw: path, type, bytes, link target.
    type Raw<'a> = (&'a str, tar::EntryType, &'a [u8], &'a str);

    /// A .tar.gz whose entries are written raw (a hostile archive's paths
    /// are not what `tar::Builder` would let through).
    fn targz(dir: &Path, entries: &[Raw<'_>]) -> PathBuf {
        let path = dir.join("code.tar.gz");
        let f = std::fs::File::create(&path).unwrap();
        let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap();
        path
    }

    #[test]
    fn a_folder_archive_is_extracted_and_its_entrypoint_found() {
        let d = scratch("ok");
        let t = targz(
            &d,
            &[
                ("./src/", tar::EntryType::Directory, b"", ""),
                ("./src/train.py", tar::EntryType::Regular, b"print(1)", ""),
                ("./src/util.py", tar::EntryType::Regular, b"X = 1", ""),
            ],
        );
        let out = d.join("out");
        materialize(
            &t,
            "code.tar.gz",
            CodePackaging::TarGz,
            &out,
            "src/train.py",
        )
        .unwrap();
        assert_eq!(std::fs::read(out.join("src/util.py")).unwrap(), b"X = 1");
        let e = materialize(
            &t,
            "code.tar.gz",
            CodePackaging::TarGz,
            &d.join("again"),
            "main.py",
        );
        assert_eq!(e, Err(CodeError::NoEntrypoint("main.py".into())));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn hostile_archives_are_refused_and_write_nothing_outside() {
        let d = scratch("hostile");
        let cases: Vec<(&str, Vec<Raw<'_>>, &str)> = vec![
            (
                "dotdot",
                vec![("../escaped.py", tar::EntryType::Regular, b"x", "")],
                "`..`",
            ),
            (
                "absolute",
                vec![("/tmp/abs.py", tar::EntryType::Regular, b"x", "")],
                "absolute",
            ),
            (
                "symlink",
                vec![("link", tar::EntryType::Symlink, b"", "/etc/passwd")],
                "link",
            ),
            (
                "hardlink",
                vec![("hard", tar::EntryType::Link, b"", "/etc/passwd")],
                "link",
            ),
            (
                "device",
                vec![("dev", tar::EntryType::Char, b"", "")],
                "not a file",
            ),
            (
                "fifo",
                vec![("fifo", tar::EntryType::Fifo, b"", "")],
                "not a file",
            ),
        ];
        for (name, entries, expect) in cases {
            let case = d.join(name);
            std::fs::create_dir_all(&case).unwrap();
            let t = targz(&case, &entries);
            let out = case.join("out");
            let e = materialize(&t, "code.tar.gz", CodePackaging::TarGz, &out, "train.py")
                .unwrap_err()
                .to_string();
            assert!(e.contains(expect), "{name}: {e}");
            assert!(!case.join("escaped.py").exists() && !Path::new("/tmp/abs.py").exists());
        }
        // A bomb: a header that lies is cut at the budget, not trusted.
        let case = d.join("bomb");
        std::fs::create_dir_all(&case).unwrap();
        let t = case.join("bomb.tar.gz");
        {
            let f = std::fs::File::create(&t).unwrap();
            let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
            let mut b = tar::Builder::new(gz);
            let mut h = tar::Header::new_gnu();
            h.set_path("big.bin").unwrap();
            h.set_size(MAX_BYTES + 1);
            h.set_mode(0o644);
            h.set_cksum();
            b.append(&h, std::io::repeat(0).take(MAX_BYTES + 1))
                .unwrap();
            b.into_inner().unwrap().finish().unwrap();
        }
        let e = materialize(
            &t,
            "bomb.tar.gz",
            CodePackaging::TarGz,
            &case.join("out"),
            "x.py",
        );
        assert!(matches!(e, Err(CodeError::TooLarge(_))), "{e:?}");
        // Not an archive at all.
        let junk = case.join("junk.zip");
        std::fs::write(&junk, b"not a zip").unwrap();
        let e = materialize(
            &junk,
            "junk.zip",
            CodePackaging::Zip,
            &case.join("z"),
            "x.py",
        );
        assert!(matches!(e, Err(CodeError::Format { .. })), "{e:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Sets the Unix mode of entry `name` in the central directory of the
    /// zip `bytes` (the zip crate writes permission bits only).
    fn set_zip_mode(bytes: &mut [u8], name: &str, mode: u32) {
        let at = (0..bytes.len() - 46)
            .find(|&i| {
                bytes[i..i + 4] == [0x50, 0x4b, 0x01, 0x02]
                    && bytes[i + 46..].starts_with(name.as_bytes())
            })
            .expect("the entry's central directory header");
        bytes[at + 5] = 3; // made by: Unix
        bytes[at + 38..at + 42].copy_from_slice(&(mode << 16).to_le_bytes());
    }

    #[test]
    fn a_zip_with_a_link_or_a_climbing_name_is_refused() {
        let d = scratch("zip");
        for (name, link, expect) in [("../up.py", false, "`..`"), ("ln", true, "link")] {
            let path = d.join("c.zip");
            {
                let f = std::fs::File::create(&path).unwrap();
                let mut z = zip::ZipWriter::new(f);
                let opts = zip::write::SimpleFileOptions::default();
                if link {
                    z.add_symlink(name, "/etc/passwd", opts).unwrap();
                } else {
                    z.start_file(name, opts).unwrap();
                    z.write_all(b"x").unwrap();
                }
                z.finish().unwrap();
            }
            let e = materialize(&path, "c.zip", CodePackaging::Zip, &d.join("out"), "up.py")
                .unwrap_err()
                .to_string();
            assert!(e.contains(expect), "{name}: {e}");
        }
        assert!(!d.join("up.py").exists());
        // A FIFO, a character device, a block device and a socket, each
        // a file whose Unix mode names its type: refused, not written as
        // a plain file.
        for (i, mode) in [0o010644u32, 0o020644, 0o060644, 0o140644]
            .into_iter()
            .enumerate()
        {
            let path = d.join(format!("special-{i}.zip"));
            let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            let opts = zip::write::SimpleFileOptions::default();
            z.start_file("train.py", opts).unwrap();
            z.write_all(b"print(1)").unwrap();
            z.start_file("special", opts).unwrap();
            let mut bytes = z.finish().unwrap().into_inner();
            set_zip_mode(&mut bytes, "special", mode);
            std::fs::write(&path, bytes).unwrap();
            let out = d.join(format!("special-out-{i}"));
            let e = materialize(&path, "c.zip", CodePackaging::Zip, &out, "train.py");
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("\"special\" is not a file or a folder"),
                "{mode:o}: {e}"
            );
            assert!(!out.join("special").exists(), "{mode:o}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
