//! The shared secret: read from a file or the environment, and checked for
//! what would let others learn or guess it. Anyone who holds it can write
//! beneath a receiver's root, so a token file others can read, or a token
//! short enough to guess, is said at start.
#![forbid(unsafe_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use wirerate_engine::error::{Error, Result};

/// Tokens shorter than this draw a warning.
pub const MIN_TOKEN_LEN: usize = 16;

/// The longest token taken: far more than any secret needs (the advised
/// one is 44 characters), and small enough that `--token-file /dev/zero`
/// or a mistyped path to a data file is refused at once instead of read
/// until memory runs out.
pub const MAX_TOKEN_LEN: usize = 4096;

/// A loaded token and what is wrong with how it is kept.
#[derive(Debug, Clone)]
pub struct Token {
    /// The secret, surrounding whitespace removed.
    pub bytes: Vec<u8>,
    /// Weaknesses worth telling the user about.
    pub warnings: Vec<String>,
}

fn how_to_make(path: &str) -> String {
    format!("head -c 32 /dev/urandom | base64 > {path} && chmod 600 {path}")
}

/// What is wrong with a token of `len` bytes kept in `path` with `mode`
/// (`None`: not in a file, but in the environment variable `path`).
fn weaknesses(path: &str, mode: Option<u32>, len: usize) -> Vec<String> {
    let mut w = Vec::new();
    if let Some(mode) = mode
        && mode & 0o077 != 0
    {
        let who = match (mode & 0o070 != 0, mode & 0o007 != 0) {
            (true, true) => "its group and everyone else",
            (true, false) => "its group",
            _ => "everyone",
        };
        w.push(format!(
            "the token file {path} can be read by {who} (mode {:03o}), and whoever reads it can write to every receiver that trusts it; chmod 600 {path}",
            mode & 0o777
        ));
    }
    if len < MIN_TOKEN_LEN {
        // A variable is no file to write the new token to.
        let how = match mode {
            Some(_) => how_to_make(path),
            None => format!(
                "put one in a file, {}, and pass --token-file PATH",
                how_to_make("PATH")
            ),
        };
        w.push(format!(
            "the token in {path} is {len} bytes, short enough to guess; use at least {MIN_TOKEN_LEN} random bytes ({how})"
        ));
    }
    w
}

/// `raw`, trimmed, as a token from `from`, or why it is none. The length
/// is checked before trimming: a file read only up to the limit must not
/// pass for one whose text went on after some whitespace.
fn checked(from: &str, raw: &[u8]) -> Result<Vec<u8>> {
    if raw.len() > MAX_TOKEN_LEN {
        return Err(Error::Config(format!(
            "{from} holds more than {MAX_TOKEN_LEN} bytes, too much for a token: is it the right file? \
             A token is a short secret ({})",
            how_to_make("PATH")
        )));
    }
    Ok(raw.trim_ascii().to_vec())
}

/// Reads the token in `path`.
pub fn from_file(path: &Path) -> Result<Token> {
    use std::io::Read;
    let shown = path.display().to_string();
    let reading = |e| Error::io(format!("reading the token file {shown}"), e);
    // One byte past the limit tells a file that is too long from one
    // that just fits, without reading the rest (/dev/zero has no end).
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_LEN as u64 + 1).read_to_end(&mut raw))
        .map_err(reading)?;
    let bytes = checked(&format!("the token file {shown}"), &raw)?;
    if bytes.is_empty() {
        return Err(Error::Config(format!(
            "the token file {shown} is empty; put a secret in it ({})",
            how_to_make(&shown)
        )));
    }
    let mode = std::fs::metadata(path).ok().map(|m| m.permissions().mode());
    Ok(Token {
        warnings: weaknesses(&shown, mode, bytes.len()),
        bytes,
    })
}

/// Takes the token from an environment variable's `value`.
pub fn from_env(name: &str, value: &str) -> Result<Token> {
    let bytes = checked(name, value.as_bytes())?;
    if bytes.is_empty() {
        return Err(Error::Config(format!(
            "{name} is empty; put a secret in it"
        )));
    }
    Ok(Token {
        warnings: weaknesses(name, None, bytes.len()),
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_long_token_draws_no_warning() {
        assert!(weaknesses("t", Some(0o100600), 44).is_empty());
        assert!(weaknesses("t", Some(0o400), 16).is_empty());
    }

    #[test]
    fn a_token_others_can_read_is_named_with_who_can() {
        let w = weaknesses("/etc/wirerate/token", Some(0o100644), 44);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("everyone") && w[0].contains("chmod 600"),
            "{w:?}"
        );
        let g = weaknesses("t", Some(0o640), 44);
        assert!(g[0].contains("its group") && g[0].contains("640"), "{g:?}");
    }

    #[test]
    fn a_short_token_is_named() {
        let w = weaknesses("t", Some(0o600), 15);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("15 bytes"), "{w:?}");
    }

    // The warning for a short WIRERATE_TOKEN said to write a new token to
    // a file named WIRERATE_TOKEN.
    #[test]
    fn a_short_token_in_the_environment_is_told_to_move_to_a_file() {
        let t = from_env("WIRERATE_TOKEN", "short").unwrap();
        assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
        let w = &t.warnings[0];
        assert!(w.contains("the token in WIRERATE_TOKEN is 5 bytes"), "{w}");
        assert!(w.contains("--token-file PATH"), "{w}");
        assert!(w.contains("> PATH"), "{w}");
        assert!(!w.contains("> WIRERATE_TOKEN"), "{w}");
    }

    // `--token-file /dev/zero` was read without end.
    #[test]
    fn a_token_file_longer_than_a_token_is_refused_without_reading_it_all() {
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, vec![b'a'; MAX_TOKEN_LEN]).unwrap();
        assert_eq!(from_file(&p).unwrap().bytes.len(), MAX_TOKEN_LEN);
        std::fs::write(&p, vec![b'a'; 1 << 20]).unwrap();
        // Not unwrap_err: it would print the whole token.
        let refused = |p: &Path| match from_file(p) {
            Ok(t) => panic!("took a token of {} bytes", t.bytes.len()),
            Err(e) => e.to_string(),
        };
        let e = refused(&p);
        assert!(e.contains("more than 4096 bytes"), "{e}");
        assert!(e.contains("is it the right file?"), "{e}");
        // Read only up to the limit: this would not end otherwise.
        let e = refused(Path::new("/dev/zero"));
        assert!(
            e.contains("the token file /dev/zero holds more than"),
            "{e}"
        );
        let long = "a".repeat(MAX_TOKEN_LEN + 1);
        assert!(matches!(
            from_env("WIRERATE_TOKEN", &long),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn the_file_is_checked_as_it_is_on_disk() {
        let dir = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let t = from_file(&p).unwrap();
        assert_eq!(t.bytes, b"short");
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
        std::fs::write(&p, "  \n").unwrap();
        assert!(matches!(from_file(&p), Err(Error::Config(_))));
    }
}
