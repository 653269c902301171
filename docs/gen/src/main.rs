//! Writes the book's generated reference pages under docs/src/reference/.
//! Run from anywhere in the repository: `cargo run -p wirerate-docs`. A test
//! fails when a committed page differs from what this writes.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../src");
    let pages = match wirerate_docs::pages() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("wirerate-docs: cannot render the reference: {e}");
            return ExitCode::from(2);
        }
    };
    for (path, text) in pages {
        let p = src.join(path);
        if std::fs::read_to_string(&p).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if let Err(e) = std::fs::write(&p, text) {
            eprintln!("wirerate-docs: writing {}: {e}", p.display());
            return ExitCode::from(2);
        }
        println!("wrote docs/src/{path}");
    }
    ExitCode::SUCCESS
}
