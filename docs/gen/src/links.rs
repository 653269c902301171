//! Checks that every relative link of the book (docs/src/) and of the
//! README leads to a file that exists and, with a `#fragment`, to a heading
//! of that page, named as mdBook names it. A link out of docs/src/, or to a
//! page SUMMARY.md does not list, would be broken in the built book even
//! though the file exists, so both are refused too. Links in code are not
//! links; links with a scheme (`https:`) are not checked.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

/// A link as written: where, and to what.
#[derive(Debug, PartialEq)]
pub struct Link {
    /// 1-based line.
    pub line: usize,
    /// The target, as written between the parentheses.
    pub target: String,
}

/// The inline links and images of `markdown`, outside code blocks and code
/// spans.
pub fn links(markdown: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (i, line) in prose_lines(markdown) {
        let text = without_code_spans(line);
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = closing_paren(after);
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            let target = target.trim_start_matches('<').trim_end_matches('>');
            out.push(Link {
                line: i + 1,
                target: target.to_string(),
            });
            rest = &after[end..];
        }
    }
    out
}

/// Lines outside fenced code blocks, with their 0-based numbers.
fn prose_lines(markdown: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    markdown.lines().enumerate().filter(move |(_, line)| {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                false
            }
            (Some(f), Some(m)) if f == m => {
                fence = None;
                false
            }
            (Some(_), _) => false,
            (None, None) => true,
        }
    })
}

/// `line` with its code spans blanked out: what is between runs of
/// backticks of the same length.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let ticks = &rest[start..start + run];
        let after = &rest[start + run..];
        match after.find(ticks) {
            Some(end) => rest = &after[end + run..],
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Where the parenthesis that closes a link target is, counting nested ones.
fn closing_paren(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return i,
            ')' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

/// The ids mdBook gives `markdown`'s headings: the heading's text,
/// lowercased, keeping letters, digits, `_` and `-`, spaces made `-`, and
/// `-1`, `-2`, ... after a repeated one (mdbook-html's `id_from_content`
/// and `unique_id`).
pub fn anchors(markdown: &str) -> HashSet<String> {
    let mut used = HashSet::new();
    for (_, line) in prose_lines(markdown) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let id = heading_id(line[hashes..].trim().trim_end_matches('#').trim());
        let mut unique = id.clone();
        let mut n = 0;
        while !used.insert(unique.clone()) {
            n += 1;
            unique = format!("{id}-{n}");
        }
    }
    used
}

/// The id of a heading whose Markdown text is `text`: its rendered text
/// (links as their text, no code or emphasis marks) put through mdBook's rule.
pub fn heading_id(text: &str) -> String {
    let mut rendered = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rendered.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = &after[(closing_paren(after) + 1).min(after.len())..];
    }
    rendered.push_str(rest);
    rendered
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// `path` with `.` and `..` resolved, without touching the disk.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The pages SUMMARY.md lists, relative to docs/src/.
pub fn summary_pages(summary: &str) -> HashSet<PathBuf> {
    links(summary)
        .into_iter()
        .map(|l| normalize(Path::new(&l.target)))
        .collect()
}

/// What is wrong with the links of `files` (paths relative to `root`),
/// given their text: each problem as `file:line: what`. `book` is the
/// book's source directory, relative to `root`, and `in_book` what its
/// SUMMARY.md lists, relative to it.
pub fn check(
    root: &Path,
    files: &HashMap<PathBuf, String>,
    book: &Path,
    in_book: &HashSet<PathBuf>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut keys: Vec<&PathBuf> = files.keys().collect();
    keys.sort();
    for file in keys {
        let from_book = file.starts_with(book);
        for link in links(&files[file]) {
            if link.target.contains("://") || link.target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match link.target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.target.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                normalize(&file.parent().unwrap_or(Path::new("")).join(path))
            };
            let mut say = |what: String| {
                problems.push(format!(
                    "{}:{}: {}: {what}",
                    file.display(),
                    link.line,
                    link.target
                ))
            };
            if !root.join(&target).exists() {
                say(format!("{} does not exist", target.display()));
                continue;
            }
            if from_book {
                match target.strip_prefix(book) {
                    Err(_) => {
                        say("leads out of the book's sources, so not into the built book".into());
                        continue;
                    }
                    Ok(page)
                        if page.extension().is_some_and(|e| e == "md")
                            && !in_book.contains(page) =>
                    {
                        say(format!(
                            "{} is not in SUMMARY.md, so not in the built book",
                            page.display()
                        ));
                        continue;
                    }
                    Ok(_) => {}
                }
            }
            let Some(fragment) = fragment else { continue };
            let text = match files.get(&target) {
                Some(t) => t.clone(),
                None => std::fs::read_to_string(root.join(&target)).unwrap_or_default(),
            };
            if !anchors(&text).contains(fragment) {
                say(format!("{} has no heading #{fragment}", target.display()));
            }
        }
    }
    problems
}

