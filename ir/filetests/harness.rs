//! The file-test format (see README.md in this folder): finding `.rir` files, reading their
//! `;` headers, and running them all with one report. Shared by `ir/tests/filetests.rs` and
//! `codegen-ptx/tests/filetests.rs`, which include this file with `#[path]`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The kinds of test a file may ask for.
pub const KINDS: [&str; 5] = ["verify", "interpret", "optimize", "profile", "compile"];

/// Header keys written as `; key: value`.
const COLON_KEYS: [&str; 5] = ["error", "passes", "target", "ptx", "ptx-not"];

/// Header keys written as `; key value`.
const WORD_KEYS: [&str; 5] = ["test", "launch", "arg", "expect", "count"];

/// One header line.
pub struct Directive {
    /// 1-based line in the file.
    pub line: usize,
    pub key: String,
    pub value: String,
}

/// A file test: its text (the whole file, which parses as one kernel) and its header.
pub struct FileTest {
    pub path: PathBuf,
    pub text: String,
    /// `verify`, `interpret`, `optimize`, `profile` or `compile`.
    pub kind: String,
    pub directives: Vec<Directive>,
}

impl FileTest {
    /// The directives with this key, in file order.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a Directive> + 'a {
        self.directives.iter().filter(move |d| d.key == key)
    }

    /// The one directive with this key, if any (an error if there are several).
    pub fn one<'a>(&'a self, key: &'a str) -> Result<Option<&'a Directive>, String> {
        let mut found = self.all(key);
        let first = found.next();
        match found.next() {
            Some(d) => Err(format!("line {}: a second `{key}` directive", d.line)),
            None => Ok(first),
        }
    }

    /// Reject directives the test kind does not use (typos would otherwise be ignored).
    pub fn allow_only(&self, keys: &[&str]) -> Result<(), String> {
        match self.directives.iter().find(|d| d.key != "test" && !keys.contains(&d.key.as_str())) {
            Some(d) => Err(format!("line {}: `{}` does not apply to `test {}`", d.line, d.key, self.kind)),
            None => Ok(()),
        }
    }
}

/// The folder of file tests: where the sources were built, else `ir/filetests` under the
/// current folder (the GPU machine runs bundled test executables from the project root).
pub fn filetests_dir() -> PathBuf {
    let built = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../ir/filetests"));
    if built.is_dir() {
        built.canonicalize().unwrap_or_else(|_| built.to_path_buf())
    } else {
        PathBuf::from("ir/filetests")
    }
}

/// Every `.rir` file under `dir`, sorted by path.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rir") {
                out.push(path);
            }
        }
    }
    let mut out = vec![];
    walk(dir, &mut out);
    out.sort();
    out
}

/// Read a file and its header: the `;` lines before the first other line.
pub fn read(path: &Path) -> Result<FileTest, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut directives = vec![];
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(comment) = line.strip_prefix(';') else { break };
        let comment = comment.trim();
        let (word, rest) = comment.split_once(char::is_whitespace).unwrap_or((comment, ""));
        let key = match word.strip_suffix(':') {
            Some(k) if COLON_KEYS.contains(&k) => k,
            Some(k) if !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '-') => {
                return Err(format!("line {}: unknown directive `{word}`", i + 1));
            }
            _ if WORD_KEYS.contains(&word) => word,
            // Anything else is a free comment.
            _ => continue,
        };
        directives.push(Directive { line: i + 1, key: key.to_string(), value: rest.trim().to_string() });
    }
    let mut kinds = directives.iter().filter(|d| d.key == "test");
    let kind = match (kinds.next(), kinds.next()) {
        (Some(d), None) if KINDS.contains(&d.value.as_str()) => d.value.clone(),
        (Some(d), None) => {
            return Err(format!("line {}: unknown test kind `{}` (known: {})", d.line, d.value, KINDS.join(", ")))
        }
        (None, _) => return Err(format!("no `; test <kind>` line in the header (kinds: {})", KINDS.join(", "))),
        (Some(_), Some(d)) => return Err(format!("line {}: a second `test` line", d.line)),
    };
    Ok(FileTest { path: path.to_path_buf(), text, kind, directives })
}

/// Whether `RUDA_BLESS=1` asks tests to rewrite their expected output.
pub fn blessing() -> bool {
    std::env::var("RUDA_BLESS").is_ok_and(|v| v == "1")
}

/// Run `run` on every file (a panic counts as that file's failure), print a summary, and fail
/// with every failure and its file name.
pub fn run_all(files: &[PathBuf], run: impl Fn(&FileTest) -> Result<(), String>) {
    assert!(!files.is_empty(), "no .rir files found");
    let mut failures = vec![];
    for path in files {
        let outcome = catch_unwind(AssertUnwindSafe(|| read(path).and_then(|ft| run(&ft))));
        let message = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(message)) => message,
            Err(payload) => {
                let what = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                format!("panicked: {what}")
            }
        };
        failures.push(format!("--- {}\n{}", path.display(), message.trim_end()));
    }
    println!("file tests: {} passed, {} failed", files.len() - failures.len(), failures.len());
    if !failures.is_empty() {
        panic!("{} of {} file tests failed:\n{}", failures.len(), files.len(), failures.join("\n"));
    }
}