/// Checks the book under `root`/docs/src and `root`/README.md.
pub fn check_book(root: &Path) -> std::io::Result<Vec<String>> {
    let book = PathBuf::from("docs/src");
    let mut files = HashMap::new();
    files.insert(
        PathBuf::from("README.md"),
        std::fs::read_to_string(root.join("README.md"))?,
    );
    let mut dirs = vec![book.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root.join(&dir))? {
            let name = dir.join(entry?.file_name());
            if root.join(&name).is_dir() {
                dirs.push(name);
            } else if name.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(root.join(&name))?;
                files.insert(name, text);
            }
        }
    }
    let summary = files
        .get(&book.join("SUMMARY.md"))
        .cloned()
        .unwrap_or_default();
    Ok(check(root, &files, &book, &summary_pages(&summary)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_in_code_are_not_links() {
        let md = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n![pic](p.png \"title\")\n";
        let targets: Vec<String> = links(md).into_iter().map(|l| l.target).collect();
        assert_eq!(targets, ["a.md", "p.png"]);
    }

    #[test]
    fn heading_ids_follow_mdbook() {
        assert_eq!(heading_id("io_uring and seccomp"), "io_uring-and-seccomp");
        assert_eq!(
            heading_id("`--passes`: add more rustdoc passes"),
            "--passes-add-more-rustdoc-passes"
        );
        assert_eq!(
            heading_id("The agents' endpoint and logs"),
            "the-agents-endpoint-and-logs"
        );
        assert_eq!(heading_id("[Warm](w.md), measured"), "warm-measured");
        let a = anchors("# A\n## Status\n```\n# not a heading\n```\n## Status\n");
        let mut a: Vec<_> = a.into_iter().collect();
        a.sort();
        assert_eq!(a, ["a", "status", "status-1"]);
    }

    fn problems(files: &[(&str, &str)], summary: &[&str]) -> Vec<String> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/tmp")
            .join(format!("wirerate-docs-links-{}", std::process::id()));
        let map: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        for (p, t) in &map {
            std::fs::create_dir_all(dir.join(p).parent().unwrap()).unwrap();
            std::fs::write(dir.join(p), t).unwrap();
        }
        let in_book = summary.iter().map(PathBuf::from).collect();
        let found = check(&dir, &map, Path::new("docs/src"), &in_book);
        std::fs::remove_dir_all(&dir).unwrap();
        found
    }

    #[test]
    fn a_missing_file_a_missing_heading_and_a_page_outside_the_book_are_reported() {
        let found = problems(
            &[
                (
                    "README.md",
                    "[ok](docs/src/a.md#two) [gone](docs/src/none.md)\n",
                ),
                (
                    "docs/src/a.md",
                    "# One\n## Two\n[self](#two) [bad](#three) [b](b.md) [out](../../README.md)\n",
                ),
                ("docs/src/b.md", "# B\n"),
            ],
            &["a.md"],
        );
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(
            found[0].starts_with("README.md:1: docs/src/none.md: "),
            "{}",
            found[0]
        );
        assert!(
            found[1].contains("#three: docs/src/a.md has no heading #three"),
            "{}",
            found[1]
        );
        assert!(
            found[2].contains("b.md is not in SUMMARY.md"),
            "{}",
            found[2]
        );
        assert!(found[3].contains("leads out of the book"), "{}", found[3]);
    }
}
